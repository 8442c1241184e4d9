#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs one fuzz target for a bounded time (and at most $FUZZ_RUNS executions when that is set)
# and prints one line:
#   NAME: N execs in S s, E exec/s, corpus C (+M new), crashes X, leaks L, ubsan U
# New inputs go to WORK/corpus, findings to WORK/artifacts, libFuzzer's output to WORK/log
# (WORK is emptied first); the SEED directories are read, never written. On a finding the
# end of the log (the sanitizer's report) is printed. Exits 1 on any finding or when the
# fuzzer fails, 0 otherwise.
#   usage: run.sh NAME FUZZER WORK SECONDS SEED_DIR...
set -uo pipefail
if (($# < 4)); then
    echo "usage: run.sh NAME FUZZER WORK SECONDS SEED_DIR..." >&2
    exit 2
fi
name=$1 fuzzer=$2 work=$3 secs=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)

# Largest input per target: one whole unit of what it parses (docs/fuzzing.md).
extra=()
case $name in
    handle) max_len=128 ;;
    tcp-wire) max_len=48 ;;
    tcp-hello) max_len=984 ;;           # 24 records of 41 bytes
    verbs-wire) max_len=256 ;;          # a control message slot
    params) max_len=4096 ;;
    registry) max_len=70240 ;;          # a segment with 2 path entries
    report) max_len=6144; extra=(-close_fd_mask=2) ;; # its stderr notes are noise here
    rules) max_len=8192 ;;
    *) echo "run.sh: unknown target $name" >&2; exit 2 ;;
esac
[[ -f $here/dict/$name.dict ]] && extra+=(-dict="$here/dict/$name.dict")

rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
seeds=()
for d in "$@"; do [[ -d $d ]] && seeds+=("$d"); done

[[ -n ${FUZZ_RUNS:-} ]] && extra+=(-runs="$FUZZ_RUNS")

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$fuzzer" -max_total_time="$secs" -max_len="$max_len" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "${extra[@]}" \
    "$work/corpus" "${seeds[@]}" >"$work/log" 2>&1
rc=$?

stat() { sed -n "s/^stat::$1: *//p" "$work/log" | tail -n 1; }
count() { (($#)) && find "$@" -type f 2>/dev/null | wc -l || echo 0; }
execs=$(stat number_of_executed_units)
eps=$(stat average_exec_per_sec)
secs_run=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$work/log" | tail -n 1 | awk '{print $5}')
seeded=$(count "${seeds[@]}")  # the seed directories only
new=$(count "$work/corpus")
crashes=$(count "$work/artifacts" -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*')
leaks=$(count "$work/artifacts" -name 'leak-*')
ubsan=$(grep -c 'runtime error:' "$work/log")
echo "$name: ${execs:-?} execs in ${secs_run:-?} s, ${eps:-?} exec/s," \
     "corpus $((seeded + new)) (+$new new), crashes $crashes, leaks $leaks, ubsan $ubsan"
if ((rc != 0 || crashes + leaks + ubsan > 0)); then
    echo "$name: FINDING (fuzzer exit $rc); end of $work/log:"
    tail -n 60 "$work/log"
    ls -l "$work/artifacts"
    exit 1
fi
exit 0
