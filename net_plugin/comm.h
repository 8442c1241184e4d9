// SPDX-License-Identifier: Apache-2.0
// The transport-agnostic core of a connection: NCCL requests, message sequencing, the ack
// window (a send completes only when the receiver holds the whole message), multi-recv tag
// matching. It drives one path through the fabric interface; the failover engine will give it
// several without changing this shape.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric.h"
#include "nccl_abi/nccl_common.h"
#include "nccl_abi/profiler_net_vigil.h"
#include "progress.h"
#include "telemetry/registry.h"
#include "telemetry/window.h"

namespace vigil::net {

/// Most receives one irecv may group (NCCL's maxRecvs upper bound we report).
inline constexpr int kMaxRecvs = 8;
/// Outstanding requests per comm object (NCCL_NET_MAX_REQUESTS).
inline constexpr int kMaxRequests = 32;
/// Messages in flight per connection: NCCL_NET_MAX_REQUESTS x maxRecvs sends (reference 1.7,
/// multi-recv). Also the size of the receiver's sequence window.
inline constexpr int kMaxInflight = kMaxRequests * kMaxRecvs;
/// Largest message: test() reports sizes as int.
inline constexpr uint64_t kMaxMessageBytes = 0x7fffffff;

class Comm;

/// One NCCL request (`void* request`). Lives in its comm's fixed pool; never allocated on the
/// data path. `state` is the only field another thread reads without the comm lock.
struct Request {
    enum : uint8_t { kFree = 0, kPending = 1, kDone = 2 };
    std::atomic<uint8_t> state{kFree};
    bool is_send = false;
    Comm *comm = nullptr;
    // send
    uint64_t seq = 0;
    size_t size = 0;
    // recv: n buffers; msg_size[i] is the size of the message bound to buffer i
    int n = 0;
    int remaining = 0;
    std::array<uint8_t *, kMaxRecvs> data{};
    std::array<uint64_t, kMaxRecvs> capacity{};
    std::array<int32_t, kMaxRecvs> tags{};
    std::array<uint64_t, kMaxRecvs> msg_size{};
    std::array<bool, kMaxRecvs> bound{};
};

/// Common part of a send or receive comm: the lock, the sticky error and test().
/// Thread-safety: isend/irecv/test/close may come from NCCL's proxy thread while the
/// progress engine thread runs on_ready(); all state is under `mu_` except Request::state
/// and `error_`.
class Comm : public ProgressClient
{
public:
    virtual ~Comm() = default;

    /// NCCL's test(): *done = 1 once `r` completed (sizes[0..n) filled for receives, sizes may
    /// be NULL), after which `r` is recycled. Returns 0, or -errno once the connection has no
    /// path left (the request is then dead too).
    int test(Request *r, int *done, int *sizes) noexcept;

    /// Stops the engine from calling this comm and waits until it no longer does. Called
    /// once, by the close entry point, before delete.
    void detach() noexcept;

    void on_ready() noexcept override;
    /// Timer work at most every kTimerNs: I/O progress is event-driven, so a tick only has to
    /// run watchdogs, heartbeats, probes and rebuilds, and many idle comms stay cheap.
    void on_tick() noexcept override;
    static constexpr uint64_t kTimerNs = 20'000'000; // 20 ms

    /// Registers the path's fds with the progress engine. Returns 0 or -errno.
    int attach() noexcept;

protected:
    /// Progress every path; called with mu_ held.
    virtual void progress_locked() noexcept = 0;
    virtual size_t nfds() const noexcept = 0;
    virtual int fd(size_t i) const noexcept = 0;
    /// Records the first fatal error (no path left) and logs it once.
    void fail_locked(int err, const std::string &what) noexcept;

    std::mutex mu_;
    std::atomic<int> error_{0};
    std::atomic<uint64_t> next_timer_ns_{0};
    bool detached_ = false;
};

/// Path slots of a connection: the primary on the comm's own device and the hot-standby
/// backup on another device.
inline constexpr int kPrimary = 0;
inline constexpr int kBackup = 1;
inline constexpr int kMaxPaths = 2;

/// Failover tuning, from the VIGIL_* table; plain values so unit tests can set them.
struct FailoverConfig {
    uint64_t fatal_timeout_ns = 10'000'000'000ull; ///< no path left this long -> error
    uint64_t stall_timeout_ns = 2'000'000'000ull;  ///< in flight, nothing heard -> path dead
    uint64_t probe_interval_ns = 100'000'000ull;   ///< probes/heartbeats on quiet paths
    uint64_t failback_hold_ns = 1'000'000'000ull;  ///< a rebuilt primary must live this long
    uint64_t rebuild_backoff_min_ns = 50'000'000ull;   ///< first retry delay of a rebuild
    uint64_t rebuild_backoff_max_ns = 1'000'000'000ull; ///< retry delay cap (no attempt limit)
    // Telemetry (not failover, but the same owner reads it): windows of window_ns per path
    // in the process's registry; 0 turns the meters off.
    uint64_t window_ns = 0;
    telemetry::DetectorConfig detector;
    std::vector<double> link_bytes_per_s; ///< per local device: caps the detector's baseline
};

/// One path's telemetry: its registry entry, the sink writing windows there, and the meter.
/// Owned by the comm's path slot; used under the comm's lock.
struct PathTelemetry {
    PathTelemetry(const FailoverConfig &cfg, int kind, int slot, int dev, const std::string &desc,
                  uint64_t conn_id);
    ~PathTelemetry();
    PathTelemetry(const PathTelemetry &) = delete;
    PathTelemetry &operator=(const PathTelemetry &) = delete;
    telemetry::PathEntry *entry;
    telemetry::RegistrySink sink;
    telemetry::PathMeter meter;
};

/* NCCL's sendComm: failover state machine.
 *
 * States of each path slot: Active (carries messages), Standby (connected, probed, carries
 * nothing), Dead (gone; a rebuild may bring it back). One slot is Active while any is alive.
 *
 * Transitions:
 *   Active --error | port down | stall | receiver's request--> Dead, and a live Standby
 *       becomes Active: generation += 1, every message not yet acked (seq in
 *       [acked_, next_seq_)) is posted again on it from its first byte. Completed sends
 *       never need replay: a send completes only on the receiver's ack (invariant 3).
 *   Standby --error | silence (no heartbeat for stall_timeout)--> Dead (no traffic moves).
 *   Dead --rebuild accepted by the peer--> Standby (attempts back off from
 *       rebuild_backoff_min to _max, without limit); with no slot alive it becomes Active at
 *       once (generation += 1, replay).
 *   Failback: a rebuilt primary that stayed alive for failback_hold while the backup is
 *       Active: new messages wait until the backup has written everything posted to it (a
 *       frame boundary, so the backup can take over again later), then the primary becomes
 *       Active with generation += 1 and replays what is not acked; the backup is Standby.
 *   no slot alive --> requests keep reporting "not done" until fatal_timeout, then every
 *       pending and later request fails with -ECONNRESET (ncclRemoteError) and one WARN.
 *
 * Invariants: acks only ever raise acked_; a message is posted on exactly one live path per
 * generation; NCCL never sees an error while a slot is alive.
 */
class SendComm final : public Comm
{
public:
    /// `paths[kBackup]` may be null (VIGIL_BACKUP=off, or no other device); `rebuilder` may be
    /// null (dead paths then stay dead).
    SendComm(std::array<std::unique_ptr<SendPath>, kMaxPaths> paths, const FailoverConfig &cfg,
             std::unique_ptr<PathRebuilder> rebuilder = nullptr);

    /// NCCL's isend(). *out = NULL when kMaxInflight sends are outstanding (NCCL retries).
    /// Returns 0, -EMSGSIZE for size > kMaxMessageBytes, or the connection's error.
    /// `phandle`: NCCL's proxy-step profiler handle (v10+, may be NULL); when the plugin has a
    /// profiler callback, pending net events are emitted as its children (never with NULL).
    int isend(const void *data, size_t size, int tag, Request **out, void *phandle = nullptr) noexcept;

    /// The profiler callback NCCL handed to init (v10+); NULL disables net events.
    /// Process-wide; set before comms exist.
    static void set_profiler(ncclProfilerCallback_t cb) noexcept;

    /// Failure injection and port events: leave path `slot` now (as if it failed with
    /// `cause`); with `sabotage` also break its sockets so the peer sees the failure too.
    /// Thread-safe.
    void fail_path(int slot, const std::string &cause, bool sabotage) noexcept;
    /// A local port went down: leave every path of this connection on `dev`. Thread-safe.
    void port_down(int dev, const std::string &cause) noexcept;
    /// A local port came back: rebuild dead paths on `dev` now, not after their backoff.
    void port_up(int dev) noexcept;
    /// Device of the active path, or -1. Thread-safe.
    int active_dev() noexcept;

    std::string describe() const;

    /// Counters for tests and logs. Thread-safe reads.
    struct Stats {
        uint32_t generation = 1;
        uint32_t failovers = 0;
        uint32_t failbacks = 0;
        uint32_t rebuilds = 0;
        uint64_t replayed_messages = 0;
    };
    Stats stats() noexcept;

private:
    struct Slot {
        std::unique_ptr<SendPath> path;
        bool alive = false;
        uint64_t last_heard_ns = 0;
        uint64_t last_sent_ns = 0;
        uint64_t up_since_ns = 0;
        uint64_t next_rebuild_ns = 0;
        uint64_t backoff_ns = 0;
        std::string desc;
        std::unique_ptr<PathTelemetry> tm; // null with telemetry off
    };

    void progress_locked() noexcept override;
    size_t nfds() const noexcept override;
    int fd(size_t i) const noexcept override;
    void meter_locked(int slot) noexcept;
    /// Bytes of the messages posted but not acked yet.
    uint64_t unacked_bytes_locked() const noexcept;
    void failover_locked(int dead, const std::string &cause) noexcept;
    /// Makes `slot` Active: generation += 1, replay everything not acked. Returns the
    /// number of replayed bytes.
    uint64_t switch_to_locked(int slot) noexcept;
    void rebuild_locked(uint64_t now) noexcept;
    /// The failback target died while draining: post what was held back on the active path.
    void cancel_drain_locked() noexcept;
    /// Emits pending net events (newest window of the active path, failovers, failbacks) as
    /// children of `phandle`.
    void emit_events_locked(void *phandle) noexcept;
    void queue_event_locked(uint8_t type, int slot, uint64_t bytes) noexcept;
    void post_locked(uint64_t seq) noexcept;

    std::array<Slot, kMaxPaths> slots_;
    FailoverConfig cfg_;
    std::unique_ptr<PathRebuilder> rebuilder_;
    bool draining_ = false; // failback waits for the backup to reach a frame boundary
    uint64_t drain_from_seq_ = 0; // messages from here on are held back while draining
    uint64_t backup_since_ns_ = 0;
    int active_ = kPrimary;
    uint32_t gen_ = 1;
    std::array<Request, kMaxInflight> reqs_; // slot seq % kMaxInflight
    std::array<const void *, kMaxInflight> data_{};
    std::array<int32_t, kMaxInflight> tag_{};
    std::array<uint64_t, kMaxInflight> posted_ns_{}; // when each message was (re)posted
    uint64_t next_seq_ = 0;
    uint64_t acked_ = 0; // every seq below is held by the receiver
    bool peer_closed_ = false;
    uint64_t no_path_since_ns_ = 0;
    Stats stats_;
    // failover timing: detection time, and the seq whose ack proves the replay landed
    uint64_t failover_t0_ns_ = 0;
    uint64_t failover_probe_seq_ = 0;
    bool failover_timing_ = false;
    // Profiler net events: a bounded queue of failover/failback descriptors, the last window
    // emitted per slot, and a ring of descriptors handed to NCCL (kept alive a while: a
    // profiler may read extData after startEvent returns).
    static constexpr int kEventQueue = 8, kDescrRing = 16;
    std::array<vigilNetProfDescr_v1_t, kEventQueue> evq_{};
    int evq_n_ = 0;
    std::array<uint64_t, kMaxPaths> last_window_emitted_{};
    std::array<vigilNetProfDescr_v1_t, kDescrRing> descr_ring_{};
    unsigned descr_next_ = 0;
};

/// NCCL's recvComm. Owns its paths; implements the sink they place frames through.
/// Frames of an older generation are discarded; the first frame of a newer one resets the
/// partial progress of every incomplete message (the sender replays them whole) and bytes
/// of completed messages are never written again (invariant 2).
class RecvComm final : public Comm, private RecvSink
{
public:
    /// `acceptor` (may be null) hands over paths the sender rebuilt.
    RecvComm(std::array<std::unique_ptr<RecvPath>, kMaxPaths> paths, const FailoverConfig &cfg,
             std::unique_ptr<PathAcceptor> acceptor = nullptr);

    /// NCCL's irecv() with n (1..kMaxRecvs) buffers. *out = NULL when all kMaxRequests
    /// requests or the sequence window are in use (NCCL retries). Returns 0, -EINVAL for a
    /// bad n, or the connection's error.
    int irecv(int n, void *const *data, const size_t *sizes, const int *tags,
              Request **out) noexcept;

    /// The local port of path `slot` failed: ask the sender to leave it (through another
    /// live path) and stop using it. Thread-safe.
    void fail_path(int slot, const std::string &cause) noexcept;
    /// A local port went down: fail_path() for every path on `dev`. Thread-safe.
    void port_down(int dev, const std::string &cause) noexcept;

    std::string describe() const;
    uint32_t generation() noexcept;

private:
    struct Slot {
        Request *req = nullptr; // the irecv covering this seq
        int buf = -1;           // buffer index once bound by the first frame's tag
        uint64_t got = 0;
        bool complete = false;
    };
    struct PathSlot {
        std::unique_ptr<RecvPath> path;
        std::unique_ptr<PathTelemetry> tm; // null with telemetry off
        bool alive = false;
        bool orderly = false; // ended by the peer's close, not an error
        uint64_t last_heard_ns = 0;
        uint64_t last_beat_ns = 0;
        std::string desc;
    };

    void progress_locked() noexcept override;
    size_t nfds() const noexcept override;
    int fd(size_t i) const noexcept override;
    Placement locate(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size) override;
    bool still_wanted(uint32_t gen, uint64_t seq) override;
    int landed(uint64_t seq, uint64_t len, uint32_t gen) override;
    void lose_path_locked(int i, const std::string &why, bool orderly) noexcept;

    std::array<PathSlot, kMaxPaths> paths_;
    int cur_path_ = 0; // the path whose progress() is running (for per-path telemetry)
    bool waiting_for_post_ = false; // a frame waited for an irecv during this progress
    FailoverConfig cfg_;
    std::unique_ptr<PathAcceptor> acceptor_;
    uint64_t next_accept_poll_ns_ = 0;
    std::array<Request, kMaxRequests> reqs_;
    std::array<Slot, kMaxInflight> slots_; // slot seq % kMaxInflight
    uint32_t gen_ = 1;
    uint64_t next_post_seq_ = 0;           // seq the next irecv's first buffer covers
    uint64_t floor_ = 0;                   // every seq below is complete
    bool peer_closed_ = false;
    uint64_t no_path_since_ns_ = 0;
};

} // namespace vigil::net
