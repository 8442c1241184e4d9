#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# perftest.sh  (run INSIDE the lab's guest, after topo.sh up)  The reference figures Vigil's
# verbs benchmarks are compared with: perftest's ib_write_bw and ib_write_lat between rxe_a1
# and rxe_b1 (RC, one QP, RoCE v2 GID index 1), printed as a Markdown table.
# From the host: scripts/rxe/vm.sh 'scripts/rxe/topo.sh up && scripts/rxe/perftest.sh'
#
# perftest converts CPU cycles to time with a clock rate it samples at start and refuses
# (reports 0 or inf) when the sample is noisy (r^2 < 0.9), which happens under TCG on a
# loaded host. Each run is therefore retried up to PERF_TRIES times; ib_write_bw's duration
# mode also prints the messages it completed, so when every try fails the bandwidth is derived
# from that count (marked "from the count"). Latency is measured in cycles (-C) and converted
# with the guest's calibrated TSC rate.
# Environment: PERF_SECONDS (per bandwidth size, default 5), PERF_LAT_ITERS (default 1000),
# PERF_TRIES (default 5), PERF_TESTS (default "bw lat").
set -uo pipefail
secs=${PERF_SECONDS:-5}
iters=${PERF_LAT_ITERS:-1000}
tries=${PERF_TRIES:-5}
server_ip=10.11.0.2

# One server + client run; prints the client's result line for message size $2.
run_once() { # tool, size, args...
    local tool=$1 size=$2
    shift 2
    "$tool" -d rxe_b1 -x 1 -F -s "$size" "$@" >/dev/null 2>&1 &
    local srv=$!
    sleep 1
    timeout 180 "$tool" -d rxe_a1 -x 1 -F -s "$size" "$@" "$server_ip" 2>/dev/null |
        awk -v s="$size" '$1 == s'
    wait "$srv" 2>/dev/null
}

echo "| test | message | result |"
echo "|---|---|---|"
tests=${PERF_TESTS:-bw lat}
[[ $tests == *bw* ]] && for size in 4096 65536 1048576; do
    result=
    for ((t = 1; t <= tries; t++)); do
        line=$(run_once ib_write_bw "$size" -q 1 -D "$secs" --report_gbits)
        # columns: bytes iterations BW-peak[Gb/s] BW-average[Gb/s] MsgRate[Mpps]
        if awk '{exit !($4 > 0)}' <<<"$line"; then
            result=$(awk '{printf "%.3f Gbit/s, %.0f msg/s", $4, $5 * 1e6}' <<<"$line")
            break
        fi
    done
    if [[ -z $result && -n ${line:-} ]]; then
        result=$(awk -v d="$secs" '{printf "%.3f Gbit/s from the count (%d messages in %d s; clock calibration failed %d times)", $2 * $1 * 8 / d / 1e9, $2, d, t - 1}' t="$t" <<<"$line")
    fi
    echo "| ib_write_bw, ${secs} s | $size B | ${result:-n/a} |"
done
# Latency in CPU cycles (-C: no clock sampling), turned into microseconds with the TSC rate
# the guest kernel calibrated (/proc/cpuinfo "cpu MHz"), which is what perftest itself uses
# when its own sample agrees.
mhz=$(awk -F: '/^cpu MHz/ {print $2 + 0; exit}' /proc/cpuinfo)
[[ $tests == *lat* ]] && for size in 8 4096; do
    line=$(run_once ib_write_lat "$size" -n "$iters" -C)
    # columns: bytes iterations t_min t_max t_typical t_avg t_stdev p99 p99.9 (cycles)
    result=$(awk -v m="$mhz" '$5 > 0 {printf "min %.1f us, typical %.1f us, avg %.1f us, p99 %.1f us, p99.9 %.1f us", $3 / m, $5 / m, $6 / m, $8 / m, $9 / m}' <<<"$line")
    echo "| ib_write_lat, $iters iterations | $size B | ${result:-n/a} |"
done
exit 0
