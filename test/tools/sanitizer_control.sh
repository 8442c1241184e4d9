#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A sanitizer run's negative control: the control program commits the defect MODE, and the
# sanitizer must report it (PATTERN on stderr) and end the process with a failure status, as
# it would for the same defect in Vigil. Passes only then.
#   usage: sanitizer_control.sh CONTROL_BIN MODE PATTERN
set -uo pipefail
BIN=${1:?usage: sanitizer_control.sh CONTROL_BIN MODE PATTERN}
MODE=${2:?}
PATTERN=${3:?}
err=$(mktemp /tmp/vigil-sancontrol.XXXXXX)
trap 'rm -f "$err"' EXIT
rc=0
"$BIN" "$MODE" 2>"$err" || rc=$?
grep -m3 -E 'Sanitizer|runtime error' "$err"
if ((rc == 0)); then
    echo "FAIL: $MODE: the process ended with status 0: this sanitizer run would miss reports" >&2
    exit 1
fi
if ! grep -q -- "$PATTERN" "$err"; then
    cat "$err" >&2
    echo "FAIL: $MODE: status $rc without '$PATTERN' on stderr" >&2
    exit 1
fi
echo "sanitizer control $MODE: reported and stopped (status $rc)"
