#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One row of the port-cut table of a fanout run (scripts/bench_scale.sh on TCP,
scripts/rxe/bench.sh's scale mode on verbs).

Usage: fanout_cut.py --header
       fanout_cut.py SENDER_OUT RECEIVER_OUT CUT_S RESTORE_S

SENDER_OUT and RECEIVER_OUT are vigil-netbench --workload fanout --duration outputs (rank 0's
summary, rank 1's "# round" and "# took" lines); CUT_S and RESTORE_S are when the port went
down and came back, in seconds of CLOCK_MONOTONIC (the clock the rounds are timed on).
Columns: the rounds and their median time; failover: from the cut to each in-flight
connection's message landing, ms, p50/p99 over the connections in flight at the cut
(inflight), beside the same point of the rounds before the cut (healthy); restore: the
slowest round in progress within 2 s of the restore (failback waits VIGIL_FAILBACK_HOLD_MS),
its time and its connections' completion times p50/p99, ms; and the slowest round of the run
(when it began, from the first round). Exits non-zero when the run reported errors.
"""
import sys

if sys.argv[1:] == ["--header"]:
    print("# failover: from the cut to each in-flight connection's message landing, ms, p50/p99 over the\n"
          "# connections in flight at the cut (inflight); healthy: the same point of the rounds before\n"
          "# the cut; restore: the slowest round in progress within 2 s of the restore (failback waits\n"
          "# VIGIL_FAILBACK_HOLD_MS), its time and its connections' completion times p50/p99, ms; and the\n"
          "# slowest round of the run (when it began, from the first round)")
    print("%6s | %6s %9s | %8s %8s %8s | %8s %8s | %8s %8s %8s | %8s %8s" % (
        "conns", "rounds", "median_ms", "inflight", "fo_p50", "fo_p99", "ok_p50", "ok_p99", "restore", "p50",
        "p99", "worst_ms", "worst_at"))
    sys.exit(0)

import json, re
d = next(json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"type":"fanout"'))
s = [l for l in open(sys.argv[1]) if l.startswith('{"ok"')]
assert s and json.loads(s[-1])["errors"] == 0, "errors in the run"
r = d["recv"]
lines = open(sys.argv[2]).read().splitlines()
parsed = [m.groups() for m in
          (re.match(r"# round (\d+) at (\S+) took (\S+) ms, connections p50 (\S+) p99 (\S+) ms", l)
           for l in lines) if m]
ids = [int(g[0]) for g in parsed]                             # each round's number, in order
rounds = [tuple(float(x) for x in g[1:]) for g in parsed]      # (at, ms, p50, p99)
took = {int(l.split()[2]): [float(x) for x in l.split()[3:]] for l in lines if l.startswith("# took ")}
def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")
def after(k, off_ms):
    # Each connection of round k still in flight `off_ms` into the round: how much longer it took.
    return [x - off_ms for x in took[ids[k]] if x > off_ms]
def failover(cut):
    # The first round that ends after the cut (the cut may fall between two rounds: all of the
    # next one's connections are then in flight from its start).
    k = next((i for i, x in enumerate(rounds) if x[0] + x[1] / 1e3 > cut), None)
    if k is None:
        return f'{"-":>8} {"-":>8} {"-":>8} | {"-":>8} {"-":>8}'
    off = (cut - rounds[k][0]) * 1e3
    hit = after(k, off)
    ok = [y for i in range(1, k) for y in after(i, max(off, 0.0))] # round 0 aside: warm-up
    f = lambda v, q: f"{pct(v, q):8.1f}" if v else f'{"-":>8}'
    return f"{len(hit):8d} {f(hit, 0.5)} {f(hit, 0.99)} | {f(ok, 0.5)} {f(ok, 0.99)}"
def slowest(t0, t1):
    # The slowest round in progress at some time in [t0, t1].
    hit = [x for x in rounds if x[0] < t1 and x[0] + x[1] / 1e3 > t0]
    if not hit:
        return f'{"-":>8} {"-":>8} {"-":>8}'
    at, ms, p50, p99 = max(hit, key=lambda x: x[1])
    return f"{ms:8.1f} {p50:8.1f} {p99:8.1f}"
cut, restore = float(sys.argv[3]), float(sys.argv[4])
print(f'{d["conns"]:6d} | {r["rounds"]:6d} {r["round_p50_us_per_conn"] * d["conns"] / 1e3:9.1f} | '
      f'{failover(cut)} | {slowest(restore, restore + 2)} | '
      f'{r["worst_round_ms"]:8.1f} {r["worst_round_at_s"]:7.1f}s')
