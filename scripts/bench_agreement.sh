#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The agreed health view at scale: N ranks of one communicator (build/test/bench/
# vigil-agreebench) against a real redis-server the driver starts (and ends by PID), at
# each N: store commands per second per rank and store CPU in steady state (no health
# change) and after one, the ranks' own CPU, getCollInfo p50/p99 per rank, the agreement
# latency (rank 0's NIC turns degraded -> the first block whose register carries it, in
# blocks and ms) and whether every rank used the same view for every block. Then, at
# FAULT_RANKS, the store restarted empty, the last rank stalled, and the process of the
# last rank killed: the longest call, how far the others went on, the WARN lines. Last, it
# projects 8,192 and 65,536 ranks from the measured growth.
#
#   scripts/bench_agreement.sh                       # this build, N = 16 64 256 1024
#   RANKS="16 64" FAULTS= scripts/bench_agreement.sh # other N, no fault runs
#   BASE_REV=<rev> scripts/bench_agreement.sh        # also that revision, side by side: its
#                                                    # tuner and common/, this driver
#   BASE_REV=<rev> BIN=none scripts/bench_agreement.sh   # that revision alone
#
# Layout: RANKS_PER_HOST (8) ranks a simulated host (its own hostname and /dev/shm when run
# as root), every rank its own process below 1,024 ranks and MEMBERS_PER_PROC ranks a process
# from there on (8: one process a host, each rank still its own tuner with its own thread and
# store connection; 1,024 processes of one rank each leave a 2-core machine no time to call). Each rank asks getCollInfo RATE (200) times a second,
# VIGIL_TUNER_BLOCK BLOCK (128): about 1.6 blocks a second; its process wakes every TICK_MS
# (5 ms, 20 ms from 256 ranks on: 4 calls a wake). Phases: join, STEADY_S (20) s steady,
# CHANGE_S (10) s after the change.
# A run that does not join within JOIN_S (120) s is reported as such. Faults: FAULTS
# ("restart stall die") at FAULT_RANKS (1024), FAULT_S (20) s each.
# Not a test: on the shared 2-core development machine the figures move with the load.
set -euo pipefail
cd "$(dirname "$0")/.."

RANKS=${RANKS:-"16 64 256 1024"}
RATE=${RATE:-200}
BLOCK=${BLOCK:-128}
STEADY_S=${STEADY_S:-20}
CHANGE_S=${CHANGE_S:-10}
JOIN_S=${JOIN_S:-120}
FAULTS=${FAULTS-"restart stall die"}
FAULT_RANKS=${FAULT_RANKS:-1024}
FAULT_S=${FAULT_S:-20}
BIN=${BIN:-build/test/bench/vigil-agreebench}
OUT=${OUT:-/tmp/vigil-bench-agreement.jsonl}

[[ $BIN == none || -x $BIN ]] || { echo "bench_agreement: no $BIN (build first)" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "bench_agreement: redis-server not installed (scripts/setup.sh)" >&2; exit 1; }

BASE_BIN=""
if [[ -n ${BASE_REV:-} ]]; then
    # The baseline's tuner with this driver, built from `git archive` into a cache outside
    # the checkout (rebuilt when the driver changes).
    drv=(test/bench/bench_agreement.cc test/bench/meson.build test/tuner/agree_lib.cc test/tuner/agree_lib.h)
    cache=${VIGIL_BENCH_CACHE:-/var/tmp/vigil-bench-base}/agree-$(git rev-parse --short "$BASE_REV")-$(cat "${drv[@]}" | md5sum | cut -c1-8)
    BASE_BIN=$cache/build/test/bench/vigil-agreebench
    if [[ ! -x $BASE_BIN ]]; then
        echo "# building the baseline $BASE_REV in $cache" >&2
        rm -rf "$cache" && mkdir -p "$cache/src"
        git archive "$BASE_REV" | tar -x -C "$cache/src"
        for f in "${drv[@]}"; do cp "$f" "$cache/src/$f"; done
        meson setup "$cache/build" "$cache/src" >/dev/null
        nice -n 10 ninja -C "$cache/build" -j2 test/bench/vigil-agreebench >/dev/null
    fi
fi

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
LOGS=$(mktemp -d /tmp/vigil-bench-agreement.XXXXXX)

RANKS_PER_HOST=${RANKS_PER_HOST:-8}
per_proc() { if [[ -n ${MEMBERS_PER_PROC:-} ]]; then echo "$MEMBERS_PER_PROC"; elif (($1 < 1024)); then echo 1; else echo 8; fi; }
tick_ms() { if [[ -n ${TICK_MS:-} ]]; then echo "$TICK_MS"; elif (($1 < 256)); then echo 5; else echo 20; fi; }

one() { # one BIN N LABEL [FAULT]: prints the driver's JSON line with "build" and "warns" added
    local bin=$1 n=$2 label=$3 fault=${4:-none} k procs hosts line log warns
    k=$(per_proc "$n")
    procs=$(((n + k - 1) / k))
    hosts=$(((n + RANKS_PER_HOST - 1) / RANKS_PER_HOST))
    ((hosts <= procs)) || hosts=$procs
    log=$LOGS/$label-$n-$fault.log
    line=$(NCCL_DEBUG=WARN timeout $((JOIN_S + STEADY_S + CHANGE_S + FAULT_S + 120)) "$bin" --ranks "$n" \
        --procs "$procs" --hosts "$hosts" --tick-ms "$(tick_ms "$n")" --rate "$RATE" --block "$BLOCK" --join-s "$JOIN_S" --steady-s "$STEADY_S" \
        --change-s "$CHANGE_S" --fault "$fault" --fault-s "$FAULT_S" 2>"$log" | tail -1) || true
    warns=$(grep -c WARN "$log" || true)
    [[ $line == \{* ]] || line="{\"ranks\":$n,\"procs\":$procs,\"joined\":false,\"fault\":\"$fault\",\"failed\":\"no result (timeout or crash)\"}"
    echo "${line%\}},\"build\":\"$label\",\"warns\":$warns}" | tee -a "$OUT"
}

: >"$OUT"
echo "# vigil agreement at scale: rate $RATE calls/s per rank, block $BLOCK, ${STEADY_S}s steady + ${CHANGE_S}s after a change; load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores" >&2
for n in $RANKS; do
    [[ -n $BASE_BIN ]] && one "$BASE_BIN" "$n" "base" >/dev/null
    [[ $BIN == none ]] || one "$BIN" "$n" "this" >/dev/null
done
for f in $FAULTS; do
    [[ -n $BASE_BIN ]] && one "$BASE_BIN" "$FAULT_RANKS" "base" "$f" >/dev/null
    [[ $BIN == none ]] || one "$BIN" "$FAULT_RANKS" "this" "$f" >/dev/null
done

python3 - "$OUT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def g(r, k, fmt="{:.2f}"):
    v = r.get(k)
    return "-" if v is None or v == -1 else fmt.format(v)
print("| build | ranks (hosts, processes) | joined | store cmds/s/rank steady | after change | EVAL+GET /s/rank | store CPU % | rank CPU % per rank | agreement latency blocks (rank 0, max) | ms (median, max) | getCollInfo p50 / p99 median / worst p99 (µs) | waits | agree |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
normal = [r for r in rows if r.get("fault", "none") == "none"]
faults = [r for r in rows if r.get("fault", "none") != "none"]
for r in normal:
    if not r.get("joined"):
        print(f"| {r['build']} | {r['ranks']} ({r.get('hosts','-')}, {r.get('procs','-')}) | no (join {g(r,'join_s','{:.0f}')} s) | | | | | | | | | | |")
        continue
    print(f"| {r['build']} | {r['ranks']} ({r['hosts']}, {r['procs']}) | {r['join_s']:.1f} s | {g(r,'steady_cmds_per_rank_s')} | "
          f"{g(r,'change_cmds_per_rank_s')} | {r['steady_evals_per_rank_s']+r['steady_gets_per_rank_s']:.2f} | "
          f"{g(r,'steady_store_cpu_pct','{:.1f}')} | {g(r,'steady_rank_cpu_pct','{:.2f}')} | "
          f"{g(r,'victim_latency_blocks','{:.0f}')}, {g(r,'latency_blocks_max','{:.0f}')} | "
          f"{g(r,'latency_ms_median','{:.0f}')}, {g(r,'latency_ms_max','{:.0f}')} | "
          f"{r['p50_ns_median']/1e3:.2f} / {r['p99_ns_median']/1e3:.2f} / {r['p99_ns_worst']/1e3:.1f} | "
          f"{r['waits']:.0f} | {'yes' if r['agree'] and r['disagreeing_blocks'] == 0 else 'NO'} |")
if faults:
    print()
    print("| build | fault | ranks (hosts, processes) | longest call of a rank that went on (ms) | blocks every rank that went on passed after it | store cmds/s/rank during | every block's view equal on every rank | WARN lines (all ranks) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in faults:
        if not r.get("joined"):
            print(f"| {r['build']} | {r['fault']} | {r['ranks']} ({r.get('hosts','-')}, {r.get('procs','-')}) | did not join | | | | {r.get('warns','-')} |")
            continue
        print(f"| {r['build']} | {r['fault']} | {r['ranks']} ({r['hosts']}, {r['procs']}) | {r['fault_max_call_ms']:.1f} | "
              f"{r['fault_blocks_went_on_min']} | {g(r,'fault_cmds_per_rank_s')} | "
              f"{'yes' if r['disagreeing_blocks'] == 0 else 'NO'} ({r['views_compared']} views) | {r['warns']} |")
# Projection: per build, the largest N that joined gives the store's CPU per command; the
# commands per rank are taken as the growth from the smallest to the largest N measured
# extrapolated linearly in log2(N) (flat growth stays flat).
import math
for build in sorted({r["build"] for r in rows}):
    ok = [r for r in normal if r["build"] == build and r.get("joined") and r.get("stats_ok")]
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
echo "# JSON lines: $OUT; the driver's logs: $LOGS" >&2
