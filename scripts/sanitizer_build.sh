# SPDX-License-Identifier: Apache-2.0
# shellcheck shell=bash
# Sourced, not run: the meson options of the sanitized builds, one definition for
# scripts/sanitize.sh (build-asan, build-tsan) and scripts/rxe/run-suite.sh (its own ASan
# build when it is given none).
#
# -O1 -g1. -O1 is what clang's ASan and TSan manuals ask for reasonable speed ("-O1 or
# higher"), as sanitizer and fuzzing builds usually are; under ASan + UBSan it compiles the
# tests 45 % faster than -O2 here (test_failback.cc: 16.5 s against 29.5 s) and the tests run
# no slower. The line tables (-g1) symbolize every frame of a report without the full debug
# info that costs a third of the compile time. Assertions stay on (no NDEBUG: not a release).
# UBSan does not recover: its first report ends the process, so meson counts a failed test.
# shellcheck disable=SC2034 # used by the scripts that source this file
ASAN_MESON_ARGS=(-Doptimization=1 -Ddebug=false "-Db_sanitize=address,undefined" -Db_lundef=false
                 "-Dcpp_args=-fno-sanitize-recover=all -g1")
# shellcheck disable=SC2034
TSAN_MESON_ARGS=(-Doptimization=1 -Ddebug=false -Db_sanitize=thread -Db_lundef=false
                 -Dcpp_args=-g1)
