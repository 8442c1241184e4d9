// SPDX-License-Identifier: Apache-2.0
// RAII over an RC queue pair and its state machine (RESET -> INIT -> RTR -> RTS, ERR).
#pragma once

#include <cstdint>
#include <memory>

#include <infiniband/verbs.h>

#include "cq.h"
#include "device.h"
#include "ops.h"

namespace vigil::verbs {

/// Work-queue sizes of a new QP. Plain data.
struct QpCaps {
    uint32_t max_send_wr = 128;
    uint32_t max_recv_wr = 128;
    uint32_t max_send_sge = 1;
    uint32_t max_recv_sge = 1;
    uint32_t max_inline_data = 0; ///< bytes
};

/// What one end of an RC connection tells the other (QP number, first PSN, GID, LID). Plain
/// data: the fabric carries it in its own wire format and must bound what it reads.
struct QpEndpoint {
    uint32_t qpn = 0; ///< 24 bits
    uint32_t psn = 0; ///< 24 bits: the first packet sequence number this end sends
    uint8_t gid[16] = {};
    uint16_t lid = 0; ///< InfiniBand only; 0 on RoCE
};

/// The local choices for RTR and RTS. Defaults are NCCL's IB transport's (net_ib connect.cc:
/// timeout 20, retry_cnt 7, rnr_retry 7, min_rnr_timer 12, one outstanding RDMA READ, hop
/// limit 255). Under rxe, retry_cnt 7 means "retry for ever": tests use less.
struct QpPathAttr {
    uint8_t port = 1;
    uint8_t gid_index = 0;     ///< local GID (source of the GRH)
    bool global = true;        ///< use a GRH: always on RoCE, across subnets on InfiniBand
    int mtu = IBV_MTU_1024;    ///< enum ibv_mtu, at most the port's active MTU
    uint8_t timeout = 20;      ///< local ACK timeout, 4.096 us * 2^timeout (0: infinite)
    uint8_t retry_cnt = 7;     ///< transport retries, 0..7
    uint8_t rnr_retry = 7;     ///< receiver-not-ready retries, 0..7 (7: infinite)
    uint8_t sl = 0;            ///< service level, 0..15
    uint8_t traffic_class = 0; ///< GRH traffic class (DSCP << 2 on RoCE)
    uint8_t hop_limit = 255;
    uint8_t max_rd_atomic = 1;  ///< RDMA READs this end may have outstanding (iflush)
    uint8_t min_rnr_timer = 12; ///< 0.64 ms
};

/// An RC queue pair. Owns it; move-only; destroy it before its CQs and PD. The state
/// changes go through the fault seam's modify_qp, posting through post_send/post_recv. One
/// thread posts to a QP's send queue at a time (likewise for its receive queue); modify and
/// query are control-path calls. A QP that went to ERR is replaced, never reused.
class Qp {
public:
    Qp() = default;
    /// Creates an RC QP on `pd` with the given CQs and sizes; `qp_context` comes back in
    /// async events. 0 or -errno.
    [[nodiscard]] static int create_rc(const Pd &pd, const Cq &send_cq, const Cq &recv_cq,
                                       const QpCaps &caps, void *qp_context, Qp *out) noexcept;

    ibv_qp *get() const noexcept { return qp_.get(); }
    explicit operator bool() const noexcept { return qp_ != nullptr; }
    uint32_t num() const noexcept { return qp_->qp_num; }
    /// The caps the provider granted (at least the requested ones).
    const QpCaps &caps() const noexcept { return caps_; }

    /// RESET -> INIT on `port` with remote `access` flags (IBV_ACCESS_REMOTE_WRITE, ...).
    [[nodiscard]] int to_init(uint8_t port, int access, uint16_t pkey_index = 0) noexcept;
    /// INIT -> RTR towards `remote`.
    [[nodiscard]] int to_rtr(const QpPathAttr &path, const QpEndpoint &remote) noexcept;
    /// RTR -> RTS, sending from `local_psn`.
    [[nodiscard]] int to_rts(const QpPathAttr &path, uint32_t local_psn) noexcept;
    /// Any state -> ERR: outstanding WRs complete with IBV_WC_WR_FLUSH_ERR.
    [[nodiscard]] int to_error() noexcept;
    /// The QP's current state (ibv_query_qp). 0 or -errno.
    [[nodiscard]] int query_state(ibv_qp_state *state) const noexcept;

    [[nodiscard]] int post_send(ibv_send_wr *wr, ibv_send_wr **bad) const noexcept
    {
        return verbs::post_send(qp_.get(), wr, bad);
    }
    [[nodiscard]] int post_recv(ibv_recv_wr *wr, ibv_recv_wr **bad) const noexcept
    {
        return verbs::post_recv(qp_.get(), wr, bad);
    }

private:
    struct Destroy {
        void operator()(ibv_qp *q) const noexcept;
    };
    std::unique_ptr<ibv_qp, Destroy> qp_;
    QpCaps caps_;
};

} // namespace vigil::verbs
