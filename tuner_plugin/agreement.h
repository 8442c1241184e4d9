// SPDX-License-Identifier: Apache-2.0
// Agreement on the health view of one communicator: the sequence of its getCollInfo calls
// is cut into blocks of B calls, and the view used for block b is the value of the
// write-once register R[comm][b] in the store.
//
// Protocol (docs/tuner.md "Agreement"):
//  - Every member (tuner context = rank) joins the store's current epoch by publishing its
//    record (health, progress, rules digest). A register may be proposed only when all
//    nRanks members have joined the epoch (checked atomically with the write), and only
//    by a member at most kMaxAhead blocks ahead of the slowest member.
//  - Resolving block b: read R[b]; if absent, propose the aggregate of the members'
//    published health, set-if-absent; use whatever the register holds. Blocks are
//    resolved in order, ahead of use, by the background thread.
//  - A new epoch (the store restarted or lost its data) is seen by every member; each
//    re-asserts every register it knows (set-if-absent) before joining the new epoch, so
//    no value any member may have used is lost before proposals resume.
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

class Agreement
{
public:
    /// `comm`: NCCL's commId; `nranks`: members to wait for; `self`: this member's record
    /// template (id, host, pid, env rank, rules digest); `lookahead`: blocks resolved ahead
    /// of use.
    Agreement(uint64_t comm, uint32_t nranks, const MemberRecord &self, uint32_t lookahead);

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

    /// Background thread: one round of store work. `health`: this member's current NICs
    /// (n_nics, nics) and multipath flag; `publish`: publish the record this round (the caller paces it).
    /// Returns true when it made progress or has more to do at once.
    bool step(Store &store, const MemberRecord &health, bool publish, ResolveSink &sink);
    /// Background thread: publishes this member as done (progress past every block), so
    /// the others are not held back by it. Best effort.
    void leave(Store &store);

    uint64_t comm() const { return comm_; }
    uint64_t epoch() const { return epoch_; }
    const std::string &last_error() const { return last_error_; }
    /// Members of the epoch last seen, and the smallest progress among them.
    uint32_t members_seen() const { return members_seen_; }
    /// The member records fetched last (for the rules-digest check). Background thread.
    const std::vector<MemberRecord> &members() const { return members_; }

    static constexpr uint64_t kRing = 4096; ///< resolved views kept (>= kMaxAhead + lookahead)

private:
    struct Slot {
        std::atomic<uint64_t> tag{0}; ///< block + 1 once `view` is written
        View view;
    };
    int join(Store &store, ResolveSink &sink);
    int publish(Store &store, const MemberRecord &health);
    int resolve_one(Store &store, ResolveSink &sink, uint64_t block);

    const uint64_t comm_;
    const uint32_t nranks_;
    const uint32_t lookahead_;
    MemberRecord self_;
    std::vector<Slot> ring_;
    std::atomic<uint64_t> progress_{0};
    std::atomic<uint64_t> resolved_{0};
    uint64_t epoch_ = 0; // 0: not joined
    uint64_t min_progress_ = 0;
    uint32_t members_seen_ = 0;
    std::vector<MemberRecord> members_;
    bool have_members_ = false;
    View last_;
    bool have_last_ = false;
    std::string last_error_;
    uint64_t seq_ = 0;
    bool waiting_members_logged_ = false;
};

} // namespace vigil::tuner
