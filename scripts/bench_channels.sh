#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Side-by-side benchmark (not a test): NCCL's channel pattern against iperf3. One process
# pair with N connections (vigil-netbench --workload bandwidth --channels N: message k on
# connection k mod N, the run ends with the slowest) against `iperf3 -P N` on the same link,
# alternating ROUNDS times, at N = 1, 2, 4, 8; reports the median throughput, its ratio, and
# CPU seconds per GB moved by both processes (vigil-netbench: getrusage of both ranks;
# iperf3: its own getrusage-based host + remote CPU utilisation times the run's length).
# Targets: throughput ratio >= 0.9 and CPU per GB <= 1.2x iperf3's at every N.
# Loopback always; the lab veth pair too when run as root. VIGIL_SOCKET_NTHREADS and
# VIGIL_NSTREAMS pass through (the plugin's log goes to a file: a CPU-bound host flags paths
# degraded, which is noise here). Loopback and veth are CPU-bound: they show the per-connection
# CPU cost, not a NIC's interrupt and NUMA effects.
# Usage: scripts/bench_channels.sh [ROUNDS] (BYTES=4M, SECS=3, CHANNELS="1 2 4 8")
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ROUNDS=${1:-3}
SECS=${SECS:-3}
BYTES=${BYTES:-4M}
CHANNELS=${CHANNELS:-1 2 4 8}
bin=$PWD/build/test/netbench/vigil-netbench
plugin=$PWD/build/net_plugin/libnccl-net-vigil.so
tmp=$(mktemp -d /tmp/vigil-bench-ch.XXXXXX)
source scripts/pids.sh
# iperf3 servers run in command substitutions: each is recorded in $tmp/servers.
trap 'pid_stop_recorded "$tmp/servers"; rm -rf "$tmp"' EXIT
source scripts/bench_lib.sh
bytes_of() { python3 -c 'import sys; s=sys.argv[1]; m={"K":1<<10,"M":1<<20,"G":1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))' "$1"; }
size=$(bytes_of "$BYTES")

# vigil_run SRV CLI IFNAME N -> "GB/s CPU_s_per_GB"
vigil_run() {
    local rdv="unix:$tmp/rdv.$RANDOM.sock" iters
    iters=$(( (SECS * 5 * 1000000000) / size ))   # ~SECS at 5 GB/s
    VIGIL_SOCKET_IFNAME="=$3" run_in "$1" "$bin" --plugin "$plugin" --rank 1 --nranks 2 --rendezvous "$rdv" \
        --workload bandwidth --bytes "$size" --iters "$iters" --channels "$4" >/dev/null 2>>"$tmp/vigil.log" &
    local rpid=$!
    VIGIL_SOCKET_IFNAME="=$3" run_in "$2" "$bin" --plugin "$plugin" --rank 0 --nranks 2 --rendezvous "$rdv" \
        --workload bandwidth --bytes "$size" --iters "$iters" --channels "$4" >"$tmp/v.json" 2>>"$tmp/vigil.log" ||
        { cat "$tmp/vigil.log" >&2; return 1; }
    wait "$rpid" || { cat "$tmp/vigil.log" >&2; return 1; }
    python3 - "$tmp/v.json" <<'PY'
import json, sys
d = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert d["ok"] and d["errors"] == 0, d
print(d["gbps"], d["cpu_s"] / (d["bytes"] / 1e9))
PY
}

# iperf_run SRV CLI ADDR N -> "GB/s CPU_s_per_GB"
iperf_run() {
    local port=$((5200 + RANDOM % 100))
    bg_start "$1" iperf3 -s -p "$port" -1 >/dev/null 2>&1
    pid_record "$tmp/servers" iperf3
    local spid=$BG_PID
    sleep 0.3
    run_in "$2" iperf3 -c "$3" -p "$port" -P "$4" -t "$SECS" -l "$(( size < 1048576 ? size : 1048576 ))" -J >"$tmp/ip.json"
    pid_stop "$spid" iperf3 || true
    python3 - "$tmp/ip.json" <<'PY'
import json, sys
e = json.load(open(sys.argv[1]))["end"]
gbps = e["sum_received"]["bits_per_second"] / 8e9
secs = e["sum_received"]["seconds"]
cpu = e["cpu_utilization_percent"]
cpu_s = (cpu["host_total"] + cpu["remote_total"]) / 100 * secs
print(gbps, cpu_s / (gbps * secs))
PY
}

bench_site() { # label SRV CLI IFNAME ADDR
    local label=$1 srv=$2 cli=$3 ifn=$4 addr=$5 n k
    for n in $CHANNELS; do
        local vb=() vc=() ib=() ic=() r
        for ((k = 0; k < ROUNDS; k++)); do
            r=$(vigil_run "$srv" "$cli" "$ifn" "$n"); vb+=("${r% *}"); vc+=("${r#* }")
            r=$(iperf_run "$srv" "$cli" "$addr" "$n"); ib+=("${r% *}"); ic+=("${r#* }")
        done
        local v i cv ci
        v=$(median "${vb[@]}"); i=$(median "${ib[@]}"); cv=$(median "${vc[@]}"); ci=$(median "${ic[@]}")
        printf "%-10s %3d %10.3f %10.3f %7.3f %10.3f %10.3f %7.3f\n" "$label" "$n" "$v" "$i" \
            "$(python3 -c "print($v/$i)")" "$cv" "$ci" "$(python3 -c "print($cv/$ci)")"
    done
}

if [[ -z ${NETLAB:-} ]]; then
    echo "# vigil bench_channels: $BYTES messages, ${SECS}s per measurement, median of $ROUNDS alternating rounds"
    echo "# $(nproc) cores, $(uname -r), $(iperf3 --version | head -1), VIGIL_NSTREAMS=${VIGIL_NSTREAMS:-default}," \
         "VIGIL_SOCKET_NTHREADS=${VIGIL_SOCKET_NTHREADS:-default}"
    printf "%-10s %3s %10s %10s %7s %10s %10s %7s\n" "link" "N" "vigil GB/s" "iperf3" "ratio" "vigil s/GB" "iperf3" "ratio"
    bench_site loopback local local lo 127.0.0.1
    if [[ $(id -u) -eq 0 ]]; then scripts/netlab.sh run -H 2 -P 1 -- "$0" "$@"; fi
    exit 0
fi
bench_site "lab veth" 1 0 eth0 10.77.0.2
