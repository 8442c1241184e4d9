#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The demo: builds Vigil, makes a lab of 4 hosts x 2 NIC ports (network namespaces, every port
# limited to RATE by tbf), and runs a validated ring all-reduce between the 4 hosts through
# libnccl-net-vigil.so, loaded the way NCCL loads it, with the library's own profiler
# (ncclProfiler_v6) driven as NCCL's proxy drives it. While it runs, host 1's port 0 goes
# through four phases, PHASE_ITERS all-reduce iterations each:
#   healthy -> degraded (cut to 25 % of RATE) -> failed (link down) -> restored
# Prints per phase the all-reduce bus bandwidth next to the capacity bound (what the ports can
# still carry: the ring runs at its slowest host's pace, and host 1 keeps (1 + 1/4) / 2 of its
# send capacity degraded and 1/2 failed), the share of host 1's traffic on that port, the
# failovers and failbacks; draws both over time (demo.png in the log directory); then
# `vigil report` over the ranks' profiler and telemetry files names the degraded port. Every
# byte of every iteration is checked. Needs root.
#   LATE_RANK=R     also make rank R arrive 20 ms late at every all-reduce, to see it named
#   VIGIL_MULTIPATH=0   the same with the backup a hot standby only (the degraded port paces)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
HOSTS=4
BYTES=${BYTES:-16M}
RATE=${RATE:-300mbit}
PHASE_ITERS=${PHASE_ITERS:-8}

if [[ -z ${NETLAB:-} ]]; then
    exec scripts/netlab.sh run -H "$HOSTS" -P 2 -- "$0" "$@"
fi

bin=$PWD/build/test/netbench/vigil-netbench
plugin=$PWD/build/net_plugin/libnccl-net-vigil.so
rdv=unix:$(mktemp -u /tmp/vigil-demo.XXXXXX.sock)
logs=$(mktemp -d /tmp/vigil-demo-logs.XXXXXX)
iters=$((4 * PHASE_ITERS))
rate_mbit=${RATE%mbit}
echo "== lab $NETLAB: $HOSTS hosts x 2 ports at $RATE (tbf); ring all-reduce of $BYTES per rank," \
     "$iters iterations, 2 channels (one per port)"
echo "== each rank's log (NCCL_DEBUG=INFO): $logs/rank<N>.log; profiler and telemetry files: $logs/files"
mkdir -p "$logs/files"
extra=(--channels 2 --slice 4M --profile net)
for h in $(seq 0 $((HOSTS - 1))); do for p in 0 1; do scripts/netlab.sh degrade "$h" "$p" "$RATE"; done; done
[[ -z ${LATE_RANK:-} ]] || extra+=(--delay-rank "$LATE_RANK" --delay-us 20000)
export NCCL_DEBUG=INFO VIGIL_PROFILE_DIR=$logs/files VIGIL_TELEMETRY_DIR=$logs/files VIGIL_FAILBACK_HOLD_MS=500
mono() { python3 -c 'import time; print(time.monotonic())'; }
pids=()
for ((r = HOSTS - 1; r >= 0; r--)); do
    out=/dev/null
    ((r == 0)) && out=$logs/rank0.out
    scripts/netlab.sh exec "$r" -- "$bin" --plugin "$plugin" --rank "$r" --nranks "$HOSTS" \
        --rendezvous "$rdv" --workload allreduce --bytes "$BYTES" --iters "$iters" "${extra[@]}" \
        >"$out" 2>"$logs/rank$r.log" &
    pids+=($!)
    echo "$r $!" >>"$logs/pids"
done

# The phases, driven by the iterations rank 0 has finished.
done_iters() { grep -cE '^ +[0-9]+ ' "$logs/rank0.out" 2>/dev/null || true; }
wait_iters() { # N: until rank 0 finished N iterations (or the job ended)
    while (($(done_iters) < $1)); do
        kill -0 "${pids[-1]}" 2>/dev/null || return 0
        sleep 0.05
    done
}
set +e
wait_iters 1
echo "healthy $(mono)" >"$logs/phases"
echo "== phase healthy: every port at $RATE"
wait_iters $((PHASE_ITERS))
scripts/netlab.sh degrade 1 0 "$((rate_mbit / 4))mbit"
echo "degraded $(mono)" >>"$logs/phases"
echo "== phase degraded: host 1 port 0 cut to $((rate_mbit / 4)) Mbit/s"
wait_iters $((2 * PHASE_ITERS))
scripts/netlab.sh fail 1 0
echo "failed $(mono)" >>"$logs/phases"
echo "== phase failed: host 1 port 0 down"
wait_iters $((3 * PHASE_ITERS))
scripts/netlab.sh restore 1 0 && scripts/netlab.sh degrade 1 0 "$RATE"
echo "restored $(mono)" >>"$logs/phases"
echo "== phase restored: host 1 port 0 back at $RATE"
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
echo "end $(mono)" >>"$logs/phases"
echo "== plugin banner (rank 0):"
grep -m1 "loaded" "$logs/rank0.log" || true
grep -h '^{' "$logs/rank0.out" | tail -1
echo "== warnings in the ranks' logs: $(cat "$logs"/rank*.log | grep -c " WARN " || true)" \
     "($(cat "$logs"/rank*.log | grep -c "path degraded" || true) degraded-path verdicts)"

PY=python3
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && PY=/usr/bin/python3
$PY - "$logs" "$RATE" <<'PYEOF' || rc=1
import glob, json, statistics, sys
logs, rate = sys.argv[1], sys.argv[2]
phases = [l.split() for l in open(f"{logs}/phases")]
names = [p[0] for p in phases[:-1]]
bounds = {"healthy": 1.0, "degraded": 0.625, "failed": 0.5, "restored": 1.0}
edges = [float(p[1]) for p in phases]
iters = []  # (end time, busbw GB/s, wrong elements)
for line in open(f"{logs}/rank0.out"):
    f = line.split()
    if len(f) == 7 and f[0].isdigit():
        iters.append((float(f[6]), float(f[4]), int(f[5])))
# Host 1's send paths: bytes per window and device, from its telemetry file.
pid1 = [l.split()[1] for l in open(f"{logs}/pids") if l.split()[0] == "1"][0]
dev, win = {}, []
for path in glob.glob(f"{logs}/files/vigil-*-{pid1}.jsonl"):
    for line in open(path):
        d = json.loads(line)
        if d.get("type") == "path" and d.get("kind") == "send":
            dev[d["path"]] = d["device"]
        elif d.get("type") == "window" and d["path"] in dev and d["bytes"] > 0:
            win.append((d["start_ns"] / 1e9, dev[d["path"]], d["bytes"]))
def phase_of(t):
    for k in range(len(names)):
        if edges[k] <= t < edges[k + 1]:
            return names[k]
    return None
events = {"failover": 0, "failback": 0}
for path in glob.glob(f"{logs}/rank*.log"):
    for line in open(path):
        if "failover:" in line: events["failover"] += 1
        if "failback to" in line: events["failback"] += 1
base = None
print(f"{'phase':10s} {'busbw Gbit/s':>13s} {'kept':>6s} {'bound':>6s} {'kept/bound':>10s} {'host 1 eth0 share':>18s}")
for k, name in enumerate(names):
    # The first iteration of a phase straddles the change: left out.
    bw = [b for t, b, _ in iters if edges[k] <= t < edges[k + 1]][1:]
    by = {}
    for t, d, b in win:
        if phase_of(t) == name:
            by[d] = by.get(d, 0) + b
    share = by.get("eth0", 0) / max(1, sum(by.values()))
    if not bw:
        print(f"{name:10s} (no iteration finished in this phase)")
        continue
    m = statistics.mean(bw)
    if base is None: base = m
    print(f"{name:10s} {m * 8:13.3f} {m / base:6.2f} {bounds[name]:6.3f} {m / base / bounds[name]:10.2f} {share:18.2f}")
wrong = sum(w for _, _, w in iters)
print(f"failovers {events['failover']}, failbacks {events['failback']} (log lines over all ranks); "
      f"{len(iters)} iterations validated, {wrong} wrong elements")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("(matplotlib not available: no plot)")
    sys.exit(1 if wrong else 0)
t0 = edges[0]
fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
a1.plot([t - t0 for t, _, _ in iters], [b * 8 for _, b, _ in iters], "o-", ms=3, label="all-reduce bus bandwidth")
for k, name in enumerate(names):
    a1.hlines(bounds[name] * base * 8, edges[k] - t0, edges[k + 1] - t0, colors="gray", linestyles="--",
              label="capacity bound" if k == 0 else None)
    for a in (a1, a2):
        a.axvline(edges[k] - t0, color="k", lw=0.6)
    a2.text(edges[k] - t0 + 0.1, 1.02, name, fontsize=8)
a1.set_ylabel("Gbit/s")
a1.legend(loc="lower left", fontsize=8)
a1.set_title(f"Ring all-reduce, 4 hosts x 2 ports at {rate}; host 1 port 0 healthy, cut to 25 %, down, back")
bins = {}
for t, d, b in win:
    k = int((t - t0) / 0.25)
    bins.setdefault(k, {}).setdefault(d, 0)
    bins[k][d] += b
ks = sorted(k for k in bins if k >= 0)
a2.plot([k * 0.25 for k in ks], [bins[k].get("eth0", 0) / sum(bins[k].values()) for k in ks], ".-",
        label="host 1: share of its sent bytes on eth0 (the cut port)")
a2.set_ylim(0, 1.1)
a2.set_ylabel("share")
a2.set_xlabel("time since the first iteration (s)")
a2.legend(loc="lower left", fontsize=8)
fig.tight_layout()
fig.savefig(f"{logs}/demo.png", dpi=110)
print(f"plot: {logs}/demo.png")
sys.exit(1 if wrong else 0)
PYEOF
echo "== vigil report $logs/files (full output: $logs/report.txt, plots: $logs/report/*.png)"
build/tools/vigil report --out "$logs/report" "$logs/files" >"$logs/report.txt" 2>&1 || rc=1
grep -E "^(slowest|arrival|degraded|events|plots)" "$logs/report.txt" || true
exit $rc
