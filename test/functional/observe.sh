#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Observability never fails a job: two ranks over loopback through the net plugin (with its
# tuner and profiler) under bad observability settings must still run exactly, each bad value
# said in one WARN. Cases:
#   - missing telemetry and profiler directories are created, owner-only, and get their files;
#   - directories that cannot be made (a file in the path, inside /proc) get a WARN, no files;
#   - every Observe variable of the table set to junk at once (numbers, VIGIL_PROFILE_EVENTS,
#     VIGIL_TUNER_STORE): one WARN each, defaults used;
# and, as the contrast, a bad Data variable (VIGIL_NSTREAMS) still fails init.
source "$(dirname "$0")/lib.sh"
export VIGIL_SOCKET_IFNAME="=lo" VIGIL_FABRIC=tcp
PARAMS_BIN=${PARAMS_BIN:?PARAMS_BIN (vigil-params) from meson}
ARGS=(--workload allreduce --bytes 2M --iters 10 --tuner net --tuner-nodes 2 --profile net)

# warned OUT PATTERN: some rank's stderr has a WARN line matching PATTERN.
warned() {
    grep -hE "WARN .*$2" "$1".err.* >/dev/null ||
        { cat "$1".err.* >&2; fail "no WARN matching: $2"; }
}

# 1. Missing directories, two levels deep.
out=$(VIGIL_TELEMETRY_DIR="$TMP/t/new" VIGIL_PROFILE_DIR="$TMP/p/new" run_ranks 2 "${ARGS[@]}")
expect_ok "$out"
for d in "$TMP/t" "$TMP/t/new" "$TMP/p" "$TMP/p/new"; do
    [[ -d $d ]] || fail "$d was not created"
    [[ $(stat -c %a "$d") == 700 ]] || fail "$d has mode $(stat -c %a "$d"), not 700"
done
ls "$TMP"/t/new/vigil-*.jsonl >/dev/null 2>&1 || fail "no telemetry file in the created directory"
ls "$TMP"/p/new/vigil-prof-*.jsonl >/dev/null 2>&1 || fail "no profiler file in the created directory"
echo "created: $(ls "$TMP/t/new" "$TMP/p/new" | tr '\n' ' ')"

# 2. Directories that cannot be made: a regular file in the path, and a path inside /proc.
: >"$TMP/afile"
for bad in "$TMP/afile/sub" /proc/vigil-cannot-exist/sub; do
    out=$(VIGIL_TELEMETRY_DIR="$bad" VIGIL_PROFILE_DIR="$bad" run_ranks 2 "${ARGS[@]}")
    expect_ok "$out"
    warned "$out" "VIGIL_TELEMETRY_DIR=\"$bad\": .*; running on without telemetry files"
    warned "$out" "VIGIL_PROFILE_DIR=\"$bad\": .*; profiling continues without files"
done

# 3. Every Observe variable of the table at once, each with a value it cannot take.
observe=()
while IFS='|' read -r _ var type _ _ bad _; do
    var=$(echo "$var" | tr -d ' `')
    [[ $bad == *"WARN, default"* ]] || continue
    case $(echo "$type" | tr -d ' ') in
    int | bytes | bool) observe+=("$var=junk") ;;
    esac
done < <("$PARAMS_BIN" --markdown | tail -n +3)
((${#observe[@]} >= 15)) || fail "only ${#observe[@]} numeric Observe variables in the table"
observe+=("VIGIL_PROFILE_EVENTS=coll,nonsense" "VIGIL_TUNER_STORE=mongodb://x")
out=$(export "${observe[@]}"; run_ranks 2 "${ARGS[@]}")
expect_ok "$out"
for kv in "${observe[@]}"; do
    var=${kv%%=*}
    warned "$out" "bad value $var=\"${kv#*=}\".*; using the default"
done
echo "observe: ${#observe[@]} bad values, each warned, run exact"

# 4. The contrast: a bad Data variable fails init on both ranks.
ranks_fail_init data VIGIL_NSTREAMS=junk
grep -q 'WARN .*bad value VIGIL_NSTREAMS="junk"' "$TMP/data.err.0" || fail "no WARN for VIGIL_NSTREAMS"
echo "observability settings: ok"
