// SPDX-License-Identifier: Apache-2.0
// The progress engine: one background thread per process that moves data for every comm
// whose sockets become ready, so transfers advance even when NCCL does not call test().
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace vigil::net {

/// Something the engine can drive: a comm. on_ready() runs on the engine thread and must
/// take the comm's own lock (it may block briefly behind an isend/irecv/test of the app).
class ProgressClient
{
public:
    virtual void on_ready() noexcept = 0;
    /// Called every kTickNs for clients registered with add_ticker() (timers: watchdogs,
    /// probes, rebuilds). Defaults to on_ready().
    virtual void on_tick() noexcept { on_ready(); }

protected:
    ~ProgressClient() = default;
};

/// Edge-triggered epoll loop. Thread-safe: add()/remove() may be called from any thread.
/// Lifetime: started by the first plugin init, stopped by the last finalize (refcounted by
/// the plugin). A client must call remove() for its fds and then quiesce() before it is
/// destroyed, so that no callback for it is still running.
class ProgressEngine
{
public:
    static ProgressEngine &instance();

    /// Starts the thread (idempotent). Returns 0 or -errno.
    int start();
    /// Stops and joins the thread (idempotent).
    void stop();
    /// Watches `fd` (readable, writable, hang-up; edge-triggered) for `client`; with `wake`
    /// false it is registered muted (see interest()). Returns 0 or -errno.
    int add(int fd, ProgressClient *client, bool wake = true);
    /// Unmutes (`wake`) or mutes a watched fd: a muted fd wakes the thread only for errors
    /// and hang-ups. Unmuting reports the fd at once if it is ready then (epoll re-evaluates
    /// it), so nothing that arrived while muted is missed. An fd not watched is ignored.
    void interest(int fd, ProgressClient *client, bool wake);
    void remove(int fd);
    /// Calls client->on_tick() every kTickNs (timers: watchdogs, probes, fatal timeouts).
    /// remove_ticker() must precede quiesce() and destruction.
    void add_ticker(ProgressClient *client);
    void remove_ticker(ProgressClient *client);

    static constexpr uint64_t kTickNs = 10'000'000; // 10 ms
    /// Returns once no callback for an fd removed before this call can still run: it waits
    /// for the loop iteration in progress (which may hold events fetched before the removal)
    /// to end. Wakes the thread so that takes microseconds, not the epoll timeout.
    void quiesce();

private:
    void loop();

    std::mutex mu_;
    std::mutex tick_mu_;
    std::vector<ProgressClient *> tickers_;
    int epfd_ = -1;
    int wakefd_ = -1;
    std::thread thread_;
    std::atomic<bool> running_{false};
    std::atomic<uint64_t> iterations_{0}; // loop iterations completed
};

} // namespace vigil::net
