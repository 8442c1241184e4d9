#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The demo: builds Vigil, makes a lab of 4 hosts x 2 NIC ports (network namespaces), and runs
# a validated ring all-reduce between the 4 hosts through libnccl-net-vigil.so, loaded the way
# NCCL loads it. Shows the plugin's load banner and the result table. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
HOSTS=${HOSTS:-4}
BYTES=${BYTES:-64M}
ITERS=${ITERS:-5}

if [[ -z ${NETLAB:-} ]]; then
    exec scripts/netlab.sh run -H "$HOSTS" -P 2 -- "$0" "$@"
fi

bin=$PWD/build/test/netbench/vigil-netbench
plugin=$PWD/build/net_plugin/libnccl-net-vigil.so
rdv=unix:$(mktemp -u /tmp/vigil-demo.XXXXXX.sock)
logs=$(mktemp -d /tmp/vigil-demo-logs.XXXXXX)
echo "== lab $NETLAB: $HOSTS hosts x 2 ports; all-reduce of $BYTES per rank, $ITERS iterations"
echo "== each rank's log (NCCL_DEBUG=INFO): $logs/rank<N>.log"
pids=()
for ((r = HOSTS - 1; r >= 1; r--)); do
    NCCL_DEBUG=INFO scripts/netlab.sh exec "$r" -- "$bin" --plugin "$plugin" --rank "$r" --nranks "$HOSTS" \
        --rendezvous "$rdv" --workload allreduce --bytes "$BYTES" --iters "$ITERS" >/dev/null 2>"$logs/rank$r.log" &
    pids+=($!)
done
NCCL_DEBUG=INFO scripts/netlab.sh exec 0 -- "$bin" --plugin "$plugin" --rank 0 --nranks "$HOSTS" \
    --rendezvous "$rdv" --workload allreduce --bytes "$BYTES" --iters "$ITERS" 2>"$logs/rank0.log"
rc=$?
for p in "${pids[@]}"; do wait "$p" || rc=1; done
echo "== plugin banner (rank 0):"
grep -m1 "loaded" "$logs/rank0.log" || true
echo "== warnings in the ranks' logs: $(cat "$logs"/rank*.log | grep -c " WARN " || true)" \
     "($(cat "$logs"/rank*.log | grep -c "path degraded" || true) degraded-path verdicts: the $HOSTS ranks and their" \
     "progress threads share $(nproc) CPU cores here, so paths slow down while ranks compute)"
exit $rc
