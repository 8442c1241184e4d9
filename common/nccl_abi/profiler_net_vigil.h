/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own net-plugin profiler event descriptor (ncclProfileNetPlugin "extData"), shared
 * by the net plugin (producer) and a profiler that understands it. NCCL passes it through
 * untouched (docs/nccl-abi.md, "Net plugin events in the profiler"): netPlugin.id =
 * pluginId, netPlugin.data = a pointer to this struct. pluginId: low 16 bits the descriptor
 * version, next 16 bits the plugin type (NCCL's IB = 1 << 16, Socket = 2 << 16; ours below).
 * C-compatible; fixed layout (64 bytes). */
#ifndef VIGIL_NCCL_ABI_PROFILER_NET_VIGIL_H
#define VIGIL_NCCL_ABI_PROFILER_NET_VIGIL_H

#include <stdint.h>

#define VIGIL_PROFILER_NET_TYPE (0x5647 << 16) /* "VG" */
#define VIGIL_PROFILER_NET_VERSION 1
#define VIGIL_PROFILER_NET_ID ((int64_t)(VIGIL_PROFILER_NET_TYPE | VIGIL_PROFILER_NET_VERSION))

enum {
    vigilNetProfWindow = 1,   /* a closed telemetry window of the path */
    vigilNetProfFailover = 2, /* the connection left `slot` for the other path */
    vigilNetProfFailback = 3  /* the connection returned to its primary */
};

typedef struct {
    uint8_t type;        /* vigilNetProf* */
    uint8_t slot;        /* path: 0 primary, 1 backup */
    uint8_t degraded;    /* window: the detector's verdict */
    uint8_t state;       /* window: 1 active, 2 standby, 3 dead */
    uint32_t generation; /* connection generation */
    int32_t dev;         /* local NCCL device of the path */
    uint32_t window_us;  /* window: length */
    uint64_t start_ns;   /* window: CLOCK_MONOTONIC start; failover/failback: when */
    uint64_t bytes;      /* window: bytes completed; failover/failback: bytes replayed */
    uint64_t busy_ns;    /* window: time with data in flight */
    uint64_t lat_p99_ns; /* window: completion latency p99 */
    uint64_t conn;       /* the connection (as `conn` in the telemetry registry and files); 0 unknown */
    uint16_t share_permille; /* window: this path's share of its connection's bytes over the newest
                                windows of the paths that carry (multipath), per mille; 1000 for
                                the only carrying path; 0 when the connection moved nothing */
    uint16_t reserved16;
    uint32_t reserved32;
} vigilNetProfDescr_v1_t;

#endif /* VIGIL_NCCL_ABI_PROFILER_NET_VIGIL_H */
