#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run-suite.sh [MESON TEST ARGS...]  The verbs suite on real Soft-RoCE, in one command: sets up
# the RDMA lab, builds the suite on the host with AddressSanitizer and UBSan, boots the lab's
# guest once, builds the rxe topology there and runs `meson test --suite verbs` inside. Its
# output streams; it ends with the time of each phase and meson's summary.
#
# Results: BUILD/meson-logs/rxe-testlog.json (a build's own testlog.json is left alone).
# Exit status: meson's; 77 only when qemu or the kernel package cannot be installed (the
# reason is printed); 124 / 125 when the guest timed out / died; 1 when the build fails.
# Environment: VIGIL_RXE_BUILD (build directory, default build/rxe-asan), and vm.sh's
# variables (VIGIL_RXE_TIMEOUT, VIGIL_RXE_ACCEL, ...). Run as root.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
src=$PWD
build=${VIGIL_RXE_BUILD:-build/rxe-asan}
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

t0=$(now)
scripts/rxe/setup.sh
rc=$?
((rc == 77)) && exit 77
((rc == 0)) || { echo "run-suite: lab setup failed" >&2; exit 1; }
t1=$(now)

# The project's build tools (scripts/setup.sh installs them) and an ASan build of the suite.
if ! command -v meson >/dev/null || ! dpkg-query -W catch2 >/dev/null 2>&1; then
    scripts/setup.sh || { echo "run-suite: scripts/setup.sh failed" >&2; exit 1; }
fi
if [[ ! -f $build/build.ninja ]]; then
    source scripts/sanitizer_build.sh # scripts/sanitize.sh's ASan build
    meson setup "$build" "${ASAN_MESON_ARGS[@]}" -Dwerror=false >"$src/$build.setup.log" 2>&1 ||
        { tail -20 "$src/$build.setup.log" >&2; echo "run-suite: meson setup failed" >&2; exit 1; }
fi
# Only what the verbs suite runs: the rest of the project is not needed in the guest.
ninja -C "$build" test/verbs/vigil-verbs-lab test/verbs/vigil-verbs-comm net_plugin/libnccl-net-vigil.so \
    test/netbench/vigil-netbench tools/vigil >"$build/rxe-build.log" 2>&1 ||
    { tail -30 "$build/rxe-build.log" >&2; echo "run-suite: build failed" >&2; exit 1; }
t2=$(now)

mkdir -p "$build/meson-logs"
rm -f "$build/meson-logs/rxe-testlog.json" # a dead guest must not leave a stale result behind
out=$(mktemp)
trap 'rm -f "$out"' EXIT
export VIGIL_VERBS_REQUIRE_ASAN=1
VIGIL_RXE_ENV="VIGIL_VERBS_REQUIRE_ASAN" VIGIL_RXE_SHARE_RW="$src/$build/meson-logs" \
    scripts/rxe/vm.sh "scripts/rxe/topo.sh up && meson test -C '$build' --no-rebuild --suite verbs --print-errorlogs --logbase rxe-testlog $*" \
    2> >(tee -a "$out" >&2) | tee -a "$out"
rc=${PIPESTATUS[0]}
t3=$(now)
wait

echo
echo "run-suite: lab setup $(secs "$t0" "$t1") s, host build $(secs "$t1" "$t2") s, guest $(secs "$t2" "$t3") s" \
    "($(grep -o 'boot [0-9.]* s, command [0-9.]* s' "$out" | tail -1 || echo 'no timing'))"
# meson's summary last, as the project's other runners end.
sed -n '/^Ok: /,$p' "$out" | grep -v '^vm: ' | grep -v '^Full log' || true
exit "$rc"
