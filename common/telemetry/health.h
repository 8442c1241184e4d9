// SPDX-License-Identifier: Apache-2.0
// Per-device health read from the net plugin's telemetry registry (registry.h), for the
// tuner (which publishes it to its store) and the `vigil` tool; and the tuner's per-process
// status segment, where it shows the agreed view of each communicator to `vigil top` and
// `vigil export`.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "registry.h"

namespace vigil::telemetry {

/// One local NIC (an NCCL device of the net plugin) as the registry shows it.
struct DeviceHealth {
    std::string name;          ///< device name ("eth0")
    uint32_t dev = 0;          ///< NCCL device index
    uint32_t paths = 0;        ///< live path entries on the device
    bool failed = false;       ///< a path on it is dead: its traffic failed over
    bool degraded = false;     ///< a live path on it is flagged by the detector
    /// Worst degraded path's busy-time bandwidth (bytes/s), 0 if none: per path the detector's
    /// judged value when it flagged the path (PathEntry::verdict_judged_bps), or from a writer
    /// without that field the median over its flagged windows still in the ring.
    double judged_bps = 0;
    double baseline_bps = 0;   ///< that path's baseline (bytes/s), from the same window
    uint64_t failovers = 0;    ///< failovers of the device's paths, summed
    /// Busy-time bandwidth over baseline: 0 when failed, judged/baseline when degraded (1
    /// when the baseline is unknown), else 1.
    double fraction() const;
};

/// The devices of one process (one registry segment).
struct ProcessHealth {
    std::string host;
    int pid = 0;
    std::vector<DeviceHealth> devices; ///< sorted by device index
    /// Some connection sends on two live paths at once (multipath: its backup carries a
    /// share), seen as two send entries of one connection both active.
    bool multipath = false;
    /// The process's effective network bandwidth fraction; 1 with no devices. Without
    /// multipath: min(the smallest degraded fraction, (devices - failed) / devices), as
    /// traffic is split evenly over channels, so the slowest NIC paces a ring, and a failed
    /// NIC's share moves onto the others. With multipath each path takes what its port
    /// drains, so what is left is the mean of the devices' fractions (a failed one: 0).
    double effective_fraction() const;
};

/// Aggregates one mapped registry. Reads only (never blocks the writer); torn or
/// overwritten windows are skipped. Not thread-safe for one `view`.
ProcessHealth read_health(const RegistryView &view);

/// Health of the process `pid` of this user (its registry segment; the one whose header
/// names `pid`, newest first). Returns 0, or -ENOENT when the process has no registry
/// (the net plugin is not loaded or telemetry is off), or another -errno with *why.
int read_process_health(int pid, ProcessHealth *out, std::string *why);

/// Every live registry of this user on this host.
std::vector<ProcessHealth> read_all_health();

// ---- the tuner's status segment -------------------------------------------------------
//
// /dev/shm/vigiltune-<uid>-<pid>-<16 hex>, mode 0600, liveness by flock (registry.h):
//   TunerStatusHeader (512 bytes), TunerCommStatus[kMaxTunerComms]
// Writer: the tuner's background thread only, each entry under a seqlock (`seq` odd while
// written). Readers: `vigil top`, `vigil export` (copy, then re-check `seq`).

inline constexpr char kTunerStatusMagic[8] = {'V', 'G', 'L', 'T', 'U', 'N', 'E', '1'};
inline constexpr uint32_t kTunerStatusVersion = 1;
inline constexpr char kTunerStatusStem[] = "vigiltune";
inline constexpr uint32_t kMaxTunerComms = 256;

/// One communicator's agreed view as its tuner context sees it.
struct TunerCommStatus {
    std::atomic<uint32_t> in_use; ///< 0 free, 1 live, 2 finalized
    std::atomic<uint32_t> seq;    ///< seqlock
    uint64_t comm;                ///< NCCL's commId (commHash)
    uint32_t nranks;
    uint32_t nnodes;
    uint32_t abi;                 ///< tuner ABI version NCCL uses (3..7)
    uint8_t steering;             ///< 1: health steering on
    uint8_t state;                ///< agreed view: 0 healthy, 1 degraded, 2 failover, 3 none
    uint16_t permille;            ///< agreed effective network bandwidth fraction
    uint16_t degraded_nics;
    uint16_t failed_nics;
    uint32_t reserved0;
    uint64_t block;               ///< block this rank's getCollInfo calls are in
    uint64_t calls;               ///< getCollInfo calls
    uint64_t view_block;          ///< first block of the current view
    uint64_t view_changes;
    uint64_t waits;               ///< times a call waited for an unresolved register
    uint64_t wait_ns;             ///< time spent waiting
    uint64_t steered;             ///< calls whose choice the rules or the view changed
    char source[48];              ///< proposer of the current view ("host/pid[/rRANK]")
    char store[64];               ///< "shm", "redis://...", or why steering is off
    uint64_t reserved[4];
};

struct TunerStatusHeader {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint32_t entry_size;
    uint32_t max_comms;
    int32_t pid;
    uint32_t reserved0;
    char host[64];
    std::atomic<uint32_t> comms_used; ///< high-water mark of entries handed out
    uint8_t pad[512 - 8 - 4 * 4 - 8 - 64 - 4];
};
static_assert(sizeof(TunerStatusHeader) == 512);

constexpr size_t tuner_status_bytes() { return sizeof(TunerStatusHeader) + kMaxTunerComms * sizeof(TunerCommStatus); }

/// A consistent copy of one TunerCommStatus (same fields, plain).
struct TunerCommSnapshot {
    bool finalized = false;
    uint64_t comm = 0;
    uint32_t nranks = 0, nnodes = 0, abi = 0;
    bool steering = false;
    uint8_t state = 3;
    uint16_t permille = 1000, degraded_nics = 0, failed_nics = 0;
    uint64_t block = 0, calls = 0, view_block = 0, view_changes = 0, waits = 0, wait_ns = 0, steered = 0;
    std::string source, store;
};

/// One process's tuner status, copied out of its segment.
struct TunerProcessStatus {
    std::string host;
    int pid = 0;
    std::vector<TunerCommSnapshot> comms; ///< live and finalized entries
};

/// Every live tuner status segment of this user, or with `all_users` of every user (stale ones
/// are reaped first). Segments whose layout this build does not know are skipped and, with
/// `refused`, counted there.
std::vector<TunerProcessStatus> read_tuner_status(bool all_users = false, int *refused = nullptr);

} // namespace vigil::telemetry
