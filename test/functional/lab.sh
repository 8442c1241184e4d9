#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The driver over the network-namespace lab. "main": 4 hosts x 2 ports, ring all-reduce of
# >= 1 GiB total traffic, exact result. "version V": 2 hosts, all-reduce and multi-recv on
# the second port through ncclNetPlugin_vV. "peer-rails BIN": the peer-pattern test's
# cross-rail case (device i to device j != i) inside one host with both ports.
source "$(dirname "$0")/lib.sh"
need_root_lab

if [[ ${NETLAB:-} == "" ]]; then
    routed=()
    [[ $1 == peer-rails ]] && routed=(--routed)
    exec "$NETLAB_SH" run -H "${LAB_HOSTS:-4}" -P 2 "${routed[@]}" -- "$0" "$@"
fi

case $1 in
main)
    out=$(run_ranks 4 --workload allreduce --bytes 64M --iters 3 --check)
    expect_ok "$out"
    bytes=$(json_get "$out" bytes)
    (( bytes >= 1 << 30 )) || fail "only $bytes bytes moved; the main job needs >= 1 GiB"
    cat "$out"
    ;;
version)
    out=$(run_ranks 2 --api-version "$2" --dev 1 --workload allreduce --bytes 16M --iters 2)
    expect_ok "$out"
    out=$(run_ranks 2 --api-version "$2" --dev 1 --workload multirecv --iters 20)
    expect_ok "$out"
    ;;
peer-rails)
    rdv="unix:$TMP/peer.sock"
    pids=()
    for r in 1 0; do
        "$NETLAB_SH" exec "$r" -- env VIGIL_SOCKET_IFNAME=eth0,eth1 PEER_RANK=$r PEER_RDV="$rdv" \
            "$2" '[rails]' >"$TMP/peer.$r" 2>&1 &
        pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    ((rc == 0)) || { cat "$TMP"/peer.* >&2; fail "cross-rail patterns failed"; }
    ;;
*) fail "unknown case $1" ;;
esac
echo "lab $*: ok"
