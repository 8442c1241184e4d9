// SPDX-License-Identifier: Apache-2.0
// Agreement on the health view of one communicator: the sequence of its getCollInfo calls
// is cut into blocks of B calls, and the view used for block b is the value of the
// write-once register R[comm][b] in the store.
//
// Protocol (docs/tuner.md "The agreed health view"):
//  - Every member (tuner context = rank) joins the store's current epoch by publishing its
//    record (health, progress, rules digest). It publishes again only when its NICs' health
//    changes, when its progress moved kProgressStep blocks, and on a heartbeat: store traffic
//    per member does not grow with the communicator.
//  - Resolving block b: read R[b] (and the next span() - 1 registers, one store call); if
//    absent, propose set-if-absent the aggregate of the members' published health. A view
//    carries the health generation it was computed at; while the store's generation is
//    still that of the last view, the proposal is that view again; otherwise it is computed
//    from this member's copy of the records, read (O(members)) only after the store refused
//    a proposal because the generation moved (-ECANCELED). Use whatever the register holds.
//    Blocks are resolved in order, ahead of use, by the background thread. A member never
//    polls a register another writes: absent means it proposes.
//  - A register may be proposed only when all nRanks members have joined the epoch, and
//    only below the slowest member's published progress + kMaxAhead; the store checks both
//    atomically with the write.
//  - A new epoch (the store restarted or lost its data) is seen by every member (an absent
//    register leads to a proposal, which checks the epoch); each re-asserts every register
//    it knows from the smallest progress the store last reported on, set-if-absent, before
//    joining the new epoch, so no value any member may have used or may still need is lost
//    before proposals resume (they need every member joined).
//  - A member that reaches a block whose register it cannot read waits; it never guesses.
//
// Threads: the hot path (the thread NCCL calls getCollInfo from, one at a time per
// communicator) calls view_at() and set_progress(): lock-free, no system call. The
// background thread calls step(). Everything else is the background thread's.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "store.h"
#include "view.h"

namespace vigil::tuner {

/// Called by step() for every register this member resolves, in block order.
struct ResolveSink {
    virtual void resolved(uint64_t block, const View &v, bool changed, bool proposed) = 0;
    virtual void store_event(const std::string &what, bool warn) = 0;

protected:
    ~ResolveSink() = default;
};

/// How a member's background work is paced (from Config).
struct Pacing {
    uint32_t lookahead = 2;                  ///< blocks resolved ahead of use
    uint64_t heartbeat_ns = 60'000'000'000;  ///< republish at least this often
};

/// Blocks of progress after which a member republishes (the head start check lags the
/// slowest member by at most this much, which only ever makes it stricter).
inline constexpr uint64_t kProgressStep = 256;

class Agreement
{
public:
    /// `comm`: NCCL's commId; `nranks`: members to wait for; `self`: this member's record
    /// template (id, host, pid, env rank, rules digest).
    Agreement(uint64_t comm, uint32_t nranks, const MemberRecord &self, const Pacing &pacing);

    /// Hot path: the view of `block` once resolved, else nullptr. Lock-free.
    const View *view_at(uint64_t block) const noexcept
    {
        const Slot &s = ring_[block % kRing];
        return s.tag.load(std::memory_order_acquire) == block + 1 ? &s.view : nullptr;
    }
    /// Hot path: the block this member's calls are in (the thread resolves ahead of it).
    void set_progress(uint64_t block) noexcept { progress_.store(block, std::memory_order_release); }
    uint64_t progress() const noexcept { return progress_.load(std::memory_order_acquire); }
    /// Blocks resolved so far (all blocks below are in the ring).
    uint64_t resolved() const noexcept { return resolved_.load(std::memory_order_acquire); }

    /// What one step() did.
    enum class Step {
        kIdle,    ///< nothing to do until progress moves
        kMore,    ///< made progress and has more to do at once
        kBlocked, ///< waiting on the store or on other members: retry later (back off)
    };
    /// Background thread: one round of store work at `now_ns`. `health`: this member's
    /// current NICs and multipath flag, when `fresh` (read this round); it is published when
    /// it differs from what was published last.
    Step step(Store &store, const MemberRecord &health, bool fresh, uint64_t now_ns, ResolveSink &sink);
    /// Background thread: publishes this member as done (progress past every block), so
    /// the others are not held back by it. Best effort.
    void leave(Store &store);

    uint64_t comm() const { return comm_; }
    uint64_t epoch() const { return epoch_; }
    const std::string &last_error() const { return last_error_; }
    /// Members of the epoch at this member's last publication.
    uint32_t members_seen() const { return members_seen_; }
    /// Distinct rules digests among them (> 1: ranks use different rules files).
    uint32_t digests_seen() const { return digests_seen_; }
    /// Store calls made, member lists read (O(members) each), proposals that wrote a
    /// register, and publications, since the start (background thread).
    struct Counts {
        uint64_t store_calls = 0, member_reads = 0, proposals = 0, publications = 0;
    };
    const Counts &counts() const { return counts_; }

    static constexpr uint64_t kRing = 4096; ///< resolved views kept (>= kMaxAhead + lookahead)

private:
    struct Slot {
        std::atomic<uint64_t> tag{0}; ///< block + 1 once `view` is written
        View view;
    };
    int join(Store &store, ResolveSink &sink);
    int publish(Store &store, bool health_changed, uint64_t now_ns);
    int resolve(Store &store, ResolveSink &sink, uint64_t block);
    void install(ResolveSink &sink, uint64_t block, const View &v, bool proposed);
    static bool same_health(const MemberRecord &a, const MemberRecord &b);

    const uint64_t comm_;
    const uint32_t nranks_;
    const Pacing pacing_;
    MemberRecord self_;      // with the health last read
    bool have_health_ = false;
    MemberRecord published_; // what the store took last
    bool have_published_ = false;
    std::vector<Slot> ring_;
    std::atomic<uint64_t> progress_{0};
    std::atomic<uint64_t> resolved_{0};
    uint64_t epoch_ = 0; // 0: not joined
    uint64_t published_progress_ = 0;
    uint64_t next_heartbeat_ns_ = 0;
    uint64_t min_progress_ = 0; // the store's last word on the slowest member's progress
    uint32_t members_seen_ = 0;
    uint32_t digests_seen_ = 0;
    std::vector<MemberRecord> members_;
    std::string members_gen_; // generation members_ were read at ("" : not read)
    uint64_t members_gen_num_ = 0;
    View last_;
    bool have_last_ = false;
    std::string last_error_;
    uint64_t seq_ = 0;
    bool waiting_members_logged_ = false;
    Counts counts_;
};

} // namespace vigil::tuner
