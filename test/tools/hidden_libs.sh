#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The plugins on a node without the optional libraries, as a standard GPU image is: in a
# private mount namespace, libibverbs, hiredis and libnl are covered by an empty file, and
# two vigil-netbench ranks stream over loopback through the net plugin (with its tuner and
# profiler). Expected: the run is exact; one INFO line says the verbs fabric is off for want
# of libibverbs and TCP is used; with VIGIL_TUNER_STORE=redis://... one WARN names hiredis and
# the tuner keeps to its rules; VIGIL_FABRIC=verbs (a data path that cannot be built as
# configured) fails init with a WARN that names the library.
# Needs root (unshare -m, mount --bind): else exit 77.
#   usage: hidden_libs.sh    (NETBENCH_BIN, NETBENCH_PLUGIN from meson)
set -euo pipefail
if [[ ${1:-} != --inside ]]; then
    if [[ $(id -u) -ne 0 ]] || ! unshare -m true 2>/dev/null; then
        echo "SKIP: needs root and mount namespaces" >&2
        exit 77
    fi
    exec unshare -m --propagation private "$0" --inside
fi

source "$(dirname "$0")/../functional/lib.sh"
export VIGIL_SOCKET_IFNAME="=lo" NCCL_DEBUG=INFO

hidden=()
for pat in 'libibverbs.so*' 'libhiredis.so*' 'libnl-3.so*' 'libnl-route-3.so*'; do
    for dir in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do
        for f in "$dir"/$pat; do
            [[ -e $f ]] || continue
            mount --bind /dev/null "$f"
            hidden+=("$f")
        done
    done
done
echo "hidden: ${hidden[*]:-(none installed)}"
# Nothing of them may load now, whatever asks.
python3 - <<'PY' || fail "a hidden library still loads"
import ctypes
for name in ("libibverbs.so.1", "libhiredis.so.0.14", "libhiredis.so.1.1.0", "libnl-3.so.200"):
    try:
        ctypes.CDLL(name)
    except OSError:
        continue
    raise SystemExit(f"{name} loaded")
PY

# grep_log FILES PATTERN WHAT: at least one line of the ranks' stderr matches.
grep_log() {
    local out=$1 pattern=$2 what=$3
    grep -hE "$pattern" "$out".err.* || { cat "$out".err.* >&2; fail "no line: $what"; }
}

# 1. Stream, all-reduce with the tuner and the profiler from the net library, store Redis.
out=$(VIGIL_TUNER_STORE=redis://127.0.0.1:6399 VIGIL_FABRIC=auto \
      run_ranks 2 --workload allreduce --bytes 4M --iters 20 --tuner net --tuner-nodes 2 --profile net)
expect_ok "$out"
grep_log "$out" 'INFO .*no verbs fabric \(no RDMA library \(.*libibverbs\.so\.1.*\)\); using tcp' \
    "the verbs fabric is off for want of libibverbs, TCP is used"
grep_log "$out" 'WARN .*VIGIL_TUNER_STORE=redis://127.0.0.1:6399 needs hiredis: no hiredis library' \
    "the tuner names hiredis and keeps to its rules"
out=$(run_ranks 2 --workload bandwidth --min-bytes 1 --max-bytes 16M --factor 16 --check --iters 8 --warmup 1)
expect_ok "$out"

# 2. VIGIL_FABRIC=verbs cannot be built here: init fails, saying why.
ranks_fail_init verbs VIGIL_FABRIC=verbs
grep -E 'WARN .*verbs fabric: no RDMA library \(.*libibverbs\.so\.1' "$TMP/verbs.err.0" ||
    { cat "$TMP"/verbs.err.* >&2; fail "no WARN naming libibverbs"; }
echo "hidden libraries: ok"
