#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench.sh  (run INSIDE the lab's guest, after topo.sh up)  The verbs fabric against perftest
# on the same rxe link, side by side in one run, and its failover time. A benchmark, not a
# test: it prints Markdown tables with the ratios.
#   bandwidth  ib_write_bw vs vigil-netbench's bandwidth workload (rank 0 -> rank 1, one
#              direction), alternating ROUNDS times per size; medians and vigil/perftest
#   latency    ib_write_lat vs vigil-netbench's latency workload (8-byte ping-pong), RTT/2
#              p50 both, alternating ROUNDS times; netbench with a receive posted ahead (as
#              NCCL posts its next steps) and as a plain ping-pong (--recv-ahead 0)
#   multipath  the cost of multipath on healthy ports: the bandwidth workload (64 KiB and
#              1 MiB) and the 8-byte latency p50 with multipath and with VIGIL_MULTIPATH=0,
#              alternating ROUNDS times; medians and their ratio
#   degraded   every port shaped to BENCH_RATE_MBIT (16) Mbit/s with tbf, then rank 0's
#              primary port cut to 50 % and 25 % of it: the bandwidth workload (512 KiB
#              messages, eight in flight) with multipath and with VIGIL_MULTIPATH=0, each
#              healthy and cut; the fraction of its own healthy rate each keeps, next to the
#              capacity bound (1 + f) / 2 that multipath can reach (f without it)
#   failover   FAULTS port faults (rank 0's primary port down, then up) under a looping
#              all-reduce: per fault the time from the port going down to the plugin's
#              failover (detection) and from the failover to the first replayed message
#              acknowledged (the plugin's own INFO line); median and p99
#   scale      what a verbs connection costs as their number grows (scripts/bench_scale.sh's
#              fanout over RC QPs): for each N in BENCH_CONNS (16 64 256), rank 0 opens N
#              send connections to rank 1, each with its backup on the other port; 10 rounds
#              of one BENCH_SCALE_BYTES (16K) message on every connection, every byte checked,
#              then BENCH_IDLE (10) s with all open and nothing posted. Per N and side: set-up
#              time, a round's time per connection, idle CPU and wake-ups a second over the
#              idle phase's second half, resident memory and fds per connection. Then
#              (BENCH_CUT=1, the default) per N the port cut under load of bench_scale.sh:
#              rank 0's port a0 down 4 s into 12 s of rounds, up 4 s later; per connection in
#              flight at the cut, the time to its message landing (scripts/fanout_cut.py)
# From the host:  scripts/rxe/vm.sh 'scripts/rxe/topo.sh up && scripts/rxe/bench.sh'
# Environment: BENCH_BUILD (build directory, default build), ROUNDS (3), FAULTS (24),
# BENCH_TESTS (default "bandwidth latency failover"; "multipath", "degraded" and "scale" on
# request), BENCH_CONNS, BENCH_SCALE_BYTES and BENCH_IDLE (for scale),
# BENCH_RATE_MBIT (16, for degraded), BENCH_WINDOW (netbench requests in
# flight, default 32: NCCL's NCCL_NET_MAX_REQUESTS), BENCH_YIELD (1, the default: netbench
# yields the CPU after a polling pass that moved nothing, as NCCL's proxy thread does, which
# leaves rxe's kernel work room on the guest's two CPUs; 0: it spins).
# Everything runs under the emulated CPU (TCG): compare the ratios, not the absolute figures.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${BENCH_BUILD:-build}
nb=$PWD/$build/test/netbench/vigil-netbench
plugin=$PWD/$build/net_plugin/libnccl-net-vigil.so
topo=$PWD/scripts/rxe/topo.sh
rounds=${ROUNDS:-3}
faults=${FAULTS:-24}
window=${BENCH_WINDOW:-32}
tests=${BENCH_TESTS:-bandwidth latency failover}
yield=()
[[ ${BENCH_YIELD:-1} == 1 ]] && yield=(--yield)
tmp=$(mktemp -d /tmp/vigil-rxe-bench.XXXXXX)
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    "$topo" port a0 up >/dev/null 2>&1 || true
    for p in a0 a1 b0 b1; do "$topo" unshape "$p" >/dev/null 2>&1 || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
[[ -x $nb && -f $plugin ]] || { echo "bench: build $build first (ninja -C $build)" >&2; exit 1; }
export VIGIL_FABRIC=verbs VIGIL_IB_RETRY_CNT=5 VIGIL_IB_TIMEOUT=14
hca=("=rxe_a0,rxe_a1" "=rxe_b0,rxe_b1")
median() { python3 -c 'import statistics,sys; v=[float(x) for x in sys.argv[1:]]; print(statistics.median(v) if v else 0)' "$@"; }
json() { python3 -c 'import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])[sys.argv[2]])' "$1" "$2"; }
mhz=$(awk -F: '/^cpu MHz/ {print $2 + 0; exit}' /proc/cpuinfo)

# vigil RUN_ARGS...: both ranks of vigil-netbench; prints rank 0's summary file.
n=0
vigil() {
    n=$((n + 1))
    local r
    pids=()
    for r in 1 0; do
        VIGIL_IB_HCA=${hca[r]} "$nb" --plugin "$plugin" --rank "$r" --nranks 2 "${yield[@]}" \
            --rendezvous "unix:$tmp/rdv.$n" --timeout 300 "$@" >"$tmp/out$n.$r" 2>"$tmp/err$n.$r" &
        pids[r]=$!
    done
    wait "${pids[0]}" "${pids[1]}"
    pids=()
    echo "$tmp/out$n.0"
}
# perftest TOOL SIZE ARGS...: server on rxe_b0, client on rxe_a0 (RoCE v2 GID 1); prints the
# client's result line.
perftest() {
    local tool=$1 size=$2
    shift 2
    "$tool" -d rxe_b0 -x 1 -F -s "$size" "$@" >/dev/null 2>&1 &
    local srv=$!
    sleep 1
    timeout 300 "$tool" -d rxe_a0 -x 1 -F -s "$size" "$@" 10.10.0.2 2>/dev/null | awk -v s="$size" '$1 == s'
    wait "$srv" 2>/dev/null
}

if [[ $tests == *bandwidth* ]]; then
    echo "| bandwidth | ib_write_bw (Gbit/s) | vigil verbs (Gbit/s) | vigil / perftest |"
    echo "|---|---|---|---|"
    for size in 65536 1048576; do
        iters=$((size >= 1048576 ? 60 : 600))
        pb=() vb=()
        for ((k = 0; k < rounds; k++)); do
            # Duration mode: perftest's own rate needs a clock sample that TCG often spoils
            # (it then prints 0); the message count it completed in the duration does not.
            line=$(perftest ib_write_bw "$size" -q 1 -D 5 --report_gbits)
            g=$(awk '{ if ($4 > 0) print $4; else if ($2 > 0) print $2 * $1 * 8 / 5 / 1e9 }' <<<"$line")
            [[ -n $g ]] && pb+=("$g")
            f=$(vigil --workload bandwidth --bytes "$size" --iters "$iters" --window "$window")
            vb+=("$(python3 -c "print($(json "$f" gbps) * 8)")")
        done
        p=$(median "${pb[@]}") v=$(median "${vb[@]}")
        printf '| %s B, %d messages, median of %d | %.4f | %.4f | %.2f |\n' "$size" "$iters" "$rounds" "$p" "$v" \
            "$(python3 -c "print($v / $p if $p > 0 else 0)")"
    done
    echo
fi

if [[ $tests == *latency* ]]; then
    echo "| latency, 8 B | ib_write_lat p50 (us) | vigil verbs p50 (us) | vigil / perftest |"
    echo "|---|---|---|---|"
    pl=() va=() v0=()
    for ((k = 0; k < rounds; k++)); do
        line=$(perftest ib_write_lat 8 -n 1000 -C)
        # columns: bytes iterations t_min t_max t_typical t_avg t_stdev p99 p99.9 (cycles)
        c=$(awk '{print $5}' <<<"$line")
        [[ -n $c ]] && pl+=("$(python3 -c "print($c / $mhz)")")
        f=$(vigil --workload latency --bytes 8 --iters 1000 --recv-ahead 1)
        va+=("$(json "$f" lat_p50_us)")
        f=$(vigil --workload latency --bytes 8 --iters 1000 --recv-ahead 0)
        v0+=("$(json "$f" lat_p50_us)")
    done
    p=$(median "${pl[@]}")
    for row in "receive posted ahead (as NCCL)" "plain ping-pong"; do
        if [[ $row == plain* ]]; then v=$(median "${v0[@]}"); else v=$(median "${va[@]}"); fi
        printf '| 1000 round trips, %s, median of %d runs | %.1f | %.1f | %.2f |\n' "$row" "$rounds" "$p" "$v" \
            "$(python3 -c "print($v / $p if $p > 0 else 0)")"
    done
    echo
fi

if [[ $tests == *multipath* ]]; then
    echo "| healthy ports | multipath | \`VIGIL_MULTIPATH=0\` | multipath / off |"
    echo "|---|---|---|---|"
    declare -A got=()
    for ((k = 0; k < rounds; k++)); do
        for mp in 1 0; do
            for size in 65536 1048576; do
                iters=$((size >= 1048576 ? 60 : 600))
                f=$(VIGIL_MULTIPATH=$mp vigil --workload bandwidth --bytes "$size" --iters "$iters" --window "$window")
                got[bw$size.$mp]+=" $(python3 -c "print($(json "$f" gbps) * 8)")"
            done
            f=$(VIGIL_MULTIPATH=$mp vigil --workload latency --bytes 8 --iters 1000 --recv-ahead 1)
            got[lat.$mp]+=" $(json "$f" lat_p50_us)"
        done
    done
    for row in bw65536 bw1048576 lat; do
        # shellcheck disable=SC2086 # the lists are words
        on=$(median ${got[$row.1]}) off=$(median ${got[$row.0]})
        case $row in
        bw65536) what="bandwidth, 64 KiB messages (Gbit/s)" ;;
        bw1048576) what="bandwidth, 1 MiB messages (Gbit/s)" ;;
        lat) what="latency, 8 B, p50 (us)" ;;
        esac
        printf '| %s, median of %d | %.4f | %.4f | %.2f |\n' "$what" "$rounds" "$on" "$off" \
            "$(python3 -c "print($on / $off if $off > 0 else 0)")"
    done
    echo
fi

if [[ $tests == *degraded* ]]; then
    rate=${BENCH_RATE_MBIT:-16}
    # Deep tbf queues that never drop (rxe 6.1 answers some retransmissions of a multi-packet
    # write with an invalid-request NAK) and a QP timeout longer than their queueing delay.
    save_timeout=$VIGIL_IB_TIMEOUT
    export VIGIL_IB_TIMEOUT=21
    # stream MULTIPATH: rank 0 -> rank 1, 512 KiB messages, eight in flight; prints Gbit/s.
    stream() {
        local f
        f=$(VIGIL_MULTIPATH=$1 vigil --workload bandwidth --bytes 512K --iters 24 --window 8 --check)
        [[ $(json "$f" ok) == True ]] || { echo "bench: the degraded stream failed" >&2; return 1; }
        python3 -c "print($(json "$f" gbps) * 8)"
    }
    echo "| rank 0's primary cut to | multipath: kept of its healthy rate | capacity bound (1 + f) / 2 | kept / bound | \`VIGIL_MULTIPATH=0\`: kept (bound f) |"
    echo "|---|---|---|---|---|"
    for pct in 50 25; do
        declare -A kept=()
        for mp in 1 0; do
            for p in a0 a1 b0 b1; do "$topo" shape "$p" "${rate}mbit" 10s; done
            h=$(stream "$mp") || break 2
            "$topo" shape a0 "$((rate * pct / 100))mbit" 10s
            c=$(stream "$mp") || break 2
            kept[$mp]=$(python3 -c "print($c / $h if $h > 0 else 0)")
            printf '  (multipath %s: healthy %.4f, cut %.4f Gbit/s)\n' "$mp" "$h" "$c" >&2
        done
        bound=$(python3 -c "print((1 + $pct / 100) / 2)")
        printf '| %d %% of %d Mbit/s | %.2f | %.3f | %.2f | %.2f |\n' "$pct" "$rate" "${kept[1]}" "$bound" \
            "$(python3 -c "print(${kept[1]} / $bound)")" "${kept[0]}"
    done
    for p in a0 a1 b0 b1; do "$topo" unshape "$p"; done
    export VIGIL_IB_TIMEOUT=$save_timeout
    echo
fi

if [[ $tests == *failover* ]]; then
    export NCCL_DEBUG=INFO VIGIL_FAILBACK_HOLD_MS=200 VIGIL_FATAL_TIMEOUT_MS=30000
    n=$((n + 1))
    for r in 1 0; do
        VIGIL_IB_HCA=${hca[r]} "$nb" --plugin "$plugin" --rank "$r" --nranks 2 --rendezvous "unix:$tmp/rdv.$n" \
            --timeout 3000 --workload allreduce --bytes 1M --loop >"$tmp/out$n.$r" 2>"$tmp/err$n.$r" &
        pids[r]=$!
    done
    err=$tmp/err$n.0
    until grep -q "accepted primary" "$err" 2>/dev/null; do sleep 0.2; done
    sleep 2
    mono() { python3 -c 'import time; print(f"{time.monotonic():.6f}")'; }
    count() { grep -c -- "$1" "$err" || true; }
    : >"$tmp/down_at"
    for ((i = 1; i <= faults; i++)); do
        mono >>"$tmp/down_at"
        "$topo" port a0 down
        until (($(count "failover: primary dev rxe_a0:1") >= i)); do sleep 0.05; done
        sleep 0.5
        "$topo" port a0 up
        "$topo" wait a0 active 30 || break
        until (($(count "failback to primary dev rxe_a0:1") >= i)); do sleep 0.05; done
        sleep 0.5
    done
    kill -USR1 "${pids[0]}"
    wait "${pids[0]}" "${pids[1]}"
    ok=$(json "$tmp/out$n.0" ok)
    pids=()
    python3 - "$tmp/down_at" "$err" "$faults" "$ok" <<'PY'
import re, statistics, sys
down = [float(x) for x in open(sys.argv[1]) if x.strip()]
text = open(sys.argv[2]).read()
acked = [(float(m.group(2)), float(m.group(1)) / 1e3) for m in re.finditer(
    r"first replayed message acknowledged ([0-9.]+) us after the failure was detected \(generation \d+, "
    r"detected at monotonic ([0-9.]+) s", text)]
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else float("nan")
detect = []
for t_det, _ in acked:
    before = [d for d in down if d <= t_det]
    if before:
        detect.append((t_det - before[-1]) * 1e3)
switch = [ms for _, ms in acked]
print(f"| failover, {sys.argv[3]} port faults, run ok: {sys.argv[4]} | median (ms) | p99 (ms) | samples |")
print("|---|---|---|---|")
print(f"| port down -> failover (the port event, under TCG) | {statistics.median(detect):.1f} | {pct(detect, 99):.1f} | {len(detect)} |"
      if detect else "| port down -> failover | n/a | n/a | 0 |")
print(f"| failover -> first replayed message acknowledged | {statistics.median(switch):.1f} | {pct(switch, 99):.1f} | {len(switch)} |"
      if switch else "| failover -> first replayed message acknowledged | n/a | n/a | 0 |")
print(f"\n({len(down)} faults; a failover with nothing in flight has no replay to time)")
PY
fi

if [[ $tests == *scale* ]]; then
    idle=${BENCH_IDLE:-10}
    echo "| conns | set-up (s) | round per conn (us), p50 / worst | steady idle CPU recv / send | wake-ups/s recv / send | KiB per conn recv / send | fds per conn recv / send |"
    echo "|---|---|---|---|---|---|---|"
    for c in ${BENCH_CONNS:-16 64 256}; do
        f=$(vigil --workload fanout --channels "$c" --bytes "${BENCH_SCALE_BYTES:-16K}" --iters 10 --idle "$idle" --check) ||
            { echo "bench: the fanout at $c connections failed" >&2; tail -n 5 "$tmp/err$n.0" "$tmp/err$n.1" >&2; break; }
        python3 - "$f" <<'PY'
import json, sys
d = next(json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"type":"fanout"'))
s = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"ok"')]
assert s and s[-1]["errors"] == 0, "errors in the run"
r, t = d["recv"], d["send"]
print(f'| {d["conns"]} | {max(r["setup_s"], t["setup_s"]):.2f} | {r["round_p50_us_per_conn"]:.0f} / {r["round_max_us_per_conn"]:.0f} | '
      f'{r["idle_steady_cpu_pct"]:.2f} % / {t["idle_steady_cpu_pct"]:.2f} % | '
      f'{r["idle_steady_wakes_per_s"]:.1f} / {t["idle_steady_wakes_per_s"]:.1f} | '
      f'{r["rss_kib_per_conn"]:.1f} / {t["rss_kib_per_conn"]:.1f} | {r["fds_per_conn"]:.2f} / {t["fds_per_conn"]:.2f} |')
PY
    done
    echo
    echo "(under TCG: compare how each column grows with N, not the absolute figures)"
    if [[ ${BENCH_CUT:-1} == 1 ]]; then
        # The port cut under load (scripts/bench_scale.sh's second table): rounds for 12 s,
        # rank 0's port a0 (the primary of half the connections) down after 4 s, up 4 s later.
        source scripts/bench_lib.sh
        fail_a0() { "$topo" port a0 down; }
        restore_a0() { "$topo" port a0 up; }
        echo
        echo "rank 0's port a0 down 4 s into 12 s of rounds, up 4 s later:"
        echo
        echo '```'
        python3 scripts/fanout_cut.py --header
        mono_clock_init
        for c in ${BENCH_CONNS:-16 64 256}; do
            n=$((n + 1))
            for r in 1 0; do
                VIGIL_IB_HCA=${hca[r]} "$nb" --plugin "$plugin" --rank "$r" --nranks 2 "${yield[@]}" \
                    --rendezvous "unix:$tmp/rdv.$n" --timeout 600 --workload fanout --channels "$c" \
                    --bytes "${BENCH_SCALE_BYTES:-16K}" --idle 0 --duration 12 >"$tmp/out$n.$r" 2>"$tmp/err$n.$r" &
                pids[r]=$!
            done
            for _ in $(seq 1200); do grep -q "^# fanout" "$tmp/out$n.0" 2>/dev/null && break; sleep 0.1; done
            sleep 4
            cut_restore 4000000 fail_a0 restore_a0 2>/dev/null
            if ! wait "${pids[0]}" || ! wait "${pids[1]}"; then
                echo "bench: the cut at $c connections failed" >&2
                tail -n 5 "$tmp/out$n.0" "$tmp/err$n.0" "$tmp/err$n.1" >&2
                break
            fi
            pids=()
            python3 scripts/fanout_cut.py "$tmp/out$n.0" "$tmp/out$n.1" "$cut_t" "$restore_t"
            "$topo" wait a0 active 30 >/dev/null || true
        done
        echo '```'
    fi
fi
