// SPDX-License-Identifier: Apache-2.0
// The profiler's version-neutral event model: what one NCCL profiler event becomes once the
// ABI shim has translated its descriptor. The core never sees NCCL's descriptor types.
#pragma once

#include <cstdint>

namespace vigil::prof {

/// Event kinds. Values are NCCL's ncclProfile* bit positions (nccl_profiler.h;
/// docs/nccl-abi.md, "Profiler events and their timing"), so `1u << kind` is the
/// activation-mask bit.
enum class Kind : uint8_t {
    kGroup = 0,
    kColl = 1,
    kP2p = 2,
    kProxyOp = 3,
    kProxyStep = 4,
    kProxyCtrl = 5,
    kKernelCh = 6,
    kNet = 7,
    kGroupApi = 8,
    kCollApi = 9,
    kP2pApi = 10,
    kKernelLaunch = 11,
    kLegacyCount = 12, ///< kinds 0-11; 12-14 are NCCL's copy-engine events, never recorded
    kKernelPhase = 15, ///< v7: a phase of a symmetric kernel's channel
};

/// Whether `k` (a bit position of NCCL's mask) is a kind this profiler records.
constexpr bool recordable(unsigned k)
{
    return k < static_cast<unsigned>(Kind::kLegacyCount) || k == static_cast<unsigned>(Kind::kKernelPhase);
}

/// The activation-mask bit of `k`.
constexpr uint32_t bit(Kind k) { return 1u << static_cast<unsigned>(k); }

inline constexpr int kMaxStates = 6; ///< state transitions kept per event (the last one is
                                     ///< overwritten when more arrive)

/// A Vigil net-plugin event carried in-band (our descriptor, profiler_net_vigil.h).
struct NetInfo {
    uint8_t type;     ///< vigilNetProf*: 1 window, 2 failover, 3 failback; 0 not ours
    uint8_t slot;     ///< 0 primary, 1 backup
    uint8_t degraded;
    uint8_t state;    ///< 1 active, 2 standby, 3 dead
    uint32_t generation;
    int32_t dev;
    uint32_t window_us;
    uint64_t start_ns; ///< CLOCK_MONOTONIC
    uint64_t bytes;
    uint64_t busy_ns;
    uint64_t lat_p99_ns;
    uint64_t conn; ///< connection id, as in the telemetry registry (0 unknown)
    uint16_t share_permille; ///< window: the path's share of its connection's bytes (multipath)
};
static_assert(sizeof(NetInfo) == 64);

/// One event, as recorded (112 bytes; copied once, at stop, into the writer's ring).
/// `id` is the handle NCCL holds; `parent` the parent's handle when it is one of ours and
/// still live at start (else 0); `root` the Coll or P2p event the work belongs to (0 when
/// unknown). Times are CLOCK_MONOTONIC ns. String pointers are NCCL's static literals
/// (valid while NCCL is loaded; the writer is drained before the last finalize returns).
struct Record {
    Kind kind;
    uint8_t nstates;
    uint8_t flags;   ///< kFlag*
    uint8_t reserved;
    uint16_t ctx;    ///< context number (0: unknown or another process's, e.g. PXN)
    uint16_t thread; ///< pool of the thread that started it
    uint64_t id;
    uint64_t parent;
    uint64_t root;
    uint64_t start_ns;
    uint64_t stop_ns;
    union {
        struct {
            uint64_t seq;
            uint64_t count;
            const char *func;
            const char *datatype;
            const char *algo;
            const char *proto;
            int32_t root_rank;
            uint8_t channels;
            uint8_t warps;
            uint64_t user_tag; ///< v7: the application's tag (0 untagged)
        } coll;
        struct {
            uint64_t count;
            const char *func;
            const char *datatype;
            int32_t peer;
            uint8_t channels;
            uint64_t user_tag; ///< v7
        } p2p;
        struct {
            int32_t pid;
            int32_t peer;
            int32_t steps;
            int32_t chunk;
            uint8_t channel;
            uint8_t is_send;
            uint64_t in_progress_ns; ///< state 19, 0 if not seen
        } op;
        struct {
            int32_t step;
            uint8_t channel; ///< from the parent ProxyOp (255 unknown)
            uint8_t is_send;
            uint8_t state[kMaxStates];
            uint64_t trans_size;
            uint32_t at_ns[kMaxStates]; ///< since start_ns, saturated
        } step;
        struct {
            uint8_t channel;
            uint64_t gpu_start_ns; ///< GPU globaltimer
            uint64_t gpu_stop_ns;  ///< 0 until KernelChStop
        } kch;
        struct {
            uint8_t channel;
            uint8_t phase;         ///< 0 initial sync, 1 compute, 2 final sync
            const char *name;      ///< NCCL's static phase name
            uint64_t gpu_start_ns; ///< GPU globaltimer
            uint64_t gpu_stop_ns;  ///< 0 until KernelPhaseStop
        } phase;
        NetInfo net;
        struct {
            int64_t plugin_id; ///< a net event of another plugin: its pluginId
        } foreign_net;
        struct {
            uint64_t count;
            const char *func;
            const char *datatype;
            int32_t depth; ///< GroupApi: groupDepth
            uint8_t graph_captured;
            uint32_t start_stop_ns; ///< GroupApi: GroupStartApiStop (23), since start
            uint32_t end_start_ns;  ///< GroupApi: GroupEndApiStart (24), since start
        } api;
        struct {
            uint8_t state[kMaxStates];
            uint32_t at_ns[kMaxStates];
            int32_t appended;
        } ctrl;
    };
};
static_assert(sizeof(Record) == 112, "the ring and pool sizes are documented in these units");

inline constexpr uint8_t kFlagForeign = 2; ///< PXN: posted by another process
/// Coll/P2p: NCCL's activation mask had kernel-channel events on when it started, so its
/// channels' KernelCh events are due and the writer waits for them (NCCL samples the mask
/// per call; RAS may change it at run time from 2.31 on).
inline constexpr uint8_t kFlagKernelCh = 4;

} // namespace vigil::prof
