#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Port-failure scenarios in the network-namespace lab (issue: failover). Every scenario runs
# the driver's validated ring all-reduce (exact sums: no byte lost, duplicated or misplaced)
# and asserts that its fault really fired (the plugin's WARN/INFO lines).
#   primary-down   4x2: host 1's primary port down mid-run (>= 1 GiB), restored later
#   every-host     4x2: each host's primary port in turn; then 3x3 with spread backups
#   flap           2x2: a port down/up 20 times during one run, failback after each
#   backup-dies    2x2: primary then backup down -> bounded error, no hang
#   peer-killed    3x2: one rank SIGKILLed -> the others fail cleanly within the bound
#   degraded       2x2: a port limited to ~10% with tbf -> the run completes, exact
#   inject         2x2: VIGIL_INJECT_FAIL breaks host 0's eth0 path after 30 messages, with
#                  4 channels (connections spread over both ports), exact
#   striped        2x2, ports at 400 Mbit/s, host 0's port 0 cut to 100: its connection
#                  stripes over both ports (multipath); that port then fails mid-stream (the
#                  shared path takes over), heals (failback, and the backup shares again),
#                  then the shared port fails (a new generation on the primary), exact
source "$(dirname "$0")/../functional/lib.sh"
source "$(dirname "$0")/../../scripts/pids.sh"
need_root_lab
CASE=$1
case $CASE in
primary-down | every-host) HP="-H 4 -P 2" ;;
peer-killed) HP="-H 3 -P 2" ;;
*) HP="-H 2 -P 2" ;;
esac
if [[ ${NETLAB:-} == "" && $CASE != every-host-3x3 ]]; then
    # shellcheck disable=SC2086
    exec "$NETLAB_SH" run $HP -- "$0" "$@"
fi
export NCCL_DEBUG=INFO VIGIL_FATAL_TIMEOUT_MS=${VIGIL_FATAL_TIMEOUT_MS:-3000}

# start_ranks N ARGS...: ranks in the background; sets PIDS and OUT (rank 0's stdout).
start_ranks() {
    local n=$1; shift
    RUN_ID=$((RUN_ID + 1))
    OUT="$TMP/out.$RUN_ID"
    local rdv="unix:$TMP/rdv.$RUN_ID.sock" r
    PIDS=()
    for ((r = n - 1; r >= 0; r--)); do
        local extra=()
        ((r == 0)) && [[ -n ${RANK0_ENV:-} ]] && extra=("$RANK0_ENV")
        "$NETLAB_SH" exec "$r" -- env "${extra[@]}" "$NETBENCH_BIN" --plugin "$NETBENCH_PLUGIN" --rank "$r" \
            --nranks "$n" --rendezvous "$rdv" --timeout 200 "$@" \
            >"$OUT.rank$r" 2>"$OUT.err.$r" &
        PIDS[r]=$!
    done
}
wait_all_ok() {
    local r rc=0
    for r in "${!PIDS[@]}"; do wait "${PIDS[r]}" || { echo "rank $r failed" >&2; rc=1; }; done
    if ((rc)); then cat "$OUT".rank* "$OUT".err.* >&2; fail "a rank failed"; fi
    expect_ok "$OUT.rank0"
}
count() { cat "$OUT".err.* | grep -c -- "$1" || true; }
# wait_for PATTERN SECONDS: until a rank logged PATTERN (the run is under way).
wait_for() {
    local i
    for ((i = 0; i < $2 * 20; i++)); do
        (( $(count "$1") > 0 )) && return 0
        sleep 0.05
    done
    fail "never saw \"$1\""
}

case $CASE in
primary-down)
    start_ranks 4 --workload allreduce --bytes 64M --iters 12
    wait_for "accepted primary" 20
    sleep 0.5
    "$NETLAB_SH" fail 1 0
    sleep 1
    "$NETLAB_SH" restore 1 0
    wait_all_ok
    (( $(json_get "$OUT.rank0" bytes) >= 1 << 30 )) || fail "less than 1 GiB moved"
    (( $(count "failover: primary dev eth0") >= 1 )) || fail "no failover happened"
    # Host 1's own port: its link monitor sees it go down first (the data path only stalls).
    grep -q "failover: primary dev eth0.*port eth0 down (netlink)" "$OUT.err.1" ||
        fail "host 1 did not fail over on its link monitor's port event"
    ;;
every-host)
    start_ranks 4 --workload allreduce --bytes 64M --iters 40
    wait_for "accepted primary" 20
    for h in 0 1 2 3; do
        sleep 0.4; "$NETLAB_SH" fail "$h" 0; sleep 0.4; "$NETLAB_SH" restore "$h" 0
    done
    wait_all_ok
    for r in 0 1 2 3; do
        grep -q "failover: primary dev eth0" "$OUT.err.$r" || fail "host $r did not fail over"
    done
    # 3 hosts x 3 ports, spread backups: host 0's port 0 down.
    exec env NETLAB= "$NETLAB_SH" run -H 3 -P 3 -- "$0" every-host-3x3
    ;;
every-host-3x3)
    start_ranks 3 --workload allreduce --bytes 48M --iters 16
    wait_for "accepted primary" 20
    sleep 0.5; "$NETLAB_SH" fail 0 0
    wait_all_ok
    grep -q "failover: primary dev eth0" "$OUT.err.0" || fail "host 0 did not fail over"
    ;;
flap)
    export VIGIL_FAILBACK_HOLD_MS=30
    start_ranks 2 --workload allreduce --bytes 32M --iters 400
    wait_for "accepted primary" 20
    for i in $(seq 20); do
        "$NETLAB_SH" fail 0 0; sleep 0.2; "$NETLAB_SH" restore 0 0
        # The next flap only once this one has failed back (bounded), so a slow machine
        # cannot merge two flaps into one.
        for _ in $(seq 60); do
            (( $(grep -c "failback to primary" "$OUT.err.0" || true) >= i )) && break
            sleep 0.05
        done
        sleep 0.1
    done
    wait_all_ok
    fo=$(grep -c "failover: primary dev eth0" "$OUT.err.0" || true)
    fb=$(grep -c "failback to primary" "$OUT.err.0" || true)
    echo "host 0: $fo failovers, $fb failbacks"
    (( fo == 20 && fb == 20 )) || fail "expected 20 failovers and 20 failbacks on host 0, got $fo and $fb"
    ;;
backup-dies)
    start_ranks 2 --workload allreduce --bytes 64M --iters 400
    wait_for "accepted primary" 20
    sleep 0.5; "$NETLAB_SH" fail 0 0; sleep 0.3
    t0=$(date +%s.%N); "$NETLAB_SH" fail 0 1
    rc=0; for r in "${!PIDS[@]}"; do wait "${PIDS[r]}" && rc=1; done
    t1=$(date +%s.%N)
    ((rc == 0)) || fail "a rank finished ok with no path left"
    took=$(python3 -c "print($t1 - $t0)")
    echo "both ports down: ranks failed after ${took}s (VIGIL_FATAL_TIMEOUT_MS=$VIGIL_FATAL_TIMEOUT_MS)"
    python3 -c "import sys; sys.exit(0 if $took < $VIGIL_FATAL_TIMEOUT_MS / 1000 + 5 else 1)" || fail "error came too late"
    (( $(count "no path") >= 1 )) || fail "no 'no path' WARN"
    grep -q "ncclResult 6" "$OUT".rank* || fail "no ncclRemoteError reached the caller"
    ;;
peer-killed)
    start_ranks 3 --workload allreduce --bytes 64M --iters 400
    wait_for "accepted primary" 20
    sleep 1
    t0=$(date +%s.%N)
    # PIDS[2] is rank 2's driver itself (netlab.sh exec and ip netns exec exec, env too).
    pid_stop "${PIDS[2]}" vigil-netbench KILL || fail "rank 2 (pid ${PIDS[2]}) is not running"
    rc=0; for r in 0 1; do wait "${PIDS[r]}" && rc=1; done
    t1=$(date +%s.%N)
    ((rc == 0)) || fail "a survivor finished ok although its peer died"
    took=$(python3 -c "print($t1 - $t0)")
    echo "peer killed: survivors failed after ${took}s"
    python3 -c "import sys; sys.exit(0 if $took < $VIGIL_FATAL_TIMEOUT_MS / 1000 + 5 else 1)" || fail "error came too late"
    ;;
inject)
    RANK0_ENV=VIGIL_INJECT_FAIL=eth0:msgs=30 start_ranks 2 --workload allreduce --bytes 32M --iters 4 --channels 4
    wait_all_ok
    grep -q "fault injection: failing dev eth0 now (after 30 messages)" "$OUT.err.0" ||
        fail "the injected fault did not fire"
    grep -q "failover: primary dev eth0.*injected failure" "$OUT.err.0" || fail "no failover after the injection"
    # Only the rank that armed it fires it (the variable is per process).
    ! grep -q "fault injection" "$OUT.err.1" || fail "injection fired on a process that did not arm it"
    ;;
degraded)
    start_ranks 2 --workload allreduce --bytes 32M --iters 6
    wait_for "accepted primary" 20
    "$NETLAB_SH" degrade 0 0 1gbit
    tc -n "$NETLAB-h0" qdisc show dev eth0 | grep -q tbf || fail "tbf not installed"
    wait_all_ok
    ;;
striped)
    for h in 0 1; do for p in 0 1; do "$NETLAB_SH" degrade "$h" "$p" 400mbit; done; done
    "$NETLAB_SH" degrade 0 0 100mbit
    export VIGIL_FAILBACK_HOLD_MS=300
    start_ranks 2 --workload allreduce --bytes 32M --iters 24
    wait_for "carries pieces beside" 20
    sleep 1.5
    "$NETLAB_SH" fail 0 0 # host 0's primary (active) port, with pieces on both paths
    sleep 1
    "$NETLAB_SH" restore 0 0
    wait_for "failback to primary" 20
    sleep 1
    "$NETLAB_SH" fail 0 1 # now the shared path's port
    sleep 1
    "$NETLAB_SH" restore 0 1
    wait_all_ok
    (( $(count "failover: primary dev eth0") >= 1 )) || fail "the active path's failure did not fail over"
    (( $(count "failover: shared path lost") >= 1 )) || fail "the shared path's failure did not start a new generation"
    (( $(count "multipath: backup dev eth1") >= 2 )) || fail "the backup did not share again after the failback"
    ;;
*) fail "unknown case $CASE" ;;
esac
if [[ ${VIGIL_MULTIPATH:-1} == 0 && -n ${OUT:-} ]] && (( $(count "carries pieces beside") > 0 )); then
    fail "VIGIL_MULTIPATH=0, yet a backup carried pieces"
fi
echo "fault $CASE: ok"
