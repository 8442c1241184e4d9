// SPDX-License-Identifier: Apache-2.0
// The verbs fault seam: the few libibverbs calls a fabric makes on its data path, behind one
// table of function pointers, each normalised to return 0 or -errno.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>

#include <infiniband/verbs.h>

namespace vigil::verbs {

/// The data-path verbs a fabric calls, as a table of plain function pointers (rdma-core's
/// provider ops, verbs_context_ops, are the model). Every entry returns 0 or a negative errno
/// (poll_cq: the number of completions, >= 0, or a negative errno); the defaults wrap
/// libibverbs and normalise its mixed conventions (positive errno returns, NULL + errno,
/// negative counts). Tests install a table whose entries wrap the defaults to inject faults
/// rxe cannot produce on demand (see fault.h); production code never changes it. Cost when
/// no test table is installed: one relaxed atomic load and one indirect call per verb.
struct Ops {
    /// ibv_post_send(qp, wr, bad_wr). On error *bad_wr names the first WR not posted.
    int (*post_send)(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad_wr) noexcept;
    /// ibv_post_recv(qp, wr, bad_wr). On error *bad_wr names the first WR not posted.
    int (*post_recv)(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad_wr) noexcept;
    /// ibv_poll_cq: up to `n` completions into wc[0..n). Returns how many (>= 0) or -errno.
    int (*poll_cq)(ibv_cq *cq, int n, ibv_wc *wc) noexcept;
    /// ibv_modify_qp(qp, attr, attr_mask).
    int (*modify_qp)(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask) noexcept;
    /// ibv_reg_mr(pd, addr, length, access); *mr receives the region on success.
    int (*reg_mr)(ibv_pd *pd, void *addr, size_t length, int access, ibv_mr **mr) noexcept;
    /// ibv_reg_dmabuf_mr(pd, offset, length, iova, fd, access); *mr receives the region.
    int (*reg_dmabuf_mr)(ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                         int access, ibv_mr **mr) noexcept;
};

/// The table that calls libibverbs. Static storage; thread-safe.
const Ops &default_ops() noexcept;

namespace detail {
extern std::atomic<const Ops *> g_ops;
} // namespace detail

/// The table in force. Thread-safe (one relaxed load).
inline const Ops &ops() noexcept
{
    return *detail::g_ops.load(std::memory_order_relaxed);
}

/// Installs `table` (must outlive its installation; nullptr restores the defaults) and
/// returns the previous one. Only while no data path is running: a verb already inside the
/// old table finishes there. Meant for tests.
const Ops *install_ops(const Ops *table) noexcept;

/// Converts a libibverbs return value that is 0, a positive errno, or -1 with errno set
/// (providers differ) into 0 / -errno. Never returns a positive value.
inline int errno_rc(int rc) noexcept
{
    if (rc == 0) return 0;
    if (rc > 0) return -rc;
    return errno > 0 ? -errno : -EIO;
}

/// The normalised verbs themselves, through the table in force. noexcept; same thread-safety
/// as the underlying verb (post/poll on one QP/CQ from one thread at a time, or as the
/// provider allows).
[[nodiscard]] inline int post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad) noexcept
{
    return ops().post_send(qp, wr, bad);
}
[[nodiscard]] inline int post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad) noexcept
{
    return ops().post_recv(qp, wr, bad);
}
[[nodiscard]] inline int poll_cq(ibv_cq *cq, int n, ibv_wc *wc) noexcept
{
    return ops().poll_cq(cq, n, wc);
}
[[nodiscard]] inline int modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int mask) noexcept
{
    return ops().modify_qp(qp, attr, mask);
}

} // namespace vigil::verbs
