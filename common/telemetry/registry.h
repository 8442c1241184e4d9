// SPDX-License-Identifier: Apache-2.0
// The per-host telemetry registry: one shared-memory segment per process,
// /dev/shm/vigil-<uid>-<pid>-<16 hex>, mode 0600 (the random suffix keeps processes of
// different pid namespaces apart), with a documented, versioned binary layout:
//
//   RegistryHeader                       (4 KiB: identity of the process)
//   PathEntry[max_paths]                 (each: path identity + a single-producer ring of
//                                         kRingCapacity WindowRecords)
//
// Writers: the plugin, one producer per path (the comm owning it, under its lock).
// Readers: the `vigil` tool, the tuner. Readers never block writers: a reader that peeks
// detects records overwritten while it copied them; one reader may register as the ring's
// consumer, and then the producer drops windows when that consumer falls behind and counts
// them in `dropped`. The owner holds a shared flock on its segment for its lifetime; a
// segment nobody holds is stale and removed by reap_stale() (works across pid namespaces).
// Entry `in_use`: 0 free, 1 live, 2 retired (its path is gone; the telemetry writer still
// drains it, then frees it).
// All multi-byte fields are little-endian (the host's; x86-64 and aarch64).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "window.h"

namespace vigil::telemetry {

inline constexpr char kRegistryMagic[8] = {'V', 'G', 'L', 'R', 'E', 'G', '0', '1'};
inline constexpr uint32_t kRegistryVersion = 1;
inline constexpr uint32_t kRingCapacity = 256; // windows per path (256 ms at 1 ms; the
                                               // writer drains every 50 ms)
inline constexpr uint32_t kMaxRegistryPaths = 128;     // ~4.2 MB per process, reserved up front

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared-memory atomics");

/// Ring control block (64 bytes).
struct RingHeader {
    std::atomic<uint64_t> head;         ///< records published so far (producer)
    std::atomic<uint64_t> tail;         ///< records taken by the registered consumer
    std::atomic<uint64_t> dropped;      ///< windows not published: the consumer was full
    std::atomic<uint32_t> consumer_pid; ///< 0: no consumer, the oldest record is overwritten
    uint32_t capacity;
    uint64_t reserved[4];
};
static_assert(sizeof(RingHeader) == 64);

/// One path of one connection (send or receive side).
struct PathEntry {
    std::atomic<uint32_t> in_use; ///< 0 free, 1 live (written last), 2 retired
    uint8_t kind;                 ///< 0 send, 1 receive
    uint8_t slot;                 ///< 0 primary, 1 backup
    std::atomic<uint8_t> state;   ///< PathState
    std::atomic<uint8_t> degraded;
    std::atomic<uint32_t> generation;
    uint32_t dev;                 ///< local NCCL device index
    uint64_t conn_id;             ///< pairs the paths of one connection in this process
    char dev_name[16];
    char local[64];               ///< local endpoint
    char peer[64];                ///< remote endpoint
    std::atomic<uint64_t> total_bytes;
    std::atomic<uint64_t> total_ops;
    std::atomic<uint64_t> failovers; ///< times this path stopped being active by failure
    std::atomic<uint64_t> failbacks; ///< times traffic moved back to this (rebuilt primary) path
    std::atomic<uint64_t> degraded_verdicts; ///< times the detector flagged this path degraded
    /// The detector's judged value and baseline (bytes/s) in the window that last flagged the
    /// path degraded: the episode's evidence, one value while it lasts (read_health). 0: never
    /// flagged, or written by a build from before these fields (they were reserved, zero).
    std::atomic<uint64_t> verdict_judged_bps;
    std::atomic<uint64_t> verdict_baseline_bps;
    uint64_t reserved[2];
    RingHeader ring;
    WindowRecord records[kRingCapacity];
};

inline constexpr uint32_t kMaxRegistryPorts = 16; // local ports with hardware counters
inline constexpr uint32_t kMaxRegistryDevices = 16; // NCCL devices with cumulative totals

/// What one NCCL device's (port's) paths did over the process's life, whatever paths came and
/// went: path entries are reused when a path is rebuilt or its connection closes, so their own
/// counters restart, while these only grow (Prometheus counters). Indexed by the NCCL device
/// index; devices from kMaxRegistryDevices on are not counted. Written by the plugin with
/// relaxed atomic adds (any thread), read by `vigil export` at any time: each counter is
/// monotonic, the set is not one instant. Lives in what older builds left as header padding,
/// so a reader of such a segment sees no devices. 128 bytes.
struct DeviceTotals {
    char name[16];                        ///< NCCL device name ("eth0"); empty: unused
    std::atomic<uint64_t> bytes[2];       ///< bytes of closed windows: [0] send, [1] receive
    std::atomic<uint64_t> ops[2];         ///< ops of closed windows, likewise
    std::atomic<uint64_t> failovers;      ///< its paths that failed while carrying traffic
    std::atomic<uint64_t> failbacks;      ///< traffic moved back to a rebuilt primary on it
    std::atomic<uint64_t> degraded[2];    ///< degraded verdicts on its paths, send / receive
    std::atomic<uint64_t> windows_dropped; ///< windows its paths' rings dropped
    uint64_t reserved[5];
};
static_assert(sizeof(DeviceTotals) == 128, "DeviceTotals layout is part of the registry ABI");

/// One local port's hardware counters (RDMA), as its fabric last sampled them, so that a lossy
/// link shows before it fails: cumulative values since the port appeared, -1 where the device
/// has no such counter (names per driver: net_plugin/verbs/hw_counters.h). Single writer (the
/// fabric's sampler thread), seqlock: `seq` is odd while the values change; readers copy and
/// retry (read_port()). Lives in what older builds left as header padding, so a reader of
/// such a segment sees no ports. 112 bytes.
struct PortCounterEntry {
    char name[24];             ///< NCCL device name ("rxe_a0:1"); empty: unused
    std::atomic<uint64_t> seq; ///< odd while being written
    uint64_t sampled_ns;       ///< CLOCK_MONOTONIC of the last sample
    int64_t retransmits;       ///< requests sent again (timeouts, NAK retries)
    int64_t seq_errors;        ///< sequence-error NAKs received
    int64_t out_of_sequence;   ///< packets received out of sequence
    int64_t duplicate_requests;
    int64_t rnr_naks;          ///< receiver-not-ready NAKs received
    int64_t retry_exceeded;    ///< requests that exhausted their retries
    int64_t link_downed;
    int64_t tx_packets;
    int64_t rx_packets;
};
static_assert(sizeof(PortCounterEntry) == 112, "PortCounterEntry layout is part of the registry ABI");

/// Segment header (padded to 4 KiB).
struct RegistryHeader {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint32_t entry_size;
    uint32_t max_paths;
    uint32_t ring_capacity;
    uint32_t record_size;
    int32_t pid;
    int32_t rank; ///< -1 unknown
    uint64_t start_ns;
    uint64_t window_ns;
    char host[64];
    std::atomic<uint32_t> paths_used; ///< high-water mark of entries handed out
    std::atomic<uint32_t> ports_used; ///< port entries handed out (0: none, or an older build)
    PortCounterEntry ports[kMaxRegistryPorts];
    std::atomic<uint32_t> devices_used; ///< high-water mark of `devices` named (0: none, or an
                                        ///< older build)
    uint32_t reserved0;
    DeviceTotals devices[kMaxRegistryDevices];
    uint8_t pad[4096 - 8 - 6 * 4 - 2 * 4 - 2 * 8 - 64 - 2 * 4 -
                kMaxRegistryPorts * sizeof(PortCounterEntry) - 2 * 4 -
                kMaxRegistryDevices * sizeof(DeviceTotals)];
};
static_assert(sizeof(RegistryHeader) == 4096);

/// Bytes of a segment with `max_paths` entries.
constexpr size_t registry_bytes(uint32_t max_paths)
{
    return sizeof(RegistryHeader) + static_cast<size_t>(max_paths) * sizeof(PathEntry);
}

/// The producer side, one per process. Thread-safe (acquire/release take a lock; pushing a
/// window to an entry's ring is lock-free and single-producer per entry).
class Registry
{
public:
    static Registry &instance();
    /// Creates this process's segment (idempotent); reaps stale ones first. `rank` -1: the
    /// launcher's (launcher_rank()), or -1 when it set none. Returns 0 or -errno (telemetry
    /// then stays off; the data path does not care).
    int open(uint64_t window_ns, int rank);
    bool is_open() const { return base_ != nullptr; }
    uint64_t window_ns() const { return window_ns_; }
    /// A free entry for a new path, or nullptr (registry closed or full).
    PathEntry *acquire(int kind, int slot, int dev, const std::string &dev_name,
                       const std::string &local, const std::string &peer, uint64_t conn_id);
    /// The path is gone. With `retire` (a telemetry writer runs) the entry waits for the
    /// writer's last drain, which frees it; otherwise it is free at once.
    void release(PathEntry *e, bool retire = false);
    std::string path() const { return path_; }
    /// The entry of port `name` (created on first use), or nullptr (registry closed, or
    /// kMaxRegistryPorts ports already). Thread-safe.
    PortCounterEntry *port(const std::string &name);
    /// This process's own entries, writable (for the telemetry writer, the rings' consumer).
    uint32_t entries_used() const;
    PathEntry *entry_at(uint32_t i) const;

private:
    std::atomic<void *> base_{nullptr};
    size_t size_ = 0;
    int fd_ = -1; // kept open: its shared flock marks the segment as live
    uint64_t window_ns_ = 0;
    std::string path_;
};

/// Pushes windows into an entry's ring and adds them to its device's totals. Wait-free;
/// single producer per entry.
void ring_push(PathEntry &e, const WindowRecord &w) noexcept;

/// Counts a failover of the path `e` (it failed while carrying traffic) on the path and its
/// device's totals. Wait-free; any thread.
void count_failover(PathEntry &e) noexcept;
/// Counts a failback to the path `e` (a rebuilt primary took the traffic back) likewise.
void count_failback(PathEntry &e) noexcept;

/// The process's rank as its launcher exported it, for processes NCCL tells nothing: the first
/// of RANK (torchrun, and most launchers), OMPI_COMM_WORLD_RANK, SLURM_PROCID and PMI_RANK
/// that holds a decimal integer in 0..2^31-2; -1 when none does. Reads the environment (call
/// it from init, not concurrently with setenv).
int launcher_rank() noexcept;

/// A port's counters as plain values (PortCounterEntry without the name and seqlock).
struct PortCounters {
    uint64_t sampled_ns = 0;
    int64_t retransmits = -1, seq_errors = -1, out_of_sequence = -1, duplicate_requests = -1,
            rnr_naks = -1, retry_exceeded = -1, link_downed = -1, tx_packets = -1, rx_packets = -1;
};
/// Publishes a sample into `e` (the single writer). Wait-free.
void write_port(PortCounterEntry &e, const PortCounters &c) noexcept;
/// Copies `e` consistently into *out. False when it is unused or kept changing.
bool read_port(const PortCounterEntry &e, PortCounters *out) noexcept;

/// A WindowSink writing to a registry entry and logging verdict changes once.
class RegistrySink final : public WindowSink
{
public:
    explicit RegistrySink(PathEntry *e, std::string what) : e_(e), what_(std::move(what)) {}
    void push(const WindowRecord &w) noexcept override;
    void verdict(bool degraded, const WindowRecord &w) noexcept override;
    void state(PathState s, uint32_t generation) noexcept override;

private:
    PathEntry *e_;
    std::string what_;
};

// ---- readers ----------------------------------------------------------------------------

/// A read-only mapping of one process's segment, validated before use.
class RegistryView
{
public:
    ~RegistryView();
    /// Maps `file` and checks magic, version and every size field against this build's
    /// layout (a segment that disagrees is refused with *why). Returns 0 or -errno.
    int open(const std::string &file, std::string *why);
    /// Views the `size` bytes at `base` as a segment, with the checks of open(): the reader
    /// over bytes in memory (tests and fuzzing). The bytes are not copied or owned and must
    /// outlive the view; `base` must be 8-byte aligned. Returns 0 or -EBADMSG with *why.
    int open_bytes(const void *base, size_t size, std::string *why);
    const RegistryHeader &header() const { return *hdr_; }
    uint32_t entries() const;
    /// Port entries in use (0 for a segment of an older build).
    uint32_t ports() const;
    /// Device totals in use, indexed by NCCL device (0 for a segment of an older build); an
    /// index below it may still be unnamed (a device no path of this process used).
    uint32_t devices() const;
    const PathEntry &entry(uint32_t i) const;
    /// Copies record `index` of `e`'s ring into *out. False when it is not published yet
    /// or was (or is being) overwritten.
    static bool read(const PathEntry &e, uint64_t index, WindowRecord *out);

private:
    int check(std::string *why);

    void *map_ = nullptr; // what open() mapped (munmapped by the destructor)
    const void *base_ = nullptr;
    size_t size_ = 0;
    const RegistryHeader *hdr_ = nullptr;
};

/// File-name stem of the telemetry registry ("/dev/shm/vigil-<uid>-<pid>-<16 hex>").
inline constexpr char kRegistryStem[] = "vigil";

/// Segment files of this user in /dev/shm ("/dev/shm/vigil-<uid>-<pid>-<16 hex>"); with
/// `all_users`, of every user (a node-wide reader: opening other users' owner-only segments
/// takes CAP_DAC_READ_SEARCH, removing them CAP_FOWNER).
std::vector<std::string> list_registries(bool all_users = false);
/// Removes segments of this user (or of every user) that no process holds (their flock is
/// free). Returns how many. Files not named like a segment are never touched.
int reap_stale(bool all_users = false);

/// The same for any kind of segment, named "/dev/shm/<stem>-<uid>-<pid>-<16 hex>".
std::vector<std::string> list_segments(const char *stem, bool all_users = false);
int reap_stale_segments(const char *stem, bool all_users = false);

/// A created segment: mapped read-write, 0600, memory reserved, and held with a shared
/// flock through `fd` (kept open for the process's life: that is what marks it live).
struct Segment {
    std::string path;
    void *base = nullptr;
    size_t size = 0;
    int fd = -1;
};
/// Reaps stale segments of `stem`, then creates this process's new one of `size` bytes
/// (zero-filled). Returns 0 or -errno.
int create_segment(const char *stem, size_t size, Segment *out);
/// Maps `file` read-only (shared) into *base / *size when it holds at least `min_size`
/// bytes. Returns 0, or -errno with a reason in *why. The caller munmaps.
int map_segment_readonly(const std::string &file, size_t min_size, void **base, size_t *size, std::string *why);
/// True when pid `pid` exists.
bool pid_alive(int pid);
/// True when `file` exists and was last modified at least 2 s ago: a segment that cannot be
/// read then is broken, not still being created by its owner (create_segment sizes it, then
/// the owner writes its header).
bool segment_settled(const std::string &file);

} // namespace vigil::telemetry
