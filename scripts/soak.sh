#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# soak.sh: seeded long fault soak of the net plugin in a 3-host x 3-port lab, every result checked.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    cat <<'EOF'
usage: scripts/soak.sh [--seed N] [--faults N | --duration S] [--report FILE] [--keep-logs]
       scripts/soak.sh --ci

Builds a 3 hosts x 3 ports lab (scripts/netlab.sh), runs vigil-netbench's validated ring
all-reduce on it without end (one rank per host, one connection per port and neighbour, so
every port carries primary paths) and injects a seeded random sequence of faults, drawn in
shuffled bags of 20 (6 port-down, 5 flap, 4 degrade, 3 host-down, 2 peer-kill):

  port-down   one port down for 0.3-3 s, then restored (at most two at once, never the
              last port of a host)
  flap        one port down and up again 5-25 ms later (ip -batch; the down time the
              plugin saw is measured from its link monitor)
  host-down   every port of one host down for 0.5 s up to 0.4 x VIGIL_FATAL_TIMEOUT_MS
              (at most 4 s): every connection of that host loses all its paths and must
              resume when the ports return
  degrade     one port limited by tbf to 50, 100 or 200 mbit for 1-4 s
  peer-kill   one rank SIGKILLed: the others must fail with an error within
              VIGIL_FATAL_TIMEOUT_MS + 5 s; the job then restarts every rank (a new epoch)

Every fault is checked to have fired from the plugin's own output (the link monitor's
port-down event and a failover or a lost path on that port; for host-down also a connection
left without a path and a path rebuilt; for degrade the tbf's held-back packets; for a peer
kill the rank's death by SIGKILL). The ranks validate every all-reduce result exactly.

It prints the faults injected and fired per kind, failovers, failbacks, messages, bytes
verified, errors surfaced to the caller (while no path was alive, and while a path was alive),
the largest stall (longest time a rank waited on the network with no request completing) and
exits non-zero on any violation: a wrong element, an error while a path was alive, a fault
that did not fire, a hang, an epoch that ended other than by a peer kill.

  --seed N        random sequence (default 1): the seed fixes the order of fault kinds and
                  each fault's draws (hold, gap, rate, target among the ports free then);
                  which ports are free depends on timing, so targets can differ between runs
  --faults N      stop after N faults (default 1000 unless --duration is given)
  --duration S    stop after S seconds
  --report FILE   also write the counts as JSON
  --keep-logs     keep every rank's output (default: kept only when the soak fails)
  --ci            the CI phase: seed 1, 40 faults, injection bounded to 240 s. Run by hand,
                  it builds build-soak/ and runs the meson test of suite `soak` there
  --build DIR     build directory used when run by hand (default build-soak, release)

Needs root (network namespaces); without it exits 77. Plugin variables (VIGIL_*) in the
environment reach the ranks. Logs: one file per rank and epoch, lines prefixed with the
CLOCK_MONOTONIC time they arrived.
EOF
}

ci=0 keep=0 build=build-soak
args=()
while (($#)); do
    case $1 in
    -h | --help) usage; exit 0 ;;
    --ci) ci=1; shift ;;
    --keep-logs) keep=1; shift ;;
    --build) build=${2:?--build needs a directory}; shift 2 ;;
    --seed | --faults | --duration | --report)
        (($# >= 2)) || { echo "soak: $1 needs a value" >&2; exit 2; }
        args+=("$1" "$2"); shift 2 ;;
    *) echo "soak: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [[ $(id -u) -ne 0 ]] || ! ip netns list >/dev/null 2>&1; then
    echo "SKIP: the soak needs root and network namespaces" >&2
    exit 77
fi

if [[ -z ${NETBENCH_BIN:-} || -z ${NETBENCH_PLUGIN:-} ]]; then
    # By hand: packages, then a release build of our own (what users build).
    scripts/setup.sh
    if [[ ! -f $build/build.ninja ]]; then
        meson setup "$build" -Dbuildtype=release -Dwerror=false >/dev/null
    fi
    # Only what the soak runs (meson test builds the test's dependencies itself).
    ninja -C "$build" net_plugin/libnccl-net-vigil.so test/netbench/vigil-netbench >/dev/null
    if ((ci)); then
        exec meson test -C "$build" --suite soak --print-errorlogs
    fi
    export NETBENCH_BIN=$PWD/$build/test/netbench/vigil-netbench
    export NETBENCH_PLUGIN=$PWD/$build/net_plugin/libnccl-net-vigil.so
fi
((ci)) && args=(--seed 1 --faults 40 --max-wall 240 "${args[@]}")

workdir=$(mktemp -d /tmp/vigil-soak.XXXXXX)
rc=0
scripts/netlab.sh run -H 3 -P 3 -- python3 test/soak/soak.py --workdir "$workdir" \
    --netlab "$PWD/scripts/netlab.sh" --netbench "$NETBENCH_BIN" --plugin "$NETBENCH_PLUGIN" \
    "${args[@]}" || rc=$?
if ((rc == 0 && !keep)); then
    rm -rf "$workdir"
else
    echo "soak: logs kept in $workdir" >&2
fi
exit "$rc"
