#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The profiler chain in the lab, no GPU: 4 hosts x 2 ports, every port shaped to 800 Mbit/s,
# a 4-rank ring all-reduce through libnccl-net-vigil.so whose own ncclProfiler_v6 is driven
# the way NCCL's proxy drives it (vigil-netbench --profile net); the net plugin's window
# events reach the profiler in-band. Then `vigil report` over the ranks' files.
#   slow-port   2 ranks, 2 channels (one per port), every port at 400 Mbit/s and host 0's
#               port 0 cut to 100 Mbit/s: the report names a path over that port
#               (10.77.0.1 <-> 10.77.0.2, both directions cross it) as the slowest link and an
#               eth0 NIC at either end, and no rank. The ports are slower than the other cases'
#               so that the host's own time between collectives stays a small share of the
#               work: both ranks busy-poll on 2 cores, and one rank's gap between finishing a
#               collective and calling the next (validating and refilling 4 MiB) ran up to
#               3.5 ms longer than the other's, 12 % of a 28 ms all-reduce at 800/200 Mbit/s,
#               which the report rightly calls late; at 400/100 it stays under 5 %. (In a longer
#               ring, back-pressure slows the busy time of upstream paths too, so a path
#               verdict needs more than busy-time bandwidth: see the README's limits.)
#               With multipath, as users run it: each path's share of a message ends when
#               the receiver reports its own pieces landed, so the fast shared path beside
#               the cut port is not charged the cut port's time.
#   late-rank   rank 1 arrives 20 ms late at every all-reduce: the report names rank 1
#   files       the trace parses, holds every kind of event the chain makes, and the summary
#               has one record per iteration per rank with the nccl-tests bus bandwidth
#   metrics     `vigil export` during the job serves the profiler's collective counters
#               (vigil_coll_*) next to the paths', in a strictly valid exposition
source "$(dirname "$0")/../functional/lib.sh"
need_root_lab
if [[ ${NETLAB:-} == "" ]]; then exec "$NETLAB_SH" run -H 4 -P 2 -- "$0" "$@"; fi
VIGIL=${VIGIL_BIN:?VIGIL_BIN not set}
for h in 0 1 2 3; do for p in 0 1; do "$NETLAB_SH" degrade "$h" "$p" 800mbit; done; done

# profile_run NRANKS ITERS ARGS...: every rank writes profiler and telemetry files to $TMP/prof.
profile_run() {
    local n=$1 iters=$2; shift 2
    mkdir -p "$TMP/prof"
    VIGIL_PROFILE_DIR=$TMP/prof VIGIL_TELEMETRY_DIR=$TMP/prof VIGIL_PROFILE_EVENTS=all \
        run_ranks "$n" --workload allreduce --bytes 4M --iters "$iters" --profile net "$@" >"$TMP/run.out"
    expect_ok "$(cat "$TMP/run.out")"
    "$VIGIL" report --out "$TMP/report" --no-plots "$TMP/prof" >"$TMP/report.txt" 2>&1 ||
        { cat "$TMP/report.txt" >&2; fail "vigil report failed"; }
    cat "$TMP/report.txt"
}
line() { grep "^$1" "$TMP/report.txt" || fail "no '$1' line in the report"; }

case $1 in
slow-port)
    for h in 0 1 2 3; do for p in 0 1; do "$NETLAB_SH" degrade "$h" "$p" 400mbit; done; done
    "$NETLAB_SH" degrade 0 0 100mbit
    # 16 all-reduces: the striping moves most of a connection off the cut port, and a path
    # counts in the link verdict only with 1 MiB carried (tools/report_model.h); in 8, the cut
    # port's paths once carried 667 KB between them and the verdict could not name them.
    profile_run 2 16 --channels 2 --slice 256K
    got=$(line "slowest link:")
    [[ $got != *"none stands out"* && $got == *" eth0 "* && $got == *10.77.0.1* && $got == *10.77.0.2* ]] ||
        fail "expected a 10.77.0.1 <-> 10.77.0.2 path, got: $got"
    got=$(line "slowest nic:")
    [[ $got != *"none stands out"* && $got == *"eth0 10.77.0."[12]* ]] || fail "expected host 0 or 1 eth0, got: $got"
    got=$(line "slowest rank:")
    [[ $got == *"none stands out"* ]] || fail "no rank is late here, got: $got"
    ;;
late-rank)
    profile_run 4 12 --delay-rank 1 --delay-us 20000
    got=$(line "slowest rank:")
    [[ $got =~ rank\ 1([^0-9]|$) ]] || fail "expected rank 1, got: $got"
    ;;
files)
    profile_run 4 6
    python3 - "$TMP/prof" <<'PY' || fail "profiler files"
import glob, json, sys
d = sys.argv[1]
sums = sorted(glob.glob(d + "/vigil-prof-*.jsonl"))
traces = sorted(glob.glob(d + "/vigil-prof-*.trace.json"))
assert len(sums) == 4 and len(traces) == 4, (sums, traces)
ranks = set()
for f in sums:
    recs = [json.loads(l) for l in open(f)]
    types = [r["type"] for r in recs]
    assert types[0] == "process" and types[-1] == "stats", types
    colls = [r for r in recs if r["type"] == "coll"]
    assert [c["seq"] for c in colls] == list(range(6)), [c["seq"] for c in colls]
    for c in colls:
        assert c["bytes"] == 4 << 20 and c["nranks"] == 4 and c["timing"] == "proxy_cpu", c
        assert abs(c["busbw_GBps"] - c["algbw_GBps"] * 1.5) < 1e-3, c
        assert c["duration_us"] > 0, c
    ranks.add(colls[0]["rank"])
    nets = [r for r in recs if r["type"] == "net" and r["event"] == "window"]
    assert nets and sum(n["bytes"] for n in nets) > 0, "no net windows with bytes"
    st = recs[-1]
    assert st["dropped_pool"] == st["dropped_ring"] == st["dropped_threads"] == 0, st
assert ranks == {0, 1, 2, 3}, ranks
for f in traces:
    ev = json.load(open(f))["traceEvents"]
    names = {e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert "collectives" in names and any(n.startswith("ch 0 send") for n in names) \
        and any(n.startswith("net dev") for n in names), names
    phs = {e["ph"] for e in ev}
    assert {"X", "b", "e", "M"} <= phs, phs
print("profiler files ok:", len(sums), "summaries,", len(traces), "traces")
PY
    ;;
metrics)
    port=$((19000 + RANDOM % 1000))
    "$VIGIL" export --listen "127.0.0.1:$port" 2>/dev/null & exp=$!
    mkdir -p "$TMP/prof"
    VIGIL_PROFILE_DIR=$TMP/prof run_ranks 2 --workload allreduce --bytes 1M --iters 400 --profile net \
        >"$TMP/run.out" & job=$!
    # Scrape while the job runs: a segment is reaped once its process is gone.
    for _ in $(seq 100); do
        [[ -n $(ls "$TMP"/prof/vigil-prof-*.jsonl 2>/dev/null) ]] && grep -qs '"type":"coll"' "$TMP"/prof/*.jsonl && break
        sleep 0.1
    done
    # One scrape while the job runs, checked as a whole: the job may end right after it.
    python3 "$HERE/../fault/prom_check.py" --save "$TMP/scrape.txt" "$port" +vigil_coll_total \
        +vigil_coll_bytes_total +vigil_coll_seconds_total vigil_coll_busbw_bytes \
        +vigil_profiler_events_total vigil_profiler_events_dropped_total +vigil_port_bytes_total ||
        { kill "$exp"; fail "bad exposition"; }
    curl_out=$(cat "$TMP/scrape.txt")
    kill "$exp" 2>/dev/null || true
    wait "$job" || fail "the job failed"
    expect_ok "$(cat "$TMP/run.out")"
    grep -E '^vigil_coll_total\{.*coll="allreduce"' <<<"$curl_out" || fail "no allreduce counter"
    ;;
*) fail "unknown case $1" ;;
esac
