#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The verdicts of scripts/gpu_check.sh, from what its ranks wrote (WORK/res/*.json), the
# profiler's summaries (WORK/prof-*/) and the lab's telemetry (WORK/lab-telemetry/).
#   usage: gpu_report.py WORK OUT_JSON OUT_TXT [--phases LIST] [--device cuda|cpu]
#   exit 0 when every check of the phases run passed, else 1
import argparse
import glob
import json
import os
import statistics
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def ranks_of(work, name):
    out = []
    for p in sorted(glob.glob(f"{work}/res/{name}.rank*.json")):
        out.append(load(p) or {"ok": False, "error": f"unreadable {os.path.basename(p)}"})
    return out


def summary_records(profdir, rank=0):
    """The coll records of `rank` from a profiler directory (one summary per process)."""
    recs, stats = [], []
    for p in sorted(glob.glob(f"{profdir}/vigil-prof-*.jsonl")):
        lines = []
        with open(p) as f:
            for line in f:
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    pass
        if any(r.get("type") == "comm" and r.get("rank") == rank for r in lines):
            recs += [r for r in lines if r.get("type") == "coll" and r.get("rank") == rank]
            stats += [r for r in lines if r.get("type") == "stats"]
    return recs, stats


class Report:
    def __init__(self):
        self.checks, self.data, self.lines = [], {}, []

    def check(self, name, ok, detail=""):
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        self.lines.append(f"  [{'PASS' if ok else 'FAIL'}] {name}{': ' + detail if detail else ''}")

    def say(self, text):
        self.lines.append(text)


def phase_collectives(work, rep):
    rep.say("collectives (every torch.distributed collective against the CPU)")
    out = {}
    for name, n in (("coll2", 2), ("coll4", 4)):
        rs = ranks_of(work, name)
        failed = [f for r in rs for f in r.get("failed", [])]
        errors = [r.get("error") for r in rs if r.get("error")]
        cases = sum(r.get("cases", 0) for r in rs)
        ok = len(rs) == n and all(r.get("ok") for r in rs)
        out[name] = {"ranks": len(rs), "cases": cases, "failed": failed[:20], "errors": errors}
        rep.check(f"{n} ranks: {cases} results exact", ok,
                  "; ".join(errors) or (f"{len(failed)} wrong, first {failed[:3]}" if failed else ""))
    rep.data["collectives"] = out


def phase_ddp(work, rep, device):
    rep.say("DDP training (30 steps, fixed seeds)")
    v, s = ranks_of(work, "ddp-vigil"), ranks_of(work, "ddp-socket")
    ok_v = len(v) == 2 and all(r.get("ok") for r in v)
    same_ranks = ok_v and len({r["param_sha256"] for r in v}) == 1
    rep.check("Vigil: both ranks end with the same parameters", same_ranks,
              "; ".join(r.get("error", "") for r in v if r.get("error")))
    data = {"vigil": [{k: r.get(k) for k in ("param_sha256", "parameters", "error")} for r in v]}
    if device == "cuda":
        ok_s = len(s) == 2 and all(r.get("ok") for r in s)
        identical = ok_v and ok_s and all(a.get("losses") == b.get("losses") and
                                          a.get("param_sha256") == b.get("param_sha256")
                                          for a, b in zip(v, s))
        rep.check("Vigil and NCCL Socket: every loss and the final parameters bit-identical", identical,
                  f"digests {v[0].get('param_sha256', '?')[:12]} / {s[0].get('param_sha256', '?')[:12]}"
                  if v and s else "missing ranks")
        data["socket"] = [{k: r.get(k) for k in ("param_sha256", "error")} for r in s]
    rep.data["ddp"] = data


def phase_tuner(work, rep):
    rep.say("tuner (rules file: every all-reduce RING/LL/2 channels)")
    none, _ = summary_records(f"{work}/prof-tuner-none")
    rules, _ = summary_records(f"{work}/prof-tuner-rules")
    choice = lambda r: (r.get("algo"), r.get("proto"), r.get("channels"))
    ar_none = [choice(r) for r in none if r.get("func") == "AllReduce"]
    ar_rules = [choice(r) for r in rules if r.get("func") == "AllReduce"]
    want = ("RING", "LL", 2)
    rep.data["tuner"] = {"without": sorted({str(c) for c in ar_none}), "with": sorted({str(c) for c in ar_rules})}
    rep.check("with the rules, every all-reduce is RING/LL on 2 channels",
              ar_rules and all(c == want for c in ar_rules), f"{len(ar_rules)} records: {set(ar_rules)}")
    rep.check("without them NCCL chose otherwise (the rules changed something)",
              ar_none and any(c != want for c in ar_none), f"{set(ar_none)}")


def align(calls, recs):
    """Pairs each timed call with its summary record: per function, the records in seq order
    whose sizes match the calls' sizes in order, the last such run (torch may issue its own
    collectives before)."""
    pairs = []
    for func in sorted({c["func"] for c in calls}):
        mine = [c for c in calls if c["func"] == func]
        rs = sorted((r for r in recs if r.get("func") == func), key=lambda r: r.get("seq", 0))
        sizes = [c["bytes"] for c in mine]
        best = None
        for o in range(0, len(rs) - len(mine) + 1):
            if [r.get("bytes") for r in rs[o:o + len(mine)]] == sizes:
                best = o
        if best is None:
            pairs += [(c, None) for c in mine]
        else:
            pairs += list(zip(mine, rs[best:best + len(mine)]))
    return pairs


def phase_timing(work, rep):
    rep.say("profiler durations against CUDA events (each call synchronised)")
    rs = ranks_of(work, "timing")
    r0 = next((r for r in rs if r.get("rank") == 0), None)
    recs, stats = summary_records(f"{work}/prof-timing")
    if not r0 or not r0.get("ok"):
        rep.check("the timing program ran", False, (r0 or {}).get("error", "no rank 0 result"))
        return
    rows, bad = [], []
    for c, r in align(r0["calls"], recs):
        if c.get("warmup"):
            continue
        cuda = c["cuda_us"]
        dur = r.get("duration_us") if r else None
        ok = dur is not None and r.get("timing") == "kernel_gpu" and abs(dur - cuda) <= max(0.10 * cuda, 20.0)
        rows.append({"func": c["func"], "bytes": c["bytes"], "cuda_us": round(cuda, 3), "duration_us": dur,
                     "timing": r.get("timing") if r else None, "kernel_us": r.get("kernel_us") if r else None,
                     "queue_us": r.get("queue_us") if r else None, "ok": ok})
        if not ok:
            bad.append(rows[-1])
    st = stats[-1] if stats else {}
    rep.data["timing"] = {"calls": rows, "stats": st}
    rep.check(f"{len(rows) - len(bad)} of {len(rows)} durations within 10 % (or 20 us) of CUDA events",
              rows and not bad, f"first misses {bad[:3]}" if bad else "")
    rep.check("no zero durations", all((x["duration_us"] or 0) > 0 for x in rows))
    rep.check("no orphans, no kernel timeouts, no anomalies in a clean run",
              st and st.get("orphans") == 0 and st.get("kernel_timeouts") == 0 and st.get("kernel_anomalies") == 0,
              json.dumps({k: st.get(k) for k in ("orphans", "kernel_timeouts", "kernel_anomalies")}))
    by = {}
    for x in rows:
        by.setdefault((x["func"], x["bytes"]), []).append(x)
    for (f, b), xs in sorted(by.items()):
        med = lambda k: statistics.median(x[k] for x in xs if x[k] is not None) if any(
            x[k] is not None for x in xs) else float("nan")
        rep.say(f"    {f:<14} {b:>10} B  cuda {med('cuda_us'):>10.1f} us  profiler {med('duration_us'):>10.1f} us")


def phase_bandwidth(work, rep):
    rep.say("bus bandwidth, all-reduce, GB/s (Vigil / NCCL Socket with 4 threads x 4 sockets)")
    table = []
    for ch in (2, 4, 8, 16):
        v, s = ranks_of(work, f"bw-vigil-{ch}"), ranks_of(work, f"bw-socket-{ch}")
        rv = next((r for r in v if r.get("rank") == 0), {})
        rsk = next((r for r in s if r.get("rank") == 0), {})
        # Vigil with one progress thread (optional: older runs lack it).
        r1 = next((r for r in ranks_of(work, f"bw-vigil1-{ch}") if r.get("rank") == 0), {})
        one = {x["bytes"]: x["busbw_GBps"] for x in r1.get("results", [])}
        for a, b in zip(rv.get("results", []), rsk.get("results", [])):
            table.append({"channels": ch, "bytes": a["bytes"], "vigil": a["busbw_GBps"], "socket": b["busbw_GBps"],
                          "vigil_1thread": one.get(a["bytes"]),
                          "ratio": a["busbw_GBps"] / b["busbw_GBps"] if b["busbw_GBps"] else None})
            alone = f", one thread {one[a['bytes']]:.3f}" if a["bytes"] in one else ""
            rep.say(f"    {ch} channels {a['bytes'] >> 20:>4} MiB: Vigil {a['busbw_GBps']:.3f}, "
                    f"Socket {b['busbw_GBps']:.3f} ({table[-1]['ratio']:.2f}x){alone}")
    rep.data["bandwidth"] = table
    rep.check("measured at 2, 4, 8 and 16 channels, 64 and 256 MiB", len(table) == 8)
    # A benchmark target, not a correctness check: reported, never failing the run.
    met = sum(1 for t in table if t["ratio"] is not None and t["ratio"] >= 1.0)
    rep.say(f"    Vigil >= 1.0x NCCL Socket at {met} of {len(table)} points")
    rep.data["bandwidth_target_met"] = met


def lab_numbers(work, name):
    rs = ranks_of(work, name)
    r0 = next((r for r in rs if r.get("rank") == 0), None)
    faults = {}
    try:
        for line in open(f"{work}/res/{name}.faults"):
            k, t = line.split()
            faults[k] = float(t)
    except OSError:
        pass
    if not r0 or "iters" not in r0:
        return {"ok": False, "error": (r0 or {}).get("error", "no result"), "faults": faults}
    it = r0["iters"]  # [end time, ms]

    def window(t0, t1):  # iterations that ran at some time in [t0, t1]
        return [ms for end, ms in it if end >= t0 and end - ms / 1e3 <= t1]
    healthy = window(it[0][0], faults.get("fail", it[-1][0]))
    failw = window(faults.get("fail", 0), faults.get("restore", 0) + 2) if "fail" in faults else []
    degw = window(faults.get("degrade", 0), faults.get("undegrade", 0)) if "degrade" in faults else []
    span = lambda a, b: max(b - a, 1e-9)
    return {"ok": all(r.get("ok") for r in rs) and len(rs) == 2, "iterations": r0.get("iterations"),
            "wrong": sum(r.get("wrong", 0) for r in rs), "faults": faults,
            "healthy_median_ms": statistics.median(healthy) if healthy else None,
            "longest_during_failure_ms": max(failw) if failw else None,
            "iters_per_s_healthy": len(healthy) / span(it[0][0], faults["fail"]) if "fail" in faults else None,
            "iters_per_s_degraded": len(degw) / span(faults["degrade"], faults["undegrade"])
            if "undegrade" in faults else None,
            "errors": [r.get("error") for r in rs if r.get("error")]}


def phase_lab(work, rep, device):
    rep.say("lab: 2 hosts x 2 ports, validated 16 MiB all-reduce loop through a port failure "
            "(4 s) and a degraded port (300 Mbit/s, 4 s)")
    if not glob.glob(f"{work}/res/lab-vigil.rank*.json"):
        rep.check("the lab ran (root, ip and tc)", False, "no results: see the log")
        return
    v = lab_numbers(work, "lab-vigil")
    data = {"vigil": v}
    rep.check("Vigil: every iteration exact, no error", v["ok"] and v.get("wrong") == 0,
              "; ".join(e for e in v.get("errors", []) if e) or f"{v.get('iterations')} iterations")
    events = {}
    for p in glob.glob(f"{work}/lab-telemetry/*.jsonl*"):
        for line in open(p):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("type") == "event":
                events[r.get("event")] = events.get(r.get("event"), 0) + 1
    data["vigil_events"] = events
    if device == "cuda":  # the --cpu dry run moves its bytes with gloo: no Vigil to judge
        rep.check("the port failure was taken over (failover and failback events)",
                  events.get("failover", 0) > 0 and events.get("failback", 0) > 0, json.dumps(events))
        rep.check("the shaped port was flagged degraded", events.get("degraded", 0) > 0, json.dumps(events))
        s = lab_numbers(work, "lab-socket")
        data["socket"] = s
        rep.say(f"    longest iteration during the failure: Vigil {v.get('longest_during_failure_ms')} ms, "
                f"NCCL Socket {s.get('longest_during_failure_ms')} ms; healthy median "
                f"{v.get('healthy_median_ms')} / {s.get('healthy_median_ms')} ms; iterations/s while "
                f"degraded {v.get('iters_per_s_degraded')} / {s.get('iters_per_s_degraded')}")
    rep.data["lab"] = data


def main():
    p = argparse.ArgumentParser()
    p.add_argument("work")
    p.add_argument("json_out")
    p.add_argument("txt_out")
    p.add_argument("--phases", default="collectives,ddp,tuner,timing,bandwidth,lab")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    phases = a.phases.split(",")
    rep = Report()
    try:
        rep.data["versions"] = open(f"{a.work}/versions.txt").read().strip()
    except OSError:
        pass
    for name, fn in (("collectives", lambda: phase_collectives(a.work, rep)),
                     ("ddp", lambda: phase_ddp(a.work, rep, a.device)),
                     ("tuner", lambda: phase_tuner(a.work, rep)),
                     ("timing", lambda: phase_timing(a.work, rep)),
                     ("bandwidth", lambda: phase_bandwidth(a.work, rep)),
                     ("lab", lambda: phase_lab(a.work, rep, a.device))):
        if name not in phases:
            continue
        if a.device != "cuda" and name in ("tuner", "timing", "bandwidth"):
            rep.say(f"{name}: skipped (no GPU: --cpu dry run)")
            continue
        try:
            fn()
        except Exception as e:  # a phase's broken inputs are its failure, not the report's
            rep.check(f"{name}: results readable", False, f"{type(e).__name__}: {e}")
    failed = [c for c in rep.checks if not c["ok"]]
    rep.data.update({"device": a.device, "checks": rep.checks, "passed": len(rep.checks) - len(failed),
                     "failed": len(failed)})
    with open(a.json_out, "w") as f:
        json.dump(rep.data, f, indent=1)
    with open(a.txt_out, "w") as f:
        f.write("\n".join(rep.lines + [f"gpu_check: {len(rep.checks) - len(failed)} passed, {len(failed)} failed"]) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
