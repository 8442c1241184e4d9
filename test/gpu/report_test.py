#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# gpu_report.py's verdicts on synthetic results shaped like a GPU run's (which CI never has):
# a run where everything holds passes; a profiler duration 30 % off its CUDA-event time, a
# tuner rule that changed nothing, a wrong collective and a port failure never taken over
# each fail their own check, and only it.
#   usage: report_test.py GPU_REPORT_PY
import json
import os
import subprocess
import sys
import tempfile

REPORT = sys.argv[1]


def put(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        if isinstance(obj, list):
            f.write("".join(json.dumps(o) + "\n" for o in obj))
        else:
            json.dump(obj, f)


def summary(d, rank, colls, stats=None):
    recs = [{"type": "process", "host": "gpu", "pid": 100 + rank},
            {"type": "comm", "comm": "0xc0", "rank": rank, "nranks": 2}]
    recs += [dict(c, type="coll", comm="0xc0", rank=rank) for c in colls]
    recs.append(stats or {"type": "stats", "orphans": 0, "kernel_timeouts": 0, "kernel_anomalies": 0})
    put(f"{d}/vigil-prof-gpu-{100 + rank}.jsonl", recs)


def work_dir(root, *, timing_off=False, tuner_noop=False, wrong=False, no_failover=False):
    w = f"{root}/work"
    for name, n in (("coll2", 2), ("coll4", 4)):
        for r in range(n):
            failed = [{"case": "broadcast", "dtype": "bf16", "elements": 1023, "ok": False, "wrong": 3}] \
                if wrong and name == "coll4" and r == 2 else []
            put(f"{w}/res/{name}.rank{r}.json", {"case": "collectives", "ok": not failed, "cases": 90,
                                                  "failed": failed, "rank": r})
    for t in ("vigil", "socket"):
        for r in range(2):
            put(f"{w}/res/ddp-{t}.rank{r}.json", {"ok": True, "losses": ["0x1.2p+1"] * 30,
                                                  "param_sha256": "ab" * 32, "rank": r})
    # Tuner: NCCL's own choice, and the rules' (or, broken, the same as NCCL's).
    rules = ("RING", "SIMPLE", 4) if tuner_noop else ("RING", "LL", 2)
    for d, (algo, proto, ch) in (("prof-tuner-none", ("RING", "SIMPLE", 4)), ("prof-tuner-rules", rules)):
        summary(f"{w}/{d}", 0, [{"func": "AllReduce", "seq": i, "bytes": 1024, "algo": algo, "proto": proto,
                                 "channels": ch} for i in range(16)])
    # Timing: two calls of torch's own first, then warm-up + 5 timed calls per size.
    calls, recs, seq = [], [], 0
    for extra in range(2):
        recs.append({"func": "AllReduce", "seq": seq, "bytes": 4, "duration_us": 9.0, "timing": "kernel_gpu"})
        seq += 1
    for size, us in ((4, 8.0), (1 << 20, 600.0), (256 << 20, 150000.0)):
        for k in range(6):
            cuda = us * (1 + 0.01 * k)
            calls.append({"func": "AllReduce", "bytes": size, "cuda_us": cuda, "warmup": k == 0})
            dur = cuda * (1.3 if timing_off and size == 1 << 20 and k == 3 else 0.98)
            recs.append({"func": "AllReduce", "seq": seq, "bytes": size, "duration_us": dur,
                         "timing": "kernel_gpu", "kernel_us": dur, "queue_us": 3.0})
            seq += 1
    for r in range(2):
        put(f"{w}/res/timing.rank{r}.json", {"ok": True, "rank": r, "calls": calls})
    summary(f"{w}/prof-timing", 0, recs)
    for ch in (2, 4, 8, 16):
        for t, bw in (("vigil", 1.8), ("socket", 1.85), ("vigil1", 1.7)):
            put(f"{w}/res/bw-{t}-{ch}.rank0.json", {"ok": True, "rank": 0, "results": [
                {"bytes": 64 << 20, "busbw_GBps": bw}, {"bytes": 256 << 20, "busbw_GBps": bw}]})
    # Lab: 18 s at 75 iterations/s; Socket stalls 6.6 s at the failure.
    t0 = 1000.0
    faults = {"fail": t0 + 3, "restore": t0 + 7, "degrade": t0 + 10, "undegrade": t0 + 14}
    for t, stall in (("vigil", 0.02), ("socket", 6.6)):
        iters, now, stalled = [], t0, False
        while now < t0 + 18:
            ms = 13.3
            if now >= faults["fail"] and not stalled:  # the first iteration after the failure
                ms, stalled = stall * 1e3, True
            now += ms / 1e3
            iters.append([now, ms])
        for r in range(2):
            put(f"{w}/res/lab-{t}.rank{r}.json", {"ok": True, "rank": r, "iterations": len(iters),
                                                  "wrong": 0, "iters": iters})
        with open(f"{w}/res/lab-{t}.faults", "w") as f:
            f.write("".join(f"{k} {v}\n" for k, v in faults.items()))
    events = [{"type": "event", "event": "degraded"}]
    if not no_failover:
        events += [{"type": "event", "event": "failover"}, {"type": "event", "event": "failback"}]
    put(f"{w}/lab-telemetry/vigil-gpu-1.jsonl", events)
    with open(f"{w}/versions.txt", "w") as f:
        f.write("torch 2.11.0 nccl 2.28.9\n")
    return w


def verdicts(w, root):
    rc = subprocess.run([sys.executable, REPORT, w, f"{root}/r.json", f"{root}/r.txt"]).returncode
    with open(f"{root}/r.json") as f:
        r = json.load(f)
    return rc, {c["check"]: c["ok"] for c in r["checks"]}, r


def main():
    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as root:
        rc, checks, r = verdicts(work_dir(root), root)
        expect(rc == 0 and all(checks.values()), f"a good run fails: {checks}")
        expect(len(checks) >= 12, f"only {len(checks)} checks")
        expect(len(r["timing"]["calls"]) == 15, f"{len(r['timing']['calls'])} timed calls aligned, wanted 15")
        expect(r["lab"]["socket"]["longest_during_failure_ms"] == 6600.0, str(r["lab"]["socket"]))
    cases = {"timing_off": "durations within", "tuner_noop": "with the rules", "wrong": "4 ranks",
             "no_failover": "taken over"}
    for flag, which in cases.items():
        with tempfile.TemporaryDirectory() as root:
            rc, checks, _ = verdicts(work_dir(root, **{flag: True}), root)
            bad = [k for k, ok in checks.items() if not ok]
            expect(rc == 1, f"{flag}: exit {rc}")
            expect(len(bad) == 1 and which in bad[0], f"{flag}: failed checks {bad}")
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    print("gpu report: ok" if not failures else f"gpu report: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
