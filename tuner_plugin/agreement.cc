// SPDX-License-Identifier: Apache-2.0
// The agreement protocol over a Store (see agreement.h for the rules it keeps).
#include "agreement.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace vigil::tuner {

static_assert(Agreement::kRing >= kMaxAhead + 64, "the ring must cover the head start plus the lookahead");

Agreement::Agreement(uint64_t comm, uint32_t nranks, const MemberRecord &self, uint32_t lookahead)
    : comm_(comm), nranks_(std::max<uint32_t>(nranks, 1)), lookahead_(std::clamp<uint32_t>(lookahead, 1, 64)),
      self_(self), ring_(kRing)
{
}

int Agreement::publish(Store &store, const MemberRecord &health)
{
    MemberRecord m = self_;
    m.n_nics = std::min<uint32_t>(health.n_nics, kMaxNics);
    std::memcpy(m.nics, health.nics, sizeof(m.nics));
    m.multipath = health.multipath;
    m.progress = progress_.load(std::memory_order_acquire);
    m.seq = ++seq_;
    uint32_t count = 0;
    const int rc = store.publish(comm_, epoch_, m, &count);
    if (rc == 0) members_seen_ = count;
    return rc;
}

int Agreement::join(Store &store, ResolveSink &sink)
{
    uint64_t e = 0;
    if (int rc = store.epoch(comm_, &e); rc != 0) return rc;
    if (e == epoch_) return 0;
    if (epoch_ != 0 || resolved_.load(std::memory_order_relaxed) > 0) {
        // The store lost its data (or this member saw it through a stale epoch). Every view
        // this member may have used goes back in before it joins the new epoch; proposals
        // there wait for all members, so none can overwrite them first.
        std::vector<uint64_t> blocks;
        std::vector<View> views;
        const uint64_t end = resolved_.load(std::memory_order_relaxed);
        for (uint64_t b = end > kRing ? end - kRing : 0; b < end; ++b) {
            const View *v = view_at(b);
            if (v == nullptr) continue;
            blocks.push_back(b);
            views.push_back(*v);
        }
        uint32_t conflicts = 0;
        if (int rc = store.reassert(comm_, e, blocks, views, &conflicts); rc != 0) return rc;
        sink.store_event("store " + store.describe() + " has a new epoch (restarted or lost its data): " +
                             std::to_string(blocks.size()) + " known registers re-asserted" +
                             (conflicts ? ", " + std::to_string(conflicts) + " held other values" : ""),
                         conflicts != 0);
    }
    epoch_ = e;
    have_members_ = false;
    waiting_members_logged_ = false;
    return 0;
}

bool Agreement::step(Store &store, const MemberRecord &health, bool publish_now, ResolveSink &sink)
{
    have_members_ = false;
    int rc = 0;
    const bool joined_before = epoch_ != 0;
    if (epoch_ == 0 || publish_now) {
        const uint64_t old = epoch_;
        if ((rc = join(store, sink)) != 0) {
            last_error_ = store.last_error();
            return false;
        }
        if (epoch_ != old || !joined_before) publish_now = true;
    }
    if (publish_now) {
        rc = publish(store, health);
        if (rc == -ESTALE) {
            epoch_ = 0;
            return true;
        }
        if (rc != 0) {
            last_error_ = store.last_error();
            return false;
        }
    }
    const uint64_t want = progress_.load(std::memory_order_acquire) + lookahead_;
    int done = 0;
    while (resolved_.load(std::memory_order_relaxed) <= want && done < 256) {
        rc = resolve_one(store, sink, resolved_.load(std::memory_order_relaxed));
        if (rc != 0) break;
        ++done;
    }
    if (rc == -ESTALE) epoch_ = 0;
    if (rc != 0 && rc != -EAGAIN && rc != -ESTALE) last_error_ = store.last_error();
    if (rc == 0) last_error_.clear();
    return rc == -ESTALE || (rc == 0 && done > 0 && resolved_.load(std::memory_order_relaxed) <= want);
}

int Agreement::resolve_one(Store &store, ResolveSink &sink, uint64_t block)
{
    View v;
    bool found = false;
    bool proposed = false;
    if (int rc = store.read(comm_, epoch_, block, &v, &found); rc != 0) return rc;
    if (!found) {
        if (!have_members_) {
            if (int rc = store.members(comm_, epoch_, &members_); rc != 0) return rc;
            have_members_ = true;
            members_seen_ = static_cast<uint32_t>(members_.size());
            // A member not joined yet is at block 0 as far as the head start is concerned.
            min_progress_ = 0;
            if (members_.size() >= nranks_) {
                min_progress_ = UINT64_MAX;
                for (const MemberRecord &m : members_) min_progress_ = std::min(min_progress_, m.progress);
            }
        }
        if (min_progress_ != UINT64_MAX && block >= min_progress_ + kMaxAhead) {
            last_error_ = "waiting for the slowest member (at block " + std::to_string(min_progress_) + ")";
            return -EAGAIN;
        }
        char source[48];
        if (self_.env_rank >= 0)
            std::snprintf(source, sizeof(source), "%.30s/%d/r%d", self_.host, self_.pid, self_.env_rank);
        else
            std::snprintf(source, sizeof(source), "%.30s/%d", self_.host, self_.pid);
        const View proposal = aggregate(members_, have_last_ ? &last_ : nullptr, source);
        bool existed = false;
        const int rc = store.propose(comm_, epoch_, block, proposal, nranks_, &v, &existed);
        if (rc == -EAGAIN) {
            last_error_ = "waiting for all " + std::to_string(nranks_) + " members to join the store (" +
                          std::to_string(members_seen_) + " so far)";
            if (!waiting_members_logged_) {
                waiting_members_logged_ = true;
                sink.store_event(last_error_, false);
            }
            return rc;
        }
        if (rc != 0) return rc;
        proposed = !existed;
    }
    Slot &s = ring_[block % kRing];
    s.view = v;
    s.tag.store(block + 1, std::memory_order_release);
    const bool changed = have_last_ ? !last_.same(v) : v.state != 0;
    sink.resolved(block, v, changed, proposed);
    last_ = v;
    have_last_ = true;
    resolved_.store(block + 1, std::memory_order_release);
    return 0;
}

void Agreement::leave(Store &store)
{
    if (epoch_ == 0) return;
    MemberRecord m = self_;
    m.progress = UINT64_MAX;
    m.seq = ++seq_;
    uint32_t count = 0;
    (void)store.publish(comm_, epoch_, m, &count);
}

} // namespace vigil::tuner
