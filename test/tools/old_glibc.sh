#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The plugins on an older glibc than the build's: Debian 11's glibc 2.31 (which still has
# pthread_* in libpthread and dl* in libdl, like RHEL 8's 2.28), run through its own dynamic
# loader. Two ranks of vigil-netbench-portable (the driver linked like the plugins) run a
# checked all-reduce and a bandwidth sweep over loopback through the net plugin, with the
# tuner and the profiler from their own libraries, profiler files written. Any symbol the
# old glibc lacks fails the load: "version `GLIBC_2.3x' not found".
# scripts/setup.sh unpacks that glibc into OLD_GLIBC_ROOT (default below); without it, or
# as non-root, exit 77.
#   usage: old_glibc.sh NETBENCH_PORTABLE NET_SO TUNER_SO PROFILER_SO COMPAT_START
set -euo pipefail
BIN=${1:?usage: old_glibc.sh NETBENCH_PORTABLE NET_SO TUNER_SO PROFILER_SO COMPAT_START}
NET=${2:?}
TUNER=${3:?}
PROF=${4:?}
START=${5:?}
OLD=${OLD_GLIBC_ROOT:-/var/cache/vigil/glibc-2.31}/lib/x86_64-linux-gnu
if [[ ! -x $OLD/ld-linux-x86-64.so.2 ]]; then
    echo "SKIP: no older glibc in $OLD (scripts/setup.sh fetches Debian 11's libc6 as root)" >&2
    exit 77
fi
TMP=$(mktemp -d /tmp/vigil-oldglibc.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

version=$("$OLD/ld-linux-x86-64.so.2" --library-path "$OLD" "$OLD/libc.so.6" | head -1)
echo "loader: $version"
[[ $version == *"2.31"* ]] || fail "$OLD is not glibc 2.31"
# A program linked like the portable driver runs its constructors once there too.
"$OLD/ld-linux-x86-64.so.2" --library-path "$OLD" "$START" || fail "constructors: $("$OLD/ld-linux-x86-64.so.2" --library-path "$OLD" "$START")"
"$START" >/dev/null || fail "constructors on this glibc: $("$START")"

# ranks WHAT ARGS...: two ranks under the old loader; rank 0's JSON summary must say ok.
ranks() {
    local what=$1 rdv="unix:$TMP/rdv.$1.sock" pids=() r rc=0
    shift
    for r in 1 0; do
        "$OLD/ld-linux-x86-64.so.2" --library-path "$OLD" "$BIN" --plugin "$NET" --rank "$r" \
            --nranks 2 --rendezvous "$rdv" --timeout 120 "$@" \
            >"$TMP/$what.out.$r" 2>"$TMP/$what.err.$r" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    if ((rc)) || ! tail -1 "$TMP/$what.out.0" | grep -q '"ok":true'; then
        cat "$TMP/$what".out.* "$TMP/$what".err.* >&2
        fail "$what: the ranks failed under glibc 2.31"
    fi
    echo "$what: $(tail -1 "$TMP/$what.out.0")"
}

export VIGIL_SOCKET_IFNAME="=lo" VIGIL_FABRIC=tcp VIGIL_PROFILE_DIR="$TMP/prof"
export VIGIL_TELEMETRY_DIR="$TMP/telemetry" NCCL_DEBUG=INFO
ranks allreduce --workload allreduce --bytes 4M --iters 20 --tuner "$TUNER" --profile "$PROF"
ranks bandwidth --workload bandwidth --min-bytes 1 --max-bytes 16M --factor 16 --check --iters 8 --warmup 1
grep -q 'vigil .* loaded, ncclNet' "$TMP"/allreduce.err.0 || fail "no load banner from the net plugin"
grep -q 'PROFILER/Vigil profiler v' "$TMP"/allreduce.err.0 || fail "no profiler banner"
grep -q 'TUNER/Vigil' "$TMP"/allreduce.err.0 || fail "no tuner line"
ls "$TMP"/prof/*.jsonl >/dev/null 2>&1 || fail "the profiler wrote no summary"
ls "$TMP"/telemetry/*.jsonl >/dev/null 2>&1 || fail "no telemetry file"
echo "old glibc: ok"
