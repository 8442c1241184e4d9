#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Control for the scale benchmark's idle CPU (not a test, no Vigil involved): what one wake-up
# of a sleeping thread costs on this host, by the resident memory of the process, alone and
# with a second such process waking on the same CPU. A process holds M MiB resident, sleeps
# 28 ms 175 times (35 wake-ups a second, about what a quiet Vigil process has) and touches 10
# of its pages at each wake-up; the cost is its thread's run time (/proc schedstat) over its
# wake-ups. On hardware or a hardware-virtualised guest the figure barely moves with M; a
# hypervisor that shadows page tables charges the switch between two large address spaces
# (docs/scale.md, "Timers on the grid").
# Usage: scripts/bench_wake_cost.sh   (MIB="16 256 1024"; needs cc and taskset)
set -euo pipefail
MIB=${MIB:-16 256 1024}
tmp=$(mktemp -d /tmp/vigil-wake-cost.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/wake.c" <<'C'
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv)
{
    const size_t bytes = (size_t)atol(argv[1]) << 20, pages = bytes / 4096;
    char *p = malloc(bytes);
    if (p == NULL) return 1;
    memset(p, 1, bytes);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", (int)gettid());
    unsigned long long run0, wait0, n0, run1, wait1, n1;
    FILE *f = fopen(path, "r");
    if (f == NULL || fscanf(f, "%llu %llu %llu", &run0, &wait0, &n0) != 3) return 1;
    fclose(f);
    const struct timespec nap = {0, 28 * 1000 * 1000};
    volatile long sum = 0;
    for (int i = 0; i < 175; ++i) {
        nanosleep(&nap, NULL);
        for (size_t k = 0; k < 10; ++k) sum += p[(k * (pages / 10) % pages) * 4096];
    }
    f = fopen(path, "r");
    if (f == NULL || fscanf(f, "%llu %llu %llu", &run1, &wait1, &n1) != 3) return 1;
    fclose(f);
    printf("%.1f\n", (double)(run1 - run0) / 1e3 / (double)(n1 - n0));
    return 0;
}
C
cc -O2 -o "$tmp/wake" "$tmp/wake.c"
echo "# us per wake-up (run time / wake-ups, 175 wake-ups at 35 a second), one process alone on"
echo "# CPU 0, then two on CPU 0 at once (both figures)"
printf '%8s | %8s | %17s\n' MiB alone "two on one CPU"
for m in $MIB; do
    alone=$(taskset -c 0 "$tmp/wake" "$m")
    taskset -c 0 "$tmp/wake" "$m" >"$tmp/a" &
    pid=$!
    b=$(taskset -c 0 "$tmp/wake" "$m")
    wait "$pid"
    printf '%8s | %8s | %8s %8s\n' "$m" "$alone" "$(cat "$tmp/a")" "$b"
done
