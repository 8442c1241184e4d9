#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs every test suite and ends with one line, "N passed, N failed, N skipped", summed over
# the phases below (each test as meson counts it; a phase that could not build or run its tests
# counts as one failure).
#
#   usage: scripts/test.sh [PHASE...]   (default: every phase, in this order)
#     default   ./build (the developers' build, -Dwerror=true): unit, functional, lab, fault,
#               telemetry, soak and ops (a real Prometheus) suites (and the verbs suite, which
#               skips outside the RDMA lab, unless the rxe phase runs too). Lab tests need root
#               (network namespaces); without it they skip (exit 77).
#     release   ./build-release (-Dbuildtype=release -Dtests=disabled -Dwerror=true: what the
#               README has users build): compiles warning-free and its installed tree passes
#               the install-tree test.
#     package   the Debian package: built once with dpkg-buildpackage (tests off, -j2), lintian
#               clean of errors, installed into an overlaid root and run in the lab
#               (test/ops/package.sh; needs root).
#     sanitize  scripts/sanitize.sh: build-asan (ASan + UBSan) unit and functional suites,
#               build-tsan (ThreadSanitizer) unit programs.
#     rxe       scripts/rxe/run-suite.sh on build-asan: the verbs suite in the RDMA lab's guest
#               on Soft-RoCE (skipped, counted once, when qemu or the guest kernel cannot be
#               installed).
#     fuzz      scripts/fuzz.sh --ci: every libFuzzer target for 15 s from its seed corpus.
#   Extra meson test arguments for the default phase: VIGIL_TEST_ARGS.
# Exit status: 0 when no phase failed.
set -uo pipefail
cd "$(dirname "$0")/.."

phases=("$@")
((${#phases[@]})) || phases=(default release package sanitize rxe fuzz)
for p in "${phases[@]}"; do
    case $p in
    default | release | package | sanitize | rxe | fuzz) ;;
    -h | --help) sed -n '3,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test.sh: unknown phase '$p' (default release package sanitize rxe fuzz)" >&2; exit 2 ;;
    esac
done

secs() { echo $(($(date +%s) - $1)); }
t_start=$(date +%s)
scripts/setup.sh || { echo "0 passed, 1 failed, 0 skipped"; exit 1; }
echo "=== test.sh: setup (packages and ./build): $(secs "$t_start") s" >&2

logs=()         # the meson test logs to sum, of every phase that ran tests
broken=0        # phases that failed without a log of failed tests to show for it
skipped_extra=0 # phases skipped as a whole
status=0

# ran PHASE RC LOG...: record a phase's result and the test logs it wrote. A non-zero status
# with no failed test in any of its logs (a build or setup failure, a dead guest) counts as one
# failure of its own.
ran() {
    local phase=$1 rc=$2 log found=()
    shift 2
    for log in "$@"; do [[ -f $log ]] && found+=("$log"); done
    logs+=("${found[@]}")
    ((rc == 0)) && return
    status=1
    if ((${#found[@]} == 0)) || ! python3 - "${found[@]}" <<'PY'; then
import json, sys
bad = [r for p in sys.argv[1:] for r in map(json.loads, open(p))
       if r.get("result") not in ("OK", "EXPECTEDFAIL", "SKIP")]
sys.exit(0 if bad else 1)
PY
        echo "test.sh: phase $phase failed (status $rc) outside its tests" >&2
        broken=$((broken + 1))
    fi
}

for p in "${phases[@]}"; do
    t0=$(date +%s)
    echo "=== test.sh: phase $p" >&2
    case $p in
    default)
        rm -f build/meson-logs/testlog.json
        # The verbs suite needs the RDMA lab's guest: the rxe phase runs it there, so here it
        # would only be counted as skipped.
        no_verbs=()
        [[ " ${phases[*]} " == *" rxe "* ]] && no_verbs=(--no-suite verbs)
        # shellcheck disable=SC2086 # VIGIL_TEST_ARGS is a word list
        meson test -C build --print-errorlogs --no-suite package "${no_verbs[@]}" ${VIGIL_TEST_ARGS:-}
        ran default $? build/meson-logs/testlog.json
        ;;
    package)
        rm -f build/meson-logs/packagelog.json
        meson test -C build --print-errorlogs --suite package --logbase packagelog
        ran package $? build/meson-logs/packagelog.json
        ;;
    release)
        rm -f build-release/meson-logs/testlog.json
        rc=0
        # The README's install build (tests off), with warnings as errors.
        release_opts=(-Dbuildtype=release -Dtests=disabled -Dwerror=true)
        if [[ -f build-release/build.ninja ]]; then
            meson configure build-release "${release_opts[@]}" >/dev/null || rc=$?
        else
            meson setup build-release "${release_opts[@]}" >/dev/null || rc=$?
        fi
        ((rc == 0)) && { ninja -C build-release >build-release/release-build.log 2>&1 ||
            { rc=$?; tail -40 build-release/release-build.log >&2; }; }
        ((rc == 0)) && { meson test -C build-release --no-rebuild --print-errorlogs install-tree || rc=$?; }
        ran release "$rc" build-release/meson-logs/testlog.json
        ;;
    sanitize)
        rm -f build-asan/meson-logs/testlog.json build-tsan/meson-logs/testlog.json
        scripts/sanitize.sh
        ran sanitize $? build-asan/meson-logs/testlog.json build-tsan/meson-logs/testlog.json
        ;;
    rxe)
        VIGIL_RXE_BUILD=build-asan scripts/rxe/run-suite.sh
        rc=$?
        if ((rc == 77)); then
            skipped_extra=$((skipped_extra + 1))
        else
            ran rxe "$rc" build-asan/meson-logs/rxe-testlog.json
        fi
        ;;
    fuzz)
        rm -f build-fuzz/meson-logs/testlog.json
        scripts/fuzz.sh --ci
        ran fuzz $? build-fuzz/meson-logs/testlog.json
        ;;
    esac
    echo "=== test.sh: phase $p: $(secs "$t0") s" >&2
done
echo "=== test.sh: every phase: $(secs "$t_start") s" >&2

python3 - "$broken" "$skipped_extra" "${logs[@]}" <<'PY'
import json, sys
passed, failed, skipped = 0, int(sys.argv[1]), int(sys.argv[2])
for path in sys.argv[3:]:
    with open(path) as f:
        for line in f:
            res = json.loads(line).get("result")
            if res in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif res == "SKIP":
                skipped += 1
            else:
                failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
exit $status
