# SPDX-License-Identifier: Apache-2.0
# Sourced by the side-by-side benchmark scripts (run from the repository root).

# run_in WHERE CMD...: WHERE is "local" or a lab host index (scripts/netlab.sh exec).
run_in() { local w=$1; shift; if [[ $w == local ]]; then "$@"; else scripts/netlab.sh exec "$w" -- "$@"; fi; }
# median X...: the median of the numbers.
median() { python3 -c 'import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
# jget FILE KEY: KEY of the last JSON line of FILE (vigil-netbench's summary).
jget() { python3 -c 'import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])[sys.argv[2]])' "$1" "$2"; }

# cut_restore HOLD_US FAIL_FN RESTORE_FN: runs FAIL_FN, then RESTORE_FN HOLD_US µs after
# FAIL_FN began, whatever FAIL_FN took; sets cut_t and restore_t (when each began, seconds of
# CLOCK_MONOTONIC, the clock vigil-netbench times its rounds on) and prints both commands'
# durations to stderr. Times come from bash's $EPOCHREALTIME less the two clocks' offset, read
# once: no process is started between the cut and the restore but the commands and a sleep (a
# python3 start can take over a second on a saturated host, and would delay the restore).
# Call mono_clock_init first, outside the timed part (it starts python3 once).
mono_clock_init() {
    _mono_off_us=$(python3 -c 'import time; print(int((time.time() - time.monotonic()) * 1e6))')
}
cut_restore() {
    local hold=$1 fail=$2 restore=$3 t0 t1 t2 t3
    [[ -n ${_mono_off_us:-} ]] || mono_clock_init
    _now_us() { _t=$((10#${EPOCHREALTIME//[!0-9]/} - _mono_off_us)); } # any locale's decimal mark
    _secs() { printf '%d.%06d' $(($1 / 1000000)) $(($1 % 1000000)); }
    _now_us; t0=$_t
    "$fail"
    _now_us; t1=$_t
    ((t1 >= t0 + hold)) || sleep "$(_secs $((t0 + hold - t1)))"
    _now_us; t2=$_t
    "$restore"
    _now_us; t3=$_t
    cut_t=$(_secs "$t0") restore_t=$(_secs "$t2")
    echo "# cut at monotonic $cut_t s, restored at $restore_t s; the fail command took $(_secs $((t1 - t0))) s, the restore command $(_secs $((t3 - t2))) s" >&2
}
