// SPDX-License-Identifier: Apache-2.0
// QP sets: creation with receives posted, connection to the peer's end, teardown to error.
#include "qp_set.h"

#include <cstring>

#include "handle.h"
#include "names.h"

namespace vigil::net::verbs_fabric {

QpSet::~QpSet() = default;

int QpSet::create(const PortInfo &port, const QpConfig &cfg, End end, std::string *why)
{
    port_ = port;
    cfg_ = cfg;
    auto bad = [&](int rc, const char *what) {
        *why = std::string(what) + " on " + port.hca->name() + ": " + strerror(-rc);
        return rc;
    };
    const verbs::Context &ctx = port.hca->ctx();
    if (int rc = verbs::CompChannel::create(ctx, &ch_); rc != 0) return bad(rc, "cannot create a completion channel");
    send_depth_ = verbs_fabric::send_depth(end);
    const uint32_t recv_wrs = recv_depth(end);
    const int depth = cfg.nqps * static_cast<int>(send_depth_ + recv_wrs);
    if (int rc = verbs::Cq::create(ctx, depth, &ch_, this, &cq_); rc != 0) return bad(rc, "cannot create a CQ");
    send_off_ = kCtlSlots * kCtlBytes;
    rec_off_ = send_off_ + kCtlSlots * kCtlBytes;
    ctl_bytes_ = rec_off_ + kMaxInflight * kRecordBytes;
    ctl_.reset(new uint8_t[ctl_bytes_]());
    if (int rc = verbs::Mr::reg(port.hca->pd(), ctl_.get(), ctl_bytes_, kAccess, &mr_); rc != 0)
        return bad(rc, "cannot register the control memory");
    verbs::QpCaps caps;
    caps.max_send_wr = send_depth_;
    caps.max_recv_wr = recv_wrs;
    for (int i = 0; i < cfg.nqps; ++i) {
        verbs::Qp qp;
        if (int rc = verbs::Qp::create_rc(port.hca->pd(), cq_, cq_, caps, this, &qp); rc != 0)
            return bad(rc, "cannot create an RC QP");
        if (int rc = qp.to_init(port.port, kAccess); rc != 0) return bad(rc, "cannot move a QP to INIT");
        qps_.push_back(std::move(qp));
        for (uint32_t s = 0; s < recv_wrs; ++s)
            if (int rc = repost(i); rc != 0) return bad(rc, "cannot post receives");
    }
    random_bytes(&psn_, sizeof(psn_));
    psn_ &= 0xffffff;
    return 0;
}

PathEnd QpSet::local_end() const
{
    PathEnd e;
    e.nqps = static_cast<uint8_t>(qps_.size());
    e.mtu = static_cast<uint8_t>(port_.active_mtu);
    e.lid = port_.lid;
    e.psn = psn_;
    e.gid = port_.gid;
    for (size_t i = 0; i < qps_.size(); ++i) e.qpn[i] = qps_[i].num();
    e.ring_addr = reinterpret_cast<uintptr_t>(ctl_.get() + rec_off_);
    e.ctl_addr = reinterpret_cast<uintptr_t>(ctl_.get());
    e.rkey = mr_.rkey();
    return e;
}

int QpSet::connect(const PathEnd &remote, std::string *why)
{
    if (remote.nqps != qps_.size()) {
        *why = "the peer has " + std::to_string(remote.nqps) + " QPs for this path, this end " +
               std::to_string(qps_.size()) + " (VIGIL_IB_QPS_PER_CONN differs)";
        return -EPROTO;
    }
    remote_ = remote;
    verbs::QpPathAttr attr;
    attr.port = port_.port;
    attr.gid_index = static_cast<uint8_t>(port_.gid_index);
    attr.global = !port_.infiniband;
    attr.mtu = std::min<int>(port_.active_mtu, remote.mtu);
    attr.timeout = cfg_.timeout;
    attr.retry_cnt = cfg_.retry_cnt;
    attr.sl = cfg_.sl;
    attr.traffic_class = cfg_.traffic_class;
    for (size_t i = 0; i < qps_.size(); ++i) {
        verbs::QpEndpoint ep;
        ep.qpn = remote.qpn[i];
        ep.psn = remote.psn;
        std::memcpy(ep.gid, remote.gid.data(), 16);
        ep.lid = remote.lid;
        if (int rc = qps_[i].to_rtr(attr, ep); rc != 0) {
            *why = std::string("cannot move QP to RTR: ") + strerror(-rc);
            return rc;
        }
        if (int rc = qps_[i].to_rts(attr, psn_); rc != 0) {
            *why = std::string("cannot move QP to RTS: ") + strerror(-rc);
            return rc;
        }
    }
    return 0;
}

void QpSet::to_error()
{
    if (dead_) return;
    dead_ = true;
    for (verbs::Qp &q : qps_) (void)q.to_error();
}

int QpSet::repost(int qp)
{
    // Only writes with immediate consume receives: no scatter list (as net_ib's ncclIbIrecv).
    ibv_recv_wr wr{};
    wr.wr_id = WrId::make(WrId::kRecv, static_cast<uint64_t>(qp));
    wr.sg_list = nullptr;
    wr.num_sge = 0;
    ibv_recv_wr *bad = nullptr;
    return qps_[static_cast<size_t>(qp)].post_recv(&wr, &bad);
}

void QpSet::rearm(bool arm)
{
    ibv_cq *cq = nullptr;
    while (ch_.wait(0, &cq) > 0) armed_ = false; // each event consumes the arm
    if (arm && !armed_ && !dead_ && cq_.arm() == 0) armed_ = true;
}

std::string QpSet::gid_text(bool local) const
{
    return verbs::gid_to_string(local ? port_.gid.data() : remote_.gid.data());
}

} // namespace vigil::net::verbs_fabric
