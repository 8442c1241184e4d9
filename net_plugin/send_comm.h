// SPDX-License-Identifier: Apache-2.0
// NCCL's sendComm: binds sends to the receiver's CTS entries, numbers them, completes them on
// the receiver's acks, and runs the failover state machine over the connection's paths.
// Split by concern: send_comm.cc (requests, CTS matching, acks), failover.cc (the state
// machine below), comm_telemetry.cc (meters and NCCL profiler net events).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm.h"
#include "pow2_ring.h"
#include "nccl_abi/nccl_common.h"
#include "nccl_abi/profiler_net_vigil.h"
#include "striper.h"

namespace vigil::net {

/* The sending side's failover state machine.
 *
 * States of each path slot (SlotState):
 *   kActive   carries messages; exactly one slot is kActive while any slot is alive
 *   kShared   multipath: carries pieces of messages beside the active path, in its generation
 *   kStandby  connected, probed, carries nothing
 *   kDead     gone (never connected, failed, or left); a rebuild may bring it back
 *
 * Multipath (FailoverConfig::multipath, every path's fabric stripes): the bytes not yet posted
 * in this generation ([assign_seq_, assign_off_) on) go out in pieces over the carrying
 * paths (Active and Shared) as the Striper decides (striper.h): each piece to the path that
 * finishes it first, another path taking only what it delivers before the faster ones could
 * deliver everything, each path only while what it has outstanding is below its port's
 * bound. A degraded port carries its share, not the pace, and nothing that would keep a
 * ring step waiting on it. Without a shared slot, whole messages go to the active path as
 * soon as they are bound.
 *
 * Transitions:
 *   Active --error | port down | stall | the receiver's request--> Dead, and a Standby
 *       becomes Active: generation += 1, a generation notice naming the dead slot (the
 *       receiver fences it), then every message not yet acked (seq in [acked_, next_seq_))
 *       is posted again on it, bound to the same CTS entries, except messages seen held
 *       (an RDMA path's record acknowledged): completed sends never need replay, a send
 *       completes only once the receiver holds it (invariant 3).
 *   Standby --error | silence (no heartbeat for stall_timeout)--> Dead (no traffic moves).
 *   Standby --multipath, the active path is the primary or this is it, alive for
 *       failback_hold when rebuilt--> Shared: a same-generation notice, then pieces.
 *   Shared --error | port down | stall | the receiver's request--> Dead: generation += 1 on
 *       the active path (a notice naming the dead slot) and every message not acked is
 *       distributed again over the paths left (a piece may have landed in part).
 *   Active dies with a Shared slot alive: the Shared slot becomes Active, as a Standby would
 *       (its fabric finishes the frames it is in and drops the rest of the old generation;
 *       a verbs path holds its notice until its old writes completed).
 *   Any generation switch re-begins every Shared slot in the new generation and distributes
 *       the replay over all carrying paths.
 *   Dead --rebuild accepted by the peer--> Standby (attempts back off from
 *       rebuild_backoff_min to _max, without limit); with no slot alive it becomes Active at
 *       once (generation += 1, a notice naming the last path lost, which the receiver
 *       fences if it has not yet, and replay).
 *   Failback: a rebuilt primary that stayed alive for failback_hold while the backup is
 *       Active: new messages wait (draining_) until the backup is idle, so no write of the
 *       old generation can land later (a backup not idle after stall_timeout is failed over
 *       as stalled instead), then the primary becomes Active with generation += 1
 *       (notice with no slot to fence) and replays what is not acked; the backup is Standby.
 *   No slot alive: requests keep reporting "not done" (and isend NULL) until
 *       fatal_timeout, then every pending and later request fails with -ECONNRESET
 *       (ncclRemoteError) and one WARN. The timer runs while data is in flight or the
 *       caller waits for a CTS (its isend was refused for want of one); an idle connection
 *       waits for a rebuild without limit.
 *   Fatal path error (protection/access error, protocol violation): the connection fails at
 *       once; no other path can make it right.
 *   The receiver's goodbye (closeRecv): sends not yet acked fail at once with one line.
 *
 * Invariants: acks only ever raise acked_; a message is posted on exactly one live path per
 * generation; NCCL never sees an error while a slot is alive (fatal errors and the
 * receiver's own close excepted).
 */
enum class SlotState : uint8_t { kDead, kStandby, kActive, kShared };

class SendComm final : public Comm
{
public:
    /// `paths.paths[kBackup]` may be null (VIGIL_BACKUP=off, no other device, or a backup
    /// that could not be set up); `paths.rebuilder` may be null (dead paths then stay dead).
    /// `devs`: the local device planned for each slot (-1: none). `ports` (outlives the comm):
    /// the carrying paths per device that multipath's queue bounds are shared by; the
    /// process's own unless a test gives its own.
    SendComm(SendPaths paths, const std::array<int, kMaxPaths> &devs, const FailoverConfig &cfg,
             const TelemetryConfig &tcfg, PortAccount &ports = PortAccount::process());
    ~SendComm() override;

    /// NCCL's isend(): binds the message to the first unbound CTS entry with tag `tag` in the
    /// oldest advertised group. *out = NULL (NCCL retries) while no such entry is there, or
    /// kMaxInflight sends are outstanding. Returns 0; -EMSGSIZE (nothing sent, the connection
    /// stays usable) when `size` exceeds the matched receive buffer or kMaxMessageBytes; or
    /// the connection's error. `mr` (NCCL's mhandle, may be null) gains a reference until the
    /// send completes. `phandle`: NCCL's proxy-step profiler handle (v10+, may be NULL).
    /// One pass over the paths (move_locked): reads CTS groups, acks, holds and landings (a
    /// hold or landing completes the sends it covers: their requests become done, as test()
    /// would make them) and writes what it posted. It acts on nothing it finds and runs no
    /// timers: a failed path is left, failovers, cumulative acks, meters and watchdogs run in
    /// test() and the engine's tick.
    int isend(const void *data, size_t size, int tag, MemRegion *mr, Request **out,
              void *phandle = nullptr) noexcept;

    /// The profiler callback NCCL handed to init (v10+); NULL disables net events.
    /// Process-wide; set before comms exist.
    static void set_profiler(ncclProfilerCallback_t cb) noexcept;

    /// Failure injection and port events: leave path `slot` now (as if it failed with
    /// `cause`); with `sabotage` also break it so the peer sees the failure too. Thread-safe.
    void fail_path(int slot, const std::string &cause, bool sabotage) noexcept;
    /// fail_path() of whichever path is active. Thread-safe.
    void fail_active(const std::string &cause, bool sabotage) noexcept;
    /// A local port went down: leave every path of this connection on `dev` now (the
    /// process's port events use note_port_down() instead). Thread-safe.
    void port_down(int dev, const std::string &cause) noexcept;
    /// A local port came back: rebuild dead paths on `dev` now, not after their backoff, on
    /// the calling thread (the process's port events use note_port_up() instead).
    /// Thread-safe.
    void port_up(int dev) noexcept;
    /// Device of the active path, or -1. Thread-safe.
    int active_dev() noexcept;

    std::string describe() const;
    /// Every path, for the connect/accept log line: "primary ..., backup ..." (or "no backup").
    std::string describe_paths() const;

    /// Counters for tests and logs. Thread-safe reads.
    struct Stats {
        uint32_t generation = 1;
        uint32_t failovers = 0;
        uint32_t failbacks = 0;
        uint32_t rebuilds = 0;
        uint64_t replayed_messages = 0;
        uint64_t pieces = 0;         ///< multipath: pieces posted to a Shared slot
        uint64_t cts_groups = 0;     ///< distinct CTS groups received
        uint64_t cts_duplicates = 0; ///< groups received again on another path
        uint64_t null_for_cts = 0;   ///< isend answered NULL for want of a CTS entry
        int alive_paths = 0;         ///< slots Active or Standby now
        uint32_t ring_slots = 0;     ///< messages the ring holds now (grows to kMaxInflight)
        uint32_t cts_slots = 0;      ///< CTS groups the ring holds now (grows to kMaxCtsGroups)
    };
    Stats stats() noexcept;

private:
    /// Per-slot adapter: what a path reports in progress() lands in the comm with its slot.
    struct SlotSink final : SendSink {
        SendComm *comm = nullptr;
        int slot = 0;
        void acked(uint64_t seq) override;
        void held(uint64_t seq) override;
        void landed(uint64_t seq, uint64_t len, uint32_t gen, uint64_t late_ns) override;
        int cts(const CtsGroup &g) override;
    };
    struct PathSlot {
        std::unique_ptr<SendPath> path;
        SlotState state = SlotState::kDead;
        uint64_t last_heard_ns = 0;
        uint64_t last_sent_ns = 0;
        uint64_t up_since_ns = 0;
        /// Liveness shared with every path of the process between the same two ports:
        /// probes are sent once per pair and interval, silence is the pair's.
        std::shared_ptr<PortPairs::Pair> pair;
        /// When this path or its port pair last heard the receiver.
        uint64_t heard() const { return std::max(last_heard_ns, pair ? pair->last_heard() : 0); }
        uint64_t next_rebuild_ns = 0;
        uint64_t backoff_ns = 0;
        bool rebuilt = false; // multipath: shares only after failback_hold
        std::string desc;
        std::unique_ptr<PathTelemetry> tm; // null with telemetry off
        SlotSink sink;
        bool alive() const { return state != SlotState::kDead; }
    };
    /// One bound message, kept until acked (the replay source).
    struct SendMsg {
        const uint8_t *data = nullptr;
        MemRegion *mr = nullptr; // one reference while pending
        int32_t tag = 0;
        uint64_t group = 0;
        int entry = 0;
        CtsEntry dest;
        uint64_t posted_ns = 0; // when (re)posted last, for latency telemetry
        /// What one path carries of the message in this generation: its meter has one
        /// operation open for it from the first byte posted there until the bytes that landed
        /// (SendSink::landed) cover what was posted, or the message completes; the Striper
        /// counts the bytes not yet landed as the path's outstanding.
        struct Share {
            bool open = false;
            uint64_t bytes = 0, landed = 0, posted_ns = 0;
        };
        std::array<Share, kMaxPaths> shares{};
        /// Completion by landings (SendSink::landed): bytes that landed in generation
        /// landed_gen, whichever path carried them; the send completes once they cover it.
        uint64_t landed = 0;
        uint32_t landed_gen = 0;
    };

    void progress_locked() noexcept override;
    void rearm_locked(bool arm) noexcept override;
    void goodbye_locked() noexcept override;
    size_t nfds() const noexcept override;
    int fd(size_t i) const noexcept override;

    // send_comm.cc
    /// isend() under the lock: checks, CTS match, bind, post. Same results as isend().
    int isend_locked(const void *data, size_t size, int tag, MemRegion *mr, Request **out) noexcept;
    /// Whether the next sequence number's ring slot is free: acked, read by no path, and its
    /// request tested by NCCL.
    bool ring_free_locked() const noexcept;
    /// The unbound entry of the oldest CTS group with tag `tag` into *entry (-1: none yet,
    /// counted in stats_.null_for_cts). 0, or -EMSGSIZE when `size` exceeds that buffer.
    int match_locked(int tag, size_t size, int *entry) noexcept;
    /// Binds the next sequence number to `entry` of the oldest group; its request, pending.
    Request &bind_locked(const void *data, size_t size, int tag, MemRegion *mr, int entry) noexcept;
    /// Doubles the message ring (at most to kMaxInflight): each bound slot moves to its seq's
    /// place in the larger ring (they hold distinct seqs modulo the old size, so modulo the
    /// new one too), its Request where NCCL holds it. False at kMaxInflight or out of memory
    /// (isend then answers NULL, as for a full ring).
    bool grow_ring_locked() noexcept;
    void on_acked(uint64_t seq) noexcept;
    void on_held(uint64_t seq) noexcept;
    /// `len` bytes of `seq` that slot `slot` carried landed in generation `gen`, `late_ns`
    /// before now (SendSink::landed): held once this generation's pieces cover it; the slot's
    /// meter operation for it ends once they cover the slot's bytes of it.
    void on_landed(int slot, uint64_t seq, uint64_t len, uint32_t gen, uint64_t late_ns) noexcept;
    /// Completes send `seq` (ring slot i): the receiver holds it.
    void complete_one_locked(uint64_t seq, uint64_t now) noexcept;
    int on_cts(int slot, const CtsGroup &g) noexcept;
    /// Completes every message below the newest ack, stamping them done at `now` (ns).
    void complete_acked_locked(uint64_t now) noexcept;
    /// Posts bytes [off, off + len) of message `seq` to slot `slot` (the whole message: 0,
    /// its size) at `now`, charging the slot's meter and the Striper.
    void post_locked(int slot, uint64_t seq, size_t off, size_t len, uint64_t now) noexcept;
    /// Posts what is bound and not yet posted in this generation: whole messages to the active
    /// path, or pieces over the carrying paths as the Striper chooses (multipath). Returns a
    /// bit per slot posted to. Nothing while no path is active or failback drains.
    unsigned distribute_locked() noexcept;
    /// Slot `slot`'s share of message `m` ends with `landed` more bytes of it landed,
    /// learned at `now` (all that were not: the message completed): its meter operation ends
    /// and the Striper counts them delivered. They landed `late` ns before `now` (at most
    /// back to the share's first post): the Striper dates them so, and the meter, where the
    /// path then had nothing else of this comm in flight, counts the news's delay as wait.
    void share_landed_locked(SendMsg &m, int slot, uint64_t landed, uint64_t now,
                             uint64_t late = 0) noexcept;
    /// Moves slot `i` to `s`; a striping slot that carries (Active, Shared) is the Striper's.
    void set_state_locked(int i, SlotState s) noexcept;
    /// Messages neither acknowledged nor seen held, and their bytes: what a switch replays
    /// and what a path left behind had in flight.
    struct Outstanding {
        uint64_t msgs = 0, bytes = 0;
    };
    Outstanding outstanding_locked() const noexcept;
    void receiver_closed_locked() noexcept;
    /// Slot `slot`'s meter gives up what it carried of the messages not acked (a failover
    /// away from it, or a new generation that replays them), which then count as not posted
    /// there. Returns what it gave up.
    Outstanding abandon_locked(int slot, uint64_t now) noexcept;

    // failover.cc
    void watchdogs_locked(uint64_t now) noexcept;
    bool quiet_locked() const noexcept override;
    void quiet_tick_locked(uint64_t now) noexcept override { watchdogs_locked(now); }
    void port_down_locked(int dev, const std::string &cause) noexcept override;
    void port_up_locked(int dev) noexcept override;
    /// A standby's pair is watched for silence while parked (watchdogs_locked()).
    int pair_uses_locked(std::array<PairUse, kMaxPaths> *out) const noexcept override;
    const FailoverConfig &failover_config() const noexcept override { return cfg_; }
    uint64_t quiet_period_ns(bool prober) const noexcept override { return quiet_period(cfg_, prober, kTimerNs); }
    void failover_locked(int dead, const std::string &cause) noexcept;
    /// Makes `slot` Active: generation += 1, a notice naming `abandoned` (-1: none) and that
    /// path's id, replay of everything neither acked nor held. Returns what it replays.
    Outstanding switch_to_locked(int slot, int abandoned, uint64_t abandoned_id) noexcept;
    void rebuild_locked(uint64_t now) noexcept;
    void failback_locked(uint64_t now) noexcept;
    /// Multipath: Standby slots that may carry become Shared (the state machine above).
    void share_locked(uint64_t now) noexcept;
    /// Whether the connection stripes: multipath on and every path's fabric stripes.
    bool striping() const noexcept;
    /// The failback target died while draining: post what was held back on the active path.
    void cancel_drain_locked() noexcept;
    void install_locked(int slot, std::unique_ptr<SendPath> p, uint64_t now) noexcept;

    // comm_telemetry.cc
    void meter_locked(int slot) noexcept;
    static constexpr int kEventQueue = 8, kDescrRing = 16;
    /// Net events ready for NCCL's profiler: descriptors in descr_ring_, in order.
    struct NetEvents {
        std::array<vigilNetProfDescr_v1_t *, kEventQueue + kMaxPaths> d{};
        int n = 0;
    };
    /// Moves the pending net events (failovers, failbacks, the newest window of each path that
    /// carries, with its share)
    /// into descr_ring_ and `ev`, when NCCL gave a callback and `phandle` (their parent).
    void take_events_locked(void *phandle, NetEvents *ev) noexcept;
    /// Hands `ev` to NCCL's profiler as children of `phandle`. Called without the comm lock:
    /// the callback is NCCL's code. The descriptors stay valid for kDescrRing more events (a
    /// profiler may read extData after startEvent returns); only NCCL's proxy thread calls
    /// isend() on a comm, so none is rewritten while it is handed over.
    static void emit_events(const NetEvents &ev, void *phandle) noexcept;
    void queue_event_locked(uint8_t type, int slot, uint64_t bytes) noexcept;
    /// Charges slot `slot`'s meter with the end points' wait its path reported with a new
    /// cumulative ack in `st` (PathStatus::wait_ns; TCP's ack delay).
    void ack_wait_locked(int slot, const PathStatus &st, uint64_t now) noexcept;
    /// After a pass whose acks completed the last message in flight: charges the carrying
    /// paths that reported no wait of their own (verbs) with this thread's run delay.
    void account_wait_locked(uint64_t now) noexcept;
    /// (send_comm.cc) Progresses slot `i`'s path: what it read lands in this comm through its
    /// sink (acks, holds and landings, which complete sends; CTS groups), and what it found
    /// that needs acting on (a path error, the receiver's goodbye or failover request, a CTS
    /// that contradicts the protocol) is kept in found_[i] for act_locked().
    void progress_path_locked(int i, uint64_t now) noexcept;
    /// (send_comm.cc) Moves bytes on every live path whose last pass found nothing: what they
    /// read and what they write (posted messages; under multipath, further pieces). Runs no
    /// timers and acts on nothing it finds: isend() does only this, as NCCL's ncclIbIsend
    /// reads its FIFO and posts; progress_locked() (test() and the engine's tick) acts on what
    /// was found, then runs the timers.
    /// Returns whether it posted anything.
    bool move_locked(uint64_t now) noexcept;
    /// Acts on what the passes found (found_): failovers, the receiver's close, fatal
    /// errors. Returns whether a path changed state; the connection may have failed.
    bool act_locked() noexcept;
    /// What a pass found on each path that progress_locked() acts on (PathStatus with an
    /// error, peer_closed or failover_requested; the first one found is kept).
    std::array<PathStatus, kMaxPaths> found_;
    /// Whether found_[i] holds something to act on.
    static bool needs_action(const PathStatus &st) noexcept
    {
        return st.error != 0 || st.peer_closed || st.failover_requested;
    }
    std::array<uint64_t, kMaxPaths> wait_ack_{}; // newest ack whose wait each path reported
    uint64_t wait_acked_ = 0;  // acked_ as account_wait_locked last saw it ...
    uint64_t wait_pass_ns_ = 0; // ... and when

    std::array<PathSlot, kMaxPaths> paths_;
    FailoverConfig cfg_;
    TelemetryConfig tcfg_;
    Striper striper_;
    std::unique_ptr<PathRebuilder> rebuilder_;
    int active_ = kPrimary;
    uint32_t gen_ = 1;
    bool draining_ = false;       // failback waits for the backup to be idle ...
    uint64_t drain_since_ns_ = 0; // ... since then, at most stall_timeout
    uint64_t backup_since_ns_ = 0;
    uint64_t no_path_since_ns_ = 0;
    int orphan_slot_ = -1;   // the last path lost with no other left (-1: none) ...
    uint64_t orphan_id_ = 0; // ... and its id: the notice on a rebuilt path names it
    bool peer_closed_ = false;

    // Messages: ring_[seq & (ring_.size() - 1)]. The ring starts at kMinRing slots and
    // doubles while more messages are in flight (or NCCL has yet to test the request of the
    // slot the next one needs), up to kMaxInflight: a connection holds what it used, 3 KiB
    // at kMinRing, 52 KiB at kMaxInflight. Slots live in ring_store_ and never move (their
    // Request is NCCL's); growing only reorders ring_.
    struct RingSlot {
        Request req; // comm != nullptr once bound
        SendMsg msg;
        bool held = false; // completed ahead of acked_ (SendSink::held)
    };
    static constexpr size_t kMinRing = 16;
    RingSlot &at(uint64_t seq) noexcept { return *ring_[seq & (ring_.size() - 1)]; }
    const RingSlot &at(uint64_t seq) const noexcept { return *ring_[seq & (ring_.size() - 1)]; }
    std::vector<RingSlot *> ring_;
    std::vector<std::unique_ptr<RingSlot[]>> ring_store_;
    uint64_t next_seq_ = 0;
    uint64_t assign_seq_ = 0; // the next bytes to post in this generation: this message ...
    size_t assign_off_ = 0;   // ... from here on
    uint64_t acked_ = 0;     // every seq below is held by the receiver
    uint64_t ack_seen_ = 0;  // highest ack reported by any path (applied by complete_acked)

    // CTS groups: cts_at(index), [cts_head_, cts_next_) known and not yet fully bound;
    // entries of the head group are bound in head_bound_. Starts at kMinCts groups and
    // doubles while the receiver has more outstanding, up to kMaxCtsGroups.
    static constexpr size_t kMinCts = 8;
    CtsGroup &cts_at(uint64_t index) noexcept { return cts_.at(index); }
    Pow2Ring<CtsGroup> cts_{kMinCts};
    uint64_t cts_head_ = 0;
    uint64_t cts_next_ = 0;
    uint64_t cts_next_first_seq_ = 0; // first_seq the group cts_next_ must carry
    std::array<bool, kMaxRecvs> head_bound_{};
    int head_unbound_ = 0;
    int cts_error_ = 0; // a path delivered a contradicting group (reported fatal by the path)
    // The caller's last isend was answered NULL for want of a CTS entry: it waits for the
    // receiver, so with no path left the fatal timer runs as for data in flight.
    bool cts_wanted_ = false;

    Stats stats_;
    // failover timing: detection time, and the seq whose ack proves the replay landed
    uint64_t failover_t0_ns_ = 0;
    uint64_t failover_probe_seq_ = 0;
    bool failover_timing_ = false;
    // Profiler net events: a bounded queue of failover/failback descriptors, the last window
    // emitted per slot, and a ring of descriptors handed to NCCL (kept alive a while: a
    // profiler may read extData after startEvent returns).
    std::array<vigilNetProfDescr_v1_t, kEventQueue> evq_{};
    int evq_n_ = 0;
    std::array<uint64_t, kMaxPaths> last_window_emitted_{};
    std::array<vigilNetProfDescr_v1_t, kDescrRing> descr_ring_{};
    unsigned descr_next_ = 0;
};

} // namespace vigil::net
