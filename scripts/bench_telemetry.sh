#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Telemetry overhead (not a test): the driver's unidirectional bandwidth run on loopback
# (4 MiB messages) with telemetry off, at the default 1 ms windows and at 10 us windows,
# alternated ROUNDS times; prints median throughput and CPU seconds per GiB (both
# processes, all threads) as ratios to "off". As root it then records per-window busy
# bandwidth of a path through a tbf degradation in the lab and draws
# docs/degrade_windows.png. Usage: scripts/bench_telemetry.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
bin=$PWD/build/test/netbench/vigil-netbench
plugin=$PWD/build/net_plugin/libnccl-net-vigil.so
vigil=$PWD/build/tools/vigil
tmp=$(mktemp -d /tmp/vigil-tbench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

if [[ -z ${NETLAB:-} ]]; then
    scripts/setup.sh
    one() { # ENV... -> "gbps cpu_s_per_gib"
        local rdv="unix:$tmp/r.$RANDOM.sock"
        env VIGIL_SOCKET_IFNAME==lo "$@" "$bin" --plugin "$plugin" --rank 1 --nranks 2 --rendezvous "$rdv" \
            --workload bandwidth --bytes 4M --iters 1000 >/dev/null &
        env VIGIL_SOCKET_IFNAME==lo "$@" "$bin" --plugin "$plugin" --rank 0 --nranks 2 --rendezvous "$rdv" \
            --workload bandwidth --bytes 4M --iters 1000 >"$tmp/o.json"
        wait
        python3 -c 'import json,sys; r=json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1]); print(r["gbps"], r["cpu_s"] / (r["bytes"] / 2**30))' "$tmp/o.json"
    }
    declare -A gb cpu
    for ((k = 0; k < ROUNDS; k++)); do
        for cfg in off default w10; do
            case $cfg in
            off) r=$(one VIGIL_TELEMETRY=0) ;;
            default) r=$(one VIGIL_TELEMETRY=1) ;;
            w10) r=$(one VIGIL_TELEMETRY=1 VIGIL_WINDOW_US=10) ;;
            esac
            gb[$cfg]+="${r% *} "; cpu[$cfg]+="${r#* } "
        done
    done
    python3 - "${gb[off]}" "${cpu[off]}" "${gb[default]}" "${cpu[default]}" "${gb[w10]}" "${cpu[w10]}" "$ROUNDS" <<'PY'
import statistics, sys
a = [list(map(float, x.split())) for x in sys.argv[1:7]]
m = [statistics.median(v) for v in a]
print(f"# telemetry overhead: loopback, 4 MiB messages, 2 streams, median of {sys.argv[7]} alternating rounds")
print(f"{'config':28s} {'GB/s':>8s} {'ratio':>7s} {'CPU s/GiB':>10s} {'ratio':>7s}")
for name, g, c in (("off (VIGIL_TELEMETRY=0)", m[0], m[1]), ("1 ms windows (default)", m[2], m[3]), ("10 us windows", m[4], m[5])):
    print(f"{name:28s} {g:8.3f} {g/m[0]:7.3f} {c:10.3f} {c/m[1]:7.3f}")
PY
    if [[ $(id -u) -eq 0 ]]; then exec scripts/netlab.sh run -H 2 -P 2 -- "$0" "$@"; fi
    exit 0
fi

# Lab part: per-window busy bandwidth of host 0's send primary through a degradation.
for h in 0 1; do for p in 0 1; do scripts/netlab.sh degrade "$h" "$p" 800mbit; done; done
export VIGIL_WINDOW_US=5000 VIGIL_DEGRADE_PCT=70 VIGIL_DEGRADE_WINDOWS=32 NCCL_DEBUG=WARN
rdv=unix:$tmp/lab.sock
source scripts/pids.sh
ranks=()
for r in 1 0; do
    bg_start "$r" "$bin" --plugin "$plugin" --rank "$r" --nranks 2 --rendezvous "$rdv" \
        --workload bandwidth --bytes 128K --iters 1000000 --timeout 60 >/dev/null 2>&1
    ranks+=("$BG_PID")
done
sleep 1
"$vigil" dump --windows 0 --follow 6 >"$tmp/follow.jsonl" &
dump_pid=$!
sleep 2; python3 -c 'import time; print(time.monotonic())' >"$tmp/t_degrade"; scripts/netlab.sh degrade 0 0 200mbit
sleep 2; python3 -c 'import time; print(time.monotonic())' >"$tmp/t_restore"; scripts/netlab.sh degrade 0 0 800mbit
wait "$dump_pid" || true
for p in "${ranks[@]}"; do
    pid_stop "$p" vigil-netbench || echo "bench: rank pid $p ended early" >&2
done
PY=python3
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null && PY=/usr/bin/python3
$PY - "$tmp" <<'PY'
import json, os, sys
tmp = sys.argv[1]
paths, wins = {}, {}
for line in open(f"{tmp}/follow.jsonl"):
    r = json.loads(line)
    if r["type"] == "path":
        paths[(r["pid"], r["path"])] = r
    else:
        wins.setdefault((r["pid"], r["path"]), []).append(r)
key = next(k for k, p in paths.items() if p["kind"] == "send" and p["slot"] == "primary" and p["device"] == "eth0"
           and len(wins.get(k, [])) > 50)
w = wins[key]
t_deg = float(open(f"{tmp}/t_degrade").read()); t_res = float(open(f"{tmp}/t_restore").read())
flags = [x["start_ns"] / 1e9 for x in w if x["degraded"]]
print(f"# {len(w)} windows of pid {key[0]} send primary eth0; degraded verdict from "
      f"{min(flags) - t_deg:+.3f} s to {max(flags) - t_deg:+.3f} s after the cut (restored at {t_res - t_deg:+.3f} s)"
      if flags else "# never flagged")
try:
    import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
except ImportError:
    sys.exit(0)
t0 = w[0]["start_ns"] / 1e9
fig, ax = plt.subplots(figsize=(9, 4))
xs = [x["start_ns"] / 1e9 - t0 for x in w]
ax.plot(xs, [x["busy_bw_Bps"] * 8 / 1e6 for x in w], lw=0.6, color="tab:blue", label="busy-time bandwidth per 5 ms window")
ax.plot(xs, [x["judged_Bps"] * 8 / 1e6 for x in w], lw=1.5, color="black", label=f"detector: last {os.environ['VIGIL_DEGRADE_WINDOWS']} loaded windows")
ax.plot(xs, [x["baseline_Bps"] * 8 / 1e6 for x in w], lw=1, ls="--", color="gray", label="baseline")
for x in w:
    if x["degraded"]:
        ax.axvspan(x["start_ns"] / 1e9 - t0, x["start_ns"] / 1e9 - t0 + x["window_us"] / 1e6, color="tab:red", alpha=0.15, lw=0)
ax.axvline(t_deg - t0, color="tab:red", ls=":", lw=1); ax.axvline(t_res - t0, color="tab:green", ls=":", lw=1)
ax.set_ylim(0, 1200)
ax.set_xlabel("time (s); red dotted: port cut from 800 to 200 Mbit/s, green: restored; shaded: flagged degraded")
ax.set_ylabel("Mbit/s")
ax.legend(loc="upper right", fontsize=8)
fig.tight_layout(); fig.savefig("docs/degrade_windows.png", dpi=110)
print("plot: docs/degrade_windows.png")
PY
