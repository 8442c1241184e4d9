#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Side-by-side benchmark (not a test): a degraded port must not pace a connection, nor a ring.
#
# Stream mode (the default). A 2-host x 2-port lab with every port limited to RATE by tbf
# (both directions, netlab.sh degrade), one process pair streaming 4 MiB messages over N
# connections (vigil-netbench --workload bandwidth --channels N: connection c on port c mod 2,
# as NCCL deals its channels; message k on connection k mod N, so the run ends with the
# slowest). Host 1's port 0 is then cut to 75, 50, 25 and 10 % of RATE. Each point runs with
# multipath (the default) and with VIGIL_MULTIPATH=0 (the backup a hot standby only),
# alternating, ROUNDS times (median).
#
# Printed per N and cut: the throughput kept as a fraction of the same mode's healthy run, and
# the capacity bound: the rate the ports the connections may use can still carry over what
# they carried healthy. With multipath every connection may use both ports: (1 + f) / 2. With
# it off, N = 1 uses only its primary port (bound f) and N >= 2 spreads over both ((1 + f) / 2,
# which pacing by the slowest channel cannot reach). Target: multipath >= 0.9 x the bound.
#
# Ring mode (`ring`). H hosts x 2 ports (H = 3 and 4, RING_HOSTS), every port at RING_RATE,
# a validated ring all-reduce (vigil-netbench --workload allreduce, RING_BYTES per rank, two
# channels: each ring step's chunk is two slices, one per channel, channel c's primary on
# port c). After RING_CUT_AT iterations host 1's port 0 is cut to 75, 50, 25 and 10 % of the
# rate, or taken down (a failover); the bus bandwidth is the mean over the iterations from
# RING_SKIP after the cut to the end, against the same mode's run with no cut. The bound is
# what host 1's ports can still carry: (1 + f) / 2 cut, 1/2 down. Targets: multipath >= 0.9 x
# the bound at 25 and 10 %, and never below its own run with the port down. Each point also
# says how busy the CPUs were (the ranks' CPU time over the run's wall time and the cores):
# the ports are kept slow enough that the CPUs are not what limits the ring.
#
# What is shaped: veth ports with tbf (token bucket, 50 ms queue); a real NIC's degradation
# (FEC errors, PFC storms, a lane down) has other dynamics. The ring's lab caps its ports' GSO
# packets at 16 KiB (NETLAB_GSO_MAX, empty: the veths' 64 KiB), so a cut port's bucket is
# 10 ms of its rate or 24 KiB, not 96 KiB: a bucket that size passed a multipath piece at the
# veth's speed, and the cut port measured several times faster than it is
# (docs/benchmarks.md, "A cut port's bucket").
# Usage: scripts/bench_degraded.sh [ROUNDS] (RATE=400mbit, SECS=3, CHANNELS="1 2 4",
#          CUTS="75 50 25 10"; KEEP=1 keeps the logs). Writes docs/degraded.png when matplotlib
#          is there.
#        scripts/bench_degraded.sh ring [ROUNDS] (RING_HOSTS="3 4", RING_RATE=200mbit,
#          RING_BYTES=8M, RING_SLICE=1M, RING_ITERS=16, RING_CUT_AT=3, RING_SKIP=3, CUTS, KEEP,
#          NETLAB_GSO_MAX=16384; RING_OFF=0 skips the VIGIL_MULTIPATH=0 runs, RING_VS=SO runs
#          another build in their place, with multipath on; PLUGIN: the
#          libnccl-net-vigil.so to run, ./build's by default).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=stream
if [[ ${1:-} == ring ]]; then
    MODE=ring
    shift
fi
ROUNDS=${1:-1}
if [[ -z ${NETLAB:-} ]]; then
    scripts/setup.sh
    [[ $MODE == stream ]] && exec scripts/netlab.sh run -H 2 -P 2 -- "$0" "$@"
    export NETLAB_GSO_MAX=${NETLAB_GSO_MAX-16384}
    for h in ${RING_HOSTS:-3 4}; do scripts/netlab.sh run -H "$h" -P 2 -- "$0" ring "$@"; done
    exit 0
fi
if [[ $MODE == ring ]]; then exec scripts/bench_ring.sh "$ROUNDS"; fi
RATE=${RATE:-400mbit}
SECS=${SECS:-3}
CHANNELS=${CHANNELS:-1 2 4}
CUTS=${CUTS:-75 50 25 10}
bin=$PWD/build/test/netbench/vigil-netbench
plugin=$PWD/build/net_plugin/libnccl-net-vigil.so
tmp=$(mktemp -d /tmp/vigil-degraded.XXXXXX)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$tmp"' EXIT
source scripts/bench_lib.sh
rate_mbit=${RATE%mbit}
[[ $rate_mbit =~ ^[0-9]+$ ]] || { echo "RATE must be in mbit (e.g. 400mbit)" >&2; exit 2; }
size=$((4 << 20))

# lat MULTIPATH -> 8-byte ping-pong p50 (us) over one connection, ports unshaped: what
# multipath costs a healthy connection's small messages (they stay on the active path).
lat() {
    local rdv="unix:$tmp/rdv.$RANDOM.sock"
    VIGIL_MULTIPATH=$1 scripts/netlab.sh exec 1 -- "$bin" --plugin "$plugin" --rank 1 --nranks 2 \
        --rendezvous "$rdv" --workload latency --bytes 8 --iters 20000 --timeout 60 >/dev/null 2>>"$tmp/vigil.log" &
    local rpid=$!
    VIGIL_MULTIPATH=$1 scripts/netlab.sh exec 0 -- "$bin" --plugin "$plugin" --rank 0 --nranks 2 \
        --rendezvous "$rdv" --workload latency --bytes 8 --iters 20000 --timeout 60 >"$tmp/l.json" 2>>"$tmp/vigil.log"
    wait "$rpid"
    jget "$tmp/l.json" lat_p50_us
}
lon=() loff=()
for ((r = 0; r < 3; ++r)); do lon+=("$(lat 1)"); loff+=("$(lat 0)"); done
python3 -c "import sys; a,b=map(float,sys.argv[1:]); print(f'# healthy, unshaped: 8 B ping-pong p50 {a:.1f} us with multipath, {b:.1f} us without (ratio {a/b:.3f}, median of 3 alternating)')" \
    "$(median "${lon[@]}")" "$(median "${loff[@]}")"

for h in 0 1; do for p in 0 1; do scripts/netlab.sh degrade "$h" "$p" "$RATE"; done; done

# point MULTIPATH N PCT -> Mbit/s of one run (PCT: host 1 port 0 at PCT % of RATE)
point() {
    local mp=$1 n=$2 pct=$3 rdv="unix:$tmp/rdv.$RANDOM.sock" exp iters
    # Enough messages for about SECS at the rate this mode should reach (whole rounds).
    exp=$(python3 -c "
f=$pct/100; n=$n; r=$rate_mbit*1e6/8
print(r*(1+f) if $mp or n>1 else r*f)")
    iters=$(python3 -c "import math; n=$n; print(max(n*2, math.ceil($exp*$SECS/$size/n)*n))")
    if ((pct < 100)); then scripts/netlab.sh degrade 1 0 "$((rate_mbit * pct / 100))mbit"; fi
    VIGIL_MULTIPATH=$mp scripts/netlab.sh exec 1 -- "$bin" --plugin "$plugin" --rank 1 --nranks 2 \
        --rendezvous "$rdv" --workload bandwidth --bytes "$size" --iters "$iters" --channels "$n" \
        --timeout 120 >/dev/null 2>>"$tmp/vigil.log" &
    local rpid=$!
    VIGIL_MULTIPATH=$mp scripts/netlab.sh exec 0 -- "$bin" --plugin "$plugin" --rank 0 --nranks 2 \
        --rendezvous "$rdv" --workload bandwidth --bytes "$size" --iters "$iters" --channels "$n" \
        --timeout 120 >"$tmp/v.json" 2>>"$tmp/vigil.log" || { tail -20 "$tmp/vigil.log" >&2; return 1; }
    wait "$rpid" || { tail -20 "$tmp/vigil.log" >&2; return 1; }
    if ((pct < 100)); then scripts/netlab.sh degrade 1 0 "$RATE"; fi
    python3 - "$tmp/v.json" <<'PY'
import json, sys
d = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert d["ok"] and d["errors"] == 0, d
print(d["gbps"] * 8e3)
PY
}

echo "# degraded port: 2 hosts x 2 ports at $RATE each (tbf), host 1 port 0 cut; 4 MiB messages; median of $ROUNDS"
printf '%-3s %-5s %12s %12s %10s %10s %8s %10s\n' N cut% "mp Mbit/s" "off Mbit/s" "mp kept" "off kept" bound "mp/bound"
: >"$tmp/table"
for n in $CHANNELS; do
    declare -A healthy=()
    for pct in 100 $CUTS; do
        on=() off=()
        for ((r = 0; r < ROUNDS; ++r)); do
            on+=("$(point 1 "$n" "$pct")")
            off+=("$(point 0 "$n" "$pct")")
        done
        m_on=$(median "${on[@]}") m_off=$(median "${off[@]}")
        if ((pct == 100)); then healthy[on]=$m_on healthy[off]=$m_off; fi
        python3 - "$n" "$pct" "$m_on" "$m_off" "${healthy[on]}" "${healthy[off]}" <<'PY' | tee -a "$tmp/table"
import sys
n, pct = int(sys.argv[1]), int(sys.argv[2])
on, off, h_on, h_off = map(float, sys.argv[3:])
f = pct / 100
bound = (1 + f) / 2
k_on, k_off = on / h_on, off / h_off
print(f"{n:<3d} {pct:<5d} {on:12.0f} {off:12.0f} {k_on:10.2f} {k_off:10.2f} {bound:8.3f} {k_on / bound:10.2f}")
PY
    done
done
if grep -q "degraded" "$tmp/vigil.log"; then echo "(the detector flagged the cut port: $(grep -c 'degraded' "$tmp/vigil.log") lines)"; fi

PY=python3
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && PY=/usr/bin/python3
$PY - "$tmp/table" "$RATE" <<'PYEOF'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("(matplotlib not available: no plot)")
    sys.exit(0)
fig, ax = plt.subplots(figsize=(8, 4.2))
ns = sorted({int(r[0]) for r in rows})
colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
for n, c in zip(ns, colors):
    pts = [(int(r[1]), float(r[4]), float(r[5])) for r in rows if int(r[0]) == n]
    pts.sort()
    ax.plot([p for p, _, _ in pts], [k for _, k, _ in pts], "o-", color=c, label=f"{n} conn., multipath")
    ax.plot([p for p, _, _ in pts], [k for _, _, k in pts], "x--", color=c, label=f"{n} conn., VIGIL_MULTIPATH=0")
xs = list(range(5, 101))
ax.plot(xs, [(1 + x / 100) / 2 for x in xs], color="gray", lw=1, label="capacity bound (1+f)/2")
ax.set_xlabel("host 1 port 0 rate (% of the healthy port)")
ax.set_ylabel("throughput kept (fraction of healthy)")
ax.set_title(f"A degraded port: 2x2 lab, ports at {sys.argv[2]} (tbf)")
ax.set_ylim(0, 1.1)
ax.grid(alpha=0.3)
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
fig.savefig("docs/degraded.png", dpi=110)
print("plot: docs/degraded.png")
PYEOF
