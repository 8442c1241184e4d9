#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The driver against the built plugin over loopback, through ncclNetPlugin_v$1: all-reduce,
# multi-recv, NULL-request retries, checked latency and a bandwidth sweep from 0 B; with
# "big" as $2 also a checked 1 GiB message; with "threads", all of it with three progress
# threads (VIGIL_SOCKET_NTHREADS=3) and the channel pattern on top: connections served by
# different threads at once, the application's test() racing them.
source "$(dirname "$0")/lib.sh"
V=$1
export VIGIL_SOCKET_IFNAME="=lo"
[[ ${2:-} == threads ]] && export VIGIL_SOCKET_NTHREADS=3

out=$(run_ranks 2 --api-version "$V" --workload allreduce --bytes 8M --iters 2)
expect_ok "$out"
[[ $(json_get "$out" api_version) == "$V" ]] || fail "loaded v$(json_get "$out" api_version), wanted v$V"

out=$(run_ranks 2 --api-version "$V" --workload multirecv --iters 40)
expect_ok "$out"

# 48 receives in flight > NCCL_NET_MAX_REQUESTS (32): the plugin must answer with NULL
# requests and the driver retries, as NCCL does.
out=$(run_ranks 2 --api-version "$V" --workload bandwidth --min-bytes 0 --max-bytes 16M --factor 16 --window 48 --check --iters 64 --warmup 4)
expect_ok "$out"
(( $(json_get "$out" null_retries) > 0 )) || fail "no NULL-request retry happened with 48 receives in flight"

out=$(run_ranks 2 --api-version "$V" --workload latency --iters 300 --warmup 20 --check)
expect_ok "$out"

if [[ ${2:-} == big ]]; then
    out=$(run_ranks 2 --api-version "$V" --workload bandwidth --bytes 1G --iters 1 --warmup 0 --check)
    expect_ok "$out"
fi
if [[ ${2:-} == threads ]]; then
    out=$(run_ranks 3 --api-version "$V" --workload allreduce --bytes 24M --iters 3 --channels 4)
    expect_ok "$out"
    out=$(run_ranks 2 --api-version "$V" --workload bandwidth --min-bytes 0 --max-bytes 16M --factor 4 --channels 5 --check --iters 100 --warmup 5)
    expect_ok "$out"
fi
echo "loopback v$V${2:+ ($2)}: ok"
