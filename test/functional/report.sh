#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `vigil report` on synthetic profiler summaries, traces and telemetry files: 4 ranks of one
# comm, 50 AllReduce; in the "late" set rank 2 arrives ~300 us late on 90% of them and the
# send path nodeA eth1 10.77.1.2 -> 10.77.1.3 has a quarter of the others' busy bandwidth.
# Checks that the report names them (stdout and report.json), that the merged trace parses
# with distinct pids, the plots; that an even set names nothing; that truncated lines,
# unknown records and a truncated trace are tolerated; that collectives of different functions
# with the same sequence numbers stay apart; and the usage/no-input exit codes.
#   usage: report.sh VIGIL_BIN
set -euo pipefail
VIGIL=${1:?usage: report.sh VIGIL_BIN}
TMP=$(mktemp -d /tmp/vigil-report.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# gen DIR late|even: writes the inputs of one job into DIR.
gen() {
    python3 - "$1" "$2" <<'PY'
import json, os, random, sys

d, mode = sys.argv[1], sys.argv[2]
late = mode == "late"
os.makedirs(d, exist_ok=True)
rnd = random.Random(42)
COMM, COMM2 = "0x5f3c9a1e22b07d11", "0x00000000000000aa"
N, NCOLL, BYTES = 4, 50, 8 << 20
T0 = 1763712000000000.0  # us, realtime
HOSTS = ["nodeA", "nodeA", "nodeB", "nodeB"]
GB = 1e9


def put(f, rec):
    f.write(json.dumps(rec) + "\n")


# Every rank sees the same collective end; rank 2's late start makes the others wait.
straggle = [300.0 if late and seq % 10 else 0.0 for seq in range(NCOLL)]
for r in range(N):
    host, pid = HOSTS[r], 4000 + r
    # Rank 3's files are its process's second session: the name alone does not give host:pid.
    stem = f"{d}/vigil-prof-{host}-{pid}" + ("-1" if r == 3 else "")
    trace = []
    with open(f"{stem}.jsonl", "w") as f:
        put(f, {"type": "process", "host": host, "pid": pid, "version": "0.1.0", "abi": "v5",
                "mono_to_realtime_ns": 1763712000123456789})
        put(f, {"type": "comm", "comm": COMM, "name": "", "rank": r, "nranks": N, "nnodes": 2, "start_us": T0})
        for seq in range(NCOLL):
            base = T0 + 1000 + seq * 5000
            start = base + rnd.uniform(-20, 20) + (straggle[seq] if r == 2 else 0)
            end = base + straggle[seq] + 800 + rnd.uniform(0, 10)
            dur = end - start
            algbw = BYTES / (dur * 1e-6) / GB
            put(f, {"type": "coll", "comm": COMM, "rank": r, "nranks": N, "seq": seq, "func": "AllReduce",
                    "count": BYTES // 4, "datatype": "ncclFloat32", "bytes": BYTES, "algo": "RING",
                    "proto": "SIMPLE", "channels": 2, "start_us": start, "duration_us": dur,
                    "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (N - 1) / N, "timing": "kernel",
                    "future_field": {"unknown": [1, 2]}})
            if seq < 5:
                trace.append({"ph": "X", "name": "AllReduce", "pid": r, "tid": 0, "ts": start, "dur": dur,
                              "args": {"seq": seq}})
        for i in range(5):
            put(f, {"type": "p2p", "comm": COMM, "rank": r, "nranks": N, "func": "Send", "peer": (r + 1) % N,
                    "count": 4096, "datatype": "ncclFloat32", "bytes": 16384, "channels": 1,
                    "start_us": T0 + 400000 + i * 100, "duration_us": 20.0, "algbw_GBps": 0.8, "timing": "proxy"})
        for dev in (0, 1):
            bw = 1.25 * GB if late and r == 0 and dev == 1 else 5 * GB
            for k in range(10):
                b = 4 << 20
                put(f, {"type": "net", "comm": COMM, "rank": r, "event": "window", "dev": dev, "slot": "primary",
                        "generation": 0, "start_us": T0 + k * 10000, "window_us": 10000, "bytes": b,
                        "busy_us": b / (bw * rnd.uniform(0.95, 1.05)) * 1e6, "busy_bw_GBps": bw / GB,
                        "lat_p99_us": 55.1, "degraded": False, "state": "active"})
        put(f, {"type": "stats", "events": 1234, "dropped_pool": 0, "dropped_ring": 0, "dropped_threads": 0,
                "leaked": 0, "foreign_handles": 0, "trace_dropped": 0, "summary_dropped": 0})
    # Two trace processes per file: rank r of COMM, and rank 5 of COMM2 in every file (collides).
    meta = [{"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r} comm {COMM}"}},
            {"ph": "M", "name": "thread_name", "pid": r, "tid": 0, "args": {"name": "collectives"}},
            {"ph": "M", "name": "process_name", "pid": 5, "args": {"name": f"rank 5 comm {COMM2}"}},
            {"ph": "X", "name": "Broadcast", "pid": 5, "tid": 0, "ts": T0, "dur": 3.0}]
    with open(f"{stem}.trace.json", "w") as f:
        f.write('{"displayTimeUnit":"ns","traceEvents":[\n')
        f.write(",\n".join(json.dumps(e) for e in meta + trace))
        f.write("\n]}\n")

# Telemetry: per host one process with send and recv paths on eth0 and eth1; nodeA's file
# rotated once (each file describes its paths again).
ADDR = {"nodeA": ("10.77.0.2", "10.77.1.2"), "nodeB": ("10.77.0.3", "10.77.1.3")}
for host, pid, other in (("nodeA", 5001, "nodeB"), ("nodeB", 5002, "nodeA")):
    paths = []
    for dev in (0, 1):
        for kind in ("send", "recv"):
            paths.append({"type": "path", "path": len(paths), "kind": kind, "slot": "primary",
                          "device": f"eth{dev}", "local": ADDR[host][dev], "peer": ADDR[other][dev],
                          "conn": 7 + dev})
    files = [f"{d}/vigil-{host}-{pid}.jsonl.1", f"{d}/vigil-{host}-{pid}.jsonl"] if host == "nodeA" \
        else [f"{d}/vigil-{host}-{pid}.jsonl"]
    per_file = 20 // len(files)
    for fi, name in enumerate(files):
        with open(name, "w") as f:
            for p in paths:
                put(f, p)
            for k in range(fi * per_file, (fi + 1) * per_file):
                for p in paths:
                    slow = late and host == "nodeA" and p["device"] == "eth1" and p["kind"] == "send"
                    bw = (1.25 if slow else 5.0) * GB * rnd.uniform(0.95, 1.05)
                    b = 16 << 20
                    busy = int(b / bw * 1e9)
                    put(f, {"type": "window", "path": p["path"], "seq": k, "start_ns": 5_000_000_000 + k * 10_000_000,
                            "window_us": 10000, "generation": 0, "bytes": b, "ops": 16, "busy_ns": busy,
                            "busy_bw_Bps": round(b * 1e9 / busy), "lat_p50_ns": 20000, "lat_p99_ns": 60000,
                            "lat_max_ns": 90000, "peak_inflight_bytes": 1 << 20, "replays": 0, "errors": 0,
                            "state": 1, "degraded": 1 if slow and k >= 8 else 0})
            if late and host == "nodeA":
                # Written to the first file, then carried into the rotated-in one as the writer
                # does: the report counts each once.
                mark = {"carried": True} if fi > 0 else {}
                put(f, {**mark, "type": "event", "event": "degraded", "mono_ns": 5_100_000_000,
                        "text": "send dev eth1 10.77.1.2 -> 10.77.1.3: 1250 MB/s, baseline 5000 MB/s"})
                put(f, {**mark, "type": "event", "event": "failover", "mono_ns": 5_150_000_000,
                        "text": "dev eth1 10.77.1.2 -> 10.77.1.3 -> dev eth0 10.77.0.2 -> 10.77.0.3: injected, "
                                "generation 1, replaying 3 messages"})
                put(f, {**mark, "type": "event", "event": "failback", "mono_ns": 5_190_000_000,
                        "text": "dev eth1 10.77.1.2 -> 10.77.1.3, generation 2"})
PY
}

# check_json REPORT late|even: the verdicts in report.json.
check_json() {
    python3 - "$1" "$2" <<'PY'
import json, sys

r = json.load(open(sys.argv[1]))
late = sys.argv[2] == "late"
cols = r["collectives"]
assert len(cols) == 50, len(cols)
assert all(c["ranks_seen"] == 4 and c["nranks"] == 4 for c in cols), "collectives not aligned on 4 ranks"
(comm,) = r["comms"]
assert comm["ranks_seen"] == 4 and comm["complete"] == 50, comm
assert sum(x["p2p"] for x in comm["ranks"]) == 20, comm["ranks"]
assert [(x["rank"], x["host"], x["pid"]) for x in comm["ranks"]] == \
    [(0, "nodeA", "4000"), (1, "nodeA", "4001"), (2, "nodeB", "4002"), (3, "nodeB", "4003")], comm["ranks"]
assert len(r["series"]) == 4 and all(len(s["t_s"]) == 50 for s in r["series"]), "series"
s, l, n = r["slowest_rank"], r["slowest_link"], r["slowest_nic"]
if late:
    assert s and s["rank"] == 2 and s["host"] == "nodeB" and s["pid"] == "4002", s
    assert 240 <= s["mean_lateness_us"] <= 320, s
    assert s["fraction_last"] >= 0.85, s
    assert comm["diagnosis"] == "late_rank", comm["diagnosis"]
    assert max(c["skew_us"] for c in cols) >= 290, "skew"
    assert l and (l["host"], l["device"], l["local"], l["peer"], l["kind"]) == \
        ("nodeA", "eth1", "10.77.1.2", "10.77.1.3", "send"), l
    assert 0.2 <= l["ratio"] <= 0.3, l
    assert l["degraded_windows"] == 12, l
    assert n and (n["host"], n["device"]) == ("nodeA", "eth1"), n
    assert 0.3 <= n["ratio"] <= 0.5, n
    assert r["event_counts"].get("failover") == 1 and r["event_counts"].get("failback") == 1, r["event_counts"]
else:
    assert s is None and l is None and n is None, (s, l, n)
    assert comm["diagnosis"] == "together", comm["diagnosis"]
    assert max(c["skew_us"] for c in cols) <= 40, "skew"
PY
}

# check_trace FILE: parses, 8 trace processes (4 files x 2) with distinct pids and names.
check_trace() {
    python3 - "$1" <<'PY'
import json, sys

t = json.load(open(sys.argv[1]))
ev = t["traceEvents"]
names = [e for e in ev if e.get("ph") == "M" and e.get("name") == "process_name"]
assert len(names) == 8, names
assert len({e["pid"] for e in names}) == 8, "pids collide"
assert len({e["pid"] for e in ev}) == 8, "events outside the named processes"
got = sorted(e["args"]["name"] for e in names)
want = sorted([f"rank {r} comm 0x5f3c9a1e22b07d11 [{h}:{4000 + r}]" for r, h in enumerate(["nodeA"] * 2 + ["nodeB"] * 2)] +
              [f"rank 5 comm 0x00000000000000aa [{h}:{4000 + r}]" for r, h in enumerate(["nodeA"] * 2 + ["nodeB"] * 2)])
assert got == want, got
assert sum(1 for e in ev if e.get("ph") == "X" and e.get("name") == "AllReduce") == 20, "AllReduce events"
PY
}

# check_plots OUT OUTPUT: PNGs when matplotlib is importable (by python3 on PATH or
# /usr/bin/python3, which the report both tries), else the skip line.
check_plots() {
    if python3 -c 'import matplotlib' 2>/dev/null || /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
        for p in duration_over_time busbw_over_time; do
            [[ -s $1/$p.png ]] || fail "$1/$p.png missing or empty"
            [[ $(head -c 8 "$1/$p.png" | od -An -tx1 | tr -d ' \n') == 89504e470d0a1a0a ]] || fail "$p.png is not a PNG"
        done
    else
        grep -q '^plots: skipped' "$2" || fail "no plots and no skip line"
        echo "report: matplotlib not importable, PNG checks skipped"
    fi
}

# report OUT LOG INPUTS...: runs the report, exit status must be 0.
report() {
    local out=$1 log=$2
    shift 2
    local rc=0
    "$VIGIL" report --out "$out" "$@" >"$log" 2>"$log.err" || rc=$?
    [[ $rc == 0 ]] || { cat "$log" "$log.err" >&2; fail "vigil report exited $rc"; }
}
expect() { # LOG REGEX
    grep -qE "$2" "$1" || { cat "$1" >&2; fail "no line matching '$2'"; }
}

# 1. A late rank and a slow path.
gen "$TMP/late" late
report "$TMP/out1" "$TMP/log1" "$TMP/late"
expect "$TMP/log1" '^slowest rank: rank 2 \(host nodeB pid 4002\) in comm 0x5f3c9a1e22b07d11: last in 4[5-9] of 50'
expect "$TMP/log1" '^arrival: rank 2 arrives late \(host-side/desync\)'
expect "$TMP/log1" '^slowest link: host nodeA eth1 10\.77\.1\.2 -> 10\.77\.1\.3 send: busy bandwidth 1\.[0-9]+ GB/s, 0\.2[0-9]x'
expect "$TMP/log1" '^slowest link: .* 12 of 20 windows degraded; events naming it: 1 degraded, 1 failback, 1 failover$'
expect "$TMP/log1" '^slowest nic: host nodeA eth1 10\.77\.1\.2: busy bandwidth [0-9.]+ GB/s, 0\.[34][0-9]x'
expect "$TMP/log1" '^events: 1 failover, 1 failback'
check_json "$TMP/out1/report.json" late
check_trace "$TMP/out1/merged.trace.json"
check_plots "$TMP/out1" "$TMP/log1"

# 2. Nothing stands out (and --no-plots writes none).
gen "$TMP/even" even
report "$TMP/out2" "$TMP/log2" --no-plots --top 3 "$TMP/even"
expect "$TMP/log2" '^slowest rank: none stands out'
expect "$TMP/log2" '^slowest link: none stands out'
expect "$TMP/log2" '^slowest nic: none stands out'
expect "$TMP/log2" '^arrival: all ranks arrive together'
check_json "$TMP/out2/report.json" even
[[ ! -e $TMP/out2/duration_over_time.png ]] || fail "--no-plots wrote a plot"

# 3. Without telemetry files the profiler's net windows decide (device indices only).
mkdir "$TMP/prof"
cp "$TMP"/late/vigil-prof-* "$TMP/prof/"
report "$TMP/out3" "$TMP/log3" --no-plots "$TMP/prof"
expect "$TMP/log3" '^slowest link: host nodeA pid 4000 rank 0 dev 1 primary: '
expect "$TMP/log3" '^slowest nic: host nodeA dev 1: '

# 4. Truncated last lines, an unknown record type, a truncated trace, stray files.
cp -r "$TMP/late" "$TMP/bad"
printf '{"type":"mystery","x":[1,2]}\n{"type":"coll","comm":"0x5f3c9a1e22b07d11","rank":1,"seq":7' \
    >>"$TMP/bad/vigil-prof-nodeA-4001.jsonl"
printf '{"type":"window","path":0,"seq":99,"start_' >>"$TMP/bad/vigil-nodeB-5002.jsonl"
f="$TMP/bad/vigil-prof-nodeB-4003-1.trace.json"
head -c "$(($(stat -c %s "$f") - 40))" "$f" >"$f.cut" && mv "$f.cut" "$f"
: >"$TMP/bad/vigil-prof-nodeC-1.jsonl"
echo garbage >"$TMP/bad/notes.txt"
report "$TMP/out4" "$TMP/log4" --no-plots "$TMP/bad"
expect "$TMP/log4" '^warning: 2 unparsable lines skipped'
expect "$TMP/log4" '^note: 1 records of unknown type ignored'
expect "$TMP/log4.err" 'vigil-prof-nodeB-4003-1.trace.json: not valid JSON .*salvaged'
expect "$TMP/log4" '^slowest rank: rank 2 '
expect "$TMP/log4" '^slowest link: host nodeA eth1 10\.77\.1\.2 -> 10\.77\.1\.3 send'
python3 -c 'import json,sys; json.load(open(sys.argv[1])); json.load(open(sys.argv[2]))' \
    "$TMP/out4/report.json" "$TMP/out4/merged.trace.json" || fail "outputs of the damaged set do not parse"

# 5. One communicator with several functions whose sequence numbers overlap, as NCCL counts
# seqNumber per function: AllReduce 0..19, Broadcast 0..19 and ReduceScatter 0..9 interleaved.
# Each is its own collective on 4 ranks; nothing is a duplicate.
python3 - "$TMP/mixed" <<'PY'
import json, os, sys
d = sys.argv[1]
os.makedirs(d)
COMM, T0 = "0x00000000000000c4", 1763712000000000.0
plan = []  # (func, seq, bytes), in issue order
for i in range(20):
    plan += [("AllReduce", i, 1 << 20), ("Broadcast", i, 4096)]
    if i % 2 == 0:
        plan.append(("ReduceScatter", i // 2, 1 << 16))
for r in range(4):
    with open(f"{d}/vigil-prof-node{r}-{100 + r}.jsonl", "w") as f:
        f.write(json.dumps({"type": "process", "host": f"node{r}", "pid": 100 + r, "version": "0.1.0",
                            "abi": "v5"}) + "\n")
        for k, (func, seq, b) in enumerate(plan):
            rec = {"type": "coll", "comm": COMM, "rank": r, "nranks": 4, "seq": seq,
                   "func": func, "bytes": b, "start_us": T0 + k * 1000 + r,
                   "duration_us": 100.0 + (b >> 14), "busbw_GBps": 1.0, "timing": "kernel_gpu"}
            if r == 3 and func == "ReduceScatter":  # kernel stamps the profiler could not trust
                rec.update({"duration_us": None, "timing": "invalid", "channels_invalid": 2})
                del rec["busbw_GBps"]
            f.write(json.dumps(rec) + "\n")
PY
report "$TMP/out6" "$TMP/log6" --no-plots "$TMP/mixed"
! grep -q 'duplicate collective records' "$TMP/log6" || fail "functions merged: $(grep duplicate "$TMP/log6")"
python3 - "$TMP/out6/report.json" <<'PY' || fail "collectives of different functions were merged"
import collections, json, sys
r = json.load(open(sys.argv[1]))
cols = r["collectives"]
count = collections.Counter(c["func"] for c in cols)
assert count == {"AllReduce": 20, "Broadcast": 20, "ReduceScatter": 10}, count
assert all(c["ranks_seen"] == 4 for c in cols), [c for c in cols if c["ranks_seen"] != 4][:2]
sizes = {(c["func"], c["bytes"]) for c in cols}
assert sizes == {("AllReduce", 1 << 20), ("Broadcast", 4096), ("ReduceScatter", 1 << 16)}, sizes
assert r["inputs"]["duplicate_records"] == 0, r["inputs"]
(comm,) = r["comms"]
assert comm["complete"] == 50, comm
# Untimed records count as arrivals, not as zero durations.
r3 = next(x for x in comm["ranks"] if x["rank"] == 3)
assert abs(r3["mean_duration_us"] - (20 * 164.0 + 20 * 100.0) / 40) < 1e-6, r3
s3 = next(x for x in r["series"] if x["rank"] == 3)
assert s3["duration_us"].count(None) == 10, s3["duration_us"]
PY

# 6. Usage errors and no input: exit 2, nothing written.
rc=0; "$VIGIL" report --out "$TMP/out5" "$TMP/nonexistent" >/dev/null 2>"$TMP/err5" || rc=$?
[[ $rc == 2 ]] || fail "missing directory: exit $rc, wanted 2"
grep -q 'no such file or directory' "$TMP/err5" || fail "missing directory not named: $(cat "$TMP/err5")"
[[ ! -e $TMP/out5 ]] || fail "output written without input"
rc=0; "$VIGIL" report --bogus "$TMP/late" >/dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "unknown option: exit $rc, wanted 2"
rc=0; "$VIGIL" report >/dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "no directory: exit $rc, wanted 2"
echo "report: ok"
