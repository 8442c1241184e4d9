#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Side-by-side benchmark (not a test): the plugin's unidirectional bandwidth at 4 MiB and
# 16 MiB messages against iperf3 with the same number of streams, on loopback and on a lab
# link, and its small-message latency against sockperf ping-pong, alternating the tools
# ROUNDS times and reporting medians and ratios. Targets: >= 0.95x iperf3, <= 1.3x sockperf.
# Needs root for the lab part, which also runs the failover benchmarks
# (scripts/bench_failover.sh, scripts/bench_failover_tput.sh); then the profiler's cost
# (scripts/bench_profiler.sh). Usage: scripts/bench.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ROUNDS=${1:-3}
SECS=${SECS:-4}
STREAMS=${VIGIL_NSTREAMS:-2}
export VIGIL_NSTREAMS=$STREAMS
bin=$PWD/build/test/netbench/vigil-netbench
plugin=$PWD/build/net_plugin/libnccl-net-vigil.so
tmp=$(mktemp -d /tmp/vigil-bench.XXXXXX)
source scripts/pids.sh
# The reference servers run in command substitutions: each is recorded in $tmp/servers.
trap 'pid_stop_recorded "$tmp/servers"; rm -rf "$tmp"' EXIT
# server WHERE NAME CMD...: a reference server in the background; sets BG_PID.
server() {
    local where=$1 name=$2
    shift 2
    bg_start "$where" "$@" >/dev/null 2>&1
    pid_record "$tmp/servers" "$name"
}

source scripts/bench_lib.sh

# vigil_bw SRV_WHERE CLI_WHERE IFNAME BYTES -> GB/s (rank 0 = sender in CLI_WHERE)
vigil_bw() {
    local rdv="unix:$tmp/rdv.$RANDOM.sock" iters
    iters=$(( (SECS * 3 * 1000000000) / $4 ))   # ~SECS at 3 GB/s
    VIGIL_SOCKET_IFNAME="=$3" run_in "$1" "$bin" --plugin "$plugin" --rank 1 --nranks 2 --rendezvous "$rdv" \
        --workload bandwidth --bytes "$4" --iters "$iters" >/dev/null &
    VIGIL_SOCKET_IFNAME="=$3" run_in "$2" "$bin" --plugin "$plugin" --rank 0 --nranks 2 --rendezvous "$rdv" \
        --workload bandwidth --bytes "$4" --iters "$iters" >"$tmp/vb.json"
    wait
    jget "$tmp/vb.json" gbps
}

# iperf_bw SRV_WHERE CLI_WHERE SRV_ADDR BYTES -> GB/s, same stream count; write size
# min(BYTES, 1 MiB), iperf3's largest block
iperf_bw() {
    local port=$((5200 + RANDOM % 100))
    server "$1" iperf3 iperf3 -s -p "$port" -1
    local spid=$BG_PID
    sleep 0.3
    run_in "$2" iperf3 -c "$3" -p "$port" -P "$STREAMS" -t "$SECS" -l "$(( $4 < 1048576 ? $4 : 1048576 ))" -J >"$tmp/ip.json"
    # A one-off server (-1) ends after its client; stop it in case the client never came.
    pid_stop "$spid" iperf3 || true
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]/8e9)' "$tmp/ip.json"
}

vigil_lat() {
    local rdv="unix:$tmp/rdv.$RANDOM.sock"
    VIGIL_SOCKET_IFNAME="=$3" run_in "$1" "$bin" --plugin "$plugin" --rank 1 --nranks 2 --rendezvous "$rdv" \
        --workload latency --bytes 8 --iters 20000 >/dev/null &
    VIGIL_SOCKET_IFNAME="=$3" run_in "$2" "$bin" --plugin "$plugin" --rank 0 --nranks 2 --rendezvous "$rdv" \
        --workload latency --bytes 8 --iters 20000 >"$tmp/vl.json"
    wait
    jget "$tmp/vl.json" lat_p50_us
}

sockperf_lat() {
    local port=$((11000 + RANDOM % 1000))
    server "$1" sockperf sockperf server --tcp -i "$3" -p "$port"
    local spid=$BG_PID
    sleep 0.3
    run_in "$2" sockperf ping-pong --tcp -i "$3" -p "$port" -m 14 -t "$SECS" >"$tmp/sp.txt" 2>&1 || true
    pid_stop "$spid" sockperf || echo "bench: sockperf server (pid $spid) ended early" >&2
    # "---> percentile 50.000 =   12.345" (usec, half round trip). 14 B is the smallest
    # message sockperf sends (its header); vigil sends 8 B.
    awk '/percentile 50.000/ {print $NF}' "$tmp/sp.txt"
}

report_bw() { # name vigil-list iperf-list
    local v i; v=$(median $2); i=$(median $3)
    printf "%-34s %10.3f %10.3f %8.3f\n" "$1" "$v" "$i" "$(python3 -c "print($v/$i)")"
}

bench_site() { # label SRV CLI IFNAME SRV_ADDR
    local label=$1 srv=$2 cli=$3 ifn=$4 addr=$5 size
    for size in 4194304 16777216; do
        local vs=() is=()
        for ((k = 0; k < ROUNDS; k++)); do vs+=("$(vigil_bw "$srv" "$cli" "$ifn" "$size")"); is+=("$(iperf_bw "$srv" "$cli" "$addr" "$size")"); done
        report_bw "$label bw $((size >> 20)) MiB (GB/s)" "${vs[*]}" "${is[*]}"
    done
    local vl=() sl=()
    for ((k = 0; k < ROUNDS; k++)); do vl+=("$(vigil_lat "$srv" "$cli" "$ifn")"); sl+=("$(sockperf_lat "$srv" "$cli" "$addr")"); done
    local v s; v=$(median "${vl[@]}"); s=$(median "${sl[@]}")
    printf "%-34s %10.2f %10.2f %8.3f\n" "$label lat 8 B p50 (us)" "$v" "$s" "$(python3 -c "print($v/$s)")"
}

if [[ -z ${NETLAB:-} ]]; then
    echo "# vigil bench: $STREAMS streams, ${SECS}s per measurement, median of $ROUNDS alternating rounds"
    echo "# $(nproc) cores, $(uname -r), $(iperf3 --version | head -1), $(sockperf --version 2>&1 | grep -o 'sockperf-version[^,]*' | head -1)"
    printf "%-34s %10s %10s %8s\n" "measurement" "vigil" "reference" "ratio"
    bench_site loopback local local lo 127.0.0.1
    if [[ $(id -u) -eq 0 ]]; then
        scripts/netlab.sh run -H 2 -P 1 -- "$0" "$@"
        echo
        scripts/bench_telemetry.sh 5
        echo
        scripts/bench_failover.sh 30
        echo
        scripts/bench_failover_tput.sh
    fi
    echo
    scripts/bench_profiler.sh 5
    exit 0
fi
bench_site "lab veth" 1 0 eth0 10.77.0.2
