// SPDX-License-Identifier: Apache-2.0
// The path engine's control sends and failure bookkeeping (its polling is in the header).
#include "path_engine.h"

#include <arpa/inet.h>
#include <cstdio>

namespace vigil::net::verbs_fabric {

PathEngine::PathEngine(std::unique_ptr<QpSet> qps, PathIdentity id) : qps_(std::move(qps)), id_(std::move(id)) {}

void PathEngine::fail(PathStatus *st, int err, std::string detail, bool fatal)
{
    if (!failed_) {
        failure_.error = err;
        failure_.fatal = fatal;
        failure_.detail = std::move(detail);
        failed_ = true;
    }
    if (st->error == 0) {
        st->error = failure_.error;
        st->fatal = failure_.fatal;
        st->detail = failure_.detail;
    }
}

void PathEngine::control(const Ctl &h, const uint8_t *payload, size_t n)
{
    if (failed_) return;
    std::vector<uint8_t> m(Ctl::kSize + n);
    h.encode(m.data());
    if (n > 0) std::memcpy(m.data() + Ctl::kSize, payload, n);
    ctl_queue_.push_back(std::move(m));
    PathStatus ignored; // errors show on the next progress()
    flush_control(&ignored);
}

bool PathEngine::flush_control(PathStatus *st)
{
    while (!failed_ && !ctl_queue_.empty()) {
        // The peer's slot for message ctl_sent_ is free once its credits cover the message
        // kCtlSlots before it; this end's copy of it once that write completed.
        const uint32_t slot = static_cast<uint32_t>(ctl_sent_ % kCtlSlots);
        if (ctl_sent_ - peer_consumed_ >= kCtlSlots || ctl_busy_[slot] || sq_used(0) >= qps_->send_depth())
            return credit_out(st); // later: a credit or a completion wakes this end
        const std::vector<uint8_t> &m = ctl_queue_.front();
        uint8_t *from = qps_->ctl_out(ctl_sent_);
        std::memcpy(from, m.data(), m.size());
        ibv_sge sge{reinterpret_cast<uintptr_t>(from), static_cast<uint32_t>(m.size()), qps_->lkey()};
        ibv_send_wr wr{};
        wr.wr_id = WrId::make(WrId::kCtlSend, slot);
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.imm_data = htonl(CtlImm::control(ctl_sent_));
        wr.wr.rdma.remote_addr = qps_->ctl_remote(ctl_sent_);
        wr.wr.rdma.rkey = qps_->remote().rkey;
        ibv_send_wr *bad = nullptr;
        // Control goes on QP 0 only: CTS groups and notices keep their order.
        if (int rc = qps_->qp(0).post_send(&wr, &bad); rc != 0) {
            fail(st, rc, std::string("posting a control message failed: ") + strerror(-rc), false);
            return false;
        }
        ctl_busy_[slot] = true;
        ++ctl_in_flight_;
        ++sq_used(0);
        ++ctl_sent_;
        ctl_queue_.pop_front();
    }
    return !failed_ && credit_out(st);
}

bool PathEngine::credit_in(uint32_t imm, PathStatus *st)
{
    const uint64_t consumed = CtlImm::unwrap(CtlImm::count(imm), ctl_sent_);
    if (consumed < peer_consumed_ || ctl_sent_ - consumed > kCtlSlots) {
        fail(st, -EPROTO,
             "a credit for " + std::to_string(CtlImm::count(imm)) + " control messages from the peer, " +
                 std::to_string(ctl_sent_) + " written and " + std::to_string(peer_consumed_) + " handed back",
             true);
        return false;
    }
    peer_consumed_ = consumed;
    return true;
}

bool PathEngine::credit_out(PathStatus *st)
{
    if (failed_ || qps_->dead() || credit_in_flight_ || ctl_got_ - credited_ < kCtlSlots / 2 ||
        sq_used(0) >= qps_->send_depth())
        return !failed_;
    ibv_send_wr wr{};
    wr.wr_id = WrId::make(WrId::kCredit, 0);
    wr.sg_list = nullptr;
    wr.num_sge = 0; // no payload: the immediate is the credit
    wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(CtlImm::credit(ctl_got_));
    wr.wr.rdma.remote_addr = qps_->remote().ctl_addr;
    wr.wr.rdma.rkey = qps_->remote().rkey;
    ibv_send_wr *bad = nullptr;
    if (int rc = qps_->qp(0).post_send(&wr, &bad); rc != 0) {
        fail(st, rc, std::string("posting a credit failed: ") + strerror(-rc), false);
        return false;
    }
    credited_ = ctl_got_;
    credit_in_flight_ = true;
    ++sq_used(0);
    return true;
}

/// One line for a failed completion: QP, status name and number, vendor error, port, GIDs.
std::string describe_wc(const ibv_wc &w, const QpSet &q)
{
    char text[512];
    std::snprintf(text, sizeof(text),
                  "qp 0x%x status %s (%d) vendor err 0x%x on dev %s port %d, local gid %s, remote gid %s",
                  w.qp_num, verbs::wc_status_name(w.status), static_cast<int>(w.status), w.vendor_err,
                  q.port().hca->name().c_str(), q.port().port, q.gid_text(true).c_str(),
                  q.gid_text(false).c_str());
    return text;
}

} // namespace vigil::net::verbs_fabric
