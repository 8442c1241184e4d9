// SPDX-License-Identifier: Apache-2.0
// RAII over libibverbs completion objects: a completion channel and a completion queue.
#pragma once

#include <memory>

#include <infiniband/verbs.h>

#include "device.h"
#include "ops.h"

namespace vigil::verbs {

/// A completion channel (ibv_comp_channel): a file descriptor that becomes readable when a
/// CQ armed with Cq::arm() gets a completion. Owns it; move-only. Its fd is non-blocking.
/// Every CQ bound to it must be destroyed first. One thread waits on it at a time.
class CompChannel {
public:
    CompChannel() = default;
    [[nodiscard]] static int create(const Context &ctx, CompChannel *out) noexcept;
    ibv_comp_channel *get() const noexcept { return ch_.get(); }
    int fd() const noexcept { return ch_->fd; }

    /// Waits up to `timeout_ms` (-1: for ever) for one CQ event and acknowledges it at once,
    /// so destroying the CQ never waits for an unacknowledged event. *cq receives the CQ;
    /// the caller re-arms it and polls. Returns 1 with an event, 0 on timeout, or -errno.
    [[nodiscard]] int wait(int timeout_ms, ibv_cq **cq) const noexcept;

private:
    struct Destroy {
        void operator()(ibv_comp_channel *c) const noexcept;
    };
    std::unique_ptr<ibv_comp_channel, Destroy> ch_;
};

/// A completion queue. Owns it; move-only. Destroy its QPs first. Polling through poll()
/// goes through the fault seam (ops.h). One thread polls a CQ at a time.
class Cq {
public:
    Cq() = default;
    /// Creates a CQ of at least `cqe` entries, bound to `channel` when not null, with
    /// `cq_context` handed back by CompChannel::wait. 0 or -errno.
    [[nodiscard]] static int create(const Context &ctx, int cqe, const CompChannel *channel,
                                    void *cq_context, Cq *out) noexcept;
    ibv_cq *get() const noexcept { return cq_.get(); }
    explicit operator bool() const noexcept { return cq_ != nullptr; }

    /// Up to `n` completions into wc: how many (>= 0) or -errno. Data path.
    [[nodiscard]] int poll(int n, ibv_wc *wc) const noexcept { return poll_cq(cq_.get(), n, wc); }
    /// Arms the CQ for one event on its channel (ibv_req_notify_cq). 0 or -errno.
    [[nodiscard]] int arm(bool solicited_only = false) const noexcept;

private:
    struct Destroy {
        void operator()(ibv_cq *c) const noexcept;
    };
    std::unique_ptr<ibv_cq, Destroy> cq_;
};

} // namespace vigil::verbs
