// SPDX-License-Identifier: Apache-2.0
// What the sending and receiving halves of a connection share: NCCL's request objects, the
// lock, the sticky error, test() and the progress engine hook-up, and the per-path telemetry
// they both keep. The halves themselves: send_comm.h and recv_comm.h.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "clock.h"
#include "fabric.h"
#include "log.h"
#include "port_pairs.h"
#include "progress.h"
#include "telemetry/registry.h"
#include "telemetry/window.h"

namespace vigil::net {

class Comm;

/// One NCCL request (`void* request`): what test() reads of a send or a receive. A send's
/// request is this alone (48 bytes: a send comm keeps one per message in flight); a receive's
/// is a RecvRequest, which `is_send` false says it is. Lives in its comm's pool (SendComm's
/// message ring, RecvComm's fixed array) at an address that never changes while NCCL holds
/// it; never allocated on the data path. `state` is the only field another thread reads
/// without the comm lock.
struct Request {
    enum : uint8_t { kFree = 0, kPending = 1, kDone = 2 };
    std::atomic<uint8_t> state{kFree};
    bool is_send = false;
    Comm *comm = nullptr;
    uint64_t seq = 0; ///< send: the message's sequence number; recv: the group's first
    size_t size = 0;  ///< send: bytes
};

/// A receive's request: n buffers, advertised as CTS group `cts`; msg_size[i] is the size of
/// the message bound to buffer i (<= its capacity, cts.entries[i].size). Or a flush.
struct RecvRequest : Request {
    int n = 0;
    int remaining = 0;
    CtsGroup cts;
    std::array<uint8_t *, kMaxRecvs> data{};
    std::array<uint64_t, kMaxRecvs> msg_size{};
    std::array<bool, kMaxRecvs> bound{};
    std::array<MemRegion *, kMaxRecvs> mr{}; ///< one reference each while pending
    // flush (recv comm's iflush): the read per path slot it waits for, if any
    bool is_flush = false;
    std::array<bool, kMaxPaths> flush_on{};
    std::array<uint64_t, kMaxPaths> flush_ticket{};
};

/// Failover and telemetry tuning, from the VIGIL_* table (path_plan.cc builds it); plain values so
/// unit tests can set them.
struct FailoverConfig {
    uint64_t fatal_timeout_ns = 10'000'000'000ull; ///< no path left this long -> error
    uint64_t stall_timeout_ns = 2'000'000'000ull;  ///< in flight, nothing heard -> path dead
    uint64_t probe_interval_ns = 100'000'000ull;   ///< probes/heartbeats on quiet paths
    uint64_t failback_hold_ns = 1'000'000'000ull;  ///< a rebuilt primary must live this long
    uint64_t rebuild_backoff_min_ns = 50'000'000ull;   ///< first retry delay of a rebuild
    uint64_t rebuild_backoff_max_ns = 1'000'000'000ull; ///< retry delay cap (no attempt limit)
    bool multipath = false;          ///< stripe over every live path whose fabric stripes
    uint64_t piece_bytes = 256 * 1024; ///< with multipath: bytes posted to one path at a time
};

/// A quiet comm's timer period (Comm::on_tick), ns. The comm that sent one of its port pairs'
/// probes or heartbeats at its last tick (`prober`: it claimed it, PortPairs::Pair::
/// claim_probe) comes back every probe interval to send the next; every other quiet comm only
/// watches its pairs' silence, which is judged against the stall timeout: a quarter of that
/// (500 ms at the defaults) is soon enough, and at thousands of quiet comms over a handful of
/// pairs five times fewer visits. Never below `floor_ns` (the busy period).
inline uint64_t quiet_period(const FailoverConfig &cfg, bool prober, uint64_t floor_ns)
{
    const uint64_t probe = std::max(floor_ns, cfg.probe_interval_ns);
    return prober ? probe : std::max(probe, cfg.stall_timeout_ns / 4);
}

/// How long after a port pair's last probe or heartbeat the next may go, ns: the probe
/// interval less a tick (at most half the interval). A prober's timer is coalesced onto the
/// engine's grid (ProgressEngine::kCoalesceNs) and may wake a little before a whole interval
/// passed; it must still send, or it would park and leave its pair unprobed.
inline uint64_t probe_spacing(const FailoverConfig &cfg)
{
    return cfg.probe_interval_ns - std::min(cfg.probe_interval_ns / 2, ProgressEngine::kTickNs);
}

/// Telemetry tuning: windows of window_ns per path in the process's registry (0: meters off).
struct TelemetryConfig {
    uint64_t window_ns = 0;
    telemetry::DetectorConfig detector;
    std::vector<double> link_bytes_per_s; ///< per local device: caps the detector's baseline
};

/// Which half of a connection a path's telemetry belongs to (registry PathEntry::kind).
enum class Direction : uint8_t { kSend = 0, kRecv = 1 };

/// One path's telemetry: its registry entry, the sink writing windows there, and the meter.
/// Owned by the comm's path slot; used under the comm's lock.
struct PathTelemetry {
    PathTelemetry(const TelemetryConfig &cfg, Direction dir, const PathIdentity &id, uint64_t conn_id);
    ~PathTelemetry();
    PathTelemetry(const PathTelemetry &) = delete;
    PathTelemetry &operator=(const PathTelemetry &) = delete;
    /// A path's telemetry, or null when telemetry is off or its set-up failed: telemetry is
    /// best effort, the data path does not depend on it.
    static std::unique_ptr<PathTelemetry> make(const TelemetryConfig &cfg, Direction dir,
                                               const PathIdentity &id, const void *owner) noexcept;
    telemetry::PathEntry *entry;
    telemetry::RegistrySink sink;
    telemetry::PathMeter meter;
};

/// Common part of a send or receive comm: the lock, the sticky error and test().
/// Thread-safety: isend/irecv/test/close may come from NCCL's proxy thread while the
/// progress engine thread runs on_ready(); all state is under `mu_` except Request::state
/// and `error_`. No foreign code runs under `mu_`: log lines wait in a log::Deferral until
/// it is free, and profiler events are emitted after unlocking.
class Comm : public ProgressClient, private PortPairs::Pair::Sleeper
{
public:
    /// Leaves the pairs it sleeps on if close() did not (no sweep may call a destroyed comm).
    virtual ~Comm()
    {
        if (parked_) unpark_locked();
    }

    /// NCCL's test(): *done = 1 once `r` completed (sizes[0..n) filled for receives, sizes may
    /// be NULL), after which `r` is recycled. Returns 0, or -errno once the connection failed
    /// (the request is then dead too).
    int test(Request *r, int *done, int *sizes) noexcept;

    /// Binds the comm to a progress engine thread (of NUMA node `numa_node`, -1: unknown; see
    /// ProgressEngine::bind) and registers the paths' fds with it. Returns 0 or -errno.
    int attach(int numa_node = -1) noexcept;
    /// closeSend/closeRecv: says goodbye on every live path (so the peer sees an orderly
    /// close, not a failure), stops the engine calling this comm and waits until it no
    /// longer does. Called once, before delete.
    void close() noexcept;

    /// The engine's fd event. With one engine thread: progress under the lock. With several:
    /// a kick that whoever holds the lock (this thread, or the application in test()) serves,
    /// so an engine thread never waits for the application.
    void on_ready() noexcept override;
    /// Timer work at most every kTimerNs while the comm is busy; while it is quiet
    /// (quiet_locked()), every probe interval if it sent a port pair's probe or heartbeat,
    /// else none: it parks on its pairs (port_pairs.h, "Parked comms") until the sweep, an
    /// fd event or the application's next call wakes it. I/O progress is event-driven, so a
    /// tick only has to run watchdogs, heartbeats, probes and rebuilds, and thousands of idle
    /// comms cost nothing each.
    void on_tick() noexcept override;
    /// When on_tick() has work next: kTimerNs after the last tick while busy, a probe
    /// interval after it for a quiet prober, kParked for a parked comm.
    uint64_t next_tick_ns() const noexcept override { return next_timer_ns_.load(std::memory_order_relaxed); }
    static constexpr uint64_t kTimerNs = 20'000'000; // 20 ms

    /// Local device of each path slot (-1: the slot has no path and never will): the devices
    /// a memory registration for this comm must cover.
    const std::array<int, kMaxPaths> &devices() const { return devs_; }

    /// A port event: local device `dev` (0..63) went down. Notes it for the comm to act on
    /// (port_down_locked) first thing in its next progress, on whichever thread runs that:
    /// the application's test() or an engine tick, which this brings forward. The thread that
    /// saw the event tells thousands of comms in microseconds each, without taking their
    /// locks or doing their failovers one after another while the watchdogs of the last ones
    /// run out. Lock-free; any thread. The failover names set_port_down_cause()'s text.
    void note_port_down(int dev) noexcept;
    /// A local port came back: noted as note_port_down() notes; at the comm's next pass a
    /// sending comm starts rebuilding its dead paths on `dev` at once, not after their backoff
    /// (port_up_locked). Lock-free; any thread: the event thread never waits for a comm, nor
    /// runs its set-up work (SetupJobs).
    void note_port_up(int dev) noexcept;
    /// What took device `dev` down ("port eth0 down (netlink)"), for the failovers that
    /// note_port_down() leads to; set before noting. Thread-safe (a leaf lock).
    static void set_port_down_cause(int dev, const std::string &cause);

protected:
    explicit Comm(const std::array<int, kMaxPaths> &devs) : devs_(devs) {}
    /// Brings the comm's timer work to the next engine tick, parked or not (a pair's sweep,
    /// a rebuilt path that arrived). Any thread, with or without mu_; takes no comm lock.
    void wake_timer() noexcept;
    /// Progress every path; called with mu_ held. Implementations begin with
    /// take_port_events_locked().
    virtual void progress_locked() noexcept = 0;
    /// port_down_locked() for each device note_port_down() noted since the last call, then
    /// port_up_locked() for each one note_port_up() noted. Called with mu_ held.
    void take_port_events_locked() noexcept;
    /// A local port came back (note_port_up): dead paths on `dev` may be rebuilt now. Called
    /// with mu_ held; the caller runs progress next. A receiving comm has nothing to do (its
    /// sender rebuilds).
    virtual void port_up_locked(int /*dev*/) noexcept {}
    /// A local port went down: leave every path of this connection on `dev`, naming `cause`.
    /// Called with mu_ held; the caller runs progress next.
    virtual void port_down_locked(int dev, const std::string &cause) noexcept = 0;
    /// SendPath/RecvPath::rearm(arm) of every live path; called with mu_ held, from the engine.
    virtual void rearm_locked(bool arm) noexcept = 0;
    /// What the engine does for this comm, on an fd event and on a tick: rearm_locked(wake_),
    /// then progress_locked(). Called with mu_ held.
    void engine_progress_locked() noexcept;
    /// Serves kicks (on_ready() with several engine threads) while mu_ is free; called
    /// without mu_, after the caller let go of it.
    void take_kicks() noexcept;
    /// Holds mu_ for a scope (isend, irecv) and serves the kicks that came meanwhile after
    /// letting go of it. What the scope logs reaches NCCL's logger after mu_ is free (the
    /// Deferral is made before the lock and ends after the kicks).
    class Locked
    {
    public:
        explicit Locked(Comm &c) : c_(c) { c_.mu_.lock(); }
        ~Locked()
        {
            c_.settle_timer_locked();
            c_.mu_.unlock();
            c_.take_kicks();
        }
        Locked(const Locked &) = delete;
        Locked &operator=(const Locked &) = delete;

    private:
        log::Deferral defer_; // first: constructed before the lock, destroyed after ~Locked
        Comm &c_;
    };
    /// Says goodbye on every live path; called with mu_ held.
    virtual void goodbye_locked() noexcept = 0;
    /// The process's port pair (PortPairs) of the path named by `id`: its device and the
    /// remote port it reaches.
    static std::shared_ptr<PortPairs::Pair> pair_of(const PathIdentity &id)
    {
        return PortPairs::process().get(id.dev, id.peer_port);
    }
    /// Nothing in flight or posted, every path up, no switch or rebuild under way: its only
    /// timer work is the port pairs' probes and silence checks, due every probe interval.
    /// Called with mu_ held.
    virtual bool quiet_locked() const noexcept = 0;
    /// A quiet comm's timer period, ns: quiet_period() of its configuration, `prober` when its
    /// last quiet tick sent a port pair's probe or heartbeat.
    virtual uint64_t quiet_period_ns(bool prober) const noexcept = 0;
    /// A quiet comm's timer work at `now`: probes or heartbeats its port pairs are due, and
    /// silence checks. No I/O pass. Called with mu_ held.
    virtual void quiet_tick_locked(uint64_t now) noexcept = 0;
    /// How a parked comm sleeps on one of its pairs (PortPairs::Pair::sleep).
    struct PairUse {
        std::shared_ptr<PortPairs::Pair> pair;
        bool on_silence = false; ///< the path's silence needs a verdict while quiet
        uint64_t heard_ns = 0;   ///< when the path last heard the peer
    };
    /// The pairs of the live paths, up to kMaxPaths (returns how many). Called with mu_ held.
    virtual int pair_uses_locked(std::array<PairUse, kMaxPaths> *out) const noexcept = 0;
    /// Failover timing of the comm (probe interval, stall timeout). Called with mu_ held.
    virtual const FailoverConfig &failover_config() const noexcept = 0;
    virtual size_t nfds() const noexcept = 0;
    virtual int fd(size_t i) const noexcept = 0;
    /// Records the first connection-wide error and logs it once.
    void fail_locked(int err, const std::string &what) noexcept;
    /// Fds of every path in `paths` (slots holding a `path` pointer), and the i-th of them.
    template <class Slots> static size_t path_fds(const Slots &paths) noexcept
    {
        size_t n = 0;
        for (const auto &s : paths)
            if (s.path) n += s.path->nfds();
        return n;
    }
    template <class Slots> static int path_fd(const Slots &paths, size_t i) noexcept
    {
        for (const auto &s : paths) {
            if (!s.path) continue;
            if (i < s.path->nfds()) return s.path->fd(i);
            i -= s.path->nfds();
        }
        return -1;
    }
    /// Starts (on) or stops the progress engine watching every fd of `path`.
    template <class Path> void watch(const Path &path, bool on) noexcept
    {
        for (size_t k = 0; k < path.nfds(); ++k) {
            if (on) ProgressEngine::instance().add(path.fd(k), this, wake_);
            else ProgressEngine::instance().remove(path.fd(k), this);
        }
    }

    /// Parks a quiet comm that sent no probe (on_tick()): registers it with every pair of its
    /// live paths. False (not parked) when the sweep does not run or a path has a pair of its
    /// own (the sweep would not see it). Called with mu_ held.
    bool park_locked() noexcept;
    /// Leaves every pair it sleeps on. Called with mu_ held.
    void unpark_locked() noexcept;
    /// A parked comm that is no longer quiet (a post, a path lost) gets its timer back: its
    /// next tick a quiet period from now (test() runs its watchdogs meanwhile). After every
    /// locked entry point. Called with mu_ held.
    void settle_timer_locked() noexcept;
    void wake_from_pair() noexcept override;

    std::mutex mu_;
    std::atomic<int> error_{0};
    std::atomic<uint64_t> next_timer_ns_{0};
    /// Parked: no timer, asleep on parked_on_'s pairs. Under mu_.
    bool parked_ = false;
    std::array<std::shared_ptr<PortPairs::Pair>, kMaxPaths> parked_on_{};
    /// This tick sent a port pair's probe or heartbeat (quiet_period()). Under mu_.
    bool probed_ = false;
    /// test() was called since the engine's last timer tick: the application polls, so
    /// completions need not wake the engine thread.
    std::atomic<bool> polled_{false};
    /// An engine thread saw this comm's fds ready but found mu_ taken (several engine threads
    /// only): the next holder progresses once more after letting go.
    std::atomic<bool> kick_{false};
    /// Devices noted down (note_port_down), bit d for device d, not yet acted on.
    std::atomic<uint64_t> ports_down_{0};
    /// Devices noted up (note_port_up), likewise.
    std::atomic<uint64_t> ports_up_{0};
    /// A port-down or port-up was noted and not yet acted on (a hint: relaxed loads).
    bool port_events_noted() const noexcept
    {
        return (ports_down_.load(std::memory_order_relaxed) | ports_up_.load(std::memory_order_relaxed)) != 0;
    }
    /// Whether the engine wants to be woken by this comm's fds (their epoll interest, and
    /// rearm's `arm`); decided at each timer tick from polled_. Under mu_.
    bool wake_ = true;
    bool detached_ = false;
    std::array<int, kMaxPaths> devs_;
};

/// This host's name, for log lines (cached).
const char *host_name();

} // namespace vigil::net
