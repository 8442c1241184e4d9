#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The driver over the network-namespace lab. "main": 4 hosts x 2 ports, ring all-reduce of
# >= 1 GiB total traffic, exact result. "version V": 2 hosts, all-reduce and multi-recv on
# the second port through ncclNetPlugin_vV. "quiet": the demo's shaped 4 x 2 all-reduce, three
# times, with no degraded-path verdict. "peer-rails BIN": the peer-pattern test's
# cross-rail case (device i to device j != i) inside one host with both ports. "idle-pairs":
# 2 hosts, 256 connections open and idle: the packets host 0 sends meanwhile (probes and
# heartbeats go once per port pair, not per connection).
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
    # alarms this guards against came in a quarter to half the runs on 2 cores (a busy
    # period's last bytes lost to the detector; under multipath, a path judged on its own
    # bytes while another connection's path shared its port).
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
idle-pairs)
    # 256 connections host 0 -> host 1 (each with its backup: 512 paths over 2 port pairs),
    # 3 rounds of traffic, then 6 s with nothing posted. Probing per path would send 512
    # probes every 100 ms (5,120 a second) from host 0 alone; per port pair it is 2 probes
    # and 2 heartbeats a second's tenth apart, a few dozen packets a second with their acks.
    # Bound: one packet per connection per second, 4 x above the per-pair cost and 10 x below
    # the per-path one.
    n=256 rdv="unix:$TMP/idle.sock" pids=()
    for r in 1 0; do
        "$NETLAB_SH" exec "$r" -- "$NETBENCH_BIN" --plugin "$NETBENCH_PLUGIN" --rank "$r" --nranks 2 \
            --rendezvous "$rdv" --timeout 240 --workload fanout --channels "$n" --iters 3 --idle 6 \
            >"$TMP/idle.out$r" 2>"$TMP/idle.err$r" &
        pids+=($!)
    done
    tx() { # packets host 0 has sent on eth0 and eth1
        "$NETLAB_SH" exec 0 -- cat /proc/net/dev | awk '$1 ~ /^eth[01]:/ { n += $11 } END { print n + 0 }'
    }
    for _ in $(seq 1200); do grep -q "^# fanout: idle" "$TMP/idle.out0" 2>/dev/null && break; sleep 0.1; done
    grep -q "^# fanout: idle" "$TMP/idle.out0" || { cat "$TMP"/idle.* >&2; fail "the fanout never went idle"; }
    sleep 1 # the last round's acks settle
    t0=$(date +%s%N) a=$(tx)
    sleep 4
    b=$(tx) ms=$((($(date +%s%N) - t0) / 1000000))
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    ((rc == 0)) || { cat "$TMP"/idle.* >&2; fail "a rank failed"; }
    grep -q '"errors":0' "$TMP/idle.out0" || { cat "$TMP/idle.out0" >&2; fail "the fanout saw errors"; }
    echo "host 0 sent $((b - a)) packets in $ms ms with $n idle connections (bound $((n * ms / 1000)))"
    (((b - a) * 1000 < n * ms)) || fail "idle connections cost more than a packet per connection per second"
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
