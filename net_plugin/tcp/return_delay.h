// SPDX-License-Identifier: Apache-2.0
// How late a TCP path's landed reports come back: the trip from the receiver to this sender
// beyond its floor, so what landed is dated when it landed, not when the news arrived.
#pragma once

#include <algorithm>
#include <cstdint>

namespace vigil::net::tcp {

/* A landed report (BackHeader::kLanded) travels back over the path's own port pair, in the
 * other direction. On a port that its own host keeps busy (a ring: every host sends on the
 * port it receives on), the report queues behind that host's outgoing data: in the lab, behind
 * up to 50 ms of a token-bucket queue at each end. Counted from post to the report's arrival,
 * a path that carries one piece at a time then measures the queue on the way back, not the
 * path, and the striper, which reads the same rate, keeps feeding it small pieces.
 *
 * Each report carries the receiver's CLOCK_REALTIME when the newest byte it covers reached
 * the receiving host (the kernel's receive stamp), so a receiving process kept off the CPU
 * counts as lateness too; the sender takes the kernel's arrival stamp (CLOCK_REALTIME of its
 * own host). Their difference is the receiver's delay in reading, the trip, and the offset of
 * the two clocks, which need not agree. The least difference over the last
 * 5-10 s (a windowed minimum in two buckets of kBucketNs, as BBR's min-RTT filter and
 * LEDBAT's base delay) is that offset plus the trip's floor; what a report's difference
 * exceeds it by is how long it queued on the way back (or sat in the receiver's back-channel
 * queue). The floor is found whenever the way back is clear once in 10 s; a way back that
 * never clears under-states the delay, as if it were not measured at all.
 *
 * Errors, and their direction. Two hosts' clocks that drift apart by r err by at most
 * r x 2 kBucketNs (0.5 ms at 50 ppm). A step of either wall clock makes the differences
 * wrong by the step until the floor is found again (at most 2 kBucketNs): a step that makes
 * them smaller is a new floor at once; one that makes them larger over-states the delay. The
 * callers bound what they take out by the time the data was on the way (since its post):
 * an over-statement makes a path look faster than it is, never slower.
 *
 * Not thread-safe (one per send path, under its comm's lock). No allocation.
 */
class ReturnDelay
{
public:
    /// Length of one bucket of the windowed minimum, ns of CLOCK_MONOTONIC.
    static constexpr uint64_t kBucketNs = 5'000'000'000;

    /// A report queued at `sent_ns` (the receiver's CLOCK_REALTIME) arrived at `arrived_ns`
    /// (this host's CLOCK_REALTIME), learned at `now` (CLOCK_MONOTONIC). Returns how much
    /// longer than the floor its trip took, ns (0 for a report that sets the floor).
    uint64_t sample(uint64_t sent_ns, uint64_t arrived_ns, uint64_t now) noexcept
    {
        // Two's-complement difference: the clocks' offset may have either sign.
        const auto d = static_cast<int64_t>(arrived_ns - sent_ns);
        if (!have_cur_ || now - bucket_ns_ >= kBucketNs) {
            // A new bucket; the one before counts only if it was the previous bucket.
            have_prev_ = have_cur_ && now - bucket_ns_ < 2 * kBucketNs;
            prev_ = cur_;
            have_cur_ = true;
            cur_ = d;
            bucket_ns_ = now;
        } else {
            cur_ = std::min(cur_, d);
        }
        const int64_t floor = have_prev_ ? std::min(prev_, cur_) : cur_;
        return static_cast<uint64_t>(d - floor);
    }

private:
    int64_t cur_ = 0, prev_ = 0; // least difference of the current and previous bucket
    uint64_t bucket_ns_ = 0;     // when the current bucket began
    bool have_cur_ = false, have_prev_ = false;
};

} // namespace vigil::net::tcp
