// SPDX-License-Identifier: Apache-2.0
// What both halves of a verbs path do with their QP set: control messages over SEND/RECV,
// polling the CQ with one WARN-worthy line per failed completion, reposting receives.
#pragma once

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

/// What both halves do with a QP set: control sends, polling, receive reposting, and the one
/// WARN for a failed completion. Not thread-safe (used under the owning comm's lock).
class PathEngine
{
public:
    PathEngine(std::unique_ptr<QpSet> qps, PathIdentity id);
    /// Queues a control message (header + payload); sent when a send slot is free. Never blocks.
    void control(const Ctl &h, const uint8_t *payload = nullptr, size_t n = 0);
    /// Polls the CQ, calling `on(wc, qp index)` for each successful completion (it returns
    /// false to stop: the path failed). A failed completion fills *st (error, fatal by
    /// class) with one line naming QP, status, vendor error and both GIDs; the successful
    /// completions polled with it are still handed to `on`, then the call ends. Receive
    /// slots are posted again after `on`. Returns false when the path failed now or before.
    template <class On> bool poll(PathStatus *st, On &&on);
    /// Hands every successful completion still in the CQ to `on`, whatever happened to the
    /// path; failed ones are dropped after to_error() (the flush), else they fail the path
    /// as poll() would. Reports nothing: a failure shows in the next poll(). Receives are
    /// posted again only while the QPs live.
    template <class On> void drain(On &&on);
    /// Posts queued control messages while send slots are free. False after filling *st
    /// when posting failed.
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
    /// One successful completion: send-slot accounting for control sends, `on` for the rest,
    /// then the receive slot posted again. False when `on` or the repost failed.
    template <class On> bool dispatch(const ibv_wc &w, PathStatus *st, On &&on);

    std::unique_ptr<QpSet> qps_;
    PathIdentity id_;
    std::deque<std::vector<uint8_t>> ctl_queue_;
    std::array<bool, kCtlSlots> ctl_busy_{};
    uint32_t ctl_in_flight_ = 0;
    std::array<uint32_t, kMaxQps> sq_used_{};
    uint64_t rr_ = 0;
    bool failed_ = false;
    PathStatus failure_; // the first failure
};

/// One line for a failed completion: QP, status name and number, vendor error, port, GIDs.
std::string describe_wc(const ibv_wc &w, const QpSet &q);

template <class On> bool PathEngine::poll(PathStatus *st, On &&on)
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
            if (!dispatch(w, st, on)) stop = true;
        }
        if (failed_ || stop) return false;
        if (n < 32) return true;
    }
}

template <class On> void PathEngine::drain(On &&on)
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
            (void)dispatch(w, &later, on);
        }
        if (n < 32) return;
    }
}

template <class On> bool PathEngine::dispatch(const ibv_wc &w, PathStatus *st, On &&on)
{
    int qi = 0;
    while (qi < qps_->nqps() && qps_->qp(qi).num() != w.qp_num) ++qi;
    const uint64_t kind = WrId::kind(w.wr_id);
    if (kind == WrId::kCtlSend) {
        const uint64_t slot = WrId::value(w.wr_id);
        if (slot < kCtlSlots && ctl_busy_[slot]) {
            ctl_busy_[slot] = false;
            --ctl_in_flight_;
            --sq_used(0);
        }
        st->heard = true; // the peer's HCA acknowledged it
        return true;
    }
    st->heard = true;
    const bool ok = on(w, qi);
    if (kind == WrId::kRecv && !qps_->dead()) {
        const uint64_t v = WrId::value(w.wr_id);
        if (int rc = qps_->repost(static_cast<int>(v >> 24), static_cast<uint32_t>(v & 0xffffff)); rc != 0) {
            fail(st, rc, std::string("reposting a receive failed: ") + strerror(-rc), false);
            return false;
        }
    }
    return ok;
}

} // namespace vigil::net::verbs_fabric
