#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Scale benchmark (not a test): what Vigil's connections cost in one process pair as their
# number grows, in the lab (2 hosts x 2 ports, every connection with its spread backup).
# vigil-netbench --workload fanout: rank 0 on host 0 opens N send connections to rank 1 on
# host 1 through the ncclNet table (an all-to-all at scale opens one per remote peer and
# channel), both polled as NCCL's proxy does; 20 rounds of one 64 KiB (BYTES) message on every
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
# Usage: scripts/bench_scale.sh   (CONNS="64 512 2048 4096", IDLE=10, BYTES=65536 per message,
# PLUGIN=path of another build's libnccl-net-vigil.so to compare; run as root)
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
BYTES=${BYTES:-65536}
bin=$PWD/build/test/netbench/vigil-netbench
plugin=${PLUGIN:-$PWD/build/net_plugin/libnccl-net-vigil.so}
tmp=$(mktemp -d /tmp/vigil-bench-scale.XXXXXX)
trap '[[ -n ${KEEP:-} ]] || rm -rf "$tmp"' EXIT

echo "# fanout: N connections host 0 -> host 1, 2 ports each, spread backups; rounds of one $BYTES-byte"
echo "# message per connection; then ${IDLE} s idle. recv = host 1's process, send = host 0's."
printf '%6s | %9s %9s | %9s %9s | %7s %7s | %11s %11s | %9s %9s | %7s %7s | %9s %9s | %7s\n' conns idle_recv idle_send \
    steady_r steady_s wake/s_r wake/s_s \
    "KiB/c recv" "KiB/c send" "used recv" "used send" "fd/c r" "fd/c s" "round_us" "worst_us" setup_s
for n in $CONNS; do
    rdv="unix:$tmp/rdv.$n.sock"
    scripts/netlab.sh exec 1 -- "$bin" --plugin "$plugin" --rank 1 --nranks 2 --rendezvous "$rdv" \
        --workload fanout --bytes "$BYTES" --channels "$n" --idle "$IDLE" --timeout 900 >"$tmp/r1.$n" 2>"$tmp/log1.$n" &
    rpid=$!
    if ! scripts/netlab.sh exec 0 -- "$bin" --plugin "$plugin" --rank 0 --nranks 2 --rendezvous "$rdv" \
        --workload fanout --bytes "$BYTES" --channels "$n" --idle "$IDLE" --timeout 900 >"$tmp/r0.$n" 2>"$tmp/log0.$n"; then
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
python3 scripts/fanout_cut.py --header
source scripts/bench_lib.sh
fail_port() { scripts/netlab.sh fail 0 0; }
restore_port() { scripts/netlab.sh restore 0 0; }
mono_clock_init
for n in $CONNS; do
    rdv="unix:$tmp/rdv.cut.$n.sock"
    scripts/netlab.sh exec 1 -- "$bin" --plugin "$plugin" --rank 1 --nranks 2 --rendezvous "$rdv" \
        --workload fanout --bytes "$BYTES" --channels "$n" --idle 0 --duration 12 --timeout 900 >"$tmp/c1.$n" 2>"$tmp/clog1.$n" &
    rpid=$!
    scripts/netlab.sh exec 0 -- "$bin" --plugin "$plugin" --rank 0 --nranks 2 --rendezvous "$rdv" \
        --workload fanout --bytes "$BYTES" --channels "$n" --idle 0 --duration 12 --timeout 900 >"$tmp/c0.$n" 2>"$tmp/clog0.$n" &
    spid=$!
    # The rounds start once every connection is up: the cut is timed from the first round.
    for _ in $(seq 600); do grep -q "^# fanout" "$tmp/c0.$n" 2>/dev/null && break; sleep 0.1; done
    sleep 4
    echo "# N=$n:" >&2
    cut_restore 4000000 fail_port restore_port
    if ! wait "$spid" || ! wait "$rpid"; then
        echo "cut N=$n failed:" >&2
        tail -n 5 "$tmp/c0.$n" "$tmp/clog0.$n" "$tmp/clog1.$n" >&2
        exit 1
    fi
    python3 scripts/fanout_cut.py "$tmp/c0.$n" "$tmp/c1.$n" "$cut_t" "$restore_t"
done
