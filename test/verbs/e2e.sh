#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The net plugin over the verbs fabric, end to end, in the RDMA lab's guest: vigil-netbench
# loads libnccl-net-vigil.so as NCCL does, rank 0 on "host A" (rxe_a0, rxe_a1), rank 1 on
# "host B" (rxe_b0, rxe_b1), validated workloads, real port faults (scripts/rxe/topo.sh).
# Every fault case checks its fault fired (the plugin's WARN/INFO lines) and the data exact.
#   api V          ncclNet vV (8..12): latency, bandwidth, all-reduce, multi-recv, exact
#   local-down     rank 0's primary port down mid-run: failover, exact; back up: failback
#   local-down-small  the same under a stream of 32 KiB messages, each one RDMA write with
#                  immediate (ShortImm), repeated (at most 10 faults) until a failover
#                  replays some: the replay is of short messages
#   local-down-small-qps2  the same with VIGIL_IB_QPS_PER_CONN=2: messages round-robin over
#                  two RC QPs per path, the replay too
#   remote-down    the peer's end of that path down (host B's port): the same
#   flap           rank 0's primary port down/up 5 times, a failback after each
#   backup-too     primary down, then the backup too, then the primary back within the fatal
#                  timeout: the connection resumes on the rebuilt primary, exact
#   both-down      both ports down for good: both ranks fail with ncclRemoteError (bounded)
#   peer-killed    rank 1 SIGKILLed: rank 0 fails with an error within the bound, no hang
#   counters       3 % packet loss on rank 0's primary port: its hardware counters, in the
#                  telemetry registry (`vigil dump`), count retransmissions; the run is exact
#   degraded       every port shaped to 1 Mbit/s (the port, not the emulated CPU, sets the
#                  pace), rank 0 streaming to rank 1, then rank 0's primary cut to a quarter:
#                  `vigil dump` flags rank 0's send primary path on rxe_a0:1, no other path
#   striped        multipath: every port shaped to 8 Mbit/s, rank 0's primary to 2 Mbit/s; over
#                  a span of 4 s both paths carry rank 0's bytes and together beat the slow
#                  port by half again (`vigil dump`);
#                  the active port fails mid-stream and heals (failback, the backup shares
#                  again), then the shared port fails and heals; the all-reduce stays exact
# Exit 77 outside the lab (no root, no VIGIL_RXE_TOPO, or no rxe_a0..b1 devices).
set -euo pipefail
CASE=${1:?case}
TOPO=${VIGIL_RXE_TOPO:-}
skip() { echo "SKIP: $*" >&2; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root"
[[ -n $TOPO && -x $TOPO ]] || skip "VIGIL_RXE_TOPO does not name the lab's topo.sh (run scripts/rxe/run-suite.sh)"
for d in rxe_a0 rxe_a1 rxe_b0 rxe_b1; do
    [[ -e /sys/class/infiniband/$d ]] || skip "no $d here (run scripts/rxe/run-suite.sh)"
done
: "${NETBENCH_BIN:?}" "${NETBENCH_PLUGIN:?}"
TMP=$(mktemp -d /tmp/vigil-verbs-e2e.XXXXXX)
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for p in a0 a1 b0 b1; do "$TOPO" unshape "$p"; "$TOPO" port "$p" up; done
    rm -rf "$TMP"
}
trap cleanup EXIT
# ON_FAIL: a command fail() runs first (a case's own diagnosis: what the registry says).
ON_FAIL=
fail() {
    echo "FAIL: $*" >&2
    [[ -n $ON_FAIL ]] && $ON_FAIL
    local f
    for f in "$TMP"/run*; do [[ -f $f ]] && { echo "--- $f" >&2; tail -n 25 "$f" >&2; }; done
    exit 1
}

export NCCL_DEBUG=INFO VIGIL_FABRIC=verbs
# rxe treats 7 retries as infinite; 14 -> 67 ms per try: a dead peer shows within a second.
export VIGIL_IB_RETRY_CNT=5 VIGIL_IB_TIMEOUT=14
export VIGIL_FAILBACK_HOLD_MS=${VIGIL_FAILBACK_HOLD_MS:-300}
export VIGIL_FATAL_TIMEOUT_MS=${VIGIL_FATAL_TIMEOUT_MS:-20000}
HCA=("=rxe_a0,rxe_a1" "=rxe_b0,rxe_b1")

# start ARGS...: both ranks in the background (rank 1 first); OUT names this run's files.
RUN=0
start() {
    RUN=$((RUN + 1))
    OUT=$TMP/run$RUN
    local r
    PIDS=()
    for r in 1 0; do
        VIGIL_IB_HCA=${HCA[r]} "$NETBENCH_BIN" --plugin "$NETBENCH_PLUGIN" --rank "$r" --nranks 2 \
            --rendezvous "unix:$TMP/rdv.$RUN" --timeout 600 "$@" >"$OUT.out$r" 2>"$OUT.err$r" &
        PIDS[r]=$!
    done
}
json() { python3 -c 'import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])[sys.argv[2]])' "$1" "$2"; }
finish_ok() {
    local r rc=0 deadline=$((SECONDS + 300))
    # Bounded (well inside meson's 600 s): a rank that never exits (a hang, or the guest
    # kernel stuck under it) fails here with the runs' logs, not as a silent timeout.
    for r in 0 1; do
        while kill -0 "${PIDS[r]}" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        kill -0 "${PIDS[r]}" 2>/dev/null && fail "rank $r did not exit within 300 s"
        wait "${PIDS[r]}" || { echo "rank $r exited $?" >&2; rc=1; }
    done
    PIDS=()
    ((rc == 0)) || fail "a rank failed"
    # Rank 0 prints the summary; a rank exits 0 only when it saw no error.
    [[ $(json "$OUT.out0" ok) == True && $(json "$OUT.out0" errors) == 0 ]] || fail "the run is not ok"
}
# stop_ok: ends a --loop run (a stop vote, every rank stops after the same iteration) and
# checks both ranks' summaries: ok, no error, every result exact.
stop_ok() {
    kill -USR1 "${PIDS[0]}"
    finish_ok
    (($(json "$OUT.out0" bytes) > 0)) || fail "nothing moved"
}
# count PATTERN [RANK]: lines matching PATTERN in the rank's log (both ranks' by default).
count() {
    local files=("$OUT".err${2:-[01]})
    cat "${files[@]}" 2>/dev/null | grep -c -- "$1" || true
}
# wait_count PATTERN N SECONDS [RANK]: until the ranks (or RANK) logged PATTERN N times.
wait_count() {
    local deadline=$((SECONDS + $3))
    until (($(count "$1" "${4:-*}") >= $2)); do
        ((SECONDS < deadline)) || fail "saw \"$1\" fewer than $2 times in $3 s"
        sleep 0.1
    done
}
# wait_for PATTERN SECONDS [RANK]: until a rank logged PATTERN.
wait_for() { wait_count "$1" 1 "$2" "${3:-*}"; }
port() { "$TOPO" port "$1" "$2"; [[ $2 == up ]] && "$TOPO" wait "$1" active 20; return 0; }

case $CASE in
api)
    v=${2:?version}
    # Small: every version runs every workload, and the emulated link is slow.
    for w in "latency --bytes 8 --iters 50" "bandwidth --min-bytes 4K --max-bytes 256K --factor 8 --iters 4" \
        "allreduce --bytes 1M --iters 2" "multirecv --iters 6"; do
        # shellcheck disable=SC2086
        start --api-version "$v" --check --workload $w
        finish_ok
        [[ $(json "$OUT.out0" api_version) == "$v" ]] || fail "ran ncclNet v$(json "$OUT.out0" api_version), not v$v"
        grep -q "fabric verbs" "$OUT.err0" || fail "the plugin did not use the verbs fabric"
        echo "v$v ${w%% *}: ok, $(json "$OUT.out0" bytes) bytes"
    done
    ;;
local-down | remote-down | local-down-small | local-down-small-qps2)
    # The small cases stream 32 KiB slices, eight in flight, and are about short messages
    # in the replay: a failover that finds none un-acknowledged (the emulated CPU leaves the
    # link idle about half the time) proves nothing there, so the port fails again, after the
    # failback, until one replays messages (at most 10 times).
    [[ $CASE == remote-down ]] && p=b0 || p=a0
    args=(--bytes 1M) tries=1
    [[ $CASE == local-down-small* ]] && args=(--bytes 1M --slice 32K) tries=10
    [[ $CASE == *-qps2 ]] && export VIGIL_IB_QPS_PER_CONN=2
    start --workload allreduce "${args[@]}" --loop
    wait_for "accepted primary" 60 0
    sleep 2
    for ((i = 1; i <= tries; i++)); do
        port "$p" down
        wait_count "failover: primary dev rxe_a0:1" "$i" 30 0
        sleep 0.5
        port "$p" up
        wait_count "failback to primary dev rxe_a0:1" "$i" 60 0
        grep "failover: primary dev rxe_a0:1" "$OUT.err0" | grep -q "replaying [1-9]" && break
        sleep 0.$((RANDOM % 10))
    done
    sleep 1
    stop_ok
    failovers=$(grep "failover: primary dev rxe_a0:1" "$OUT.err0")
    grep -o "generation [0-9]*, replaying [0-9]* messages" <<<"$failovers"
    line=$(grep -m1 "replaying [1-9]" <<<"$failovers" || true)
    ((tries == 1)) || [[ -n $line ]] || fail "none of $tries failovers replayed a message"
    [[ -n $line ]] || line=$(head -1 <<<"$failovers")
    grep "first replayed message acknowledged" "$OUT.err0" | head -1 || true
    if [[ $CASE == *-qps2 ]]; then
        # The failover names each path's QPs: two per path on both sides.
        [[ $line =~ \(qp\ 0x[0-9a-f]+,0x[0-9a-f]+\ -\>\ 0x[0-9a-f]+,0x[0-9a-f]+\) ]] ||
            fail "the failed path did not have 2 QPs (VIGIL_IB_QPS_PER_CONN=2)"
    fi
    ;;
flap)
    start --workload allreduce --bytes 1M --loop
    wait_for "accepted primary" 60 0
    sleep 2
    for i in 1 2 3 4 5; do
        port a0 down
        wait_count "failover: primary dev rxe_a0:1" "$i" 30 0
        port a0 up
        wait_count "failback to primary dev rxe_a0:1" "$i" 60 0
    done
    stop_ok
    echo "rank 0: $(count "failover: primary" 0) failovers, $(count "failback to primary" 0) failbacks"
    ;;
backup-too)
    start --workload allreduce --bytes 1M --loop
    wait_for "accepted primary" 60 0
    sleep 2
    port a0 down
    wait_for "failover: primary dev rxe_a0:1" 30 0
    sleep 1
    port a1 down
    wait_for "no path left" 30 0
    sleep 1
    port a0 up # within VIGIL_FATAL_TIMEOUT_MS: the rebuilt primary takes the connection
    wait_for "connection resumed on primary dev rxe_a0:1" 60 0
    port a1 up
    sleep 3
    stop_ok
    ;;
both-down)
    export VIGIL_FATAL_TIMEOUT_MS=4000
    start --workload allreduce --bytes 1M --loop
    wait_for "accepted primary" 60 0
    sleep 2
    port a0 down
    port a1 down
    t0=$SECONDS
    rc=0; for r in 0 1; do wait "${PIDS[r]}" && rc=1; done
    PIDS=()
    took=$((SECONDS - t0))
    echo "both ports down: both ranks failed after ${took}s (VIGIL_FATAL_TIMEOUT_MS=$VIGIL_FATAL_TIMEOUT_MS)"
    ((rc == 0)) || fail "a rank finished ok with no path left"
    ((took <= 4 + 20)) || fail "the error came after ${took}s"
    (($(count "no path") >= 1)) || fail "no 'no path' WARN"
    grep -q "ncclResult 6" "$OUT".out* "$OUT".err* || fail "no ncclRemoteError reached the caller"
    ;;
peer-killed)
    export VIGIL_FATAL_TIMEOUT_MS=4000
    start --workload allreduce --bytes 1M --loop
    wait_for "accepted primary" 60 0
    sleep 2
    kill -KILL "${PIDS[1]}"
    wait "${PIDS[1]}" || true
    t0=$SECONDS
    if wait "${PIDS[0]}"; then fail "rank 0 finished ok although its peer died"; fi
    PIDS=()
    took=$((SECONDS - t0))
    echo "peer killed: rank 0 failed after ${took}s"
    ((took <= 4 + 20)) || fail "the error came after ${took}s"
    ;;
degraded)
    # Slow ports and long windows: the emulated CPU must never set the pace, and each
    # judged span (6 x 500 ms) must hold several completions of whole RDMA messages.
    export VIGIL_WINDOW_US=500000 VIGIL_DEGRADE_WINDOWS=6 VIGIL_DEGRADE_PCT=50
    # Deep tbf queues that never drop (rxe 6.1 answers some retransmissions of a multi-packet
    # write with an invalid-request NAK, which Vigil must treat as fatal), and a QP timeout
    # (8.6 s per try) longer than the queueing delay of what is in flight.
    export VIGIL_IB_TIMEOUT=21
    : "${VIGIL_BIN:?}"
    for p in a0 a1 b0 b1; do "$TOPO" shape "$p" 1mbit 10s; done
    # One direction (rank 0 -> rank 1), as long as the case needs; stopped by signal.
    start --workload bandwidth --bytes 16K --window 8 --iters 20000 --check
    wait_for "accepted primary" 60 0
    pid0=${PIDS[0]} pid1=${PIDS[1]}
    sleep 20
    flagged() {
        "$VIGIL_BIN" dump --windows 0 | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    if r["type"] == "path" and r["degraded"] and r["state"] != "unused" and r["pid"] in (int(sys.argv[1]), int(sys.argv[2])):
        print(r["pid"], r["kind"], r["slot"], r["device"])' "$pid0" "$pid1"
    }
    before=$(flagged)
    [[ -z $before ]] || fail "flagged before any degradation: $before"
    (($(count "path degraded") == 0)) || fail "a degraded WARN before any degradation"
    "$TOPO" shape a0 250kbit 10s
    deadline=$((SECONDS + 60))
    until [[ -n $(flagged) ]]; do
        ((SECONDS < deadline)) || fail "nothing flagged after cutting a0 to a quarter"
        sleep 0.5
    done
    sleep 1
    got=$(flagged)
    kill -TERM "$pid0" "$pid1"
    wait "$pid0" "$pid1" || true
    PIDS=()
    echo "flagged: $got"
    [[ $got == "$pid0 send primary rxe_a0:1" ]] ||
        fail "expected exactly rank 0's send primary path on rxe_a0:1 ($pid0), got '$got'"
    grep -q "path degraded: send primary dev rxe_a0:1" "$OUT.err0" || fail "no WARN for the degraded path"
    ;;
striped)
    : "${VIGIL_BIN:?}"
    # Deep tbf queues that never drop (see degraded) and a QP timeout (8.6 s per try) longer
    # than what two pieces in flight wait in the slow port's queue. The stall timeout too:
    # a path's acknowledgements and heartbeats queue behind the peer's data in the other
    # direction, up to 8 slices of 512 KiB (4.2 s at 8 Mbit/s) once the peer carries all on
    # one port. With the default 2 s, a backup heard nothing while both ranks drained it for
    # the failback, and a stall failover took the traffic to the rebuilt primary first (seen
    # after the suite's earlier cases, under ASan).
    export VIGIL_IB_TIMEOUT=21 VIGIL_STALL_TIMEOUT_MS=15000
    for p in a0 a1 b0 b1; do "$TOPO" shape "$p" 8mbit 10s; done
    "$TOPO" shape a0 2mbit 10s
    # Slices of 512 KiB, eight in flight, as NCCL pipelines its steps: a lone message that
    # fits the active path's bound of two pieces would take it whole.
    start --workload allreduce --bytes 4M --slice 512K --loop
    wait_for "carries pieces beside" 60 0
    pid0=${PIDS[0]}
    # sent: bytes rank 0's send paths carried so far, primary then backup.
    sent() {
        "$VIGIL_BIN" dump --windows 0 | python3 -c '
import json, sys
got = {"primary": 0, "backup": 0}
for line in sys.stdin:
    r = json.loads(line)
    if r["type"] == "path" and r["pid"] == int(sys.argv[1]) and r["kind"] == "send":
        got[r["slot"]] += r["bytes_total"]
print(got["primary"], got["backup"])' "$pid0"
    }
    # ports: both ranks' port records (hardware retransmissions), for a failure's diagnosis.
    ports() {
        "$VIGIL_BIN" dump --windows 0 | python3 -c '
import json, sys
pids = {int(p) for p in sys.argv[1:]}
for line in sys.stdin:
    r = json.loads(line)
    if r["type"] in ("port", "path") and r["pid"] in pids:
        print(json.dumps({k: v for k, v in r.items() if not isinstance(v, (list, dict))}))' "${PIDS[@]}" >&2 || true
    }
    # A wait that fails shows what each path did over 2 s: still moving bytes, or stuck.
    ports_twice() { ports; sleep 2; echo "2 s later:" >&2; ports; }
    ON_FAIL=ports_twice
    # Judged over a span of at least 4 s, sampled every second for up to 25 s: a lone
    # retransmission (8.6 s at this QP timeout) or a stalled guest must not decide the case,
    # what the paths carry over a span in which the connection moves does.
    sleep 3
    ts=() ps=() bs=() ok=
    for _ in $(seq 25); do
        read -r p b <<<"$(sent)"
        ts+=("$(date +%s%N)") ps+=("$p") bs+=("$b")
        n=$((${#ts[@]} - 1))
        for ((i = 0; i < n; i++)); do
            ms=$(((ts[n] - ts[i]) / 1000000))
            ((ms >= 4000)) || break
            dp=$((ps[n] - ps[i])) db=$((bs[n] - bs[i]))
            # The slow port alone carries at most 2 Mbit/s: together they must beat it by
            # half again.
            if ((dp > 0 && db > 0 && 8 * (dp + db) * 1000 > 3 * 1000 * 1000 * ms)); then
                ok=1
                break 2
            fi
        done
        sleep 1
    done
    if [[ -n $ok ]]; then
        echo "rank 0 sent in $ms ms: primary (rxe_a0, 2 Mbit/s) $dp bytes, backup (rxe_a1, 8 Mbit/s) $db bytes"
    else
        for ((i = 0; i <= n; i++)); do
            echo "sample $i: +$(((ts[i] - ts[0]) / 1000000)) ms primary ${ps[i]} backup ${bs[i]}" >&2
        done
        fail "in 25 s, no span of 4 s in which both paths carried and rank 0 sent at more than 3 Mbit/s"
    fi
    shares=$(count "carries pieces beside" 0)
    port a0 down # the active path, with pieces on both
    wait_for "failover: primary dev rxe_a0:1" 30 0
    sleep 1
    port a0 up
    wait_for "failback to primary dev rxe_a0:1" 60 0
    wait_count "carries pieces beside" $((shares + 1)) 60 0
    sleep 2
    port a1 down # the shared path
    wait_for "failover: shared path lost" 30 0
    sleep 1
    port a1 up
    wait_count "carries pieces beside" $((shares + 2)) 60 0
    sleep 2
    stop_ok
    echo "rank 0: $(count "failover: " 0) failovers, $(count "failback to primary" 0) failbacks," \
        "$(count "carries pieces beside" 0) times a backup shared"
    ;;
counters)
    # Single-packet messages (below the 1024-byte RDMA MTU): a lost packet is retransmitted
    # whole after the QP's timeout, which the port's hardware counters count.
    : "${VIGIL_BIN:?}"
    "$TOPO" loss a0 3
    start --workload bandwidth --bytes 512 --window 8 --iters 3000 --check
    wait_for "accepted primary" 60 0
    pid0=${PIDS[0]}
    best=0 ports=
    while kill -0 "$pid0" 2>/dev/null; do
        out=$("$VIGIL_BIN" dump --windows 0 2>/dev/null | python3 -c '
import json, sys
pid = int(sys.argv[1]); best = -1; ports = []
for line in sys.stdin:
    r = json.loads(line)
    if r["type"] == "port" and r["pid"] == pid:
        ports.append(r["device"])
        if r["device"] == "rxe_a0:1": best = r["retransmits"]
print(best, ",".join(sorted(ports)))' "$pid0") || true
        read -r n p <<<"$out"
        [[ -n ${p:-} ]] && ports=$p
        [[ ${n:--1} =~ ^[0-9]+$ ]] && ((n > best)) && best=$n
        sleep 0.5
    done
    "$TOPO" unshape a0
    finish_ok
    echo "port rxe_a0:1 of rank 0: $best retransmissions seen in its registry; ports: $ports"
    [[ $ports == "rxe_a0:1,rxe_a1:1" ]] || fail "expected rank 0's two ports in its registry, got '$ports'"
    ((best > 0)) || fail "no retransmission counted on the lossy port"
    ;;
*) fail "unknown case $CASE" ;;
esac
echo "verbs e2e $CASE: ok"
