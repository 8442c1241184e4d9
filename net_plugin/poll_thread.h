// SPDX-License-Identifier: Apache-2.0
// A named thread asleep in poll() on one fd until it is readable: the skeleton of the
// plugins' port-event threads (the TCP link monitor's rtnetlink socket, an RDMA device's
// async-event fd). Not on the progress engine: behind thousands of busy connections' fds a
// port event waited its turn there for seconds (docs/scale.md).
#pragma once

#include <functional>
#include <string>
#include <thread>

namespace vigil::net {

/// One thread watching one fd. Its cost: the thread, its stack and one eventfd (to stop it);
/// no wake-up but the fd's own. Not thread-safe: start() and stop() from one owner.
class PollThread
{
public:
    /// Called on the thread each time the fd is readable; must drain what is there (the fd
    /// should be non-blocking) and must not throw (an exception is caught and logged).
    using OnReadable = std::function<void()>;

    PollThread() = default;
    ~PollThread() { stop(); }
    PollThread(const PollThread &) = delete;
    PollThread &operator=(const PollThread &) = delete;

    /// Starts watching `fd` (owned by the caller, open until stop() returns) on a thread named
    /// `thread_name` (at most 15 characters are kept). `what` names the fd in warnings ("link
    /// monitor", "dev mlx5_0"). Returns 0, -EBUSY when already started, or -errno.
    [[nodiscard]] int start(int fd, const std::string &thread_name, std::string what, OnReadable on_readable);
    /// Ends the thread and waits for it; idempotent. `on_readable` is not called afterwards.
    void stop() noexcept;
    bool running() const noexcept { return thread_.joinable(); }

private:
    void run() noexcept;

    int fd_ = -1;
    int stop_fd_ = -1;
    std::string what_;
    OnReadable on_readable_;
    std::thread thread_;
};

} // namespace vigil::net
