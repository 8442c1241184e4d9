// SPDX-License-Identifier: Apache-2.0
// What both halves of a verbs path do with their QP set: control messages written into the
// peer's control ring and the credits that hand its slots back, polling the CQ with one
// WARN-worthy line per failed completion, reposting receives.
#pragma once

#include <arpa/inet.h>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "../fabric.h"
#include "names.h"
#include "qp_set.h"
#include "verbs_wire.h"

namespace vigil::net::verbs_fabric {

/// What both halves do with a QP set: control messages both ways with their credits, polling,
/// receive reposting, and the one WARN for a failed completion. Not thread-safe (used under
/// the owning comm's lock).
///
/// Control messages go on QP 0 in order, each a write with immediate (CtlImm) into slot
/// n % kCtlSlots of the peer's control ring; at most kCtlSlots may be written that the peer
/// has not handed back. Each end hands slots back with a credit (a write with immediate and
/// no payload) for every kCtlSlots / 2 it consumed; a credit completes a receive at the
/// writer, so a writer waiting for one is woken. Per path end: kCtlSlots × kCtlBytes of
/// ring and as much to write from, at most kCtlSlots + 1 send work requests.
class PathEngine
{
public:
    PathEngine(std::unique_ptr<QpSet> qps, PathIdentity id);
    /// Queues a control message (header + payload, at most kCtlBytes); written when the peer
    /// has a slot for it. Never blocks.
    void control(const Ctl &h, const uint8_t *payload = nullptr, size_t n = 0);
    /// Polls the CQ, calling `on_ctl(message, bytes)` for each control message from the peer
    /// (in order; valid during the call only, the slot is handed back after it) and
    /// `on(wc, qp index)` for every other successful completion; either returns false to
    /// stop: the path failed. A failed completion fills *st (error, fatal by class) with one
    /// line naming QP, status, vendor error and both GIDs; the successful completions polled
    /// with it are still handed on, then the call ends. A control message out of order or of
    /// a bad length, and a credit for more than was written, fail the path (fatal). Receives
    /// are posted again after each. Returns false when the path failed now or before.
    template <class On, class OnCtl> bool poll(PathStatus *st, On &&on, OnCtl &&on_ctl);
    /// Hands every successful completion still in the CQ to `on` or `on_ctl`, whatever
    /// happened to the path; failed ones are dropped after to_error() (the flush), else they
    /// fail the path as poll() would. Reports nothing: a failure shows in the next poll().
    /// Receives and credits are posted only while the QPs live.
    template <class On, class OnCtl> void drain(On &&on, OnCtl &&on_ctl);
    /// Writes queued control messages while the peer has slots for them, and a credit when
    /// one is due. False after filling *st when posting failed.
    bool flush_control(PathStatus *st);
    QpSet &qps() { return *qps_; }
    const PathIdentity &identity() const { return id_; }
    bool failed() const { return failed_; }
    /// The path failed: the first failure is kept, copied into *st (unless it holds one),
    /// and reported again by every later poll().
    void fail(PathStatus *st, int err, std::string detail, bool fatal);
    /// The QP this path's next message goes on (round robin).
    int next_qp() { return static_cast<int>(rr_++ % static_cast<uint64_t>(qps_->nqps())); }
    /// Send work requests outstanding on QP i, and its budget.
    uint32_t &sq_used(int i) { return sq_used_[static_cast<size_t>(i)]; }
    bool ctl_pending() const { return !ctl_queue_.empty() || ctl_in_flight_ > 0; }

private:
    /// One successful completion: accounting for this end's control writes and credits, the
    /// peer's control messages to `on_ctl` and credits taken here, `on` for the rest, then
    /// the receive posted again. False when a handler, a check or the repost failed.
    template <class On, class OnCtl> bool dispatch(const ibv_wc &w, PathStatus *st, On &&on, OnCtl &&on_ctl);
    /// The peer's control message with immediate `imm` and `len` bytes: checked, then handed
    /// to `on_ctl`, then counted as consumed (a credit may follow).
    template <class OnCtl> bool control_in(uint32_t imm, uint32_t len, PathStatus *st, OnCtl &&on_ctl);
    /// A credit from the peer: it consumed every control message up to a count.
    bool credit_in(uint32_t imm, PathStatus *st);
    /// Posts a credit when kCtlSlots / 2 of the peer's control messages were consumed since
    /// the last one and none is in flight.
    bool credit_out(PathStatus *st);

    std::unique_ptr<QpSet> qps_;
    PathIdentity id_;
    std::deque<std::vector<uint8_t>> ctl_queue_;
    std::array<bool, kCtlSlots> ctl_busy_{}; // a write from this slot has not completed
    uint32_t ctl_in_flight_ = 0;
    uint64_t ctl_sent_ = 0;      // control messages this end wrote
    uint64_t peer_consumed_ = 0; // of them, handed back by the peer's credits
    uint64_t ctl_got_ = 0;       // the peer's control messages this end consumed
    uint64_t credited_ = 0;      // of them, handed back in a credit posted
    bool credit_in_flight_ = false;
    std::array<uint32_t, kMaxQps> sq_used_{};
    uint64_t rr_ = 0;
    bool failed_ = false;
    PathStatus failure_; // the first failure
};

/// One line for a failed completion: QP, status name and number, vendor error, port, GIDs.
std::string describe_wc(const ibv_wc &w, const QpSet &q);

template <class On, class OnCtl> bool PathEngine::poll(PathStatus *st, On &&on, OnCtl &&on_ctl)
{
    if (failed_) {
        fail(st, 0, {}, false); // reports the first failure again
        return false;
    }
    ibv_wc wc[32];
    for (;;) {
        const int n = qps_->cq().poll(32, wc);
        if (n < 0) {
            fail(st, n, std::string("polling the CQ failed: ") + strerror(-n), false);
            return false;
        }
        // Every completion polled is handled: a success after a failure in the same batch is
        // still a message that landed (another QP of the path), or a record the peer holds.
        bool stop = false;
        for (int k = 0; k < n; ++k) {
            const ibv_wc &w = wc[k];
            if (w.status != IBV_WC_SUCCESS) {
                if (!failed_) {
                    const bool fatal = verbs::classify_wc_status(w.status) == verbs::WcClass::Protection;
                    fail(st, fatal ? -EACCES : -ECONNRESET, describe_wc(w, *qps_), fatal);
                }
                continue;
            }
            if (!dispatch(w, st, on, on_ctl)) stop = true;
        }
        if (failed_ || stop) return false;
        if (n < 32) return true;
    }
}

template <class On, class OnCtl> void PathEngine::drain(On &&on, OnCtl &&on_ctl)
{
    ibv_wc wc[32];
    for (;;) {
        const int n = qps_->cq().poll(32, wc);
        if (n <= 0) return;
        for (int k = 0; k < n; ++k) {
            const ibv_wc &w = wc[k];
            PathStatus later; // a failure shows in the next poll()
            if (w.status != IBV_WC_SUCCESS) {
                // After to_error() every outstanding work request completes flushed.
                if (!failed_ && !qps_->dead()) {
                    const bool fatal = verbs::classify_wc_status(w.status) == verbs::WcClass::Protection;
                    fail(&later, fatal ? -EACCES : -ECONNRESET, describe_wc(w, *qps_), fatal);
                }
                continue;
            }
            (void)dispatch(w, &later, on, on_ctl);
        }
        if (n < 32) return;
    }
}

template <class OnCtl> bool PathEngine::control_in(uint32_t imm, uint32_t len, PathStatus *st, OnCtl &&on_ctl)
{
    if (CtlImm::count(imm) != (ctl_got_ & CtlImm::kMask)) {
        fail(st, -EPROTO,
             "control message " + std::to_string(CtlImm::count(imm)) + " from the peer where " +
                 std::to_string(ctl_got_ & CtlImm::kMask) + " was due",
             true);
        return false;
    }
    if (len < Ctl::kSize || len > kCtlBytes) {
        fail(st, -EPROTO, "a control message of " + std::to_string(len) + " bytes from the peer", true);
        return false;
    }
    // The peer writes this slot again only after a credit for it: it is read first.
    const bool ok = on_ctl(qps_->ctl_in(ctl_got_), static_cast<size_t>(len));
    ++ctl_got_;
    return credit_out(st) && ok;
}

template <class On, class OnCtl> bool PathEngine::dispatch(const ibv_wc &w, PathStatus *st, On &&on, OnCtl &&on_ctl)
{
    int qi = 0;
    while (qi < qps_->nqps() && qps_->qp(qi).num() != w.qp_num) ++qi;
    const uint64_t kind = WrId::kind(w.wr_id);
    st->heard = true; // the peer's HCA acknowledged this end's write, or wrote
    if (kind == WrId::kCtlSend) {
        const uint64_t slot = WrId::value(w.wr_id);
        if (slot < kCtlSlots && ctl_busy_[slot]) {
            ctl_busy_[slot] = false;
            --ctl_in_flight_;
            --sq_used(0);
        }
        return true;
    }
    if (kind == WrId::kCredit) {
        if (credit_in_flight_) {
            credit_in_flight_ = false;
            --sq_used(0);
        }
        return credit_out(st);
    }
    bool ok = true;
    const uint32_t imm = ntohl(w.imm_data);
    if (kind == WrId::kRecv && w.opcode == IBV_WC_RECV_RDMA_WITH_IMM && CtlImm::is_control(imm))
        ok = control_in(imm, w.byte_len, st, on_ctl);
    else if (kind == WrId::kRecv && w.opcode == IBV_WC_RECV_RDMA_WITH_IMM && CtlImm::is_credit(imm))
        ok = credit_in(imm, st);
    else
        ok = on(w, qi);
    if (kind == WrId::kRecv && !qps_->dead()) {
        if (int rc = qps_->repost(static_cast<int>(WrId::value(w.wr_id))); rc != 0) {
            fail(st, rc, std::string("reposting a receive failed: ") + strerror(-rc), false);
            return false;
        }
    }
    return ok;
}

} // namespace vigil::net::verbs_fabric
