#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sanitizer runs. build-asan/ (AddressSanitizer + UndefinedBehaviorSanitizer, -O1)
# runs the unit and functional suites; build-tsan/ (ThreadSanitizer) runs the unit suite's
# Catch2 programs (vigil-unit, vigil-tuner-unit, vigil-verbs-unit), where the threads are.
# Every program the tests run is built in the tree with the same sanitizer (the drivers that
# dlopen the plugins included), and a library loaded into a foreign program gets its runtime
# preloaded (test/tools/install.sh). Any report fails its test: halt_on_error for all three,
# -fno-sanitize-recover for UBSan, leak checking on; negative controls (test/tools,
# sanitizer-control-*) prove that a defect does fail. Only the targets the tests need are
# built. Results: build-asan/ and build-tsan/meson-logs/testlog.json. Exit status 0 only when
# both builds and every test passed.
#   usage: scripts/sanitize.sh [asan] [tsan]   (default: both; JOBS=N for ninja -j)
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1

JOBS=${JOBS:-$(nproc)}
phases=("$@")
((${#phases[@]})) || phases=(asan tsan)

source scripts/sanitizer_build.sh # ASAN_MESON_ARGS, TSAN_MESON_ARGS
# Reports halt the process with a non-zero status; meson counts it as a failed test.
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:print_summary=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:print_summary=1

# needed_targets BUILD SELECTION...: the files ninja must build for the selected tests (a
# selection word is a suite, "suite:NAME", or a test, "test:NAME"): each test's program when
# the build makes it, and the targets it declares it depends on.
needed_targets() {
    local build=$1
    shift
    python3 - "$build" "$@" <<'PY'
import json, os, subprocess, sys
build = sys.argv[1]
suites = {w[6:] for w in sys.argv[2:] if w.startswith("suite:")}
names = {w[5:] for w in sys.argv[2:] if w.startswith("test:")}
def intro(what):
    return json.loads(subprocess.run(["meson", "introspect", what, build], check=True,
                                     capture_output=True, text=True).stdout)
targets = intro("--targets")
by_id = {t["id"]: t for t in targets}
by_file = {f: t for t in targets for f in t["filename"]}
want = set()
for t in intro("--tests"):
    if t["name"] not in names and not suites & {s.split(":")[-1] for s in t["suite"]}:
        continue
    for f in t["cmd"]:
        if f in by_file:
            want.update(by_file[f]["filename"])
    for d in t["depends"]:
        if d in by_id:
            want.update(by_id[d]["filename"])
for f in sorted(want):
    print(os.path.relpath(f, build))
PY
}

# phase NAME SELECTION... -- MESON_SETUP_ARGS...: configure build-NAME, build what the
# selected tests need, run them. Returns non-zero when anything failed.
phase() {
    local name=$1 build=build-$1 sel=() wrapper=() t0 rc=0
    shift
    while (($#)) && [[ $1 != -- ]]; do sel+=("$1"); shift; done
    shift
    t0=$(date +%s)
    if [[ -f $build/build.ninja ]]; then
        meson configure "$build" "$@" >/dev/null # a build of an earlier run: same options
    else
        meson setup "$build" "$@" >/dev/null
    fi || { echo "sanitize: $name: meson setup failed" >&2; return 1; }
    local test_args=() s
    for s in "${sel[@]}"; do
        case $s in
        suite:*) test_args+=(--suite "${s#suite:}") ;;
        test:*) test_args+=("${s#test:}") ;;
        esac
    done
    mapfile -t targets < <(needed_targets "$build" "${sel[@]}")
    ((${#targets[@]})) || { echo "sanitize: $name: nothing to build for ${sel[*]}" >&2; return 1; }
    echo "sanitize: $name: building ${#targets[@]} targets for ${sel[*]}" >&2
    nice -n 5 ninja -C "$build" -j "$JOBS" "${targets[@]}" >"$build/sanitize-build.log" 2>&1 ||
        { tail -50 "$build/sanitize-build.log" >&2; echo "sanitize: $name: build failed" >&2
          return 1; }
    echo "sanitize: $name: built in $(($(date +%s) - t0)) s" >&2
    # GCC 12's TSan needs the low-entropy address layout of older kernels; without ASLR it works
    # on any (setarch -R, where the container allows personality()).
    if [[ $name == tsan ]] && setarch "$(uname -m)" -R true 2>/dev/null; then
        wrapper=(--wrapper "setarch $(uname -m) -R")
    fi
    meson test -C "$build" --no-rebuild --print-errorlogs --timeout-multiplier 3 --logbase testlog \
        "${wrapper[@]}" "${test_args[@]}" || rc=$?
    echo "sanitize: $name: done in $(($(date +%s) - t0)) s, meson test status $rc" >&2
    return "$rc"
}

status=0
for p in "${phases[@]}"; do
    case $p in
    asan)
        phase asan suite:unit suite:functional -- "${ASAN_MESON_ARGS[@]}" || status=1
        ;;
    tsan)
        phase tsan test:unit test:tuner-unit test:verbs-unit test:sanitizer-control-race -- \
            "${TSAN_MESON_ARGS[@]}" || status=1
        ;;
    *) echo "sanitize: unknown phase '$p' (asan, tsan)" >&2; exit 2 ;;
    esac
done
exit "$status"
