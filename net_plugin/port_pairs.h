// SPDX-License-Identifier: Apache-2.0
// Liveness per (local port, remote port) pair, shared by every path of the process between
// the two ports: one probe or heartbeat per pair and probe interval, whatever the number of
// connections over it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "progress.h"

namespace vigil::net {

/* Why per pair. A port that fails takes every path between it and the peer's port with it;
 * a peer port that answers on one path answers on all. NCCL's IB transport keeps no
 * per-QP heartbeat at all; TCP keepalive is per socket but kernels send it only on idle
 * sockets. Vigil probes quiet paths so that a standby's death is found before it is needed,
 * and at scale (an all-to-all opens a connection per remote peer and channel, thousands per
 * process, most idle) a probe per path and interval costs each process tens of thousands of
 * messages a second while nothing moves. With a Pair shared by every path of the process
 * between one local device and one remote port (an address, a GID), a pair is probed once per
 * interval and what any of its paths hears keeps all of them alive.
 *
 * What stays per path: errors (a socket reset, an error completion, a QP in the error state)
 * fail over the path that saw them, at once; a pair only answers "is the peer's port there".
 * A pair that falls silent for the stall timeout fails over every connection with a path on
 * it, each at its next timer (within one timer period of the others).
 *
 * Parked comms. A quiet comm (nothing in flight, every path up) that did not send its pairs'
 * probe has no timer work of its own: it parks (ProgressClient::kParked) and registers as a
 * sleeper on each of its pairs. The process's sweep (one engine timer, every probe
 * interval, O(pairs), coalesced with the probers' timers: ProgressEngine::kCoalesceNs) wakes
 * one sleeper of a pair whose probes stopped for two intervals (its prober closed or got busy
 * elsewhere), which then probes and stays awake, and every sleeper
 * that watches the pair's silence (a sender's standby) once the pair heard nothing for its
 * stall timeout. A comm that turns busy wakes itself. So thousands of idle connections cost
 * their pairs' probers and the sweep, not a timer each.
 */
class PortPairs
{
public:
    /// Liveness of one pair. Thread-safe (atomics): every comm with a path on the pair
    /// updates it from its own lock.
    struct Pair {
        /// Something arrived from the peer's port on a path of the pair at `now` (ns,
        /// CLOCK_MONOTONIC). Keeps the latest time.
        void heard(uint64_t now) noexcept;
        /// When a path of the pair last heard the peer's port (0: never).
        uint64_t last_heard() const noexcept { return heard_ns.load(std::memory_order_relaxed); }
        /// True, once per `interval_ns` across every path of the pair, for the caller that
        /// should send the pair's probe (or heartbeat) now; it then must send it.
        bool claim_probe(uint64_t now, uint64_t interval_ns) noexcept;

        /// Called by the sweep for a parked comm, with the pair's lock held: it may only
        /// schedule its own tick (never take the comm's lock, which sleep() is called under).
        class Sleeper
        {
        public:
            virtual void wake_from_pair() noexcept = 0;

        protected:
            ~Sleeper() = default;
        };
        /// `who` parks with a path on this pair: the sweep wakes it (once; it registers again
        /// when it parks again) when no probe was claimed for 2 x `interval_ns`, or with
        /// `on_silence` when neither the pair nor the path (its last word at `heard_ns`) heard
        /// the peer for `stall_ns`. A second call for `who` merges (on_silence if either).
        /// Thread-safe.
        void sleep(Sleeper *who, uint64_t interval_ns, uint64_t stall_ns, bool on_silence,
                   uint64_t heard_ns);
        /// `who` no longer sleeps here (woke, or closes). Returns once no sweep of the pair
        /// can still call it. Thread-safe.
        void unsleep(Sleeper *who);
        /// The sweep of this pair at `now`: wakes (and forgets) the sleepers due as above.
        /// Returns the smallest probe interval of the sleepers left (~0: none).
        uint64_t sweep(uint64_t now);
        /// Sleepers registered now (tests).
        size_t sleepers();

        std::atomic<uint64_t> heard_ns{0};
        std::atomic<uint64_t> probed_ns{0};
        bool shared = false; ///< in the process's map, so the sweep sees it (set once by get())

    private:
        struct Sleeping {
            uint64_t interval_ns = 0, stall_ns = 0, heard_ns = 0;
            bool on_silence = false;
        };
        std::mutex mu_;
        std::unordered_map<Sleeper *, Sleeping> sleeping_;
        // The smallest probe interval and stall timeout of any sleeper (not raised when one
        // leaves: only the pass that visits them all recomputes them). While the pair was
        // probed and heard within them, a sweep has nothing to wake and visits no sleeper.
        uint64_t min_interval_ns_ = ~0ull, min_stall_ns_ = ~0ull;
    };

    /// The pairs of this process (every comm of the net plugin).
    static PortPairs &process() noexcept;

    /// The pair of local device `dev` and remote port `peer_port` (a path's
    /// PathIdentity::peer_port), made on first use; it lives while a path holds it. An empty
    /// `peer_port` (a fabric that cannot name it) gets a pair of its own, shared with nobody.
    /// Thread-safe; allocates (not for the data path: a path takes its pair when installed).
    std::shared_ptr<Pair> get(int dev, const std::string &peer_port);
    /// Pairs alive now (held by at least one path).
    size_t size();

    /// One sweep of every pair of the map at `now` (Pair::sweep). Returns when the next one
    /// is due: the smallest probe interval of any sleeper, between 10 and 100 ms (at the
    /// default interval the engine runs it in the same wake-up as the pairs' probers).
    uint64_t sweep(uint64_t now);
    /// Runs sweep() on the progress engine (thread 0) from now on; comms park only while it
    /// runs (sweeping()). The plugin starts it after the engine and stops it before; both
    /// idempotent, not concurrent with each other.
    void start_sweeper();
    void stop_sweeper();
    bool sweeping() const noexcept { return sweeping_.load(std::memory_order_acquire); }

private:
    /// The engine timer that sweeps.
    class Sweeper final : public ProgressClient
    {
    public:
        explicit Sweeper(PortPairs &pairs) : pairs_(pairs) {}
        void on_ready() noexcept override {}
        void on_tick() noexcept override;
        uint64_t next_tick_ns() const noexcept override { return next_; }

    private:
        PortPairs &pairs_;
        uint64_t next_ = 0; // engine thread only
    };
    Sweeper sweeper_{*this};
    std::atomic<bool> sweeping_{false};
    std::mutex mu_;
    std::map<std::pair<int, std::string>, std::weak_ptr<Pair>> pairs_;
    size_t sweep_at_ = 64; // forget expired entries when the map reaches this size
};

} // namespace vigil::net
