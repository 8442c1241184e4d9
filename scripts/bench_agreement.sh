#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The agreed health view at scale: N ranks of one communicator (build/test/bench/
# vigil-agreebench) against a real redis-server this script starts (and ends by PID), at
# each N: store commands per second per rank and store CPU in steady state (no health
# change) and after one, the ranks' own CPU, getCollInfo p50/p99 per rank, and the agreement
# latency (rank 0's NIC turns degraded -> the first block whose register carries it, in
# blocks and ms). Then projects 8,192 and 65,536 ranks from the measured growth.
#
#   scripts/bench_agreement.sh                       # this build, N = 16 64 256 1024
#   RANKS="16 64" scripts/bench_agreement.sh         # other N
#   BASE_REV=<rev> scripts/bench_agreement.sh        # also that revision, side by side
#
# Ranks per process (a process is a simulated host, with its own hostname and /dev/shm when
# run as root): 1 up to 64 ranks, 4 at 256, 8 from 1,024 on (PER_PROC overrides). Each rank
# asks getCollInfo RATE (200) times a second, VIGIL_TUNER_BLOCK BLOCK (128): about 1.6
# blocks a second. Phases: join, STEADY_S (20) s steady, CHANGE_S (10) s after the change.
# A run that does not join within JOIN_S (120) s is reported as such.
# Not a test: on the shared 2-core development machine the figures move with the load.
set -euo pipefail
cd "$(dirname "$0")/.."

RANKS=${RANKS:-"16 64 256 1024"}
RATE=${RATE:-200}
BLOCK=${BLOCK:-128}
STEADY_S=${STEADY_S:-20}
CHANGE_S=${CHANGE_S:-10}
JOIN_S=${JOIN_S:-120}
BIN=${BIN:-build/test/bench/vigil-agreebench}
OUT=${OUT:-/tmp/vigil-bench-agreement.jsonl}

[[ -x $BIN ]] || { echo "bench_agreement: no $BIN (build first)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "bench_agreement: redis-server not installed (scripts/setup.sh)" >&2; exit 1; }

BASE_BIN=""
if [[ -n ${BASE_REV:-} ]]; then
    # The baseline's own driver, built once from `git archive` into a cache outside the checkout.
    cache=${VIGIL_BENCH_CACHE:-/var/tmp/vigil-bench-base}/agree-$(git rev-parse --short "$BASE_REV")
    BASE_BIN=$cache/build/test/bench/vigil-agreebench
    if [[ ! -x $BASE_BIN ]]; then
        echo "# building the baseline $BASE_REV in $cache" >&2
        rm -rf "$cache" && mkdir -p "$cache/src"
        git archive "$BASE_REV" | tar -x -C "$cache/src"
        meson setup "$cache/build" "$cache/src" >/dev/null
        nice -n 10 ninja -C "$cache/build" -j2 test/bench/vigil-agreebench >/dev/null
    fi
fi

ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
REDIS_PID=""
REDIS_DIR=$(mktemp -d /tmp/vigil-bench-redis.XXXXXX)
stop_redis() {
    if [[ -n $REDIS_PID ]]; then kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; fi
    REDIS_PID=""
}
trap 'stop_redis; rm -rf "$REDIS_DIR"' EXIT
start_redis() {
    PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --protected-mode yes \
        --maxclients 20000 --dir "$REDIS_DIR" --maxmemory-policy noeviction >"$REDIS_DIR/log" 2>&1 &
    REDIS_PID=$!
    for _ in $(seq 100); do
        redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG && return 0
        sleep 0.05
    done
    echo "bench_agreement: redis-server did not answer" >&2
    exit 1
}

per_proc() { if [[ -n ${PER_PROC:-} ]]; then echo "$PER_PROC"; elif (($1 <= 64)); then echo 1; elif (($1 < 1024)); then echo 4; else echo 8; fi; }

one() { # one BIN N LABEL: prints a JSON line with "build" added
    local bin=$1 n=$2 label=$3 k procs line
    k=$(per_proc "$n")
    procs=$(((n + k - 1) / k))
    start_redis
    line=$(timeout $((JOIN_S + STEADY_S + CHANGE_S + 120)) "$bin" --redis "127.0.0.1:$PORT" --ranks "$n" \
        --procs "$procs" --rate "$RATE" --block "$BLOCK" --join-s "$JOIN_S" --steady-s "$STEADY_S" \
        --change-s "$CHANGE_S" 2>>"$REDIS_DIR/driver.log" | tail -1) || true
    stop_redis
    [[ $line == \{* ]] || line="{\"ranks\":$n,\"procs\":$procs,\"joined\":false,\"failed\":\"no result (timeout or crash)\"}"
    echo "${line%\}},\"build\":\"$label\"}" | tee -a "$OUT"
}

: >"$OUT"
echo "# vigil agreement at scale: rate $RATE calls/s per rank, block $BLOCK, ${STEADY_S}s steady + ${CHANGE_S}s after a change; load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores" >&2
for n in $RANKS; do
    [[ -n $BASE_BIN ]] && one "$BASE_BIN" "$n" "base" >/dev/null
    one "$BIN" "$n" "this" >/dev/null
done

python3 - "$OUT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def g(r, k, fmt="{:.2f}"):
    v = r.get(k)
    return "-" if v is None or v == -1 else fmt.format(v)
print("| build | ranks (procs) | joined | store cmds/s/rank steady | after change | EVAL+GET /s/rank | store CPU % | rank CPU % per rank | agreement latency blocks (rank 0, max) | ms (median, max) | getCollInfo p50 / p99 median / worst p99 (µs) | waits | agree |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    if not r.get("joined"):
        print(f"| {r['build']} | {r['ranks']} ({r.get('procs','-')}) | no (join {g(r,'join_s','{:.0f}')} s) | | | | | | | | | | |")
        continue
    print(f"| {r['build']} | {r['ranks']} ({r['procs']}) | {r['join_s']:.1f} s | {g(r,'steady_cmds_per_rank_s')} | "
          f"{g(r,'change_cmds_per_rank_s')} | {r['steady_evals_per_rank_s']+r['steady_gets_per_rank_s']:.2f} | "
          f"{g(r,'steady_store_cpu_pct','{:.1f}')} | {g(r,'steady_rank_cpu_pct','{:.2f}')} | "
          f"{g(r,'victim_latency_blocks','{:.0f}')}, {g(r,'latency_blocks_max','{:.0f}')} | "
          f"{g(r,'latency_ms_median','{:.0f}')}, {g(r,'latency_ms_max','{:.0f}')} | "
          f"{r['p50_ns_median']/1e3:.2f} / {r['p99_ns_median']/1e3:.2f} / {r['p99_ns_worst']/1e3:.1f} | "
          f"{r['waits']:.0f} | {'yes' if r['agree'] else 'NO'} |")
# Projection: per build, the largest N that joined gives the store's CPU per command; the
# commands per rank are taken as the growth from the smallest to the largest N measured
# extrapolated linearly in log2(N) (flat growth stays flat).
import math
for build in sorted({r["build"] for r in rows}):
    ok = [r for r in rows if r["build"] == build and r.get("joined") and r.get("stats_ok")]
    if len(ok) < 2:
        continue
    lo, hi = ok[0], ok[-1]
    per_cmd = (hi["steady_store_cpu_pct"] / 100) / max(hi["steady_cmds_per_rank_s"] * hi["ranks"], 1e-9)
    slope = (hi["steady_cmds_per_rank_s"] - lo["steady_cmds_per_rank_s"]) / max(math.log2(hi["ranks"] / lo["ranks"]), 1e-9)
    for n in (8192, 65536):
        c = max(hi["steady_cmds_per_rank_s"] + slope * math.log2(n / hi["ranks"]), hi["steady_cmds_per_rank_s"] if slope < 0 else 0)
        print(f"projected ({build}): {n} ranks: {c:.2f} store cmds/s/rank, {c*n:.0f} cmds/s, one Redis core "
              f"{100*c*n*per_cmd:.1f} % busy (CPU per command {per_cmd*1e6:.2f} µs measured at {hi['ranks']} ranks; "
              f"per-rank growth {slope:+.3f} cmds/s per doubling from {lo['ranks']} to {hi['ranks']})")
EOF
echo "# JSON lines: $OUT" >&2
