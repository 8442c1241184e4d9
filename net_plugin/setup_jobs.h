// SPDX-License-Identifier: Apache-2.0
// Slow, local set-up work run off the data path. Creating and connecting a path's RDMA
// resources is tens of system calls (a CQ, a QP, a memory registration, three QP state
// changes): 1-3 ms on a ConnectX, tens of ms on Soft-RoCE under emulation. Run where the
// set-up state machine is stepped, that work held whoever stepped it: a port that heals under
// N connections rebuilt N paths in turn on the event thread or a progress-engine thread,
// under a comm lock the engine then waited for, and every connection's traffic stalled for
// the sum (1 s at 16 connections in the RDMA lab). Set-up code hands such work here and polls
// its Job; the data path never waits for it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include <sys/types.h>

namespace vigil::net {

/// One worker thread per process (`vigil-setup`), started by the first job and asleep in a
/// condition variable while none is queued: no wake-up, timer or fd of its own. Jobs run in
/// the order they were queued, one at a time. Thread-safe.
class SetupJobs
{
public:
    /// A queued piece of work. done() turns true (release) once fn has returned; rc() is its
    /// value then. The submitter may drop its handle at any time: the work still runs, and
    /// what fn captured is released on the worker thread when it returns.
    class Job
    {
    public:
        bool done() const noexcept { return done_.load(std::memory_order_acquire); }
        /// fn's return value (0 or -errno; -ENOMEM when it threw). Only once done().
        int rc() const noexcept { return rc_; }

    private:
        friend class SetupJobs;
        std::function<int()> fn_;
        std::function<void()> on_done_;
        int rc_ = 0;
        std::atomic<bool> done_{false};
    };

    /// The process's worker (never destroyed: v8-v10 never finalize).
    static SetupJobs &process();
    /// Queues `fn` (0 or -errno; exceptions are caught). `on_done`, when given, is called on
    /// the worker thread once the job is done (to wake whoever polls it; it must not block
    /// and must not throw). Returns the job's handle, or nullptr when the worker thread
    /// cannot be started (the caller then runs the work itself).
    std::shared_ptr<Job> run(std::function<int()> fn, std::function<void()> on_done = {}) noexcept;
    /// Jobs queued or running now (for tests and diagnostics).
    size_t pending() const noexcept;

private:
    void loop() noexcept;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::shared_ptr<Job>> queue_;
    size_t running_ = 0;
    std::thread thread_;
    pid_t owner_ = 0; // the process the thread runs in (a forked child starts its own)
};

} // namespace vigil::net
