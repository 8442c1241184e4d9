#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The tools' command-line contract: every command and subcommand prints its own usage on
# stdout and exits 0 for --help and -h; an unknown option exits 2 with exactly one line on
# stderr that names the option, nothing on stdout, and runs nothing.
#   usage: cli.sh NETBENCH_BIN PARAMS_BIN [VIGIL_BIN]
set -uo pipefail
NETBENCH=${1:?usage: cli.sh NETBENCH_BIN PARAMS_BIN [VIGIL_BIN]}
PARAMS=${2:?usage: cli.sh NETBENCH_BIN PARAMS_BIN [VIGIL_BIN]}
VIGIL=${3:-}
TMP=$(mktemp -d /tmp/vigil-cli.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
failures=0
bad() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# run NAME ARGS...: runs the command NAME names (its words after the program are ARGS'
# prefix), bounded in time so that a command that ignores --help cannot hang the test.
run() {
    rc=0
    timeout 20 "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
}

# check NAME PROGRAM [WORDS...]: NAME is the command as a user types it ("vigil tuner fit").
check() {
    local name=$1
    shift
    local h bogus lines before=$failures
    for h in --help -h; do
        run "$@" "$h"
        ((rc == 0)) || bad "$name $h: exit $rc, wanted 0 ($(head -1 "$TMP/err"))"
        grep -q "^usage: $name\b" "$TMP/out" || bad "$name $h: stdout has no 'usage: $name' line"
        [[ ! -s $TMP/err ]] || bad "$name $h: wrote to stderr: $(head -1 "$TMP/err")"
    done
    bogus=--no-such-option-$RANDOM
    run "$@" "$bogus"
    ((rc == 2)) || bad "$name $bogus: exit $rc, wanted 2"
    lines=$(wc -l <"$TMP/err")
    ((lines == 1)) || bad "$name $bogus: $lines lines on stderr, wanted 1"
    grep -q -- "$bogus" "$TMP/err" || bad "$name $bogus: not named on stderr: $(head -1 "$TMP/err")"
    grep -q "^$name: " "$TMP/err" || bad "$name $bogus: stderr does not start with '$name: '"
    [[ ! -s $TMP/out ]] || bad "$name $bogus: wrote to stdout: $(head -1 "$TMP/out")"
    ((failures > before)) || echo "$name: --help, -h and $bogus as expected"
}

check vigil-netbench "$NETBENCH"
check vigil-params "$PARAMS"
if [[ -n $VIGIL ]]; then
    check vigil "$VIGIL"
    for sub in dump top export report tuner; do check "vigil $sub" "$VIGIL" "$sub"; done
    for sub in explain fit; do check "vigil tuner $sub" "$VIGIL" tuner "$sub"; done
    # An option of another subcommand is unknown here (dump takes no --once).
    run "$VIGIL" dump --once
    ((rc == 2)) && grep -q -- "--once" "$TMP/err" || bad "vigil dump --once: exit $rc, wanted 2"
    # A value that is not a number is a usage error, not a silent 0.
    run "$VIGIL" top --once --interval soon
    ((rc == 2)) && grep -q "soon" "$TMP/err" || bad "vigil top --interval soon: exit $rc, wanted 2"
else
    echo "vigil not built (nlohmann-json or cpp-httplib missing): its commands not checked"
fi
run "$NETBENCH" --rank one --nranks 2 --rendezvous unix:/nonexistent
((rc == 2)) && [[ $(wc -l <"$TMP/err") == 1 ]] && grep -q "'one'" "$TMP/err" ||
    bad "vigil-netbench --rank one: exit $rc, wanted 2 with one line naming 'one'"

((failures == 0)) || { echo "cli: $failures failure(s)" >&2; exit 1; }
echo "cli: ok"
