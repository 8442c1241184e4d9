// SPDX-License-Identifier: Apache-2.0
// Completion channel and completion queue.
#include "cq.h"
#include "lib.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <poll.h>

#include "log.h"

namespace vigil::verbs {

void CompChannel::Destroy::operator()(ibv_comp_channel *c) const noexcept
{
    const int rc = lib().destroy_comp_channel(c);
    if (rc != 0) VLOG_WARN("ibv_destroy_comp_channel: %s", strerror(-errno_rc(rc)));
}

int CompChannel::create(const Context &ctx, CompChannel *out) noexcept
{
    errno = 0;
    ibv_comp_channel *c = lib().create_comp_channel(ctx.get());
    if (c == nullptr) return errno > 0 ? -errno : -ENOMEM;
    std::unique_ptr<ibv_comp_channel, Destroy> owned(c);
    const int flags = fcntl(c->fd, F_GETFL);
    if (flags < 0 || fcntl(c->fd, F_SETFL, flags | O_NONBLOCK) != 0) return -errno;
    out->ch_ = std::move(owned);
    return 0;
}

int CompChannel::wait(int timeout_ms, ibv_cq **cq) const noexcept
{
    pollfd p{ch_->fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, timeout_ms);
    if (ready < 0) return errno == EINTR ? 0 : -errno;
    if (ready == 0) return 0;
    void *context = nullptr;
    if (lib().get_cq_event(ch_.get(), cq, &context) != 0)
        return errno == EAGAIN ? 0 : (errno > 0 ? -errno : -EIO);
    lib().ack_cq_events(*cq, 1);
    return 1;
}

void Cq::Destroy::operator()(ibv_cq *c) const noexcept
{
    const int rc = lib().destroy_cq(c);
    if (rc != 0) VLOG_WARN("ibv_destroy_cq: %s", strerror(-errno_rc(rc)));
}

int Cq::create(const Context &ctx, int cqe, const CompChannel *channel, void *cq_context,
               Cq *out) noexcept
{
    if (cqe <= 0) return -EINVAL;
    errno = 0;
    ibv_cq *c =
        lib().create_cq(ctx.get(), cqe, cq_context, channel != nullptr ? channel->get() : nullptr, 0);
    if (c == nullptr) return errno > 0 ? -errno : -ENOMEM;
    out->cq_.reset(c);
    return 0;
}

int Cq::arm(bool solicited_only) const noexcept
{
    return errno_rc(ibv_req_notify_cq(cq_.get(), solicited_only ? 1 : 0));
}

} // namespace vigil::verbs
