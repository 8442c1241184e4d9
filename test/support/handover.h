// SPDX-License-Identifier: Apache-2.0
// The PathAcceptor of the in-process test connections (socket_conn.h, verbs_conn.h): hands the
// receiving comm the receive halves of paths the test's rebuilder built, in order.
#pragma once

#include <deque>
#include <memory>

#include "fabric.h"

namespace vigil::test {

/// Hands over, oldest first, what the rebuilder queued in `queue` (owned by the test, which
/// outlives the acceptor). Not thread-safe: one test thread drives both comms.
class HandoverAcceptor final : public vigil::net::PathAcceptor
{
public:
    using Queue = std::deque<std::unique_ptr<vigil::net::RecvPath>>;
    explicit HandoverAcceptor(Queue &queue) : queue_(queue) {}
    int poll(std::unique_ptr<vigil::net::RecvPath> *out) override
    {
        if (queue_.empty()) return 0;
        *out = std::move(queue_.front());
        queue_.pop_front();
        return 0;
    }

private:
    Queue &queue_;
};

} // namespace vigil::test
