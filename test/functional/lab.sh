#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The driver over the network-namespace lab. "main": 4 hosts x 2 ports, ring all-reduce of
# >= 1 GiB total traffic, exact result. "version V": 2 hosts, all-reduce and multi-recv on
# the second port through ncclNetPlugin_vV. "quiet": the demo's shaped 4 x 2 all-reduce, three
# times, with no degraded-path verdict. "peer-rails BIN": the peer-pattern test's
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
quiet)
    # The demo's job (every port shaped to 2 Gbit/s, 2 channels of 4 MiB steps, the 4 ranks
    # and their progress threads on however few cores this host has) with the telemetry
    # defaults: a healthy lab, so no rank may log a degraded path. Three runs: the false
    # alarm this guards against (a busy period's last bytes lost to the detector) came in
    # about half the runs on 2 cores.
    for h in 0 1 2 3; do for p in 0 1; do "$NETLAB_SH" degrade "$h" "$p" 2gbit; done; done
    for i in 1 2 3; do
        out=$(NCCL_DEBUG=WARN run_ranks 4 --workload allreduce --bytes 64M --iters 5 --check \
              --channels 2 --slice 4M)
        expect_ok "$out"
        if grep -h "path degraded" "$out".err.*; then
            fail "run $i: a healthy path was logged degraded"
        fi
    done
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
