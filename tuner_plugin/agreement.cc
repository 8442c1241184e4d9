// SPDX-License-Identifier: Apache-2.0
// The agreement protocol over a Store (see agreement.h for the rules it keeps).
#include "agreement.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace vigil::tuner {
namespace {

std::string member_name(const MemberRecord &m)
{
    char buf[96];
    if (m.env_rank >= 0) std::snprintf(buf, sizeof(buf), "%.63s/%d/r%d", m.host, m.pid, m.env_rank);
    else std::snprintf(buf, sizeof(buf), "%.63s/%d", m.host, m.pid);
    return buf;
}

} // namespace

static_assert(Agreement::kRing >= kMaxAhead + 64 + kMaxSpan, "the ring must cover the head start plus the lookahead");

Agreement::Agreement(uint64_t comm, uint32_t nranks, const MemberRecord &self, const Pacing &pacing)
    : comm_(comm), nranks_(std::max<uint32_t>(nranks, 1)),
      pacing_{std::clamp<uint32_t>(pacing.lookahead, 1, 64), std::max<uint64_t>(pacing.heartbeat_ns, 1'000'000)},
      self_(self), ring_(kRing)
{
}

bool Agreement::same_health(const MemberRecord &a, const MemberRecord &b)
{
    if (a.n_nics != b.n_nics || a.multipath != b.multipath) return false;
    for (uint32_t i = 0; i < a.n_nics && i < kMaxNics; ++i) {
        const NicHealth &x = a.nics[i], &y = b.nics[i];
        // A fraction is not finer than the view's 50-permille steps: noise below that is no
        // change worth a publication.
        const int d = static_cast<int>(x.permille) - static_cast<int>(y.permille);
        if (std::strncmp(x.name, y.name, sizeof(x.name)) != 0 || x.state != y.state || d >= 50 || d <= -50)
            return false;
    }
    return true;
}

int Agreement::publish(Store &store, bool health_changed, uint64_t now_ns)
{
    MemberRecord m = self_;
    m.progress = progress_.load(std::memory_order_acquire);
    m.seq = ++seq_;
    PublishAck ack;
    ++counts_.store_calls;
    const int rc = store.publish(comm_, epoch_, m, health_changed, nranks_, &ack);
    if (rc != 0) return rc;
    ++counts_.publications;
    published_ = m;
    have_published_ = true;
    members_seen_ = ack.members;
    digests_seen_ = ack.digests;
    min_progress_ = std::max(min_progress_, ack.min_progress);
    published_progress_ = m.progress;
    next_heartbeat_ns_ = now_ns + pacing_.heartbeat_ns;
    return 0;
}

int Agreement::join(Store &store, ResolveSink &sink)
{
    uint64_t e = 0;
    ++counts_.store_calls;
    if (int rc = store.epoch(comm_, &e); rc != 0) return rc;
    if (e == epoch_) return 0;
    if (epoch_ != 0 || resolved_.load(std::memory_order_relaxed) > 0) {
        // The store lost its data (or this member saw it through a stale epoch). Every view
        // this member knows that any member may have used or may still need goes back in
        // before it joins the new epoch: every block from the smallest progress the store
        // last reported (no member is behind it; 0 before all had joined) on. Proposals there
        // wait for all members, so none can overwrite them first.
        std::vector<uint64_t> blocks;
        std::vector<View> views;
        const uint64_t end = resolved_.load(std::memory_order_relaxed);
        const uint64_t from = std::max(end > kRing ? end - kRing : 0, std::min(min_progress_, end));
        for (uint64_t b = from; b < end; ++b) {
            const View *v = view_at(b);
            if (v == nullptr) continue;
            blocks.push_back(b);
            views.push_back(*v);
        }
        uint32_t conflicts = 0;
        ++counts_.store_calls;
        if (int rc = store.reassert(comm_, e, blocks, views, &conflicts); rc != 0) return rc;
        sink.store_event("store " + store.describe() + " has a new epoch (restarted or lost its data): " +
                             std::to_string(blocks.size()) + " known registers re-asserted" +
                             (conflicts ? ", " + std::to_string(conflicts) + " held other values" : ""),
                         conflicts != 0);
    }
    epoch_ = e;
    members_gen_.clear();
    waiting_members_logged_ = false;
    return 0;
}

Agreement::Step Agreement::step(Store &store, const MemberRecord &health, bool fresh, uint64_t now_ns,
                                ResolveSink &sink)
{
    if (fresh) {
        self_.n_nics = std::min<uint32_t>(health.n_nics, kMaxNics);
        std::memcpy(self_.nics, health.nics, sizeof(self_.nics));
        self_.multipath = health.multipath;
        have_health_ = true;
    }
    // Against what the store last took: a publication that failed is made again.
    const bool health_changed = have_health_ && have_published_ && !same_health(self_, published_);
    int rc = 0;
    const bool heartbeat = now_ns >= next_heartbeat_ns_;
    bool publish_now = health_changed || heartbeat ||
                       progress_.load(std::memory_order_acquire) >= published_progress_ + kProgressStep;
    // The epoch: at join, on the heartbeat, at every health read of a local store; a shared
    // store's restart also shows as an absent register (resolve()).
    if (epoch_ == 0 || heartbeat || (fresh && store.local())) {
        const uint64_t before = epoch_;
        if ((rc = join(store, sink)) != 0) {
            last_error_ = "store " + store.describe() + ": " + store.last_error();
            return Step::kBlocked;
        }
        publish_now |= epoch_ != before;
    }
    if (publish_now) {
        rc = publish(store, health_changed, now_ns);
        if (rc == -ESTALE) {
            epoch_ = 0;
            return Step::kMore;
        }
        if (rc != 0) {
            last_error_ = "store " + store.describe() + ": " + store.last_error();
            return Step::kBlocked;
        }
    }
    const uint64_t want = progress_.load(std::memory_order_acquire) + pacing_.lookahead;
    int done = 0;
    while (resolved_.load(std::memory_order_relaxed) <= want && done < 256) {
        rc = resolve(store, sink, resolved_.load(std::memory_order_relaxed));
        if (rc != 0) break;
        ++done;
    }
    if (rc == -ESTALE) {
        epoch_ = 0;
        return Step::kMore;
    }
    if (rc == -EAGAIN || rc == -EOVERFLOW) return Step::kBlocked; // last_error_ says on whom
    if (rc == -EINPROGRESS || rc == -EALREADY) {
        last_error_ = store.last_error(); // this host's rank that reads, or the block's proposer
        return Step::kBlocked;
    }
    if (rc != 0) {
        last_error_ = "store " + store.describe() + ": " + store.last_error();
        return Step::kBlocked;
    }
    last_error_.clear();
    return done > 0 && resolved_.load(std::memory_order_relaxed) <= want ? Step::kMore : Step::kIdle;
}

void Agreement::install(ResolveSink &sink, uint64_t block, const View &v, bool proposed)
{
    Slot &s = ring_[block % kRing];
    s.view = v;
    s.tag.store(block + 1, std::memory_order_release);
    const bool changed = have_last_ ? !last_.same(v) : v.state != 0;
    sink.resolved(block, v, changed, proposed);
    last_ = v;
    have_last_ = true;
    resolved_.store(block + 1, std::memory_order_release);
}

int Agreement::resolve(Store &store, ResolveSink &sink, uint64_t block)
{
    const uint32_t span = std::clamp<uint32_t>(store.span(), 1, kMaxSpan);
    View views[kMaxSpan];
    uint32_t found = 0;
    ++counts_.store_calls;
    if (int rc = store.read(comm_, epoch_, block, span, views, &found); rc != 0) return rc;
    if (found > 0) {
        for (uint32_t i = 0; i < found; ++i) install(sink, block + i, views[i], false);
        return 0;
    }
    char source[48];
    if (self_.env_rank >= 0)
        std::snprintf(source, sizeof(source), "%.30s/%d/r%d", self_.host, self_.pid, self_.env_rank);
    else
        std::snprintf(source, sizeof(source), "%.30s/%d", self_.host, self_.pid);
    // The proposal, cheapest first: the last view again when it carries the generation the
    // store still has (nothing published since: aggregating the same records with it as the
    // previous view gives it back); else the aggregate of this member's copy of the records;
    // without a copy, only a question ("!": the checks, no write), so nobody reads the
    // records while members still join. A refusal because the generation moved reads the
    // records (O(members)) and tries again; a few tries, then the next step (health changing
    // faster than that is noise).
    bool reuse = have_last_ && last_.gen_epoch == epoch_ && last_.gen != 0;
    for (int tries = 0; tries < 5; ++tries) {
        View proposal;
        std::string gen = "!";
        if (reuse) {
            proposal = last_;
            gen = std::to_string(last_.gen);
        } else if (!members_gen_.empty()) {
            proposal = aggregate(members_, have_last_ ? &last_ : nullptr, source);
            proposal.gen_epoch = epoch_;
            proposal.gen = members_gen_num_;
            gen = members_gen_;
        }
        std::snprintf(proposal.source, sizeof(proposal.source), "%s", source); // also for the claim
        bool existed = false, held_found[kMaxSpan] = {};
        Slowest slow;
        ++counts_.store_calls;
        const int rc =
            store.propose(comm_, epoch_, block, proposal, nranks_, kMaxAhead, gen, views, held_found, &existed, &slow);
        if (rc == -ECANCELED) {
            reuse = false;
            ++counts_.store_calls;
            ++counts_.member_reads;
            if (int r = store.members(comm_, epoch_, &members_, &members_gen_num_); r != 0) return r;
            members_gen_ = std::to_string(members_gen_num_);
            continue;
        }
        if (rc == -EAGAIN) {
            last_error_ = "waiting for all " + std::to_string(nranks_) + " members to join store " +
                          store.describe() + " (" + std::to_string(members_seen_) + " at this member's last publication)";
            if (!waiting_members_logged_) {
                waiting_members_logged_ = true;
                sink.store_event(last_error_, false);
            }
            return rc;
        }
        if (rc == -EOVERFLOW) {
            last_error_ = "waiting for the slowest member " + (slow.have ? member_name(slow.rec) : std::string("?")) +
                          " (its published progress is block " + std::to_string(slow.progress) + ", " +
                          std::to_string(kMaxAhead) + " blocks behind block " + std::to_string(block) + ")";
            return rc;
        }
        if (rc != 0) return rc;
        if (!existed) ++counts_.proposals;
        for (uint32_t i = 0; i < span && held_found[i]; ++i) install(sink, block + i, views[i], i == 0 && !existed);
        return 0;
    }
    last_error_ = "the members' health kept changing while proposing block " + std::to_string(block);
    return -EAGAIN;
}

void Agreement::leave(Store &store)
{
    if (epoch_ == 0) return;
    MemberRecord m = self_;
    m.progress = UINT64_MAX;
    m.seq = ++seq_;
    PublishAck ack;
    (void)store.publish(comm_, epoch_, m, false, nranks_, &ack);
}

} // namespace vigil::tuner
