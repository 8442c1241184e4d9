// SPDX-License-Identifier: Apache-2.0
// NCCL's recvComm: advertises every irecv to the sender as a CTS group, places the frames
// its paths receive, completes requests and acknowledges them. The receiving side of the
// failover protocol: it adopts the sender's newer generations, fences the path the sender
// left after a failure, asks the sender to leave a path whose local port failed, and takes
// the paths the sender rebuilt. Split by concern: recv_comm.cc (posting, placement,
// completion, acks, iflush), recv_failover.cc (the state machine below).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm.h"
#include "pow2_ring.h"

namespace vigil::net {

/* The receiving side's failover state machine.
 *
 * States of each path slot (RecvSlotState):
 *   kNone     no path: never connected (no backup); a path the sender rebuilds fills it
 *   kLive     reading, acknowledging and advertising on it
 *   kLost     failed here (error, silence with receives pending, local port down), left by
 *             the sender after a failure (its generation notice names it), or replaced by a
 *             path the sender rebuilt; fenced: nothing of it lands any more
 *   kClosed   ended by the sender's goodbye (closeSend), every stream finished
 *   kGone     closed by the sender without a goodbye: its process is gone
 *
 * Transitions:
 *   kLive --error | silence for stall_timeout with receives pending | local port down
 *       (the sender is asked, on another live path, to leave it) | the sender's generation
 *       notice names it | a rebuilt path replaces it--> kLost, fenced (RecvPath::fence).
 *   kLive --goodbye and every stream ended--> kClosed: the sender closed the connection.
 *   kLive --the sender's streams ended without a goodbye--> kGone.
 *   any --a path the sender rebuilt is accepted--> kLive: the current ack goes out on it and
 *       every group not yet complete is advertised on it again, oldest first.
 *
 * Generations: a message counts the bytes of one generation, the newest it has seen: the
 * first frame or piece of a newer one restarts its count (the sender replays a message it
 * has not seen held whole). TCP frames of a generation older than gen_ are discarded (the
 * sender replays everything not acknowledged). An RDMA piece of an older generation still
 * counts for a message that has none of a newer one: its write landed, and the sender may
 * have seen it land and completed the send, so it never comes again; every such write has
 * landed and been counted by the time the notice is answered, so a message the answer does
 * not hold is replayed whole and completes in the new generation. Bytes of completed
 * messages are never written again (invariant 2). Every CTS group goes out on every live
 * path, so whichever path survives, the sender has every group; it drops the repeats by
 * index.
 *
 * Every sink call about message `seq` from generation `gen` is judged by one rule
 * (classify_locked), in this order; "adopt" makes gen the connection's newest generation:
 *
 *   condition                                    stream       stream    direct    direct
 *                                                (locate,     (still_   (whole,   (piece,
 *                                                 landed)      wanted)   short)    last)
 *   gen newer than gen_                          adopt        kStale    adopt     adopt
 *   gen older than gen_                          kStale       kStale    -         -
 *   seq below floor_ (complete, a replay)        kStale       kStale    kStale    kStale
 *   seq not advertised, or floor_+kMaxInflight   kBad         kStale    kBad      kBad
 *     or more
 *   the message complete                        kStale       kStale    kStale    kStale
 *   gen older than the generation it counts      -            -         -         kStale
 *   otherwise                                    kLive        kLive     kLive     kLive
 *
 * kStale: ignored (a frame's bytes discarded, a record or piece not counted); kBad: the
 * sender broke the protocol, fatal for the connection (EPROTO).
 *
 * Connection, after every progress: a kLive slot and no goodbye: nothing to judge. After a
 * goodbye, receives never matched fail once no slot is live. No slot live with receives
 * outstanding: fail at once when every slot is kGone (the sender's process is gone), else
 * after fatal_timeout without a path.
 *
 * Re-entrancy: a path reports through its SlotSink while its progress(), drain() or fence()
 * is on the stack; the sink only changes this comm's state and queues what other paths must
 * do. The acks, the fence of a path a generation notice names, the drain of the others and
 * the answer to the notice run in settle_locked(), after the path's call returned.
 */
enum class RecvSlotState : uint8_t { kNone, kLive, kLost, kClosed, kGone };

class RecvComm final : public Comm
{
public:
    /// `paths.acceptor` (may be null) hands over paths the sender rebuilt. `devs`: the local
    /// device of each slot (-1: none).
    RecvComm(RecvPaths paths, const std::array<int, kMaxPaths> &devs, const FailoverConfig &cfg,
             const TelemetryConfig &tcfg);
    ~RecvComm() override;

    /// NCCL's irecv() with n (1..kMaxRecvs) buffers; `mrs` (NCCL's mhandles, may be null or
    /// hold nulls) gain a reference each until the request completes. The group is advertised
    /// to the sender at once. *out = NULL when all kMaxRequests requests or the sequence
    /// window are in use, or the request pool or message ring could not grow for want of
    /// memory (NCCL retries). Returns 0, -EINVAL for a bad n or a size beyond
    /// kMaxMessageBytes, or the connection's error.
    int irecv(int n, void *const *data, const size_t *sizes, const int *tags,
              MemRegion *const *mrs, Request **out) noexcept;

    /// NCCL's iflush() of a completed receive of n buffers: when the last buffer holding data
    /// is GPU memory written by a device that needs it (a Flusher from the fabric), an RDMA
    /// READ of it on every such device of this comm; *out is the request to test, or NULL
    /// when there is nothing to wait for (host memory, no GPUDirect). Returns 0, or the
    /// connection's error. Never blocks.
    int iflush(int n, void *const *data, const int *sizes, MemRegion *const *mrs,
               Request **out) noexcept;

    /// The local port of path `slot` failed: ask the sender to leave it (through another
    /// live path) and stop using it. Thread-safe.
    void fail_path(int slot, const std::string &cause) noexcept;
    /// A local port went down: fail_path() for every path on `dev`, now (the process's port
    /// events use note_port_down() instead). Thread-safe.
    void port_down(int dev, const std::string &cause) noexcept;

    std::string describe() const;
    /// Every path, for the connect/accept log line: "primary ..., backup ..." (or "no backup").
    std::string describe_paths() const;
    uint32_t generation() noexcept;

    /// What the connection holds for NCCL's receives now: requests in its pool (kMinRequests
    /// growing to kMaxRequests) and message slots in its ring (kMinMsgs growing to
    /// kMaxInflight). Thread-safe.
    struct Slots {
        uint32_t requests = 0;
        uint32_t messages = 0;
    };
    Slots slots() noexcept;

private:
    /// Per-slot adapter: what a path reports in progress() lands in the comm with its slot.
    struct SlotSink final : RecvSink {
        RecvComm *comm = nullptr;
        int slot = 0;
        Placement locate(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry) override;
        bool still_wanted(uint32_t gen, uint64_t seq) override;
        int landed(uint64_t seq, uint64_t len, uint32_t gen) override;
        void generation(uint32_t gen, uint64_t first_seq, int abandoned, uint64_t abandoned_id) override;
        int whole(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry) override;
        int whole_short(uint32_t gen, uint64_t seq_residue, int bits, uint64_t size, int entry) override;
        int piece(uint32_t gen, uint64_t seq_residue, int bits, uint64_t len, int entry) override;
        int piece_last(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry,
                       uint64_t len) override;
    };
    struct PathSlot {
        std::unique_ptr<RecvPath> path;
        std::unique_ptr<PathTelemetry> tm; // null with telemetry off
        RecvSlotState state = RecvSlotState::kNone;
        bool live() const { return state == RecvSlotState::kLive; }
        uint64_t last_heard_ns = 0;
        uint64_t last_beat_ns = 0;
        /// Liveness shared with every path of the process between the same two ports
        /// (PortPairs): heartbeats once per pair and interval, silence is the pair's.
        std::shared_ptr<PortPairs::Pair> pair;
        /// When this path or its port pair last heard the sender.
        uint64_t heard() const { return std::max(last_heard_ns, pair ? pair->last_heard() : 0); }
        bool carrying = false; // telemetry: shown active while it lands pieces (multipath)
        std::string desc;
        SlotSink sink;
    };
    /// A generation notice a path reported, for settle_locked().
    struct Notice {
        int slot = 0;           // the path it came on
        uint32_t gen = 0;
        int abandoned = -1;     // the slot the sender left after a failure (-1: none)
        uint64_t abandoned_id = 0;
    };
    /// One message of a posted group: msg(seq).
    struct MsgSlot {
        RecvRequest *req = nullptr; // the irecv covering this seq
        int buf = -1;           // its buffer, once bound by the sender's first frame
        bool sized = false;     // its size is known (a striped RDMA message: from its last piece)
        uint32_t gen = 0;       // the generation whose bytes `got` counts
        uint64_t got = 0;
        bool complete = false;
    };

    void progress_locked() noexcept override;
    void rearm_locked(bool arm) noexcept override;
    void goodbye_locked() noexcept override;
    size_t nfds() const noexcept override;
    int fd(size_t i) const noexcept override;

    // ---- posting, placement, completion (recv_comm.cc) ----
    /// Which sink call is asking (the columns of the rule table above).
    enum class Asking : uint8_t { kStream, kWanted, kWhole, kPiece };
    enum class Fate : uint8_t { kLive, kStale, kBad };
    /// The rule table above: what becomes of message `seq`'s bytes from generation `gen`,
    /// reported on path `slot` (adopting a newer generation where the table says so).
    Fate classify_locked(int slot, uint32_t gen, uint64_t seq, Asking asking) noexcept;
    Placement locate(int slot, uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry);
    /// Binds message `seq` to buffer `entry` on its first frame, or checks a later frame
    /// against that binding; `size` kUnsized for a piece that does not say the message's
    /// size (RecvSink::piece). 0, or -EPROTO / -EMSGSIZE.
    int bind_locked(uint64_t seq, int32_t tag, uint64_t size, int entry) noexcept;
    static constexpr uint64_t kUnsized = ~0ull;
    /// The message with sequence number residue `residue` mod 2^`bits` nearest the window
    /// (RecvSink::whole_short, piece) into *seq, and the tag of its buffer `entry` into *tag.
    /// 0; 1 for one below the floor (complete: ignore); -EPROTO for one outside what was
    /// advertised, an entry its receive does not have, or a bad `bits`. Judges nothing else
    /// (whole() and piece() classify the message).
    int unwrap_locked(uint64_t residue, int bits, int entry, uint64_t *seq,
                      int32_t *tag) const noexcept;
    /// RecvSink::piece() and piece_last() (the size kUnsized for the former).
    int piece(int slot, uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry,
              uint64_t len);
    /// Bytes of generation `gen` for message `s`: a newer generation than it counts restarts
    /// its count.
    static void restart_count_locked(MsgSlot &s, uint32_t gen) noexcept;
    bool still_wanted(uint32_t gen, uint64_t seq);
    int landed(int slot, uint64_t seq, uint64_t len, uint32_t gen);
    /// `len` more bytes of message `seq` are in place (through path `slot`); completes it and
    /// its request when all are. A floor that moves makes an ack due (settle_locked()).
    /// 0 or -EPROTO.
    int add_bytes_locked(int slot, uint64_t seq, uint64_t len) noexcept;
    int whole(int slot, uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry);
    int whole_short(int slot, uint32_t gen, uint64_t seq_residue, int bits, uint64_t size, int entry);
    /// Advertises every group not yet complete on path `i`, oldest first.
    void readvertise_locked(int i) noexcept;
    void complete_locked(RecvRequest *r) noexcept;
    /// Completes the flush requests whose reads completed.
    void progress_flushes_locked() noexcept;
    bool quiet_locked() const noexcept override;
    void quiet_tick_locked(uint64_t now) noexcept override;
    void port_down_locked(int dev, const std::string &cause) noexcept override;
    /// No silence verdict while quiet (judge_path_locked): pairs are slept on for the probes.
    int pair_uses_locked(std::array<PairUse, kMaxPaths> *out) const noexcept override;
    const FailoverConfig &failover_config() const noexcept override { return cfg_; }
    /// Path `i`'s heartbeat when its port pair is due one (PortPairs).
    void heartbeat_locked(int i, uint64_t now) noexcept;
    uint64_t quiet_period_ns(bool prober) const noexcept override { return quiet_period(cfg_, prober, kTimerNs); }
    /// What this side holds: every seq below floor_, and the completed ones above it.
    Holding holding_locked() const noexcept;

    // ---- the state machine (recv_failover.cc) ----
    /// Applies what the sinks queued while a path's call was on the stack: generation
    /// notices (fence the path named, drain the others, answer on the notice's path), then
    /// the ack on every live path when the floor moved. Never called from inside a path.
    void settle_locked() noexcept;
    /// The newest generation seen is `gen` (> gen_), on path `slot` (each message restarts
    /// its count on its first bytes of a newer generation).
    void adopt_generation_locked(int slot, uint32_t gen) noexcept;
    /// kLive slot `slot` after one progress(): its status `st` moves it to kLost, kClosed
    /// or kGone, or silence for stall_timeout with receives pending to kLost. False when
    /// the connection failed (a fatal status).
    bool judge_path_locked(int slot, const PathStatus &st, uint64_t now) noexcept;
    /// The connection-wide verdict once every path was progressed (see the comment above).
    void judge_connection_locked(uint64_t now) noexcept;
    /// Drains every live path but `except` (RecvPath::drain).
    void drain_others_locked(int except) noexcept;
    /// kLive slot `i` ends in `to` (kLost, kClosed or kGone): fenced, unwatched, logged.
    void lose_path_locked(int i, const std::string &why, RecvSlotState to) noexcept;
    void accept_rebuilt_locked(uint64_t now) noexcept;

    std::array<PathSlot, kMaxPaths> paths_;
    FailoverConfig cfg_;
    TelemetryConfig tcfg_;
    std::unique_ptr<PathAcceptor> acceptor_;
    std::array<std::unique_ptr<Flusher>, kMaxPaths> flushers_; // per slot's device; may be null
    int flushes_pending_ = 0;
    uint64_t next_accept_poll_ns_ = 0;
    // Requests: reqs_ points into req_store_'s blocks, whose requests never move (NCCL holds
    // them). The pool starts at kMinRequests and doubles while NCCL has more receives and
    // flushes pending at once, up to kMaxRequests: a connection holds what it used, 4 KiB at
    // kMinRequests, 17 KiB at kMaxRequests (544 bytes a request).
    static constexpr size_t kMinRequests = 8;
    std::vector<RecvRequest *> reqs_;
    std::vector<std::unique_ptr<RecvRequest[]>> req_store_;
    /// A free request of the pool, grown if none is (nullptr at kMaxRequests, or out of
    /// memory).
    RecvRequest *free_request() noexcept;
    // Messages: msg(seq) for seq in [floor_, next_post_seq_); no other slot holds state. The
    // ring starts at kMinMsgs and doubles while more messages are posted and not complete,
    // up to kMaxInflight: 640 bytes at kMinMsgs, 10 KiB at kMaxInflight.
    static constexpr size_t kMinMsgs = 16;
    MsgSlot &msg(uint64_t seq) noexcept { return msgs_.at(seq); }
    const MsgSlot &msg(uint64_t seq) const noexcept { return msgs_.at(seq); }
    Pow2Ring<MsgSlot> msgs_{kMinMsgs};
    uint32_t gen_ = 1;
    int active_path_ = kPrimary; // where the newest generation arrives (telemetry)
    uint64_t next_group_ = 0;    // index of the next irecv's CTS group
    uint64_t next_post_seq_ = 0; // seq the next irecv's first buffer covers
    uint64_t floor_ = 0;         // every seq below is complete
    bool ack_due_ = false;       // floor_ moved since the paths were last told
    std::vector<Notice> notices_; // reported by a path, not yet settled
    bool peer_closed_ = false;   // a slot went kClosed: the sender closed the connection
    uint64_t no_path_since_ns_ = 0; // when the last kLive slot was lost (0: one is live)
};

} // namespace vigil::net
