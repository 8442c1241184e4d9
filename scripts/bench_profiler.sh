#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Profiler cost (not a test).
#  1. Hot path: vigil-profbench (Google Benchmark) through the exported ncclProfiler_v6, every
#     event type on and the writer running; medians of 5 repetitions, then the recorder's
#     drop counters (they must be 0, or the figures include the cheaper drop path).
#  2. On a loop: a 2-rank ring all-reduce on loopback (vigil-netbench) at 1, 4 and 16 MiB per
#     rank, profiler off vs on (--profile net, VIGIL_PROFILE_EVENTS=all, files written),
#     alternated ROUNDS times; median bus bandwidth and CPU seconds per GiB (rank 0's process,
#     all threads) as ratios on/off, and the events the profiler recorded per all-reduce. No
#     GPU here: NCCL's kernel and proxy are replaced by the driver's loop; on a 2-core machine
#     the 2 ranks' polling threads share the cores, so the run-to-run spread is wide (the
#     events-per-collective x cost-per-event line is the steadier estimate).
# Usage: scripts/bench_profiler.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
scripts/setup.sh >/dev/null
bin=$PWD/build/test/netbench/vigil-netbench
plugin=$PWD/build/net_plugin/libnccl-net-vigil.so
bench=$PWD/build/test/bench/vigil-profbench
tmp=$(mktemp -d /tmp/vigil-pbench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

if [[ -x $bench ]]; then
    mkdir -p "$tmp/gb"
    VIGIL_PROFILE_DIR=$tmp/gb VIGIL_PROFILE_MAX_BYTES=64M "$bench" --benchmark_repetitions=5 --benchmark_min_time=0.2 \
        --benchmark_report_aggregates_only=true 2>/dev/null | grep -E '^#|_median|^Benchmark|^---'
    grep -h '"type":"stats"' "$tmp"/gb/*.jsonl | python3 -c '
import json, sys
s = json.loads(sys.stdin.read())
print("# recorder: %d events; dropped: pool %d, ring %d, threads %d (file bound: %d trace records not written)"
      % (s["events"], s["dropped_pool"], s["dropped_ring"], s["dropped_threads"], s["trace_dropped"]))'
else
    echo "# vigil-profbench not built (libbenchmark-dev missing)"
fi

one() { # BYTES on|off -> "busbw_gbps cpu_s_per_gib"
    local rdv="unix:$tmp/r.$RANDOM.sock" extra=() iters
    iters=$((256 * 1048576 / $(numfmt --from=iec "$1")))
    if [[ $2 == on ]]; then extra=(--profile net); rm -rf "$tmp/p"; mkdir -p "$tmp/p"; fi
    for r in 1 0; do
        env VIGIL_SOCKET_IFNAME==lo VIGIL_PROFILE_DIR="$tmp/p" VIGIL_PROFILE_EVENTS=all \
            "$bin" --plugin "$plugin" --rank "$r" --nranks 2 --rendezvous "$rdv" --workload allreduce \
            --bytes "$1" --iters "$iters" "${extra[@]}" >"$tmp/o.$r.json" 2>/dev/null &
    done
    wait
    python3 -c '
import json, sys
r = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert r["ok"], r
print(r["busbw_gbps"], r["cpu_s"] / (r["bytes"] / 2**30))' "$tmp/o.0.json"
    if [[ $2 == on ]]; then # events per all-reduce per rank, from the summaries
        python3 -c '
import glob, json, sys
ev = colls = 0
for f in glob.glob(sys.argv[1] + "/vigil-prof-*.jsonl"):
    for line in open(f):
        r = json.loads(line)
        if r["type"] == "stats": ev += r["events"]
        if r["type"] == "coll": colls += 1
print(ev / max(colls, 1))' "$tmp/p" >>"$tmp/events.$1"
    fi
}
declare -A bw cpu
for ((k = 0; k < ROUNDS; k++)); do
    for size in 1M 4M 16M; do
        for mode in off on; do
            r=$(one "$size" "$mode")
            bw[$size.$mode]+="${r% *} "; cpu[$size.$mode]+="${r#* } "
        done
    done
done
args=()
for size in 1M 4M 16M; do
    args+=("$size" "${bw[$size.off]}" "${bw[$size.on]}" "${cpu[$size.off]}" "${cpu[$size.on]}" "$(cat "$tmp/events.$size")")
done
python3 - "$ROUNDS" "${args[@]}" <<'PY'
import statistics, sys
rounds, a = sys.argv[1], sys.argv[2:]
print(f"# profiler on a loop: 2-rank all-reduce on loopback, median of {rounds} alternating rounds")
print(f"{'bytes/rank':>10s} {'busbw off':>10s} {'busbw on':>9s} {'ratio':>7s} {'CPU s/GiB off':>14s} {'on':>7s} {'ratio':>7s}"
      f" {'events/coll':>12s} {'coll us':>9s} {'x 100 ns':>9s}")
for i in range(0, len(a), 6):
    size = a[i]
    m = [statistics.median(map(float, x.split())) for x in a[i + 1:i + 5]]
    ev = statistics.median(map(float, a[i + 5].split()))
    nbytes = {"1M": 1 << 20, "4M": 4 << 20, "16M": 16 << 20}[size]
    coll_us = nbytes / (m[0] * 1e9) * 1e6  # 2 ranks: busbw = algbw
    share = ev * 100e-9 / (coll_us * 1e-6)
    print(f"{size:>10s} {m[0]:10.3f} {m[1]:9.3f} {m[1]/m[0]:7.3f} {m[2]:14.3f} {m[3]:7.3f} {m[3]/m[2]:7.3f}"
          f" {ev:12.1f} {coll_us:9.0f} {share:9.5f}")
print("# x 100 ns: events per all-reduce x 100 ns (a generous cost per event, from part 1) / all-reduce time")
PY
