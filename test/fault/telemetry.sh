#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Telemetry in the lab. Every port is shaped to 800 Mbit/s (so ports, not CPUs, set the pace)
# and host 0 streams 128 KiB messages to host 1.
#   degrade PCT   host 0's port 0 cut to PCT % mid-run: its send primary path, and no other
#                 path of the job, is flagged degraded (registry, via `vigil dump`)
#   busy-degrade PCT  the same, but once the detector judges (it has a baseline) every CPU
#                 is saturated by stress-ng (one worker per core, started and stopped by
#                 PID): under that load no path is flagged or logged degraded before the cut,
#                 and only the cut one after it
#   busy          stress-ng as above for 5 s, no cut: nothing is flagged, no rank logs a
#                 degraded path
#   idle          the same port cut to 25 %, but only ping-pong traffic (the path is never
#                 loaded): nothing is flagged
#   readers       `vigil dump --follow` and `vigil export` run through a failover: the job
#                 stays exact, every dump line parses as JSON, the exposition parses strictly
#   files         VIGIL_TELEMETRY_DIR with a 64 KiB rotation bound through an injected
#                 failover, then both ports down: the files parse, are bounded and rotated,
#                 hold windows, the failover event and the fatal error flushed before exit,
#                 and one current (unrotated) file holds both (events carried at rotation)
#   sigterm       VIGIL_TELEMETRY_DIR set, the sender gets SIGTERM mid-stream: it still dies
#                 of SIGTERM, and its file ends with the signal record after its windows
source "$(dirname "$0")/../functional/lib.sh"
need_root_lab
if [[ ${NETLAB:-} == "" ]]; then exec "$NETLAB_SH" run -H 2 -P 2 -- "$0" "$@"; fi
VIGIL=${VIGIL_BIN:?VIGIL_BIN not set}
export NCCL_DEBUG=INFO VIGIL_WINDOW_US=5000 VIGIL_DEGRADE_PCT=70
# A busy host is judged over the longest span (64 x 5 ms): stalls no end point can see (the
# kernel's own network processing waits for a CPU too) then drag an aggregate down less. And
# at the default threshold (50 %) where the cut allows it: only a cut to half needs 70 %.
if [[ $1 == busy* ]]; then
    export VIGIL_DEGRADE_WINDOWS=64
    [[ ${2:-} == 50 ]] || export VIGIL_DEGRADE_PCT=50
fi
for h in 0 1; do for p in 0 1; do "$NETLAB_SH" degrade "$h" "$p" 800mbit; done; done

start() { # WORKLOAD ARGS...
    RUN_ID=$((RUN_ID + 1)); OUT="$TMP/out.$RUN_ID"; local rdv="unix:$TMP/rdv.$RUN_ID.sock" r
    PIDS=()
    for r in 1 0; do
        "$NETLAB_SH" exec "$r" -- "$NETBENCH_BIN" --plugin "$NETBENCH_PLUGIN" --rank "$r" --nranks 2 \
            --rendezvous "$rdv" --timeout 120 "$@" >"$OUT.rank$r" 2>"$OUT.err.$r" &
        PIDS[r]=$!
    done
    until grep -q "accepted primary" "$OUT.err.0" 2>/dev/null; do sleep 0.05; done
}
stop() {
    local r
    for r in 0 1; do kill "${PIDS[r]}" 2>/dev/null || true; done
    for r in 0 1; do wait "${PIDS[r]}" 2>/dev/null || true; done
}
# The CPU load of the busy cases: one stress-ng CPU worker per core at normal priority,
# ended by PID (stress-ng stops its workers on SIGTERM; --timeout bounds it anyway).
LOAD=""
start_load() {
    command -v stress-ng >/dev/null ||
        { echo "SKIP: stress-ng is not installed (scripts/setup.sh installs it)" >&2; exit 77; }
    stress-ng --cpu "$(nproc)" --timeout 600s --quiet --temp-path "$TMP" &
    LOAD=$!
    sleep 1
    kill -0 "$LOAD" 2>/dev/null || fail "stress-ng did not start"
}
stop_load() {
    [[ -n $LOAD ]] || return 0
    kill "$LOAD" 2>/dev/null || true
    wait "$LOAD" 2>/dev/null || true
    LOAD=""
}
trap 'stop_load; rm -rf "$TMP"' EXIT
# ranks_pids: pids of the vigil-netbench processes of this run.
ranks_pids() { netbench_pids "unix:$TMP/rdv.$RUN_ID.sock"; }
# flagged: "pid kind slot device" of every path of this run flagged degraded right now.
flagged() {
    local ours
    mapfile -t ours < <(ranks_pids)
    "$VIGIL" dump --windows 0 | python3 -c '
import json, sys
ours = set(sys.argv[1:])
for line in sys.stdin:
    r = json.loads(line)
    if r["type"] == "path" and r["degraded"] and r["state"] != "unused" and str(r["pid"]) in ours:
        print(r["pid"], r["kind"], r["slot"], r["device"])' "${ours[@]}"
}
sender_pid() { pgrep -f -- "--rank 0 --nranks 2 --rendezvous unix:$TMP/rdv.$RUN_ID.sock" | while read -r p; do
    [[ $(cat "/proc/$p/comm") == vigil-netbench ]] && echo "$p"; done | head -1; }

# degraded_warns: the "path degraded" lines the ranks of this run logged so far.
degraded_warns() { grep -h "path degraded" "$OUT".err.* || true; }

# stream LOAD: the bandwidth stream until the detector judges (its warm-up waits for spans the
# end points hardly held up: seconds on a loaded machine); with LOAD=busy, then 1.5 s more with
# every CPU saturated. Nothing may be flagged or logged degraded meanwhile.
# 32 messages of 128 KiB in flight: with multipath each path then holds enough to be bound by
# its port. With 8 each path carried half of 1 MiB, its busy-time rate was the window's, not
# the port's, and on a busy host a port cut to a quarter kept up with that window-bound
# baseline in some runs.
stream() {
    local until=$((SECONDS + 15))
    start --workload bandwidth --bytes 128K --window 32 --iters 1000000
    sleep 1
    pid=$(sender_pid)
    until judging "$pid"; do
        ((SECONDS < until)) || fail "the sender's detector has no baseline after 15 s of the stream"
        sleep 0.2
    done
    if [[ $1 == busy ]]; then
        start_load
        sleep 1.5
    fi
    [[ -z $(flagged) ]] || fail "a path was flagged before any degradation: $(flagged)"
    [[ -z $(degraded_warns) ]] || fail "degraded before the cut: $(degraded_warns)"
}

# degrade PCT LOAD SECONDS: the stream, then its port cut to PCT %; waits up to SECONDS for
# the verdict (each look at the registry takes a while on a loaded host: the deadline is
# wall-clock).
degrade() {
    local until rate=$((800 * $1 / 100))mbit got
    stream "$2"
    "$NETLAB_SH" degrade 0 0 "$rate"
    until=$((SECONDS + $3))
    got=$(flagged)
    while [[ -z $got ]] && ((SECONDS < until)); do
        sleep 0.1
        got=$(flagged)
    done
    stop
    echo "flagged after cutting host 0 port 0 to $rate: $got"
    [[ $got == "$pid send primary eth0" ]] || fail "expected exactly '$pid send primary eth0' flagged, got '$got'"
    grep -q "path degraded: send primary dev eth0" "$OUT.err.0" || fail "no WARN for the degraded path"
    if degraded_warns | grep -v "path degraded: send primary dev eth0"; then
        fail "another path was logged degraded"
    fi
}

case $1 in
degrade)
    degrade "$2" idle 8
    ;;
busy-degrade)
    degrade "$2" busy 8
    ;;
busy)
    stream busy
    sleep 3.5
    got=$(flagged)
    stop
    stop_load
    [[ -z $got ]] || fail "a healthy path was flagged under CPU load: $got"
    [[ -z $(degraded_warns) ]] || fail "a healthy path was logged degraded under CPU load: $(degraded_warns)"
    echo "busy: 5 s of saturated CPUs, nothing flagged"
    ;;
idle)
    "$NETLAB_SH" degrade 0 0 200mbit
    start --workload latency --bytes 8 --iters 20000
    sleep 3
    got=$(flagged)
    stop
    [[ -z $got ]] || fail "an unloaded path was flagged: $got"
    if grep -h "path degraded" "$OUT".err.*; then fail "a degraded WARN for an unloaded path"; fi
    ;;
readers)
    port=$((19000 + RANDOM % 1000))
    "$VIGIL" export --listen "127.0.0.1:$port" 2>/dev/null & exp=$!
    start --workload allreduce --bytes 16M --iters 30
    "$VIGIL" dump --follow 4 >"$TMP/follow.jsonl" & dmp=$!
    sleep 0.8; "$NETLAB_SH" fail 0 0; sleep 0.5; "$NETLAB_SH" restore 0 0
    python3 "$HERE/../fault/prom_check.py" "$port" +vigil_port_bytes_total vigil_path_connections vigil_path_degraded \
        vigil_port_failovers_total vigil_path_rate_bytes || fail "bad exposition"
    rc=0; for r in 0 1; do wait "${PIDS[r]}" || rc=1; done
    wait "$dmp"; kill "$exp" 2>/dev/null || true
    ((rc == 0)) || { cat "$OUT".rank* >&2; fail "the job failed with readers attached"; }
    expect_ok "$OUT.rank0"
    grep -q "failover: primary dev eth0" "$OUT.err.0" || fail "no failover happened"
    python3 -c '
import json, sys
n = 0
for line in open(sys.argv[1]):
    json.loads(line); n += 1
assert n > 0, "dump printed nothing"
print(f"dump --follow: {n} JSON lines")' "$TMP/follow.jsonl"
    ;;
files)
    dir=$TMP/tel; mkdir -p "$dir"
    export VIGIL_TELEMETRY_DIR=$dir VIGIL_TELEMETRY_MAX_BYTES=64K VIGIL_FATAL_TIMEOUT_MS=1000 VIGIL_WINDOW_US=1000
    RANK0_ENV=VIGIL_INJECT_FAIL=eth0:msgs=40
    RUN_ID=$((RUN_ID + 1)); OUT="$TMP/out.$RUN_ID"; rdv="unix:$TMP/rdv.$RUN_ID.sock"
    for r in 1 0; do
        extra=(); ((r == 0)) && extra=("$RANK0_ENV")
        "$NETLAB_SH" exec "$r" -- env "${extra[@]}" "$NETBENCH_BIN" --plugin "$NETBENCH_PLUGIN" --rank "$r" \
            --nranks 2 --rendezvous "$rdv" --timeout 120 --workload allreduce --bytes 16M --iters 400 \
            >"$OUT.rank$r" 2>"$OUT.err.$r" &
        PIDS[r]=$!
    done
    until grep -q "fault injection: failing" "$OUT.err.0" 2>/dev/null; do sleep 0.05; done
    sleep 1.5
    "$NETLAB_SH" fail 0 0; "$NETLAB_SH" fail 0 1 # no path left: the job must fail, files flushed
    rc=0; for r in 0 1; do wait "${PIDS[r]}" && rc=1; done
    ((rc == 0)) || fail "the job survived with every port of host 0 down"
    python3 - "$dir" <<'PY' || { [[ -n ${KEEP_TEL:-} ]] && cp -r "$dir" "$KEEP_TEL"; fail "telemetry files"; }
import glob, json, os, sys
d = sys.argv[1]
files = sorted(glob.glob(f"{d}/vigil-*.jsonl*"))
assert files, "no telemetry files"
bound = 64 * 1024 + 4096
kinds, events, newest = {}, [], {}
for f in files:
    size = os.path.getsize(f)
    assert size <= bound, f"{f}: {size} bytes over the rotation bound"
    for line in open(f):
        r = json.loads(line)
        kinds[r["type"]] = kinds.get(r["type"], 0) + 1
        if r["type"] == "event":
            events.append(r["event"])
            if not f.endswith(".1"):
                newest.setdefault(f, set()).add(r["event"])
assert any(f.endswith(".1") for f in files), f"no rotation happened: {files}"
assert kinds.get("window", 0) > 100, kinds
assert "failover" in events, events
assert "fatal" in events, events
# Each new file starts with the newest events: the injected host's current file alone still
# tells the failover and the fatal error, however many windows came between them.
assert any({"failover", "fatal"} <= evs for evs in newest.values()), newest
print(f"{len(files)} files, records {kinds}, events {sorted(set(events))}")
PY
    ;;
sigterm)
    dir=$TMP/tel; mkdir -p "$dir"
    export VIGIL_TELEMETRY_DIR=$dir
    start --workload bandwidth --bytes 128K --window 32 --iters 1000000
    sleep 1
    pid=$(sender_pid)
    [[ -n $pid ]] || fail "no sender process"
    kill -TERM "$pid"
    rc=0; wait "${PIDS[0]}" || rc=$?
    kill "${PIDS[1]}" 2>/dev/null || true; wait 2>/dev/null || true
    ((rc == 143)) || fail "the sender exited with $rc, not by SIGTERM (143): the handler must chain to the default action"
    python3 - "$dir/vigil-$(hostname)-$pid.jsonl" <<'PY' || fail "no signal record"
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
sig = [i for i, r in enumerate(recs) if r["type"] == "signal"]
assert sig and recs[sig[0]]["signal"] == 15, "no SIGTERM record"
assert sum(1 for r in recs if r["type"] == "window") > 100, "too few windows"
print(f"{len(recs)} records, signal record at {sig[0]}")
PY
    ;;
*) fail "unknown case $1" ;;
esac
echo "telemetry $*: ok"
