// SPDX-License-Identifier: Apache-2.0
// The verbs flusher: a loopback RC QP and RDMA READs.
#include "flush.h"

#include <cerrno>
#include <cstring>
#include <random>

#include "log.h"
#include "names.h"

namespace vigil::net::verbs_fabric {
namespace {

constexpr uint32_t kReads = kMaxRequests; // reads in flight: one per request NCCL may hold

} // namespace

VerbsFlusher::~VerbsFlusher() = default;

int VerbsFlusher::create(const PortInfo &port, const QpConfig &cfg, std::unique_ptr<VerbsFlusher> *out,
                         std::string *why)
{
    std::unique_ptr<VerbsFlusher> f(new VerbsFlusher);
    f->where_ = port.hca->name() + ":" + std::to_string(port.port);
    auto bad = [&](int rc, const char *what) {
        *why = std::string(what) + " for the flush QP on " + f->where_ + ": " + strerror(-rc);
        return rc;
    };
    const verbs::Context &ctx = port.hca->ctx();
    if (int rc = verbs::Cq::create(ctx, static_cast<int>(kReads), nullptr, nullptr, &f->cq_); rc != 0)
        return bad(rc, "cannot create a CQ");
    if (int rc = verbs::Mr::reg(port.hca->pd(), f->host_, sizeof(f->host_), IBV_ACCESS_LOCAL_WRITE, &f->host_mr_);
        rc != 0)
        return bad(rc, "cannot register the read buffer");
    verbs::QpCaps caps;
    caps.max_send_wr = kReads;
    caps.max_recv_wr = 1;
    if (int rc = verbs::Qp::create_rc(port.hca->pd(), f->cq_, f->cq_, caps, nullptr, &f->qp_); rc != 0)
        return bad(rc, "cannot create the QP");
    if (int rc = f->qp_.to_init(port.port, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE); rc != 0)
        return bad(rc, "cannot move the QP to INIT");
    verbs::QpPathAttr attr;
    attr.port = port.port;
    attr.gid_index = static_cast<uint8_t>(port.gid_index);
    attr.global = !port.infiniband;
    attr.mtu = port.active_mtu;
    attr.timeout = cfg.timeout;
    attr.retry_cnt = cfg.retry_cnt;
    attr.sl = cfg.sl;
    attr.traffic_class = cfg.traffic_class;
    verbs::QpEndpoint self;
    self.qpn = f->qp_.num();
    std::random_device rd;
    self.psn = rd() & 0xffffff;
    std::memcpy(self.gid, port.gid.data(), 16);
    self.lid = port.lid;
    if (int rc = f->qp_.to_rtr(attr, self); rc != 0) return bad(rc, "cannot move the QP to RTR");
    if (int rc = f->qp_.to_rts(attr, self.psn); rc != 0) return bad(rc, "cannot move the QP to RTS");
    *out = std::move(f);
    return 0;
}

int VerbsFlusher::start(const void *data, const FabricMr &mr, uint64_t *ticket)
{
    if (error_ != 0) return error_;
    if (started_ - completed_ >= kReads) return -EAGAIN;
    ibv_sge sge{reinterpret_cast<uintptr_t>(host_), sizeof(host_), host_mr_.lkey()};
    ibv_send_wr wr{};
    wr.wr_id = started_;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(data);
    wr.wr.rdma.rkey = mr.rkey;
    ibv_send_wr *bad = nullptr;
    if (int rc = qp_.post_send(&wr, &bad); rc != 0) return rc;
    *ticket = started_++;
    return 0;
}

int VerbsFlusher::progress(uint64_t *completed)
{
    ibv_wc wc[8];
    for (int n; error_ == 0 && (n = cq_.poll(8, wc)) != 0;) {
        if (n < 0) {
            error_ = n;
            break;
        }
        for (int k = 0; k < n; ++k) {
            if (wc[k].status != IBV_WC_SUCCESS && error_ == 0) {
                VLOG_WARN("flush read on %s failed: qp 0x%x status %s (%d) vendor err 0x%x", where_.c_str(),
                          wc[k].qp_num, verbs::wc_status_name(wc[k].status), static_cast<int>(wc[k].status),
                          wc[k].vendor_err);
                error_ = -EIO;
            }
            ++completed_;
        }
    }
    *completed = completed_;
    return error_;
}

} // namespace vigil::net::verbs_fabric
