#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Repeat benchmark (not a test): how often the tuner lab's health view tells the truth, with
# the default configuration (multipath on). Runs the `tuner-lab` test RUNS times (default 20;
# test/tuner/lab.sh: 4 hosts x 2 ports at 800 Mbit/s, a ring all-reduce, host 2's port 0 cut
# to 200 Mbit/s once every rank's detector judges) and keeps each run's logs. Per run:
#   - whether the test passed (every rank logged the same view changes, one of them to at most
#     0.65 of the bandwidth after the cut);
#   - the view changes (the issue's target: at most 3 for the one fault);
#   - the paths the net plugins flagged degraded, and of them the ones that do not cross the
#     cut port (neither end on host 2's port 0, 10.77.0.3): a false alarm on an uncut port.
# Ends with the count of runs that passed, that had at most 3 view changes, and that flagged
# no path of an uncut port.
# Usage: scripts/bench_tuner_lab.sh   (RUNS=20, BUILD=build; run as root, after the build)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-20}
BUILD=${BUILD:-build}
[[ -f $BUILD/build.ninja ]] || { echo "no build in $BUILD: run scripts/setup.sh first" >&2; exit 2; }
ninja -C "$BUILD" >/dev/null
cut_addr=10.77.0.3 # host 2's port 0 (netlab.sh: port j of host i is 10.77.<j>.<i+1>)
keep=$(mktemp -d /tmp/vigil-bench-tuner-lab.XXXXXX)
echo "# tuner lab x $RUNS, default configuration; logs in $keep"
printf '%4s | %6s | %7s | %7s | %9s | %s\n' run test changes flagged uncut views
ok=0 calm=0 clean=0
for i in $(seq "$RUNS"); do
    res=FAIL
    TUNER_LAB_KEEP="$keep/$i" meson test -C "$BUILD" tuner-lab >"$keep/$i.log" 2>&1 && res=ok
    views=0 flagged=0 uncut=0 seq=-
    if [[ -f $keep/$i/changes.0 ]]; then
        views=$(wc -l <"$keep/$i/changes.0")
        seq=$(sed -E 's/.*: [a-z]+( [0-9.]+)?( \([^)]*\))? -> ([a-z]+)( ([0-9.]+))?.*/\3\5/' \
            "$keep/$i/changes.0" | paste -sd, -)
        flagged=$(cat "$keep/$i"/out.1.err.* | grep -c "path degraded:" || true)
        uncut=$(cat "$keep/$i"/out.1.err.* | grep "path degraded:" | grep -vc -- "$cut_addr:" || true)
    fi
    [[ $res == ok ]] && ok=$((ok + 1))
    [[ $res == ok ]] && ((views <= 3)) && calm=$((calm + 1))
    [[ $res == ok ]] && ((uncut == 0)) && clean=$((clean + 1))
    printf '%4d | %6s | %7d | %7d | %9d | %s\n' "$i" "$res" "$views" "$flagged" "$uncut" "$seq"
done
echo "# passed $ok of $RUNS; at most 3 view changes: $calm; no path of an uncut port flagged: $clean"
echo "# flagged paths of uncut ports, if any:"
grep -h "path degraded:" "$keep"/*/out.1.err.* | grep -v -- "$cut_addr:" | sed 's/^.*path degraded: /  /' || true
