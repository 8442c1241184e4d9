// SPDX-License-Identifier: Apache-2.0
// Per-communicator collective counters that the profiler publishes for `vigil export`
// (Prometheus): one shared-memory segment per process,
// /dev/shm/vigilprof-<uid>-<pid>-<16 hex>, mode 0600, liveness by flock like the telemetry
// registry (registry.h). Versioned layout:
//
//   ProfHeader                 (1 KiB: identity of the process, recorder counters)
//   CommEntry[kMaxComms]       (a communicator: identity + counters per collective type)
//
// Writer: the profiler's writer thread only (single producer; relaxed atomic stores).
// Readers: `vigil export`, which may read while it is written (every field is one atomic;
// a reader sees each counter monotonic, not all counters of one instant).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "registry.h"

namespace vigil::telemetry {

inline constexpr char kProfMagic[8] = {'V', 'G', 'L', 'P', 'R', 'O', 'F', '1'};
inline constexpr uint32_t kProfVersion = 1;
inline constexpr char kProfStem[] = "vigilprof";
inline constexpr uint32_t kMaxComms = 256;

/// Collective types with their own counters (low cardinality by design).
enum class CollType : uint8_t {
    kAllReduce, kAllGather, kReduceScatter, kBroadcast, kReduce, kSend, kRecv, kOther, kCount
};
/// The type of NCCL's `func` string ("AllReduce", "Send", ...; anything else kOther).
CollType coll_type(const char *func) noexcept;
/// Lower-case label value of a type ("allreduce", ...).
const char *coll_type_name(CollType t) noexcept;

struct CollCounters {
    std::atomic<uint64_t> count;
    std::atomic<uint64_t> bytes;
    std::atomic<uint64_t> time_ns;     ///< sum of durations (arrival to completion)
    std::atomic<uint64_t> busbw_Bps;   ///< bus bandwidth of the last timed one, bytes/s
};

struct CommEntry {
    std::atomic<uint32_t> in_use; ///< 0 free, 1 live (written last), 2 finalized
    int32_t rank;
    int32_t nranks;
    uint32_t reserved0;
    uint64_t comm_hash;
    char name[64];
    CollCounters types[static_cast<int>(CollType::kCount)];
    uint64_t reserved[8];
};

struct ProfHeader {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint32_t entry_size;
    uint32_t max_comms;
    int32_t pid;
    uint32_t reserved0;
    char host[64];
    std::atomic<uint32_t> comms_used; ///< high-water mark of entries handed out
    uint32_t reserved1;
    std::atomic<uint64_t> events;     ///< profiler events recorded
    std::atomic<uint64_t> dropped;    ///< events dropped (pools, rings, threads) or not
                                      ///< written (file bounds)
    uint8_t pad[1024 - 8 - 6 * 4 - 64 - 2 * 4 - 2 * 8];
};
static_assert(sizeof(ProfHeader) == 1024);

/// The producer side (the profiler's writer thread). Not thread-safe: one caller.
class ProfMetrics
{
public:
    /// Creates the segment (idempotent). Returns 0 or -errno (metrics then stay off).
    int open();
    bool is_open() const { return hdr_ != nullptr; }
    /// An entry for a new communicator, or nullptr (closed or full).
    CommEntry *add_comm(uint64_t comm_hash, const char *name, int rank, int nranks);
    void finalize_comm(CommEntry *e);
    /// Counts one finished collective of `e` (`duration_ns` 0: untimed, only counted).
    void count(CommEntry *e, const char *func, uint64_t bytes, uint64_t duration_ns, double busbw_Bps);
    void set_totals(uint64_t events, uint64_t dropped);
    /// Unmaps and unlinks the segment (idempotent); entries handed out become invalid.
    void close();
    /// In a forked child: unmaps the segment and closes this process's descriptor without
    /// unlinking it (the parent owns it; its flock stays with the parent's descriptor).
    /// Entries handed out become invalid. Idempotent.
    void forget();

private:
    ProfHeader *hdr_ = nullptr;
    CommEntry *entries_ = nullptr;
    Segment seg_;
};

/// A read-only, validated mapping of one process's segment.
class ProfView
{
public:
    ~ProfView();
    /// Returns 0 or -errno with *why (bad magic, version or layout).
    int open(const std::string &file, std::string *why);
    const ProfHeader &header() const { return *hdr_; }
    uint32_t entries() const;
    const CommEntry &entry(uint32_t i) const;

private:
    void *base_ = nullptr;
    size_t size_ = 0;
    const ProfHeader *hdr_ = nullptr;
};

} // namespace vigil::telemetry
