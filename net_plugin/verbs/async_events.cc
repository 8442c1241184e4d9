// SPDX-License-Identifier: Apache-2.0
// The async-event thread of one RDMA device.
#include "async_events.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>

#include "clock.h"
#include "lib.h"
#include "log.h"
#include "names.h"

namespace vigil::net::ib {

bool is_port_event(int type) noexcept
{
    switch (type) {
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE: return true;
    default: return false;
    }
}

AsyncEventThread::~AsyncEventThread()
{
    stop();
}

int AsyncEventThread::start(ibv_context *ctx, const std::string &name, Handler handler)
{
    if (thread_.running()) return -EBUSY;
    const int flags = fcntl(ctx->async_fd, F_GETFL);
    if (flags < 0 || fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) != 0) return -errno;
    ctx_ = ctx;
    name_ = name;
    handler_ = std::move(handler);
    // "vigil-ev-" + up to 6 characters: thread names hold 15.
    return thread_.start(ctx->async_fd, "vigil-ev-" + name_.substr(0, 6), "dev " + name_, [this] { drain(); });
}

void AsyncEventThread::stop() noexcept
{
    thread_.stop();
}

void AsyncEventThread::drain()
{
    // Every event that is there; the fd is non-blocking.
    for (;;) {
        ibv_async_event ev{};
        if (verbs::lib().get_async_event(ctx_, &ev) != 0) break;
        AsyncEvent out;
        out.type = ev.event_type;
        out.time_ns = now_ns();
        if (is_port_event(ev.event_type)) {
            out.port = ev.element.port_num;
        } else if (ev.event_type == IBV_EVENT_QP_FATAL ||
                   ev.event_type == IBV_EVENT_QP_REQ_ERR ||
                   ev.event_type == IBV_EVENT_QP_ACCESS_ERR ||
                   ev.event_type == IBV_EVENT_COMM_EST ||
                   ev.event_type == IBV_EVENT_SQ_DRAINED ||
                   ev.event_type == IBV_EVENT_PATH_MIG ||
                   ev.event_type == IBV_EVENT_PATH_MIG_ERR ||
                   ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED) {
            out.qp_num = ev.element.qp->qp_num;
            out.qp_context = ev.element.qp->qp_context;
        }
        try {
            if (handler_) handler_(out);
        } catch (const std::exception &e) {
            VLOG_WARN("dev %s: event handler failed on %s: %s", name_.c_str(),
                      verbs::event_type_name(out.type), e.what());
        } catch (...) {
            VLOG_WARN("dev %s: event handler failed on %s", name_.c_str(),
                      verbs::event_type_name(out.type));
        }
        verbs::lib().ack_async_event(&ev); // always, or destroying what it names would wait
    }
}

} // namespace vigil::net::ib
