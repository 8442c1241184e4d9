#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The package test's lab run (package.sh runs it inside its namespace, under `netlab.sh run`):
# a 2-rank all-reduce by the installed vigil-netbench with nothing in its environment but
# NCCL_NET_PLUGIN=vigil and PATH. While it runs, records the net plugin library each rank
# mapped (OUT/mapped) and waits for the installed `vigil export` to show the ranks' eth0 bytes.
#   usage: package_lab.sh OUT_DIR   (NETLAB set by netlab.sh)
set -euo pipefail
out=${1:?usage: package_lab.sh OUT_DIR}
netlab=$(dirname "$0")/../../scripts/netlab.sh
rdv=unix:$out/rdv.sock
pids=()
for r in 1 0; do
    "$netlab" exec "$r" -- env -i PATH=/usr/bin:/bin NCCL_NET_PLUGIN=vigil /usr/bin/vigil-netbench \
        --plugin vigil --rank "$r" --nranks 2 --rendezvous "$rdv" --timeout 120 \
        --workload allreduce --bytes 16M --iters 200 >"$out/rank$r.out" 2>"$out/rank$r.err" &
    pids+=($!)
done
# Our ranks only: other jobs on the machine may run vigil-netbench too.
ranks() {
    pgrep -f -- "--rendezvous $rdv" | while read -r p; do
        [[ $(cat "/proc/$p/comm" 2>/dev/null) == vigil-netbench ]] && echo "$p"
    done
}
seen=""
for _ in $(seq 600); do
    mapfile -t mine < <(ranks)
    for p in "${mine[@]}"; do
        grep -o "/[^ ]*libnccl-net-vigil.so" "/proc/$p/maps" 2>/dev/null | head -1 >>"$out/mapped" || true
    done
    if ((${#mine[@]} == 2)) && /usr/bin/vigil export --once 2>/dev/null |
        grep -qE "^vigil_port_bytes_total\{pid=\"(${mine[0]}|${mine[1]})\".*device=\"eth0\""; then
        seen=1
        break
    fi
    sleep 0.1
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[[ -n $seen ]] || { echo "FAIL: the installed vigil export never showed the ranks' bytes" >&2; exit 1; }
exit "$rc"
