#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Scale benchmark (not a test): what Vigil's connections cost in one process pair as their
# number grows, in the lab (2 hosts x 2 ports, every connection with its spread backup).
# vigil-netbench --workload fanout: rank 0 on host 0 opens N send connections to rank 1 on
# host 1 through the ncclNet table (an all-to-all at scale opens one per remote peer and
# channel), both polled as NCCL's proxy does; 20 rounds of one 64 KiB message on every
# connection at once (every byte checked); then IDLE seconds with every connection open and
# nothing posted. Per N and per side: the set-up time, a round's time per connection (median
# and worst of the rounds), the process's CPU while idle (% of one core, getrusage of every
# thread; idle_ over the whole phase, steady_ over its second half, once the connections that
# carried the last round have parked) and its wake-ups a second over that half (voluntary
# context switches: what the plugin controls; the CPU figure also holds what each one costs on
# the host, docs/scale.md), resident memory per connection after set-up and after
# traffic (the workload's own buffers aside), and fds per connection. Then (CUT=1, the default) a second run per N:
# rounds for 12 s, host 0's port 0 (the primary of half the connections) taken down after 4 s
# and restored 4 s later. The failover time: from the cut to each connection's message landing
# (the receiver's view of the first replayed message; its ack follows), p50/p99 over the
# connections whose message was in flight at the cut, beside the same figure for the rounds
# before the cut taken at the same point of the round (what those connections needed anyway,
# healthy). And the slowest round in progress within 2 s of the restore, against the median
# round: what a port failure under load costs at N.
# Usage: scripts/bench_scale.sh   (CONNS="64 512 2048 4096", IDLE=10, PLUGIN=path of another
# build's libnccl-net-vigil.so to compare; run as root)
# Environment passes through to the plugin (VIGIL_PROBE_INTERVAL_MS, VIGIL_MULTIPATH, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z ${NETLAB:-} ]]; then
    scripts/setup.sh
    [[ -f build/build.ninja ]] || meson setup build -Dbuildtype=release >/dev/null
    ninja -C build test/netbench/vigil-netbench net_plugin/libnccl-net-vigil.so >/dev/null
    exec scripts/netlab.sh run -H 2 -P 2 -- "$0" "$@"
fi
CONNS=${CONNS:-64 512 2048 4096}
# A connection holds 4 fds (docs/scale.md): 4,096 of them fit the 20,000 some hosts allow, and
# more need a higher hard limit. The plugin raises the soft limit to the hard one; root with
# CAP_SYS_RESOURCE may raise the hard.
ulimit -Hn 1048576 2>/dev/null || echo "# could not raise the hard fd limit ($(ulimit -Hn)): large N may fail" >&2
IDLE=${IDLE:-10}
CUT=${CUT:-1}
bin=$PWD/build/test/netbench/vigil-netbench
plugin=${PLUGIN:-$PWD/build/net_plugin/libnccl-net-vigil.so}
tmp=$(mktemp -d /tmp/vigil-bench-scale.XXXXXX)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$tmp"' EXIT

echo "# fanout: N connections host 0 -> host 1, 2 ports each, spread backups; rounds of one 64 KiB"
echo "# message per connection; then ${IDLE} s idle. recv = host 1's process, send = host 0's."
printf '%6s | %9s %9s | %9s %9s | %7s %7s | %11s %11s | %9s %9s | %7s %7s | %9s %9s | %7s\n' conns idle_recv idle_send \
    steady_r steady_s wake/s_r wake/s_s \
    "KiB/c recv" "KiB/c send" "used recv" "used send" "fd/c r" "fd/c s" "round_us" "worst_us" setup_s
for n in $CONNS; do
    rdv="unix:$tmp/rdv.$n.sock"
    scripts/netlab.sh exec 1 -- "$bin" --plugin "$plugin" --rank 1 --nranks 2 --rendezvous "$rdv" \
        --workload fanout --channels "$n" --idle "$IDLE" --timeout 900 >"$tmp/r1.$n" 2>"$tmp/log1.$n" &
    rpid=$!
    if ! scripts/netlab.sh exec 0 -- "$bin" --plugin "$plugin" --rank 0 --nranks 2 --rendezvous "$rdv" \
        --workload fanout --channels "$n" --idle "$IDLE" --timeout 900 >"$tmp/r0.$n" 2>"$tmp/log0.$n"; then
        wait "$rpid" || true
        echo "N=$n failed:" >&2
        tail -n 5 "$tmp/r0.$n" "$tmp/log0.$n" "$tmp/log1.$n" >&2
        exit 1
    fi
    wait "$rpid"
    python3 - "$tmp/r0.$n" <<'PY'
import json, sys
d = next(json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"type":"fanout"'))
s = [l for l in open(sys.argv[1]) if l.startswith('{"ok"')]
assert s and json.loads(s[-1])["errors"] == 0, "errors in the run"
r, t = d["recv"], d["send"]
print(f'{d["conns"]:6d} | {r["idle_cpu_pct"]:8.1f}% {t["idle_cpu_pct"]:8.1f}% | '
      f'{r["idle_steady_cpu_pct"]:8.2f}% {t["idle_steady_cpu_pct"]:8.2f}% | '
      f'{r["idle_steady_wakes_per_s"]:7.1f} {t["idle_steady_wakes_per_s"]:7.1f} | {r["rss_kib_per_conn"]:11.1f} '
      f'{t["rss_kib_per_conn"]:11.1f} | {r["rss_used_kib_per_conn"]:9.1f} {t["rss_used_kib_per_conn"]:9.1f} | '
      f'{r["fds_per_conn"]:7.2f} {t["fds_per_conn"]:7.2f} | {r["round_p50_us_per_conn"]:9.1f} '
      f'{r["round_max_us_per_conn"]:9.1f} | {max(r["setup_s"], t["setup_s"]):7.2f}')
PY
done
((CUT)) || exit 0
echo
echo "# port cut under load: host 0 port 0 down at 4 s, up at 8 s, rounds for 12 s; receiver's view."
echo "# failover: from the cut to each in-flight connection's message landing, ms, p50/p99 over the"
echo "# connections in flight at the cut (inflight); healthy: the same point of the rounds before"
echo "# the cut; restore: the slowest round in progress within 2 s of the restore (failback waits"
echo "# VIGIL_FAILBACK_HOLD_MS), its time and its connections' completion times p50/p99, ms; and the"
echo "# slowest round of the run (when it began, from the first round)"
printf '%6s | %6s %9s | %8s %8s %8s | %8s %8s | %8s %8s %8s | %8s %8s\n' conns rounds median_ms \
    inflight fo_p50 fo_p99 ok_p50 ok_p99 restore p50 p99 worst_ms worst_at
# The rounds are timed on CLOCK_MONOTONIC. The cut and the restore are timed from bash's
# $EPOCHREALTIME less the two clocks' offset, read once here: no process is started between
# the cut and the restore but the commands and a sleep (a python3 start took over a second on
# the saturated host, and delayed the restore by seconds).
mono_off_us=$(python3 -c 'import time; print(int((time.time() - time.monotonic()) * 1e6))')
mono_us() { _mono_us=$((10#${EPOCHREALTIME//[!0-9]/} - mono_off_us)); } # sets _mono_us (any locale's decimal mark)
secs() { printf '%d.%06d' $(($1 / 1000000)) $(($1 % 1000000)); }
for n in $CONNS; do
    rdv="unix:$tmp/rdv.cut.$n.sock"
    scripts/netlab.sh exec 1 -- "$bin" --plugin "$plugin" --rank 1 --nranks 2 --rendezvous "$rdv" \
        --workload fanout --channels "$n" --idle 0 --duration 12 --timeout 900 >"$tmp/c1.$n" 2>"$tmp/clog1.$n" &
    rpid=$!
    scripts/netlab.sh exec 0 -- "$bin" --plugin "$plugin" --rank 0 --nranks 2 --rendezvous "$rdv" \
        --workload fanout --channels "$n" --idle 0 --duration 12 --timeout 900 >"$tmp/c0.$n" 2>"$tmp/clog0.$n" &
    spid=$!
    # The rounds start once every connection is up: the cut is timed from the first round.
    for _ in $(seq 600); do grep -q "^# fanout" "$tmp/c0.$n" 2>/dev/null && break; sleep 0.1; done
    sleep 4
    mono_us; cut_us=$_mono_us
    scripts/netlab.sh fail 0 0
    mono_us; cut_done_us=$_mono_us
    # The restore is due 4 s after the cut, whatever the fail command took.
    ((cut_done_us >= cut_us + 4000000)) || sleep "$(secs $((cut_us + 4000000 - cut_done_us)))"
    mono_us; restore_us=$_mono_us
    scripts/netlab.sh restore 0 0
    mono_us; restore_done_us=$_mono_us
    cut_t=$(secs "$cut_us") restore_t=$(secs "$restore_us")
    echo "# N=$n: cut at monotonic $cut_t s, restored at $restore_t s; the fail command took $(secs $((cut_done_us - cut_us))) s, the restore command $(secs $((restore_done_us - restore_us))) s" >&2
    if ! wait "$spid" || ! wait "$rpid"; then
        echo "cut N=$n failed:" >&2
        tail -n 5 "$tmp/c0.$n" "$tmp/clog0.$n" "$tmp/clog1.$n" >&2
        exit 1
    fi
    python3 - "$tmp/c0.$n" "$tmp/c1.$n" "$cut_t" "$restore_t" <<'PY'
import json, re, sys
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
PY
done
