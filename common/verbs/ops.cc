// SPDX-License-Identifier: Apache-2.0
// The default verbs table (libibverbs) and its installation.
#include "ops.h"
#include "lib.h"

#include <cerrno>


namespace vigil::verbs {
namespace {

int lib_post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad) noexcept
{
    return errno_rc(ibv_post_send(qp, wr, bad));
}

int lib_post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad) noexcept
{
    return errno_rc(ibv_post_recv(qp, wr, bad));
}

int lib_poll_cq(ibv_cq *cq, int n, ibv_wc *wc) noexcept
{
    int got = ibv_poll_cq(cq, n, wc);
    // A negative count carries no errno by contract; providers that fail polling have lost
    // the CQ (device fatal, overrun), which is an I/O error to the caller.
    return got >= 0 ? got : -EIO;
}

int lib_modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int mask) noexcept
{
    return errno_rc(lib().modify_qp(qp, attr, mask));
}

int lib_reg_mr(ibv_pd *pd, void *addr, size_t length, int access, ibv_mr **mr) noexcept
{
    errno = 0;
    *mr = lib().reg_mr(pd, addr, length, access);
    if (*mr != nullptr) return 0;
    return errno > 0 ? -errno : -ENOMEM;
}

int lib_reg_dmabuf_mr(ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access,
                      ibv_mr **mr) noexcept
{
    *mr = nullptr;
    if (lib().reg_dmabuf_mr == nullptr) return -EOPNOTSUPP; // rdma-core older than 34
    errno = 0;
    *mr = lib().reg_dmabuf_mr(pd, offset, length, iova, fd, access);
    if (*mr != nullptr) return 0;
    return errno > 0 ? -errno : -EOPNOTSUPP;
}

constexpr Ops kLibOps = {lib_post_send, lib_post_recv, lib_poll_cq,
                         lib_modify_qp, lib_reg_mr,    lib_reg_dmabuf_mr};

} // namespace

namespace detail {
std::atomic<const Ops *> g_ops{&kLibOps};
} // namespace detail

const Ops &default_ops() noexcept
{
    return kLibOps;
}

const Ops *install_ops(const Ops *table) noexcept
{
    return detail::g_ops.exchange(table != nullptr ? table : &kLibOps);
}

} // namespace vigil::verbs
