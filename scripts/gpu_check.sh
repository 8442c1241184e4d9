#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Stock NCCL with Vigil's plugins on a GPU machine (not a test; needs a CUDA device and the
# build from this tree). Two processes on one GPU are made to look like two hosts
# (distinct NCCL_HOSTID) and forced onto the network plugin (NCCL_NET=vigil: a load failure
# is fatal, not a silent fallback; P2P and SHM off). It runs vigil-nccl-loop (validated
# all-reduce at 1, 16 and 128 MiB) with:
#   socket     NCCL's own Socket transport (the reference)
#   net        libnccl-net-vigil.so, profiler off (NCCL_PROFILER_PLUGIN=none)
#   prof       the same plus libnccl-profiler-vigil.so writing its files (all events)
# alternating net and prof ROUNDS times (bus bandwidth medians and the prof/net ratio: the
# profiler's overhead), then `vigil report` over the profiler's files.
# Results and logs go to OUT (default $OUT, else /tmp/vigil-gpu). Usage: scripts/gpu_check.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
OUT=${OUT:-/tmp/vigil-gpu}
mkdir -p "$OUT"
loop=$PWD/build/test/gpu/vigil-nccl-loop
net=$PWD/build/net_plugin/libnccl-net-vigil.so
prof=$PWD/build/profiler_plugin/libnccl-profiler-vigil.so
[[ -x $loop ]] || { echo "gpu_check: $loop not built (CUDA runtime or NCCL not found)" >&2; exit 1; }
export LD_LIBRARY_PATH=${NCCL_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}
export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV,PROFILE
export VIGIL_SOCKET_IFNAME==lo NCCL_SOCKET_IFNAME==lo

run() { # NAME ENV... : two ranks, rank 0's JSON lines to $OUT/NAME.<k>.jsonl
    local name=$1 id="$OUT/id.$RANDOM" r; shift
    for r in 1 0; do
        env "$@" NCCL_HOSTID="vigil-host-$r" "$loop" --rank "$r" --nranks 2 --id-file "$id" \
            --bytes 1M,16M,128M --iters 40 >"$OUT/$name.$K.rank$r.jsonl" 2>"$OUT/$name.$K.rank$r.log" &
    done
    wait
    rm -f "$id"
}
K=0
run socket NCCL_NET=Socket
for ((K = 0; K < ROUNDS; K++)); do
    run net NCCL_NET=vigil NCCL_NET_PLUGIN="$net" NCCL_PROFILER_PLUGIN=none
    rm -rf "$OUT/prof.$K"
    run prof NCCL_NET=vigil NCCL_NET_PLUGIN="$net" NCCL_PROFILER_PLUGIN="$prof" \
        VIGIL_PROFILE_DIR="$OUT/prof.$K" VIGIL_PROFILE_EVENTS=all
done
echo "== what NCCL loaded (rank 0, first prof run):"
grep -hE "NET/Vigil|PROFILER/Vigil|NET/Plugin|PROFILER/Plugin|Using network" "$OUT/prof.0.rank0.log" | head -8 || true
python3 - "$OUT" "$ROUNDS" <<'PY'
import glob, json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(name):
    res = {}
    for f in sorted(glob.glob(f"{out}/{name}.*.rank0.jsonl")):
        for line in open(f):
            r = json.loads(line)
            assert r["wrong"] == 0, (f, r)
            res.setdefault(r["bytes"], []).append(r["busbw_GBps"])
    return {b: statistics.median(v) for b, v in res.items()}
s, n, p = load("socket"), load("net"), load("prof")
print(f"# stock NCCL, 2 processes on one GPU over loopback; bus bandwidth GB/s, median of {rounds} alternating rounds")
print(f"{'bytes':>10s} {'Socket':>8s} {'vigil':>8s} {'vigil+prof':>11s} {'prof/vigil':>11s} {'vigil/Socket':>13s}")
for b in sorted(n):
    print(f"{b:>10d} {s.get(b, 0):8.3f} {n[b]:8.3f} {p.get(b, 0):11.3f} {p.get(b, 0) / n[b]:11.3f} {n[b] / max(s.get(b, 1e-9), 1e-9):13.3f}")
PY
echo "== vigil report over the profiler's files (round 0)"
build/common/vigil report --out "$OUT/report" "$OUT/prof.0" | tee "$OUT/report.txt" | grep -E "^(slowest|arrival|plots|inputs|wrote)" || true
