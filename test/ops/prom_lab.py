# SPDX-License-Identifier: Apache-2.0
"""What an operator sees, judged through a real Prometheus's HTTP API (test/ops/prometheus.sh).

  prom_lab.py phases ARGS   drives the fault sequence on one port (healthy -> degraded ->
                            failed -> restored) and checks each phase's metrics and alerts as
                            Prometheus reports them; writes the phases' times to --state
  prom_lab.py final ARGS    after the job: every family has series, no counter ever went
                            down, every dashboard query and variable returns series; with
                            --png, draws the dashboard's panels from the same queries

Every wait is for an event Prometheus reports, bounded by a generous deadline (a slow host
waits longer, it does not fail); nothing is judged by how long something took.
"""
import argparse
import json
import math
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request

# Families only the RDMA fabric fills (hardware counters of its ports): the TCP lab has none.
VERBS_ONLY = {"vigil_port_retransmits_total", "vigil_port_seq_errors_total",
              "vigil_port_out_of_sequence_total", "vigil_port_retry_exceeded_total"}


def log(msg):
    print(f"prom_lab: {msg}", flush=True)


def fail(msg):
    print(f"FAIL: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


class Prom:
    """A Prometheus server's HTTP API (/api/v1): instant and range queries, alerts, labels."""

    def __init__(self, url):
        self.url = url.rstrip("/")

    def _get(self, path, **params):
        q = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=30) as r:
            body = json.load(r)
        if body.get("status") != "success":
            fail(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr, t=None):
        params = {"query": expr}
        if t is not None:
            params["time"] = f"{t:.3f}"
        return self._get("/api/v1/query", **params)["result"]

    def value(self, expr, t=None):
        """The value of a query that yields one series; None when it yields none."""
        r = self.query(expr, t)
        if len(r) > 1:
            fail(f"{expr}: {len(r)} series, wanted one")
        return float(r[0]["value"][1]) if r else None

    def query_range(self, expr, start, end, step):
        return self._get("/api/v1/query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                         step=f"{step}s")["result"]

    def alerts(self):
        return self._get("/api/v1/alerts")["alerts"]

    def label_values(self, label, match):
        return self._get(f"/api/v1/label/{label}/values", **{"match[]": match})

    def ready(self):
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False


def wait(what, pred, timeout):
    """Calls pred() until it returns something true, every 0.5 s; fails after `timeout` s."""
    end = time.monotonic() + timeout
    while True:
        r = pred()
        if r:
            return r
        if time.monotonic() > end:
            fail(f"no {what} within {timeout} s")
        time.sleep(0.5)


def firing(prom, name, **labels):
    return [a for a in prom.alerts() if a["labels"].get("alertname") == name and a["state"] == "firing"
            and all(a["labels"].get(k) == v for k, v in labels.items())]


def sel(**labels):
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def phases(a):
    prom = Prom(a.prom)
    wait("Prometheus ready", prom.ready, 120)
    cut = {"instance": a.instance, "device": a.device}
    send = dict(cut, kind="send")
    netlab = lambda *args: subprocess.run([a.netlab, *args], check=True)
    state = {"start": time.time()}

    # Every exporter is scraped and every rank is seen.
    wait(f"{a.hosts} exporters up", lambda: prom.value('sum(up{job="vigil"})') == a.hosts, 120)
    wait(f"{a.hosts} ranks' registries",
         lambda: prom.value('sum(vigil_exporter_segments{kind="registry"})') == a.hosts, 120)
    ranks = {r["metric"].get("rank") for r in prom.query("vigil_port_bytes_total")}
    if ranks != {str(r) for r in range(a.hosts)}:
        fail(f"ranks labelled {sorted(ranks, key=str)}, wanted 0..{a.hosts - 1} (from RANK)")
    # The cut port's send paths judge (their baseline is learned): a cut before that would be
    # learned as the port's normal rate.
    wait(f"a baseline on {a.instance} {a.device}",
         lambda: prom.value(f'min(vigil_path_baseline_bandwidth_bytes{{{sel(**send, slot="primary")}}})'), 180)
    # The exposition as one exporter serves it, for promtool.
    with urllib.request.urlopen(f"http://{a.instance}:{a.exporter_port}/metrics", timeout=30) as r:
        open(a.exposition, "wb").write(r.read())
    state["healthy"] = time.time()
    time.sleep(3 * a.scrape_s)
    # Shares are judged on the port's primary paths: the connections whose own port it is.
    prim = dict(send, slot="primary")
    share_healthy = wait("a share of the cut port's primary send paths",
                         lambda: prom.value(f'avg(avg_over_time(vigil_path_share{{{sel(**prim)}}}[5s]))'), 60)
    log(f"healthy: {a.instance} {a.device} carries {share_healthy:.2f} of its connections' sent bytes")
    for c in ("failovers", "failbacks"):
        n = prom.value(f"sum(vigil_port_{c}_total)")
        if n:
            fail(f"{n:g} {c} before any fault")
    degraded_before = prom.value(f'sum(vigil_port_degraded_total{{{sel(**send)}}})')
    if degraded_before:
        # The detector's own false alarms (a saturated host) are its tests' concern
        # (test/fault/telemetry.sh busy cases); here the cut must add verdicts.
        log(f"note: {degraded_before:g} degraded verdicts on {a.instance} {a.device} before the cut")

    # Degraded: verdicts added on the cut port's send paths, the alert, the share following the
    # cut, and no failover.
    was_firing = firing(prom, "VigilPathDegraded", **send)
    state["degraded"] = time.time()  # before the change: a scrape may see it at once
    netlab("degrade", str(a.host), str(a.port), a.cut_rate)
    wait(f"a degraded verdict counted on {a.instance} {a.device}",
         lambda: prom.value(f'sum(vigil_port_degraded_total{{{sel(**send)}}})') > degraded_before, 180)
    alert = wait(f"VigilPathDegraded firing for {a.instance} {a.device}",
                 lambda: firing(prom, "VigilPathDegraded", **send), 300)
    active = min(x["activeAt"] for x in alert)
    log(f"degraded: VigilPathDegraded firing since {active}: {alert[0]['labels']}" +
        (" (already before the cut: the detector's false alarms)" if was_firing else ""))
    # Multipath gives the cut port less of each connection's bytes: its share falls.
    share_cut = wait(f"the share of {a.instance} {a.device} falling below {0.85 * share_healthy:.2f}",
                     lambda: (v := prom.value(f'avg(avg_over_time(vigil_path_share{{{sel(**prim)}}}[10s]))')) is not None
                     and v < 0.85 * share_healthy and v, 180)
    log(f"degraded: share of {a.device} {share_cut:.2f} (healthy {share_healthy:.2f})")
    if prom.value("sum(vigil_port_failovers_total)"):
        fail("a failover while the port was only degraded")

    # Failed: failovers counted on the port, the alert, its send share at 0, dead paths.
    state["failed"] = time.time()  # before the change: a scrape may see it at once
    netlab("fail", str(a.host), str(a.port))
    wait(f"failovers counted on {a.instance} {a.device}",
         lambda: prom.value(f'sum(vigil_port_failovers_total{{{sel(**cut)}}})'), 120)
    alert = wait(f"VigilFailover firing for {a.instance} {a.device}", lambda: firing(prom, "VigilFailover", **cut), 120)
    log(f"failed: VigilFailover firing: {alert[0]['labels']}")
    wait(f"dead paths on {a.instance} {a.device}",
         lambda: prom.value(f'sum(vigil_path_connections{{{sel(**cut, state="dead")}}})'), 120)
    wait(f"the share of {a.instance} {a.device} at 0",
         lambda: prom.value(f'max(vigil_path_share{{{sel(**send)}}}) or vector(0)') == 0
         and prom.value(f'sum(vigil_path_rate_bytes{{{sel(**send)}}}) or vector(0)') == 0, 120)
    log("failed: the port's send share is 0")

    # Restored: failback counted, the share back.
    state["restored"] = time.time()  # before the change: a scrape may see it at once
    netlab("restore", str(a.host), str(a.port))
    netlab("degrade", str(a.host), str(a.port), a.rate)
    wait(f"a failback counted on {a.instance} {a.device}",
         lambda: prom.value(f'sum(vigil_port_failbacks_total{{{sel(**cut)}}})'), 180)
    share_back = wait(f"the share of {a.instance} {a.device} back",
                      lambda: (v := prom.value(f'max(vigil_path_share{{{sel(**prim)}}})')) and v > 0.8 * share_healthy and v,
                      180)
    log(f"restored: failback counted, primary share {share_back:.2f}")
    time.sleep(3 * a.scrape_s)
    state["end"] = time.time()
    json.dump(state, open(a.state, "w"))


def panels(dashboard):
    for p in dashboard["panels"]:
        if p["type"] == "row":
            yield from ((q, t) for q in p.get("panels", []) for t in q.get("targets", []))
        else:
            for t in p.get("targets", []):
                yield p, t


def check_dashboard(d):
    """The dashboard's JSON as Grafana provisions it: identity, one data source variable,
    panels with unique ids on the 24-column grid, every query naming known variables."""
    for k in ("uid", "title", "panels", "templating", "schemaVersion"):
        if k not in d:
            fail(f"dashboard: no {k}")
    names = {v["name"] for v in d["templating"]["list"]}
    if not {"datasource", "job", "instance", "device"} <= names:
        fail(f"dashboard variables {sorted(names)}")
    ids = [p["id"] for p in d["panels"]]
    if len(ids) != len(set(ids)):
        fail("dashboard: duplicate panel ids")
    for p in d["panels"]:
        g = p["gridPos"]
        if g["x"] < 0 or g["w"] < 1 or g["x"] + g["w"] > 24:
            fail(f"panel {p['title']}: off the grid {g}")
        if p["type"] == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            fail(f"panel {p['title']}: not on the datasource variable")
        refs = [t["refId"] for t in p["targets"]]
        if not refs or len(refs) != len(set(refs)):
            fail(f"panel {p['title']}: targets {refs}")
        for t in p["targets"]:
            for v in re.findall(r"\$(\w+)", t["expr"]):
                if v not in names and not v.startswith("__"):
                    fail(f"panel {p['title']}: unknown variable ${v}")


def expand(expr, rate_interval):
    """A panel query as Grafana sends it with every variable at "All" (the .* regex)."""
    expr = expr.replace("$__rate_interval", rate_interval)
    return re.sub(r"\$(job|instance|device)\b", ".*", expr)


def final(a):
    prom = Prom(a.prom)
    st = json.load(open(a.state))
    start, end = st["start"], time.time()
    span = int(end - start) + 1
    step = max(1, int(a.scrape_s))

    # Every family the exporters declare has series (the RDMA-only ones aside).
    declared = re.findall(r"^# TYPE (\S+) (\S+)$", open(a.exposition).read(), re.M)
    missing = []
    for name, kind in declared:
        if name in VERBS_ONLY:
            continue
        if not prom.query(f"count(last_over_time({name}[{span}s]))", end):
            missing.append(name)
    if missing:
        fail(f"families with no series in Prometheus: {missing}")
    counters = [n for n, k in declared if k == "counter"]
    log(f"{len(declared) - len(VERBS_ONLY)} families present ({len(counters)} counters)")

    # Counters only grow: no series of any counter went down over the run.
    went_down = [(n, r["metric"]) for n in counters for r in prom.query(f"resets({n}[{span}s]) > 0", end)]
    if went_down:
        fail(f"counters that went down: {went_down}")
    log(f"no counter went down over {span} s")

    # The failover and degraded counters moved at the right phase.
    cut = sel(instance=a.instance, device=a.device)
    at = lambda expr, t: prom.value(f"sum({expr}) or vector(0)", t)
    for what, expr, before, after, from_zero in (
            ("degraded verdicts", f'vigil_port_degraded_total{{{cut},kind="send"}}', "degraded", "failed", False),
            ("failovers", f"vigil_port_failovers_total{{{cut}}}", "failed", "restored", True),
            ("failbacks", f"vigil_port_failbacks_total{{{cut}}}", "restored", "end", True)):
        v0, v1 = at(expr, st[before]), at(expr, st[after])
        if v1 <= v0 or (from_zero and v0 != 0):
            fail(f"{what}: {v0:g} when the {before} phase began, {v1:g} when it ended: wanted "
                 f"{'0, then ' if from_zero else ''}more")
        log(f"{what} on {a.instance} {a.device}: {v0:g} when the {before} phase began, {v1:g} by its end")

    # The dashboard: every variable and every panel query returns series over the run.
    d = json.load(open(a.dashboard))
    check_dashboard(d)
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.match(r"label_values\((.*), (\w+)\)$", v["query"]["query"])
        if not m or not prom.label_values(m.group(2), expand(m.group(1), "")):
            fail(f"dashboard variable {v['name']}: {v['query']['query']} returns nothing")
    results = []
    for p, t in panels(d):
        expr = expand(t["expr"], a.rate_interval)
        r = prom.query_range(expr, start, end, step)
        points = sum(1 for s in r for _, v in s["values"] if not math.isnan(float(v)))
        if not points:
            fail(f"dashboard panel '{p['title']}' query {t['refId']} returns no series: {expr}")
        results.append((p, t, r))
    log(f"dashboard: {len(results)} queries of {len({id(p) for p, _, _ in results})} panels return series")
    if a.png:
        draw(results, start, st, a.png)


def draw(results, t0, st, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    by_panel = {}
    for p, t, r in results:
        by_panel.setdefault(p["id"], (p, []))[1].append((t, r))
    n = len(by_panel)
    fig, axes = plt.subplots((n + 1) // 2, 2, figsize=(14, 2.6 * ((n + 1) // 2)), sharex=True)
    for ax, (p, targets) in zip(axes.flat, by_panel.values()):
        for t, r in targets:
            for s in sorted(r, key=lambda s: str(s["metric"]))[:12]:
                xs = [float(x) - t0 for x, _ in s["values"]]
                ys = [float(v) for _, v in s["values"]]
                label = re.sub(r"\{\{(\w+)\}\}", lambda m: s["metric"].get(m.group(1), ""), t.get("legendFormat", ""))
                ax.plot(xs, ys, lw=1, label=label)
        for ph in ("degraded", "failed", "restored"):
            ax.axvline(st[ph] - t0, color="k", lw=0.5, ls="--")
        ax.set_title(p["title"], fontsize=9)
        ax.tick_params(labelsize=7)
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        ax.set_ylabel(unit, fontsize=7)
        if len(ax.lines) <= 8:
            ax.legend(fontsize=5, loc="upper left")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("Vigil dashboard panels from the lab's Prometheus: a port degraded, failed and restored "
                 "(dashed lines)", fontsize=10)
    fig.supxlabel("seconds since the job started", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=90)
    try:  # a palette image is a quarter of the size, for the docs
        from PIL import Image
        Image.open(path).convert("RGB").quantize(colors=128).save(path, optimize=True)
    except ImportError:
        pass
    log(f"panels drawn: {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["phases", "final"])
    ap.add_argument("--prom", default="http://127.0.0.1:9090")
    ap.add_argument("--state", required=True, help="JSON file of the phases' times")
    ap.add_argument("--exposition", required=True, help="one exporter's exposition (written, then read)")
    ap.add_argument("--hosts", type=int, default=3)
    ap.add_argument("--host", type=int, default=1, help="lab host whose port is cut")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--instance", help="that host's instance label")
    ap.add_argument("--exporter-port", type=int, default=9464)
    ap.add_argument("--netlab")
    ap.add_argument("--rate", default="300mbit")
    ap.add_argument("--cut-rate", default="75mbit")
    ap.add_argument("--scrape-s", type=float, default=1)
    ap.add_argument("--rate-interval", default="5s", help="what $__rate_interval stands for")
    ap.add_argument("--dashboard")
    ap.add_argument("--png")
    a = ap.parse_args()
    a.device = f"eth{a.port}"
    phases(a) if a.command == "phases" else final(a)


if __name__ == "__main__":
    main()
