// SPDX-License-Identifier: Apache-2.0
// Port events for the TCP fabric: an rtnetlink listener (RTMGRP_LINK) that reports when a
// device's interface loses or regains carrier, the event-driven first line of failure
// detection (design invariant 4). The verbs fabric gets the same from async port events.
#pragma once

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "../progress.h"
#include "../sockets/socket.h"

namespace vigil::net::tcp {

/// Watches link state of the named interfaces. Owned by the plugin's global state; its
/// socket is driven by the progress engine, so `on_change` runs on the engine thread and
/// must not block on anything the engine thread holds.
class LinkMonitor final : public ProgressClient
{
public:
    /// dev index -> interface name; on_change(dev, up) is called once per transition.
    using Callback = std::function<void(int dev, bool up)>;

    /// Opens the netlink socket and registers it with the progress engine. Returns 0 or
    /// -errno (detection then falls back to data-path errors and the stall watchdog).
    int start(std::vector<std::string> ifnames, Callback on_change);
    /// Unregisters and closes. Idempotent.
    void stop();
    /// Last known state of `dev` (true until an event says otherwise). Thread-safe.
    bool up(int dev) const;

    void on_ready() noexcept override;

private:
    UniqueFd fd_;
    std::vector<std::string> names_;
    std::unique_ptr<std::atomic<bool>[]> up_;
    Callback cb_;
    std::mutex mu_;
};

} // namespace vigil::net::tcp
