#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Side-by-side benchmark (not a test): this build's net plugin against a baseline build of
# the plugin, alternating ROUNDS times on the same link, medians and ratios. The default
# baseline is the last byte-stream core before receiver-driven matching (CTS), to measure
# what CTS costs: unidirectional bandwidth at 4 MiB and 16 MiB messages and 8-byte ping-pong
# p50 latency (with a receive posted ahead, as NCCL posts its next steps, and as a plain
# ping-pong), on loopback and (as root) on a lab veth link. Targets: bandwidth >= 0.95x and
# p50 latency <= 1.10x the baseline.
#   scripts/bench_cts.sh [ROUNDS]
#   BASE_PLUGIN=/path/libnccl-net-vigil.so scripts/bench_cts.sh   # any other build
#   BASE_REV=<git revision> scripts/bench_cts.sh                   # build that revision
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ROUNDS=${1:-5}
SECS=${SECS:-3}
BASE_REV=${BASE_REV:-00543d9}
bin=$PWD/build/test/netbench/vigil-netbench
plugin=$PWD/build/net_plugin/libnccl-net-vigil.so
tmp=$(mktemp -d /tmp/vigil-bench-cts.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

if [[ -z ${BASE_PLUGIN:-} ]]; then
    # Build the baseline once into a cache outside the checkout (a detached worktree).
    cache=${VIGIL_BENCH_CACHE:-/var/tmp/vigil-bench-base}/$BASE_REV
    BASE_PLUGIN=$cache/build/net_plugin/libnccl-net-vigil.so
    if [[ ! -f $BASE_PLUGIN ]]; then
        echo "# building the baseline $BASE_REV in $cache" >&2
        rm -rf "$cache"
        mkdir -p "$cache"
        git worktree add --detach "$cache/src" "$BASE_REV" >/dev/null 2>&1
        meson setup "$cache/build" "$cache/src" >/dev/null
        ninja -C "$cache/build" net_plugin/libnccl-net-vigil.so >/dev/null
        git worktree remove --force "$cache/src" >/dev/null 2>&1 || true
    fi
fi
[[ -f $BASE_PLUGIN ]] || { echo "bench_cts: no baseline plugin at $BASE_PLUGIN" >&2; exit 1; }

source scripts/bench_lib.sh

# one PLUGIN SRV CLI IFNAME WORKLOAD BYTES ITERS KEY -> the KEY of rank 0's summary
one() { # PLUGIN SRV CLI IFNAME WORKLOAD BYTES ITERS KEY [netbench arguments...]
    local rdv="unix:$tmp/rdv.$RANDOM$RANDOM.sock" srv_pid
    VIGIL_SOCKET_IFNAME="=$4" run_in "$2" "$bin" --plugin "$1" --rank 1 --nranks 2 --rendezvous "$rdv" \
        --workload "$5" --bytes "$6" --iters "$7" "${@:9}" >/dev/null &
    srv_pid=$!
    VIGIL_SOCKET_IFNAME="=$4" run_in "$3" "$bin" --plugin "$1" --rank 0 --nranks 2 --rendezvous "$rdv" \
        --workload "$5" --bytes "$6" --iters "$7" "${@:9}" >"$tmp/one.json"
    wait "$srv_pid"
    jget "$tmp/one.json" "$8"
}

site() { # label SRV CLI IFNAME
    local label=$1 srv=$2 cli=$3 ifn=$4 size k
    for size in 4194304 16777216; do
        local vs=() bs=() iters=$(( (SECS * 3 * 1000000000) / size ))
        for ((k = 0; k < ROUNDS; k++)); do
            vs+=("$(one "$plugin" "$srv" "$cli" "$ifn" bandwidth "$size" "$iters" gbps)")
            bs+=("$(one "$BASE_PLUGIN" "$srv" "$cli" "$ifn" bandwidth "$size" "$iters" gbps)")
        done
        local v b; v=$(median "${vs[@]}"); b=$(median "${bs[@]}")
        printf "%-36s %10.3f %10.3f %8.3f\n" "$label bw $((size >> 20)) MiB (GB/s)" "$v" "$b" "$(python3 -c "print($v/$b)")"
    done
    # The latency workload keeps a receive posted ahead (as NCCL posts its next steps), then
    # as a plain ping-pong (each receive posted after the previous message).
    local ahead
    for ahead in 1 0; do
        local vl=() bl=()
        for ((k = 0; k < ROUNDS; k++)); do
            vl+=("$(one "$plugin" "$srv" "$cli" "$ifn" latency 8 20000 lat_p50_us --recv-ahead $ahead)")
            bl+=("$(one "$BASE_PLUGIN" "$srv" "$cli" "$ifn" latency 8 20000 lat_p50_us --recv-ahead $ahead)")
        done
        local v b; v=$(median "${vl[@]}"); b=$(median "${bl[@]}")
        printf "%-36s %10.2f %10.2f %8.3f\n" "$label lat 8 B p50 (us)$([[ $ahead == 0 ]] && echo ", plain")" "$v" "$b" \
            "$(python3 -c "print($v/$b)")"
    done
}

if [[ -z ${NETLAB:-} ]]; then
    echo "# vigil CTS cost: this build vs baseline ($BASE_PLUGIN), ${SECS}s per measurement, median of $ROUNDS alternating rounds"
    echo "# $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    printf "%-36s %10s %10s %8s\n" "measurement" "this" "baseline" "ratio"
    site loopback local local lo
    if [[ $(id -u) -eq 0 ]]; then
        BASE_PLUGIN=$BASE_PLUGIN scripts/netlab.sh run -H 2 -P 1 -- "$0" "$ROUNDS"
    fi
    exit 0
fi
site "lab veth" 1 0 eth0
