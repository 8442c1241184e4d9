// SPDX-License-Identifier: Apache-2.0
// Fault injection at the verbs seam.
#include "fault.h"

#include <stdexcept>

namespace vigil::verbs {
namespace {
// The trampolines are plain functions (the table holds function pointers), so they find
// their injector here. Written only while no data path runs (construction, destruction).
FaultInjector *g_injector = nullptr;
} // namespace

FaultInjector::FaultInjector()
{
    if (g_injector != nullptr) throw std::logic_error("a FaultInjector is already installed");
    table_ = {post_send, post_recv, poll_cq, modify_qp, reg_mr, reg_dmabuf_mr};
    next_ = &verbs::ops();
    g_injector = this;
    install_ops(&table_);
}

FaultInjector::~FaultInjector()
{
    install_ops(next_);
    g_injector = nullptr;
}

int FaultInjector::add(const Fault &fault)
{
    std::lock_guard lock(mu_);
    rules_.push_back(Rule{fault, 0, 0});
    return static_cast<int>(rules_.size() - 1);
}

uint64_t FaultInjector::fired(int id) const
{
    std::lock_guard lock(mu_);
    return id >= 0 && static_cast<size_t>(id) < rules_.size()
               ? rules_[static_cast<size_t>(id)].fired
               : 0;
}

FaultInjector::Rule *FaultInjector::match(Fault::Verb verb, uint32_t qp_num, int qp_state)
{
    Rule *hit = nullptr;
    for (Rule &r : rules_) {
        const Fault &f = r.fault;
        if (f.verb != verb || (f.qp_num != 0 && f.qp_num != qp_num)) continue;
        if (verb == Fault::Verb::ModifyQp && f.qp_state >= 0 && f.qp_state != qp_state) continue;
        // Every matching rule counts the call, so rules on the same verb stay independent.
        const uint64_t n = ++r.seen;
        const bool in_window = n >= f.nth && (f.count == 0 || n < f.nth + f.count);
        if (in_window && hit == nullptr) {
            ++r.fired;
            hit = &r;
        }
    }
    return hit;
}

int FaultInjector::check(Fault::Verb verb, uint32_t qp_num, int qp_state)
{
    std::lock_guard lock(mu_);
    const Rule *r = match(verb, qp_num, qp_state);
    return r != nullptr ? r->fault.error : 0;
}

int FaultInjector::post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad) noexcept
{
    if (const int rc = g_injector->check(Fault::Verb::PostSend, qp->qp_num, -1); rc != 0) {
        *bad = wr;
        return rc;
    }
    return g_injector->next_->post_send(qp, wr, bad);
}

int FaultInjector::post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad) noexcept
{
    if (const int rc = g_injector->check(Fault::Verb::PostRecv, qp->qp_num, -1); rc != 0) {
        *bad = wr;
        return rc;
    }
    return g_injector->next_->post_recv(qp, wr, bad);
}

int FaultInjector::poll_cq(ibv_cq *cq, int n, ibv_wc *wc) noexcept
{
    FaultInjector *self = g_injector;
    const int got = self->next_->poll_cq(cq, n, wc);
    if (got <= 0) return got;
    std::lock_guard lock(self->mu_);
    for (int i = 0; i < got; ++i) {
        if (self->flushed_qps_.count(wc[i].qp_num) != 0) {
            wc[i].status = IBV_WC_WR_FLUSH_ERR;
            wc[i].vendor_err = 0;
            continue;
        }
        if (Rule *r = self->match(Fault::Verb::PollCq, wc[i].qp_num, -1)) {
            wc[i].status = static_cast<ibv_wc_status>(r->fault.wc_status);
            wc[i].vendor_err = r->fault.vendor_err;
            if (r->fault.flush_after) self->flushed_qps_.insert(wc[i].qp_num);
        }
    }
    return got;
}

int FaultInjector::modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int mask) noexcept
{
    const int state = (mask & IBV_QP_STATE) != 0 ? static_cast<int>(attr->qp_state) : -1;
    if (const int rc = g_injector->check(Fault::Verb::ModifyQp, qp->qp_num, state); rc != 0)
        return rc;
    return g_injector->next_->modify_qp(qp, attr, mask);
}

int FaultInjector::reg_mr(ibv_pd *pd, void *addr, size_t len, int access, ibv_mr **mr) noexcept
{
    if (const int rc = g_injector->check(Fault::Verb::RegMr, 0, -1); rc != 0) {
        *mr = nullptr;
        return rc;
    }
    return g_injector->next_->reg_mr(pd, addr, len, access, mr);
}

int FaultInjector::reg_dmabuf_mr(ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd,
                                 int access, ibv_mr **mr) noexcept
{
    if (const int rc = g_injector->check(Fault::Verb::RegMr, 0, -1); rc != 0) {
        *mr = nullptr;
        return rc;
    }
    return g_injector->next_->reg_dmabuf_mr(pd, off, len, iova, fd, access, mr);
}

} // namespace vigil::verbs
