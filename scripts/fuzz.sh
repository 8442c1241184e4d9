#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fuzzes every parser of bytes Vigil does not control (docs/fuzzing.md) with libFuzzer, ASan
# and UBSan, in a clang build of its own (build-fuzz/).
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#       each target (default: all) for SECONDS (default 60), one after the other; new coverage
#       is merged into a corpus copy outside the repository, $VIGIL_FUZZ_DIR/corpus/TARGET
#       (VIGIL_FUZZ_DIR defaults to /var/tmp/vigil-fuzz; a copy starts from the seeds in
#       test/fuzz/corpus/TARGET). With FUZZ_RUNS=N a target also stops after N executions.
#       Prints per target executions, exec/s, corpus size, crashes, leaks and UBSan reports;
#       findings stay in $VIGIL_FUZZ_DIR/work/TARGET/artifacts.
#   scripts/fuzz.sh --ci
#       the CI form: build, then `meson test -C build-fuzz --suite fuzz` (each target 15 s from
#       its seed corpus; results in build-fuzz/meson-logs/testlog.json).
# Exits non-zero on any finding or failure.
set -euo pipefail
cd "$(dirname "$0")/.."

ci=false
if [[ ${1:-} == --ci ]]; then
    ci=true
    shift
elif [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '3,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
secs=${1:-60}
[[ $secs =~ ^[0-9]+$ ]] || { echo "fuzz.sh: SECONDS must be a number, not '$secs'" >&2; exit 2; }
(($# > 0)) && shift

scripts/setup.sh # the Debian packages (clang, its sanitizer and libFuzzer runtimes)

# A sanitized clang build: every library gets coverage instrumentation (fuzzer-no-link), the
# targets link libFuzzer (test/fuzz/meson.build). UBSan and libstdc++'s assertions abort, so
# libFuzzer saves the input. -O1 with line tables, as fuzzing builds usually are: it compiles
# a third faster than -O2 and still symbolizes every frame. GCC's warning set is the one held
# to -Werror, not clang's.
if [[ ! -f build-fuzz/build.ninja ]]; then
    CC=clang CXX=clang++ meson setup build-fuzz -Dfuzz=enabled -Dtests=disabled \
        -Dbuildtype=plain -Db_sanitize=address,undefined -Db_lundef=false -Dwerror=false \
        -Dwarning_level=2 -Dcpp_args="-O1 -gline-tables-only -fsanitize=fuzzer-no-link \
        -fno-sanitize-recover=all -D_GLIBCXX_ASSERTIONS" >/dev/null
fi
nice -n 5 ninja -C build-fuzz -j "$(nproc)" fuzzers >/dev/null

if $ci; then
    exec meson test -C build-fuzz --suite fuzz --no-rebuild --print-errorlogs
fi

targets=("$@")
if ((${#targets[@]} == 0)); then
    for f in build-fuzz/test/fuzz/fuzz-*; do
        t=${f##*/fuzz-}
        [[ -x $f && -f $f && $t != seeds ]] && targets+=("$t")
    done
fi
dir=${VIGIL_FUZZ_DIR:-/var/tmp/vigil-fuzz}
results=()
failed=0
for t in "${targets[@]}"; do
    bin=build-fuzz/test/fuzz/fuzz-$t
    [[ -x $bin ]] || { echo "fuzz.sh: no target $t ($bin)" >&2; exit 2; }
    copy=$dir/corpus/$t
    mkdir -p "$copy"
    [[ -n $(ls -A "$copy") ]] || cp test/fuzz/corpus/"$t"/* "$copy"/ 2>/dev/null || true
    echo "== $t: ${secs} s" >&2
    if line=$(nice -n 5 test/fuzz/run.sh "$t" "$bin" "$dir/work/$t" "$secs" "$copy"); then
        # Keep what found new coverage: a minimal merge into the corpus copy.
        if ! "$bin" -merge=1 "$copy" "$dir/work/$t/corpus" >"$dir/work/$t/merge.log" 2>&1; then
            echo "fuzz.sh: merging into $copy failed (see $dir/work/$t/merge.log)" >&2
            failed=1
        fi
        line="$line; copy $(find "$copy" -type f | wc -l) files"
    else
        failed=1
    fi
    echo "$line" >&2
    results+=("${line%%$'\n'*}")
done
echo "== fuzz results ($(date -u +%FT%TZ), ${secs} s per target)"
printf '%s\n' "${results[@]}"
exit $failed
