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
#include <utility>

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

        std::atomic<uint64_t> heard_ns{0};
        std::atomic<uint64_t> probed_ns{0};
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

private:
    std::mutex mu_;
    std::map<std::pair<int, std::string>, std::weak_ptr<Pair>> pairs_;
    size_t sweep_at_ = 64; // forget expired entries when the map reaches this size
};

} // namespace vigil::net
