// SPDX-License-Identifier: Apache-2.0
// The path engine's control sends and failure bookkeeping (its polling is in the header).
#include "path_engine.h"

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
        uint32_t slot = 0;
        while (slot < kCtlSlots && ctl_busy_[slot]) ++slot;
        if (slot == kCtlSlots || sq_used(0) >= kSendDepth) return true; // later, as sends complete
        const std::vector<uint8_t> &m = ctl_queue_.front();
        std::memcpy(qps_->send_slot(slot), m.data(), m.size());
        ibv_sge sge{reinterpret_cast<uintptr_t>(qps_->send_slot(slot)), static_cast<uint32_t>(m.size()), qps_->lkey()};
        ibv_send_wr wr{};
        wr.wr_id = WrId::make(WrId::kCtlSend, slot);
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        ibv_send_wr *bad = nullptr;
        // Control goes on QP 0 only: CTS groups and notices keep their order.
        if (int rc = qps_->qp(0).post_send(&wr, &bad); rc != 0) {
            fail(st, rc, std::string("posting a control message failed: ") + strerror(-rc), false);
            return false;
        }
        ctl_busy_[slot] = true;
        ++ctl_in_flight_;
        ++sq_used(0);
        ctl_queue_.pop_front();
    }
    return !failed_;
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
