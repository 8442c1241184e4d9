// SPDX-License-Identifier: Apache-2.0
// RC queue pair.
#include "qp.h"
#include "lib.h"

#include <cerrno>
#include <cstring>

#include "log.h"

namespace vigil::verbs {

void Qp::Destroy::operator()(ibv_qp *q) const noexcept
{
    // EBUSY: an async event of this QP is still unacknowledged (the event thread acks at once).
    const int rc = lib().destroy_qp(q);
    if (rc != 0) VLOG_WARN("ibv_destroy_qp: %s", strerror(-errno_rc(rc)));
}

int Qp::create_rc(const Pd &pd, const Cq &send_cq, const Cq &recv_cq, const QpCaps &caps,
                  void *qp_context, Qp *out) noexcept
{
    ibv_qp_init_attr attr{};
    attr.qp_context = qp_context;
    attr.send_cq = send_cq.get();
    attr.recv_cq = recv_cq.get();
    attr.qp_type = IBV_QPT_RC;
    attr.cap.max_send_wr = caps.max_send_wr;
    attr.cap.max_recv_wr = caps.max_recv_wr;
    attr.cap.max_send_sge = caps.max_send_sge;
    attr.cap.max_recv_sge = caps.max_recv_sge;
    attr.cap.max_inline_data = caps.max_inline_data;
    errno = 0;
    ibv_qp *q = lib().create_qp(pd.get(), &attr);
    if (q == nullptr) return errno > 0 ? -errno : -ENOMEM;
    out->qp_.reset(q);
    // ibv_create_qp writes back what the provider granted.
    out->caps_ = {attr.cap.max_send_wr, attr.cap.max_recv_wr, attr.cap.max_send_sge,
                  attr.cap.max_recv_sge, attr.cap.max_inline_data};
    return 0;
}

int Qp::to_init(uint8_t port, int access, uint16_t pkey_index) noexcept
{
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = pkey_index;
    a.port_num = port;
    a.qp_access_flags = static_cast<unsigned>(access);
    return modify_qp(qp_.get(), &a,
                     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int Qp::to_rtr(const QpPathAttr &path, const QpEndpoint &remote) noexcept
{
    if (remote.qpn > 0xffffff || remote.psn > 0xffffff || path.sl > 15) return -EINVAL;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = static_cast<ibv_mtu>(path.mtu);
    a.dest_qp_num = remote.qpn;
    a.rq_psn = remote.psn;
    a.max_dest_rd_atomic = path.max_rd_atomic;
    a.min_rnr_timer = path.min_rnr_timer;
    a.ah_attr.port_num = path.port;
    a.ah_attr.sl = path.sl;
    a.ah_attr.dlid = remote.lid;
    if (path.global) {
        a.ah_attr.is_global = 1;
        std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
        a.ah_attr.grh.sgid_index = path.gid_index;
        a.ah_attr.grh.hop_limit = path.hop_limit;
        a.ah_attr.grh.traffic_class = path.traffic_class;
    }
    return modify_qp(qp_.get(), &a,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
}

int Qp::to_rts(const QpPathAttr &path, uint32_t local_psn) noexcept
{
    if (local_psn > 0xffffff || path.retry_cnt > 7 || path.rnr_retry > 7 || path.timeout > 31)
        return -EINVAL;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = path.timeout;
    a.retry_cnt = path.retry_cnt;
    a.rnr_retry = path.rnr_retry;
    a.sq_psn = local_psn;
    a.max_rd_atomic = path.max_rd_atomic;
    return modify_qp(qp_.get(), &a,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                         IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

int Qp::to_error() noexcept
{
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    return modify_qp(qp_.get(), &a, IBV_QP_STATE);
}

int Qp::query_state(ibv_qp_state *state) const noexcept
{
    ibv_qp_attr a{};
    ibv_qp_init_attr init{};
    const int rc = errno_rc(lib().query_qp(qp_.get(), &a, IBV_QP_STATE, &init));
    if (rc == 0) *state = a.qp_state;
    return rc;
}

} // namespace vigil::verbs
