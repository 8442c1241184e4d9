#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# All-reduce throughput through a port failure (not a test). A 3-host x 3-port lab with every
# port limited to RATE by tbf (so the ports, not this machine's CPUs, are the bottleneck) runs
# a ring all-reduce over 6 channels (2 per port). Host 0's port 0 goes down at ~3 s and comes
# back at ~8 s. Three runs: fault-free, VIGIL_BACKUP=spread, and a fixed pairing. Prints the
# bus bandwidth before / during / after the failure as ratios to the fault-free run and draws
# docs/failover_timeline.png. Usage: scripts/bench_failover_tput.sh [RATE]
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-300mbit}
if [[ -z ${NETLAB:-} ]]; then
    scripts/setup.sh
    exec scripts/netlab.sh run -H 3 -P 3 -- "$0" "$@"
fi
bin=$PWD/build/test/netbench/vigil-netbench
plugin=$PWD/build/net_plugin/libnccl-net-vigil.so
tmp=$(mktemp -d /tmp/vigil-tput.XXXXXX)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$tmp"' EXIT
for h in 0 1 2; do for p in 0 1 2; do scripts/netlab.sh degrade "$h" "$p" "$RATE"; done; done
export NCCL_DEBUG=INFO VIGIL_FAILBACK_HOLD_MS=200

run() { # NAME FAIL(0|1) [env...]
    local name=$1 fail=$2; shift 2
    local rdv=unix:$tmp/$name.sock r
    for r in 2 1 0; do
        env "$@" scripts/netlab.sh exec "$r" -- "$bin" --plugin "$plugin" --rank "$r" --nranks 3 \
            --rendezvous "$rdv" --workload allreduce --bytes 12M --channels 6 --slice 256K \
            --iters 70 --timeout 300 >"$tmp/$name.out.$r" 2>"$tmp/$name.err.$r" &
    done
    until grep -q "^ *1 " "$tmp/$name.out.0" 2>/dev/null; do sleep 0.05; done
    python3 -c 'import time; print(time.monotonic())' >"$tmp/$name.t0"
    if ((fail)); then
        sleep 3; python3 -c 'import time; print(time.monotonic())' >"$tmp/$name.tfail"
        scripts/netlab.sh fail 0 0
        sleep 5; python3 -c 'import time; print(time.monotonic())' >"$tmp/$name.trestore"
        scripts/netlab.sh restore 0 0
    fi
    wait
    grep -q '"ok":true' "$tmp/$name.out.0" || { cat "$tmp/$name.out.0"; echo "run $name failed" >&2; exit 1; }
}
run clean 0
run spread 1 VIGIL_BACKUP=spread
run pairing 1 VIGIL_BACKUP=eth0:eth1,eth1:eth2,eth2:eth0

PY=python3
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import matplotlib' 2>/dev/null && PY=/usr/bin/python3
$PY - "$tmp" "$RATE" <<'PYEOF'
import re, statistics, sys
tmp, rate = sys.argv[1], sys.argv[2]
def series(name):
    pts = []
    for line in open(f"{tmp}/{name}.out.0"):
        f = line.split()
        if len(f) == 7 and f[0].isdigit():
            pts.append((float(f[6]), float(f[4])))  # (end time, busbw GB/s)
    return pts
def t(name, what):
    try: return float(open(f"{tmp}/{name}.{what}").read())
    except OSError: return None
def failback_time(name):
    for r in range(3):
        for line in open(f"{tmp}/{name}.err.{r}"):
            pass
    # the failback of the failed host's own connection (host 0)
    last = None
    for line in open(f"{tmp}/{name}.err.0"):
        if "failback to primary" in line: last = line
    return None
clean = series("clean")
base = statistics.mean(b for _, b in clean[2:])
print(f"# all-reduce bus bandwidth through a port failure: 3 hosts x 3 ports at {rate} each, 6 channels")
print(f"fault-free: {base*8e3:.0f} Mbit/s bus bandwidth (ratio 1.00)")
rows = {}
for name in ("spread", "pairing"):
    pts = series(name)
    tf, tr = t(name, "tfail"), t(name, "trestore")
    before = [b for e, b in pts[2:] if e < tf]
    during = [b for e, b in pts if tf + 0.3 < e < tr]
    after = [b for e, b in pts if e > tr + 1.5]
    rows[name] = (pts, tf, tr)
    fmt = lambda v: f"{statistics.mean(v)/base:.2f}" if v else "n/a"
    print(f"{name:8s}: before {fmt(before)}, during (1 of 3 ports down on host 0) {fmt(during)}, after repair {fmt(after)}")
try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    print("(matplotlib not available: no plot)")
    sys.exit(0)
fig, ax = plt.subplots(figsize=(9, 4.2))
t0c = clean[0][0]
ax.plot([e - t0c for e, _ in clean], [b * 8e3 for _, b in clean], label="fault-free", color="gray", lw=1)
for name, color in (("spread", "tab:blue"), ("pairing", "tab:orange")):
    pts, tf, tr = rows[name]
    t0 = pts[0][0]
    ax.plot([e - t0 for e, _ in pts], [b * 8e3 for _, b in pts], label=f"VIGIL_BACKUP={name}", color=color, lw=1.5)
    ax.axvline(tf - t0, color=color, ls="--", lw=0.8)
    ax.axvline(tr - t0, color=color, ls=":", lw=0.8)
ax.set_xlabel("time since the run started (s); dashed: host 0 port 0 down, dotted: restored")
ax.set_ylabel("all-reduce bus bandwidth (Mbit/s)")
ax.set_title(f"Ring all-reduce through a port failure and failback (3x3 lab, {rate} per port)")
ax.legend(loc="lower left")
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig("docs/failover_timeline.png", dpi=110)
print("plot: docs/failover_timeline.png")
PYEOF
