// SPDX-License-Identifier: Apache-2.0
// One thread per open RDMA device that reads its asynchronous events (port up/down, GID and
// LID changes, device fatal, QP errors) and hands each to a callback.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <infiniband/verbs.h>

#include "poll_thread.h"

namespace vigil::net::ib {

/// One asynchronous event, copied out of libibverbs (the event itself is acknowledged
/// before the callback returns to the thread's loop). Plain data.
struct AsyncEvent {
    int type = 0;               ///< enum ibv_event_type
    int port = 0;               ///< 1-based port for port events (PORT_*, GID/LID/PKEY/SM change,
                                ///< CLIENT_REREGISTER); 0 for device, QP, CQ, SRQ and WQ events
    uint32_t qp_num = 0;        ///< QP events (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, COMM_EST, ...)
    void *qp_context = nullptr; ///< that QP's context, as given at QP creation
    uint64_t time_ns = 0;       ///< when the thread read it (vigil::now_ns())
};

/// True for event types that name a port (element.port_num is valid).
bool is_port_event(int type) noexcept;

/// Reads the async events of one ibv_context on a thread of its own and calls `handler` for
/// each, in order, on that thread. Owns the thread, not the context (which must outlive
/// it). The context's async fd is switched to non-blocking and waited on with poll() next to
/// an eventfd, so stop() (and the destructor) end the thread at once, whatever the device
/// does. Events are acknowledged right after the handler returns, so a QP or CQ the event
/// names can be destroyed afterwards; the handler must not block for long and must not
/// destroy objects of this context itself (ibv_destroy_qp waits for the acknowledgement).
/// start/stop are not thread-safe against each other; the handler runs on the event thread.
class AsyncEventThread {
public:
    using Handler = std::function<void(const AsyncEvent &)>;

    AsyncEventThread() = default;
    ~AsyncEventThread();
    AsyncEventThread(const AsyncEventThread &) = delete;
    AsyncEventThread &operator=(const AsyncEventThread &) = delete;

    /// Starts the thread. `name` (the device's) names the thread for debuggers. Returns 0 or
    /// -errno (-EBUSY when already started).
    [[nodiscard]] int start(ibv_context *ctx, const std::string &name, Handler handler);
    /// Ends the thread and waits for it; idempotent. The handler is not called afterwards.
    void stop() noexcept;
    bool running() const noexcept { return thread_.running(); }

private:
    /// Reads and hands over every event queued on the context's async fd.
    void drain();

    ibv_context *ctx_ = nullptr;
    Handler handler_;
    std::string name_;
    PollThread thread_;
};

} // namespace vigil::net::ib
