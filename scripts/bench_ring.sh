#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The ring mode of scripts/bench_degraded.sh (run through it: `scripts/bench_degraded.sh ring`),
# inside a lab of NETLAB_HOSTS hosts x 2 ports it made: a validated ring all-reduce with host
# 1's port 0 cut or down after RING_CUT_AT iterations, with multipath and with
# VIGIL_MULTIPATH=0, ROUNDS times each, alternating (median; the last columns are the range of
# each column's runs, so a reader sees how far apart rounds of one build read). Prints one
# table row per point. RING_OFF=0 leaves out the second column (it reads "-"). RING_VS=SO
# makes the second column another libnccl-net-vigil.so with multipath on, for a side-by-side
# of two builds in one lab run.
# Usage: scripts/bench_ring.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -n ${NETLAB:-} && -n ${NETLAB_HOSTS:-} ]] || { echo "bench_ring.sh: run it through scripts/bench_degraded.sh ring" >&2; exit 2; }
ROUNDS=${1:-1}
HOSTS=$NETLAB_HOSTS
RATE=${RING_RATE:-200mbit}
BYTES=${RING_BYTES:-8M}
SLICE=${RING_SLICE:-1M}
ITERS=${RING_ITERS:-16}
CUT_AT=${RING_CUT_AT:-3}
SKIP=${RING_SKIP:-3}
CUTS=${CUTS:-75 50 25 10}
OFF=${RING_OFF:-1}
VS=${RING_VS:-}
[[ -z $VS || -f $VS ]] || { echo "bench_ring.sh: RING_VS=$VS: no such file" >&2; exit 2; }
bin=$PWD/build/test/netbench/vigil-netbench
plugin=${PLUGIN:-$PWD/build/net_plugin/libnccl-net-vigil.so}
tmp=$(mktemp -d /tmp/vigil-ring.XXXXXX)
trap '[[ -n ${KEEP:-} ]] && echo "logs: $tmp" >&2 || rm -rf "$tmp"' EXIT
source scripts/bench_lib.sh
rate_mbit=${RATE%mbit}
[[ $rate_mbit =~ ^[0-9]+$ ]] || { echo "RING_RATE must be in mbit (e.g. 200mbit)" >&2; exit 2; }
ncpu=$(nproc)

all_ports() { for h in $(seq 0 $((HOSTS - 1))); do for p in 0 1; do scripts/netlab.sh degrade "$h" "$p" "$RATE"; done; done; }
all_ports

# run MP WHAT [SO] -> "busbw_mbit cpu_fraction" of one run (of SO, ./build's plugin or
# PLUGIN by default). WHAT: "healthy", a cut percentage, or "down". Each rank's CPU time
# (user + system, getrusage of its process) goes to a file.
run() {
    local mp=$1 what=$2 so=${3:-$plugin} rdv="unix:$tmp/rdv.$RANDOM.sock" r pids=() t0 t1 out=$tmp/rank0.out
    : >"$tmp/cpu"
    : >"$out"
    t0=$(date +%s.%N)
    for ((r = HOSTS - 1; r >= 0; r--)); do
        local o=/dev/null
        ((r == 0)) && o=$out
        VIGIL_MULTIPATH=$mp scripts/netlab.sh exec "$r" -- python3 -c '
import resource, subprocess, sys
rc = subprocess.call(sys.argv[2:])
u = resource.getrusage(resource.RUSAGE_CHILDREN)
open(sys.argv[1], "a").write(f"{u.ru_utime + u.ru_stime}\n")
sys.exit(rc)' "$tmp/cpu" "$bin" --plugin "$so" --rank "$r" --nranks "$HOSTS" \
            --rendezvous "$rdv" --workload allreduce --bytes "$BYTES" --iters "$ITERS" \
            --channels 2 --slice "$SLICE" --timeout 300 >"$o" 2>>"$tmp/vigil.log" &
        pids+=($!)
    done
    # The cut, once rank 0 finished CUT_AT iterations.
    if [[ $what != healthy ]]; then
        while (($(grep -cE '^ +[0-9]+ ' "$out" || true) < CUT_AT)); do
            kill -0 "${pids[-1]}" 2>/dev/null || break
            sleep 0.02
        done
        if [[ $what == down ]]; then scripts/netlab.sh fail 1 0
        else scripts/netlab.sh degrade 1 0 "$((rate_mbit * what / 100))mbit"; fi
    fi
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    t1=$(date +%s.%N)
    if [[ $what == down ]]; then scripts/netlab.sh restore 1 0 >/dev/null; fi
    all_ports
    ((rc == 0)) || { tail -20 "$tmp/vigil.log" >&2; return 1; }
    python3 - "$out" "$tmp/cpu" "$t0" "$t1" "$ncpu" "$((CUT_AT + SKIP))" <<'PY'
import json, sys
out, cpu, t0, t1, ncpu, first = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rows = [l.split() for l in open(out) if len(l.split()) == 7 and l.split()[0].isdigit()]
assert all(int(r[5]) == 0 for r in rows), "wrong elements in the all-reduce"
summary = json.loads([l for l in open(out) if l.startswith("{")][-1])
assert summary["ok"] and summary["errors"] == 0, summary
bw = [float(r[4]) * 8e3 for r in rows if int(r[0]) >= first]  # busbw GB/s -> Mbit/s
busy = sum(float(x) for x in open(cpu)) / ((t1 - t0) * ncpu)
print(f"{sum(bw) / len(bw):.1f} {busy:.2f}")
PY
}

gso=$(ip -n "$NETLAB-h1" -d -j link show dev eth0 | grep -o '"gso_max_size":[0-9]*' | head -1)
echo "# ring all-reduce: $HOSTS hosts x 2 ports at $RATE (tbf; GSO packets up to ${gso#*:} bytes)," \
     "$BYTES per rank, 2 channels, $SLICE slices;" \
     "host 1 port 0 cut after iteration $CUT_AT, mean busbw of iterations $((CUT_AT + SKIP))..$((ITERS - 1)); median of $ROUNDS"
two=off
if [[ -n $VS ]]; then
    two=vs
    echo "# mp: $plugin; vs: $VS (multipath on in both)"
fi
printf '%-2s %-8s %11s %11s %8s %8s %7s %9s %9s %6s %13s %13s\n' H point "mp Mbit/s" "$two Mbit/s" "mp kept" \
    "$two kept" bound "mp/bound" "$two/bound" cpu "mp range" "$two range"
declare -A healthy=()
for what in healthy $CUTS down; do
    on=() off=() cpu=()
    for ((k = 0; k < ROUNDS; ++k)); do
        read -r b c <<<"$(run 1 "$what")"
        on+=("$b")
        cpu+=("$c")
        ((OFF)) || continue
        if [[ -n $VS ]]; then read -r b c <<<"$(run 1 "$what" "$VS")"
        else read -r b c <<<"$(run 0 "$what")"; fi
        off+=("$b")
        cpu+=("$c")
    done
    m_on=$(median "${on[@]}") m_cpu=$(median "${cpu[@]}") m_off=nan
    ((OFF)) && m_off=$(median "${off[@]}")
    if [[ $what == healthy ]]; then healthy[on]=$m_on healthy[off]=$m_off; fi
    python3 - "$HOSTS" "$what" "$m_on" "$m_off" "${healthy[on]}" "${healthy[off]}" "$m_cpu" "${on[*]}" "${off[*]:-}" <<'PY'
import math, sys
h, what = int(sys.argv[1]), sys.argv[2]
on, off, h_on, h_off, cpu = map(float, sys.argv[3:8])
runs, runs2 = ([float(x) for x in a.split()] for a in sys.argv[8:10])
bound = 1.0 if what == "healthy" else 0.5 if what == "down" else (1 + int(what) / 100) / 2
label = what if what in ("healthy", "down") else f"cut {what}%"
k_on, k_off = on / h_on, off / h_off
num = lambda x, w, p: f"{'-':>{w}s}" if math.isnan(x) else f"{x:{w}.{p}f}"
span = lambda xs: f"{min(xs):.1f}..{max(xs):.1f}" if xs else "-"
print(f"{h:<2d} {label:<8s} {on:11.1f} {num(off, 11, 1)} {k_on:8.2f} {num(k_off, 8, 2)} {bound:7.3f} "
      f"{k_on / bound:9.2f} {num(k_off / bound, 9, 2)} {cpu:6.2f} {span(runs):>13s} {span(runs2):>13s}")
PY
done
