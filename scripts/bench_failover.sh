#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Failover-time benchmark (not a test): in a 2-host x 2-port lab host 0 streams 1 MiB
# messages to host 1 (8 in flight) while a primary port goes down TRIALS times, alternately
# host 0's (the sender sees the port event) and host 1's (the receiver sees it and asks the
# sender to fail over), restored in between with failback. For every failover it reports the
# time from `ip link set down` to the first replayed message acknowledged, from the plugin's
# own timestamps (CLOCK_MONOTONIC, shared by every namespace): median and p99.
# Usage: scripts/bench_failover.sh [TRIALS]
set -euo pipefail
cd "$(dirname "$0")/.."
TRIALS=${1:-20}
if [[ -z ${NETLAB:-} ]]; then
    scripts/setup.sh
    exec scripts/netlab.sh run -H 2 -P 2 -- "$0" "$@"
fi
bin=$PWD/build/test/netbench/vigil-netbench
plugin=$PWD/build/net_plugin/libnccl-net-vigil.so
tmp=$(mktemp -d /tmp/vigil-fobench.XXXXXX)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$tmp"' EXIT
export NCCL_DEBUG=INFO VIGIL_FAILBACK_HOLD_MS=50
rdv=unix:$tmp/rdv.sock
source scripts/pids.sh
ranks=()
for r in 1 0; do
    bg_start "$r" "$bin" --plugin "$plugin" --rank "$r" --nranks 2 --rendezvous "$rdv" \
        --workload bandwidth --bytes 1M --iters 1000000 --timeout 600 >"$tmp/out.$r" 2>"$tmp/err.$r"
    ranks+=("$BG_PID")
done
until grep -q "accepted primary" "$tmp/err.0" 2>/dev/null; do sleep 0.1; done
sleep 0.5
# The port goes down inside one `ip` call; its start and end bound the moment (the ip
# process itself takes a few ms to start, so the measured time is an upper bound).
python3 - "$NETLAB" "$TRIALS" "$tmp/downs" <<'PY'
import subprocess, sys, time
lab, trials, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(out, "w") as f:
    for i in range(trials):
        ns = f"{lab}-h{i % 2}"
        t0 = time.monotonic()
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "down"], check=True)
        t1 = time.monotonic()
        f.write(f"{t0} {t1}\n")
        time.sleep(0.3)
        subprocess.run(["ip", "-n", ns, "link", "set", "eth0", "up"], check=True)
        time.sleep(1.5)  # rebuild (attempts back off up to 1 s) + hold + failback
PY
for p in "${ranks[@]}"; do
    pid_stop "$p" vigil-netbench || echo "bench: rank pid $p ended early" >&2
done
python3 - "$tmp" <<'PY'
import re, statistics, sys
tmp = sys.argv[1]
downs = [tuple(map(float, x.split())) for x in open(f"{tmp}/downs")]
acks = []
for r in (0,):
    for line in open(f"{tmp}/err.{r}"):
        m = re.search(r"detected at monotonic ([0-9.]+) s, acked at ([0-9.]+) s", line)
        if m:
            acks.append((r, float(m.group(1)), float(m.group(2))))
# The kernel's link-down event as each host's link monitor received it: the port-failure time.
events = []
for r in (0, 1):
    for line in open(f"{tmp}/err.{r}"):
        m = re.search(r"link monitor: eth0 is down \(monotonic ([0-9.]+) s\)", line)
        if m:
            events.append(float(m.group(1)))
times, lower, inner = [], [], []
for r, det, ack in acks:
    prior = [d for d in downs if d[0] <= det + 1e-3]
    # only this trial's event: after its ip call started
    ev = [e for e in events if prior and prior[-1][0] <= e <= det + 1e-6]
    if prior and ev:
        times.append((ack - prior[-1][0]) * 1e3)   # from the start of `ip link set down`
        lower.append((ack - ev[-1]) * 1e3)         # from the kernel's link-down event
        inner.append((ack - det) * 1e3)            # detection -> ack, inside the plugin
if not times:
    sys.exit("no failover with data in flight was measured")
def stats(v):
    v = sorted(v)
    p99 = v[min(len(v) - 1, int(round(0.99 * (len(v) - 1))))]
    return f"median {statistics.median(v):.2f} ms, p99 {p99:.2f} ms, max {v[-1]:.2f} ms"
print(f"# failover time over {len(downs)} port failures (alternately the sender's and the "
      f"receiver's port), {len(times)} failovers with data in flight")
print(f"link down (ip call start) -> first replayed message acked: {stats(times)}")
print(f"link-down netlink event   -> first replayed message acked: {stats(lower)}")
print(f"failure detected          -> first replayed message acked: {stats(inner)}")
PY
