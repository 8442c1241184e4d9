#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The demo: builds Vigil, makes a lab of 4 hosts x 2 NIC ports (network namespaces), and runs
# a validated ring all-reduce between the 4 hosts through libnccl-net-vigil.so, loaded the way
# NCCL loads it, with the library's own profiler (ncclProfiler_v6) driven as NCCL's proxy
# drives it. Shows the plugin's load banner, the result table, and `vigil report` over the
# ranks' profiler and telemetry files (slowest rank, NIC and path). Needs root.
#   SLOW_PORT=H:P   cut host H's port P to 25 % of the others (tbf) to see it named
#   LATE_RANK=R     make rank R arrive 20 ms late at every all-reduce to see it named
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
echo "== each rank's log (NCCL_DEBUG=INFO): $logs/rank<N>.log; profiler and telemetry files: $logs/files"
mkdir -p "$logs/files"
extra=(--channels 2 --slice 4M --profile net)
for h in $(seq 0 $((HOSTS - 1))); do for p in 0 1; do scripts/netlab.sh degrade "$h" "$p" 2gbit; done; done
if [[ -n ${SLOW_PORT:-} ]]; then
    scripts/netlab.sh degrade "${SLOW_PORT%%:*}" "${SLOW_PORT##*:}" 500mbit
    echo "== host ${SLOW_PORT%%:*} port ${SLOW_PORT##*:} cut to 500 Mbit/s (the others: 2 Gbit/s)"
fi
[[ -z ${LATE_RANK:-} ]] || extra+=(--delay-rank "$LATE_RANK" --delay-us 20000)
export NCCL_DEBUG=INFO VIGIL_PROFILE_DIR=$logs/files VIGIL_TELEMETRY_DIR=$logs/files
pids=()
for ((r = HOSTS - 1; r >= 1; r--)); do
    scripts/netlab.sh exec "$r" -- "$bin" --plugin "$plugin" --rank "$r" --nranks "$HOSTS" \
        --rendezvous "$rdv" --workload allreduce --bytes "$BYTES" --iters "$ITERS" "${extra[@]}" \
        >/dev/null 2>"$logs/rank$r.log" &
    pids+=($!)
done
set +e
scripts/netlab.sh exec 0 -- "$bin" --plugin "$plugin" --rank 0 --nranks "$HOSTS" \
    --rendezvous "$rdv" --workload allreduce --bytes "$BYTES" --iters "$ITERS" "${extra[@]}" 2>"$logs/rank0.log"
rc=$?
for p in "${pids[@]}"; do wait "$p" || rc=1; done
echo "== plugin banner (rank 0):"
grep -m1 "loaded" "$logs/rank0.log" || true
echo "== warnings in the ranks' logs: $(cat "$logs"/rank*.log | grep -c " WARN " || true)" \
     "($(cat "$logs"/rank*.log | grep -c "path degraded" || true) degraded-path verdicts)"
echo "== vigil report $logs/files (full output: $logs/report.txt, plots: $logs/report/*.png)"
build/tools/vigil report --out "$logs/report" "$logs/files" >"$logs/report.txt" 2>&1 || rc=1
grep -E "^(slowest|arrival|plots)" "$logs/report.txt" || true
exit $rc
