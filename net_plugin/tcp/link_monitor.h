// SPDX-License-Identifier: Apache-2.0
// Port events for the TCP fabric: an rtnetlink listener (RTMGRP_LINK) that reports when a
// device's interface loses or regains carrier, the event-driven first line of failure
// detection (design invariant 4). The verbs fabric gets the same from async port events.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../poll_thread.h"
#include "../sockets/socket.h"

namespace vigil::net::tcp {

/// Watches link state of the named interfaces on a thread of its own ("vigil-links"), asleep
/// in poll() on the rtnetlink socket until the kernel reports a link change: one thread per
/// process, no wake-up without an event. Not on the progress engine: there, behind thousands
/// of busy connections' fds, a port event waited its turn for 0.7 s (down) to 5.8 s (up) at
/// 4,096 connections (docs/scale.md). The verbs fabric's async-event thread is the same
/// design, as is NCCL's (net_ib.cc, ncclIbAsyncThreadMain). Owned by the plugin's global
/// state.
class LinkMonitor
{
public:
    /// dev index -> interface name; on_change(dev, up) is called once per transition, on the
    /// monitor's thread (never an engine thread, so it may take locks they take). An exception
    /// from it is logged and the event dropped.
    using Callback = std::function<void(int dev, bool up)>;

    LinkMonitor() = default;
    LinkMonitor(const LinkMonitor &) = delete;
    LinkMonitor &operator=(const LinkMonitor &) = delete;
    ~LinkMonitor() { stop(); }

    /// Opens the netlink socket and starts the thread. Returns 0 or -errno (detection then
    /// falls back to data-path errors and the stall watchdog); -EBUSY when running already.
    int start(std::vector<std::string> ifnames, Callback on_change);
    /// Wakes and joins the thread, closes the socket. Idempotent; not concurrent with start().
    void stop() noexcept;
    /// Last known state of `dev` (true until an event says otherwise). Thread-safe.
    bool up(int dev) const;

private:
    /// Reads every message queued on the socket and reports the transitions among them.
    void drain();

    UniqueFd fd_;
    PollThread thread_;
    std::vector<std::string> names_;
    std::unique_ptr<std::atomic<bool>[]> up_;
    Callback cb_;
};

} // namespace vigil::net::tcp
