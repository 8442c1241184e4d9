#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs every test suite (unit, functional, lab) and ends with "N passed, N failed".
# Lab tests need root (network namespaces); without it they are skipped (exit 77) and counted
# as skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh || exit 1

meson test -C build --print-errorlogs "$@"
rc=$?

python3 - build/meson-logs/testlog.json <<'PY'
import json, sys
passed = failed = skipped = 0
with open(sys.argv[1]) as f:
    for line in f:
        r = json.loads(line)
        res = r.get("result")
        if res in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif res == "SKIP":
            skipped += 1
        else:
            failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
exit $rc
