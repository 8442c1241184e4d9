// SPDX-License-Identifier: Apache-2.0
// A port's fair-share clock: how much of a local port's time each of the paths busy on it had.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace vigil::telemetry {

/* Paths of one process share their local port: under multipath every connection stripes over
 * both of a host's ports, so each port carries the active path of one connection and the
 * shared path of another at once (NCCL's channels), and each path moves about half of what
 * the port does. Judged alone, each then reads half its baseline, learned while it had the
 * port to itself: a healthy port flagged degraded.
 *
 * The clock advances at 1/n of real time while n paths of this process are busy on the port
 * (have data in flight), and stands still while none is: a path's share of the port over a
 * busy span is the clock's advance over it (processor sharing, as a fair queue's virtual
 * time). A path alone on the port is charged its whole busy time; two busy together, half
 * each. Bytes over that share is what the path would move with the port to itself: the same
 * as its own rate when alone, the port's rate when shared fairly, and lower when the port,
 * or the path beyond it, is slow.
 *
 * What it cannot see: other processes on the same port (one rank per GPU usually has its own
 * rail; where ranks share a NIC, each process judges its paths against what it saw alone),
 * and a share that is not fair (a path with one small piece in flight beside one with
 * megabytes queued still counts as one of two). Either can make a path look slower than its
 * port, never faster.
 *
 * Thread-safe: a mutex around three words, taken when a path's busy state changes and when
 * its meter closes a window while busy (at most once per window, 1 ms by default, per busy
 * path); not a spin lock, which on a saturated host spins out a time slice behind a holder
 * that was preempted. No allocation.
 */
class PortClock
{
public:
    /// A path became busy at `now` (ns, CLOCK_MONOTONIC). Returns the clock's reading (ns of
    /// fair-share time) from which the path's share counts.
    double enter(uint64_t now) noexcept;
    /// A path that entered stopped being busy at `now`; returns the clock's reading.
    double leave(uint64_t now) noexcept;
    /// The clock's reading at `now`.
    double read(uint64_t now) noexcept;
    /// `bytes` of a path on this port arrived (a completion, or bytes reported landed).
    /// Lock-free.
    void carried(uint64_t bytes) noexcept { bytes_.fetch_add(bytes, std::memory_order_relaxed); }
    /// Bytes the port's paths carried since the process began. A path's meter takes the
    /// difference over its own busy time: what the port moved while the path waited on it.
    /// A first-in first-out queue shares that out unevenly (a path with one piece queued
    /// behind another's megabytes gets far less than half of the port for that time), yet
    /// the port was not slow (DegradeDetector, "Sharing"). Lock-free.
    uint64_t carried_total() const noexcept { return bytes_.load(std::memory_order_relaxed); }
    /// Paths busy on the port now.
    int busy() const noexcept { return n_.load(std::memory_order_relaxed); }

    /// The clock of local device `dev` in direction `dir` (0 send, 1 receive) of this process,
    /// or nullptr when `dev` is outside [0, kDevs) (a path of an unknown device is judged
    /// alone). Lives for the whole process.
    static PortClock *of(int dir, int dev) noexcept;
    static constexpr int kDevs = 64;

private:
    void advance(uint64_t now) noexcept; // with mu_ held
    std::mutex mu_;
    double v_ = 0;          // the fair-share time, ns
    uint64_t last_ns_ = 0;  // when v_ was last advanced
    std::atomic<int> n_{0}; // paths busy
    std::atomic<uint64_t> bytes_{0}; // carried()
};

} // namespace vigil::telemetry
