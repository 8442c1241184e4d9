#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# scripts/gpu_check.sh on a machine without a CUDA device: exit 77 with one line saying why,
# nothing run; its Python parses.
#   usage: skip_test.sh GPU_CHECK_SH
set -uo pipefail
CHECK=${1:?usage: skip_test.sh GPU_CHECK_SH}
HERE=$(dirname "$0")
for f in "$HERE/torch_check.py" "$HERE/gpu_report.py"; do
    python3 -c "import ast, sys; ast.parse(open(sys.argv[1]).read())" "$f" || { echo "FAIL: $f does not parse" >&2; exit 1; }
done
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "SKIP: this machine has a CUDA device; the check would run (scripts/gpu_check.sh)" >&2
    exit 77
fi
out=$(mktemp -d /tmp/vigil-gpu-skip.XXXXXX)
trap 'rm -rf "$out"' EXIT
rc=0
TMPDIR=$out "$CHECK" --out "$out/o" >"$out/stdout" 2>"$out/stderr" || rc=$?
[[ $rc == 77 ]] || { cat "$out/stderr" >&2; echo "FAIL: exit $rc without a GPU, wanted 77" >&2; exit 1; }
grep -q 'SKIP: no' "$out/stderr" || { cat "$out/stderr" >&2; echo "FAIL: no reason given" >&2; exit 1; }
[[ ! -s $out/stdout ]] || { echo "FAIL: it printed to stdout" >&2; exit 1; }
echo "gpu check without a GPU: $(cat "$out/stderr")"
