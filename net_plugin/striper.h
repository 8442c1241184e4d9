// SPDX-License-Identifier: Apache-2.0
// Multipath's scheduler: which carrying path of a connection takes the next piece of the
// bytes bound and not yet posted, and how large that piece is. Fabric-neutral: it sees paths
// only as what they were given, what landed and when, and whether their queue has room.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "fabric.h"

namespace vigil::net {

/// How many striped paths carry on each local device of a process: the paths that divide a
/// port's queue bound between them (Striper, "room"). Implementations are thread-safe: every
/// comm of a process updates the process's account from its own lock.
class PortAccount
{
public:
    virtual ~PortAccount() = default;
    /// A path on device `dev` starts (`delta` +1) or stops (-1) carrying striped traffic.
    /// Devices the account does not track are ignored.
    virtual void add(int dev, int delta) noexcept = 0;
    /// Paths carrying on `dev` now (0 for a device the account does not track).
    virtual int carriers(int dev) const noexcept = 0;
    /// A connection's preferred path (the one it keeps to while it is as fast as any, NCCL's
    /// channel-to-NIC choice) is now on `dev` (`delta` +1) or no longer (-1). Devices the
    /// account does not track are ignored.
    virtual void lead(int dev, int delta) noexcept = 0;
    /// Connections whose preferred path is on `dev` now (0 for a device not tracked).
    virtual int leaders(int dev) const noexcept = 0;
    /// A path on `dev` that is not its connection's preferred one starts (`delta` +1) or
    /// stops (-1) holding a whole piece or more not yet landed: its connection spills onto
    /// `dev` (Striper, "Wide room"). Devices the account does not track are ignored.
    virtual void spill(int dev, int delta) noexcept = 0;
    /// Paths spilling onto `dev` now (0 for a device not tracked).
    virtual int spillers(int dev) const noexcept = 0;
    /// A connection leading on `dev` measured its preferred path there at `bytes_per_s`.
    /// Devices the account does not track are ignored.
    virtual void lead_rate(int dev, double bytes_per_s) noexcept = 0;
    /// The rate a leader on `dev` last measured, bytes/s (0: none yet, or not tracked).
    virtual double lead_rate(int dev) const noexcept = 0;
    /// The account of this process, shared by every connection of the net plugin.
    static PortAccount &process() noexcept;
};

/// A PortAccount over devices [0, kDevs): counters in a fixed table.
class PortCounters final : public PortAccount
{
public:
    static constexpr int kDevs = 64;
    void add(int dev, int delta) noexcept override;
    int carriers(int dev) const noexcept override;
    void lead(int dev, int delta) noexcept override;
    int leaders(int dev) const noexcept override;
    void spill(int dev, int delta) noexcept override;
    int spillers(int dev) const noexcept override;
    void lead_rate(int dev, double bytes_per_s) noexcept override;
    double lead_rate(int dev) const noexcept override;

private:
    std::array<std::atomic<int>, kDevs> n_{};
    std::array<std::atomic<int>, kDevs> lead_{};
    std::array<std::atomic<int>, kDevs> spill_{};
    std::array<std::atomic<uint64_t>, kDevs> rate_{}; // bytes/s
};

/* The striping policy.
 *
 * A connection that stripes posts the bytes it has bound to receive buffers and not yet
 * posted in its generation (`remaining`, the rest of its current message first) in pieces,
 * each to one carrying path. The Striper decides, for the next piece, which path and how
 * many bytes, from what each path has outstanding (posted, not yet landed at the receiver:
 * queued here, in the kernel, on the wire, unread there) and its rate.
 *
 * Rate. Bytes landed over the time the path had bytes outstanding, both sums decayed with a
 * half-life of kHalfLifeNs of that busy time, so a port that slows is followed within a few
 * pieces; the busy span since the last landing counts too, so a path that stops delivering
 * looks slower at once, not at its next landing. Idle time counts for nothing. A path never
 * measured takes the rate another connection's preferred path last measured on its port
 * (PortAccount::lead_rate), else the fastest of its connection's measured rates (none
 * measured: all are equal), at most what it holds over the time it has waited. Once another
 * of its connection's paths was measured, it takes a minimum piece after kReprobeNs without
 * one, whatever it is assumed to be worth: a connection whose messages fit its preferred
 * path's room would otherwise never measure it, and with the preferred path's port cut, the
 * guess (that very path's rate) kept every message there.
 *
 * Finish time of path i for a piece of n bytes: (outstanding_i + n) / rate_i, where
 * outstanding_i is less what the path delivered at its rate since its last landing was
 * learned (landings are learned in lumps and late: a path that just finished must not look
 * loaded). The fluid share of path i: the bytes it would carry if the `remaining` bytes were
 * poured over the paths so that all finish together (water-filling over outstanding_i /
 * rate_i): what it can deliver before the others could deliver everything.
 *
 * Placement, in order: `prefer` (the active path, so small messages keep to one path), then
 * the others by finish time. The path that finishes the piece first, and every path at
 * least kSlowRatio as fast as the fastest, takes a whole piece while it has room: healthy
 * paths are kept full and drain at their own pace (a path fed less than its room runs
 * latency-bound, measures slower than it is, and would be fed less still). A whole piece is
 * piece_bytes, or the message's rest, or, for a message larger than a piece, an eighth of
 * what remains where that is less (down to a minimum piece, a quarter of piece_bytes: 64 KiB
 * by default), so the end of what is bound is fine enough to share out. A clearly slower
 * path takes only three quarters of its fluid share, and only when that is at least a
 * minimum piece: it never takes bytes it would deliver after the faster ones could have
 * delivered all of them, even where the estimates are somewhat off (too little costs the
 * faster paths the rest at their rate, too much costs the excess at the slow path's). Near
 * the end of what is bound (a ring step's last pieces) a degraded port therefore takes
 * nothing, and is never waited for longer than a dead one would cost; in a stream
 * (`remaining` large) it takes pieces at its own pace. A path that got no piece for
 * kReprobeNs and has nothing outstanding takes a minimum piece (or its share, if larger)
 * and measures it alone: its time holds the path's latency as well, so the rate it shows is
 * a lower bound. Above the estimate, the estimate starts afresh from it (a port that healed
 * is found at the cost of one minimum piece); not above, the estimate learned under load
 * stays (a probe of a slow port would make it look slower still, and starve it of the
 * traffic that measures it and that the detector judges it by).
 *
 * Room. The caller says which paths have room: a path's own queue has room and it holds less
 * than room_limit() bytes not yet on the wire (SendPath::can_post). The limit is the port's
 * bound of four pieces divided over the connections carrying on it (two pieces each up to
 * two paths, 4 x piece / n beyond, never below half a piece), so a slow port holds about as
 * much whatever the number of connections (NCCL's channels) striping over it.
 *
 * Wide room. The preferred path holds four times that while it is as fast as every other
 * carrying path that has been measured and as the preferred paths other connections lead
 * with on those ports (PortAccount::lead_rate), and every other one is on a port where
 * another connection of the process keeps its own preferred path (PortAccount::leaders). Such a port
 * has no time to spare: a piece spilled there when the preferred path's room filled landed
 * behind that connection's traffic, and a ring step ended with it. In a healthy 4-rank ring
 * of two channels (each port one channel's primary and the other's backup), spilling cost
 * 11 to 26 % of the bus bandwidth against VIGIL_MULTIPATH=0 (docs/benchmarks.md, "Multipath
 * in a healthy ring"). A preferred path that slows below kSlowRatio of another is held to
 * the plain room again, and the pieces go where they finish first; with another port free
 * of other connections (one connection alone striping two ports), nothing changes. Nor is
 * the room wide while another connection spills onto the preferred path's port (one of its
 * other paths there holds a whole piece or more not yet landed, PortAccount::spillers):
 * that connection's own port is slow, its pieces here are what keeps its ring step short,
 * and four pieces of ours ahead of each of them starved it (a 4-rank ring with one port cut
 * to 25 %: the cut connection's other path went unused for seconds at a time). The
 * leaders' rates are the gate's other half: a connection's own other path, fed only what
 * overflows, measures the queue ahead of it as much as the port, and a preferred path on a
 * port cut to a quarter kept its wide room against it and left that path unused.
 *
 * Not thread-safe: used under its comm's lock. Memory: a few words per path; no allocation.
 */
class Striper
{
public:
    /// Half-life of a path's rate estimate, ns of busy time.
    static constexpr uint64_t kHalfLifeNs = 20'000'000;
    /// A path at least this fraction as fast as the fastest takes whole pieces while it has
    /// room; a slower one only what it delivers in time.
    static constexpr double kSlowRatio = 0.8;
    /// A carrying path left without pieces this long takes one again, ns.
    static constexpr uint64_t kReprobeNs = 500'000'000;

    /// `piece_bytes` (> 0): the largest piece. `ports` outlives the Striper.
    Striper(uint64_t piece_bytes, PortAccount *ports) noexcept;
    ~Striper(); ///< leaves the port account for every path still carrying
    Striper(const Striper &) = delete;
    Striper &operator=(const Striper &) = delete;

    /// Path `slot` (on local device `dev`) starts or stops carrying pieces. A path that stops
    /// forgets what it had outstanding (the core abandoned it: failover, a new generation);
    /// its rate estimate stays, for when it carries again.
    void set_carrying(int slot, int dev, bool carrying, uint64_t now) noexcept;
    bool carrying(int slot) const noexcept { return paths_[static_cast<size_t>(slot)].carrying; }

    /// `bytes` posted to path `slot` at `now` (ns, CLOCK_MONOTONIC).
    void on_post(int slot, uint64_t bytes, uint64_t now) noexcept;
    /// `bytes` that path `slot` carried arrived at the receiver (landed, or the message they
    /// belong to completed), learned at `now`.
    void on_landed(int slot, uint64_t bytes, uint64_t now) noexcept;
    /// `bytes` that path `slot` carried will not be delivered by it (abandoned).
    void on_dropped(int slot, uint64_t bytes) noexcept;

    /// The next piece: `slot` -1 (post nothing now: every path that should take it is full),
    /// else the path and its length, 1..min(piece_bytes, msg_left) (a message of 0 bytes: 0).
    struct Pick {
        int slot = -1;
        uint64_t len = 0;
    };
    /// For a message whose unposted rest is `msg_left` bytes, of `remaining` bytes bound and
    /// not yet posted in this generation (msg_left <= remaining). `room[i]`: path i takes a
    /// piece now (SendPath::can_post(room_limit(i))). `prefer`: the active path.
    Pick next(uint64_t msg_left, uint64_t remaining, const std::array<bool, kMaxPaths> &room,
              int prefer, uint64_t now) noexcept;

    /// Path `slot`'s rate estimate at `now`, bytes/s; 0 before its first landing.
    double rate(int slot, uint64_t now) const noexcept;
    /// Bytes posted to path `slot` and not yet landed.
    uint64_t outstanding(int slot) const noexcept { return paths_[static_cast<size_t>(slot)].out; }
    /// Bytes path `slot` may hold not yet on the wire (the room rule above).
    uint64_t room_limit(int slot) const noexcept;

private:
    struct PathState {
        bool carrying = false;
        int dev = -1;         // counted in the port account while carrying (-1: not counted)
        uint64_t out = 0;     // posted, not yet landed
        uint64_t mark_ns = 0; // busy time is accounted up to here
        double bytes_w = 0;   // decayed sums: bytes landed ...
        double busy_w = 0;    // ... over busy ns
        uint64_t last_post_ns = 0;
        bool reprobing = false; // its next landing is a reprobe piece's (on_landed)
        bool spilling = false;  // counted in the port account's spillers of dev
    };
    /// Adds the busy time up to `now` to path `p`'s sums (decaying them).
    static void account(PathState &p, uint64_t now) noexcept;
    /// Rates of the carrying paths at `now`, unmeasured ones filled in (see above).
    std::array<double, kMaxPaths> rates(uint64_t now) const noexcept;

    uint64_t piece_;
    uint64_t min_piece_; // piece_ / 4: the least a path beside the fastest one is given ...
    uint64_t align_;     // ... and pieces shorter than a message's rest end on this boundary
    PortAccount *ports_;
    std::array<PathState, kMaxPaths> paths_{};
    int wide_ = -1;     // the preferred path while its room is wide ("Wide room"); -1: none
    int lead_slot_ = -1; // the path whose device this connection leads on (-1: none) ...
    int lead_dev_ = -1;  // ... and that device, as counted in the port account
    /// Moves this connection's lead in the port account to path `slot`'s device (-1: none).
    void lead_on(int slot) noexcept;
    /// Brings path `i`'s entry among the port account's spillers up to date: counted while
    /// it carries, is not the lead path and holds a whole piece or more.
    void judge_spill(size_t i) noexcept;
    /// Sets wide_ for the preferred path `prefer` from the rates `r` ("Wide room"), and
    /// moves the lead to it.
    void judge_room(int prefer, const std::array<double, kMaxPaths> &r) noexcept;
};

} // namespace vigil::net
