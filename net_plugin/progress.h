// SPDX-License-Identifier: Apache-2.0
// The progress engine: background threads that move data for every comm whose sockets become
// ready, so transfers advance even when NCCL does not call test(), and so that the bytes of
// several connections (NCCL's channels) move on several cores at once.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <sched.h>
#include <string>
#include <thread>
#include <vector>

namespace vigil::net {

/// Something the engine can drive: a comm, an acceptor, a link monitor. on_ready() runs on the
/// engine thread serving the client and must take the client's own lock (it may block briefly
/// behind an isend/irecv/test of the application).
class ProgressClient
{
public:
    virtual void on_ready() noexcept = 0;
    /// Timer work (watchdogs, probes, rebuilds) of a client registered with add_ticker(), on
    /// the engine thread serving it, when next_tick_ns() is due. Defaults to on_ready().
    virtual void on_tick() noexcept { on_ready(); }
    /// When the client wants its next on_tick() (CLOCK_MONOTONIC ns); asked by the engine
    /// right after each on_tick(). 0 (the default), or a time less than a kTickNs away: one
    /// engine tick from now. kParked: none until ProgressEngine::wake(); a parked client is
    /// in no heap and costs nothing. Called on the engine thread only.
    virtual uint64_t next_tick_ns() const noexcept { return 0; }
    /// next_tick_ns() of a client with no timer work until something wakes it.
    static constexpr uint64_t kParked = ~0ull;

protected:
    ~ProgressClient() = default;

private:
    friend class ProgressEngine;
    int thread_ = 0; // the engine thread serving this client (ProgressEngine::bind); 0 until bound
    // Its timer, under its shard's tick_mu: registered (add_ticker), and the due time of its
    // one valid heap entry (kParked: none; kCalling: the loop has it out to call). Heap
    // entries with another due time are stale and dropped when they come up.
    bool ticking_ = false;
    uint64_t due_ = kParked;
};

/// Edge-triggered epoll loops, one per engine thread. Thread 0 always runs (acceptors, link
/// monitors, and comms when the engine has one thread); further threads start when comms are
/// bound to them, up to `threads` per NUMA node (VIGIL_SOCKET_NTHREADS), each pinned to the
/// CPUs of its node when sysfs names them. A client is served by exactly one thread, so its
/// callbacks never run concurrently with each other.
/// Thread-safe: every member may be called from any thread.
/// Lifetime: started by the first plugin init, stopped by the last finalize (refcounted by
/// the plugin). A client must call remove() for its fds, remove_ticker(), then quiesce()
/// before it is destroyed, so that no callback for it is still running.
class ProgressEngine
{
public:
    static ProgressEngine &instance();

    /// Most engine threads per NUMA node (VIGIL_SOCKET_NTHREADS's range).
    static constexpr int kMaxThreads = 16;
    /// Engine threads in all, across nodes (a bound; further comms share the least loaded).
    static constexpr int kMaxShards = 64;

    /// Starts thread 0 (idempotent) and sets how many threads may serve comms per NUMA node
    /// (1..kMaxThreads; 1: thread 0 serves everything). Returns 0 or -errno.
    int start(int threads = 1);
    /// Stops and joins every thread (idempotent); threads() is 1 again. Every client must be
    /// gone: no other member may run concurrently with stop().
    void stop();
    /// The per-node thread count given to start() (1 while stopped).
    int threads() const { return per_node_.load(std::memory_order_relaxed); }
    /// Chooses the thread that serves `client` from now on: with one thread per node, thread
    /// 0; else the least loaded thread of NUMA node `numa_node` (-1: unknown, unpinned), or a
    /// new one while the node has fewer than threads(). Call before add()/add_ticker() for the
    /// client, and unbind() after its quiesce(). A thread that cannot start leaves the client
    /// on an existing one (logged). Never fails.
    void bind(ProgressClient *client, int numa_node);
    void unbind(ProgressClient *client);
    /// Watches `fd` (readable, writable, hang-up; edge-triggered) for `client`; with `wake`
    /// false it is registered muted (see interest()). Returns 0 or -errno (-ENODEV while the
    /// engine is stopped). interest(), remove() and the ticker calls are no-ops then.
    int add(int fd, ProgressClient *client, bool wake = true);
    /// Unmutes (`wake`) or mutes a watched fd: a muted fd wakes the thread only for errors
    /// and hang-ups. Unmuting reports the fd at once if it is ready then (epoll re-evaluates
    /// it), so nothing that arrived while muted is missed. An fd not watched is ignored.
    void interest(int fd, ProgressClient *client, bool wake);
    void remove(int fd, ProgressClient *client);
    /// Calls client->on_tick() from the next engine tick on, then whenever its next_tick_ns()
    /// is due (timers: watchdogs, probes, fatal timeouts). Each thread keeps its tickers in a
    /// heap by due time: a tick costs O(log n) per client that is due, nothing per client that
    /// is not, so thousands of quiet comms cost only what their own timers ask for.
    /// remove_ticker() must precede quiesce() and destruction.
    void add_ticker(ProgressClient *client);
    void remove_ticker(ProgressClient *client);
    /// Brings a ticker's next on_tick() forward to the first engine tick at or after `at_ns`
    /// (CLOCK_MONOTONIC): a parked client (ProgressClient::kParked) is called again, one
    /// due later is called sooner, one due sooner is left alone. O(log n); no-op for a client
    /// that is not registered (any more). Any thread; may be called with the client's own
    /// lock held (the engine calls no client under its timer lock).
    void wake(ProgressClient *client, uint64_t at_ns);

    /// The engine's timer resolution: a thread runs the tickers that are due at most this
    /// often (a client's calls are at least this far apart), and otherwise sleeps in
    /// epoll_wait until its earliest timer is due (kIdleNs at the most).
    static constexpr uint64_t kTickNs = 10'000'000; // 10 ms
    /// The longest a thread sleeps with no timer due and no fd ready.
    static constexpr uint64_t kIdleNs = 1'000'000'000; // 1 s
    /// A timer a client asks for this far out or further is background work (a quiet comm's
    /// probes, the port pairs' sweep): it is moved onto a grid of CLOCK_MONOTONIC
    /// (coalesced()), so that such timers share one wake-up per kCoalesceNs in every process
    /// of the host, as the kernel's round_jiffies() does for its own. A thread's wake-ups, not
    /// its work, are what idle connections cost: 50 to 500 us each on a virtual machine.
    /// Shorter timers (a busy comm's watchdogs, every kTimerNs) are left where they are.
    static constexpr uint64_t kCoalesceNs = 100'000'000; // 100 ms
    /// Where the engine runs a timer due at `due_ns` that was asked for at `now_ns` (both
    /// ns, CLOCK_MONOTONIC): when `due_ns` is kCoalesceNs or more away, the first multiple
    /// of kCoalesceNs at or after `due_ns - kTickNs` (at most a tick early, less than
    /// kCoalesceNs late); else (or within kCoalesceNs of UINT64_MAX: kParked) `due_ns`
    /// itself. Idempotent: a multiple of kCoalesceNs stays where it is. A client that
    /// checks its own due time when called (Comm::on_tick) stores this value, not `due_ns`,
    /// or a call moved earlier would find it not yet due and run it a moment later, off the
    /// grid, from then on. Rounding never more than a tick early keeps a timer of one
    /// interval on the grid once it is there: each call lands a whole interval after the
    /// last, give or take the engine's lateness.
    static constexpr uint64_t coalesced(uint64_t due_ns, uint64_t now_ns) noexcept
    {
        if (due_ns < now_ns || due_ns - now_ns < kCoalesceNs || due_ns > ~0ull - kCoalesceNs) return due_ns;
        return (due_ns - kTickNs + kCoalesceNs - 1) / kCoalesceNs * kCoalesceNs;
    }
    /// Returns once no callback for an fd or ticker removed before this call can still run:
    /// it waits for each thread's loop iteration in progress (which may hold events fetched
    /// before the removal) to end. Wakes the threads so that takes microseconds, not the epoll
    /// timeout. A no-op on an engine thread (two of them waiting for each other would never
    /// return): clients are removed and destroyed by the application's threads.
    void quiesce();

private:
    struct Shard {
        int numa = -1;
        int clients = 0; // bound clients (under ProgressEngine::mu_)
        int epfd = -1;
        int wakefd = -1;
        std::thread thread;
        std::atomic<bool> running{false};
        std::atomic<uint64_t> iterations{0}; // loop iterations completed
        /// A registered client's next call.
        struct Timer {
            uint64_t due = 0;
            ProgressClient *client = nullptr;
            bool operator>(const Timer &o) const { return due > o.due; }
        };
        std::mutex tick_mu;
        /// Min-heap on due (std::greater): each registered client's valid entry (due equal to
        /// its due_), none for a parked client or one the loop has out to call, and stale
        /// entries (a wake moved the client sooner) that are dropped when they come up.
        std::vector<Timer> timers;
        /// When the loop's epoll_wait ends at the latest (0 while it is awake).
        std::atomic<uint64_t> sleep_until{0};
        /// A timer now due at `at_ns`: wakes the loop if it sleeps past it. tick_mu held.
        void nudge(uint64_t at_ns);
    };
    /// ProgressClient::due_ while the loop has the client out to call.
    static constexpr uint64_t kCalling = ~0ull - 1;
    /// Creates and starts shard `index` for `numa` (pinned to the node's CPUs when known).
    /// Called with mu_ held. Returns 0 or -errno.
    int start_shard_locked(int index, int numa);
    /// The thread serving `client`, or nullptr while the engine is stopped.
    Shard *shard_of(const ProgressClient *client)
    {
        return client->thread_ < nshards_.load(std::memory_order_acquire)
                   ? shards_[static_cast<size_t>(client->thread_)].get()
                   : nullptr;
    }
    static void loop(Shard &s);

    std::mutex mu_;
    std::array<std::unique_ptr<Shard>, kMaxShards> shards_;
    std::atomic<int> nshards_{0};
    std::atomic<int> per_node_{1};
};

/// Parses a sysfs cpulist ("0-7,16-23", a trailing newline allowed) into `set`, keeping only
/// the CPUs also in `allowed`. Returns true when `set` is then not empty; false, with `set`
/// empty, for malformed text or no CPU left. Pure.
bool parse_cpulist(const std::string &list, const cpu_set_t &allowed, cpu_set_t *set);

} // namespace vigil::net
