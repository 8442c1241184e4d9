// SPDX-License-Identifier: Apache-2.0
// The verbs fabric's path: RC QPs on one HCA port (VIGIL_IB_QPS_PER_CONN of them) between two
// devices. The sender RDMA-writes a message's payload straight into the receive buffer the
// receiver advertised in its CTS entry, then RDMA-writes (with immediate) the message's record
// into the receiver's record ring on the same QP; the write's RC completion is the ack (the
// receiver holds the data). A message of at most ShortImm::kMaxSize bytes is one write with
// immediate into the buffer, the immediate standing in for the record. With multipath a large
// message is striped over both paths of its connection in pieces: each piece but the last is
// one write with immediate (PieceImm) at its offset, the last is payload and record; the
// receiver counts a message's bytes whichever path they came on. Control messages (CTS
// groups, generation notices and the holding answer, probes, heartbeats, failover requests,
// goodbyes) are writes with immediate into the peer's control ring on QP 0, with credits
// back (PathEngine); no receive carries a buffer. After a generation notice the sender waits for
// the receiver's holding answer and never writes a message the receiver already holds (an RDMA
// write cannot be discarded once it lands, and the buffer may be NCCL's again).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "../fabric.h"
#include "hca.h"
#include "path_engine.h"
#include "qp_set.h"
#include "verbs_wire.h"

namespace vigil::net::verbs_fabric {

/// Slots of a QP's flight ring: at least the data work requests it may have outstanding
/// (kDataDepth), a power of two so its 32-bit counts wrap onto the same slots.
inline constexpr uint32_t kFlightRing = 256;

/// Sending half of a verbs path. Stripes (SendPath::stripes): a piece of a message other
/// than its last is one write with immediate (PieceImm), its last piece payload writes and a
/// Record with its offset; every piece's completion reports SendSink::landed. A begin() while
/// work requests of the old generation are in flight holds the generation notice back until
/// they completed, so nothing of the old generation lands after the receiver's answer.
/// Not thread-safe: used under the owning SendComm's lock.
class VerbsSendPath final : public SendPath
{
public:
    VerbsSendPath(std::unique_ptr<QpSet> qps, PathIdentity id);
    ~VerbsSendPath() override;

    const PathIdentity &identity() const override { return eng_.identity(); }
    void begin(uint64_t first_seq, uint32_t gen, int abandoned, uint64_t abandoned_id) override;
    void post(const OutMessage &m) override;
    bool idle() const override;
    void probe() override;
    void goodbye() override;
    void sabotage() override;
    uint64_t oldest_referenced() const override;
    bool stripes() const override { return true; }
    /// Room for another piece: fewer than kMaxInflight queued, and less than `limit` payload
    /// bytes queued or on the QPs with writes not completed (what the port has not yet
    /// delivered). No system call.
    bool can_post(uint64_t limit) const override
    {
        return queue_.size() < kMaxInflight && queued_bytes_ + flight_bytes_ < limit;
    }
    PathStatus progress(SendSink &sink) override;
    void rearm(bool arm) override { eng_.qps().rearm(arm); }
    int fd(size_t) const override { return qps_fd_; }
    size_t nfds() const override { return 1; }

private:
    /// False, with *why, when `m` cannot go on this path: its source is not registered on
    /// this path's device (`mr`), the receiver gave no rkey for that device, or a piece that
    /// is not its message's last (`middle`: one write with immediate) is larger than one RDMA
    /// write.
    bool sendable(const OutMessage &m, const FabricMr *mr, bool middle, std::string *why) const;
    /// Posts the payload and record of `m` (a whole message or a piece) on one QP. False when
    /// the QP has no room (the message stays queued); sets *err on a failure.
    bool transmit(const OutMessage &m, int *err, std::string *why);
    void on_control(const Ctl &h, const uint8_t *payload, size_t len, SendSink &sink, PathStatus *st);
    /// The signaled work request at the head of QP `qi`'s flights completed: the receiver's
    /// memory holds the message (SendSink::held) or the piece (SendSink::landed), and its
    /// work requests have left the send queue. The last flight sends a held notice.
    void on_done(int qi, SendSink &sink);
    /// Sends the notice begin() held back (at once when nothing is in flight, else from
    /// on_done() when the old generation's last write completed).
    void send_notice();

    /// A message or piece whose signaled work request has not completed: its send-queue use.
    struct Flight {
        uint64_t seq = 0;
        uint32_t len = 0; // payload bytes
        uint32_t gen = 0;
        uint8_t wrs = 0; // payload writes + the completing one
        bool piece = false;
    };

    PathEngine eng_;
    int qps_fd_;
    int nqps_;
    uint32_t gen_ = 1;
    std::deque<OutMessage> queue_;            // posted, not yet on a QP
    uint64_t queued_bytes_ = 0;               // their payload bytes
    // Per QP, a ring of kFlightRing flights in posting order (a QP completes its signaled
    // work requests in order): QP i's are flight_[i * kFlightRing + (k % kFlightRing)] for k in
    // [fl_head_[i], fl_tail_[i]). Within a generation seqs increase along each ring.
    std::vector<Flight> flight_;
    std::array<uint32_t, kMaxQps> fl_head_{}, fl_tail_{};
    uint32_t in_flight_n_ = 0;
    uint64_t flight_bytes_ = 0; // payload bytes of the flights
    bool awaiting_holding_ = false; // after begin(): the receiver's answer comes first
    bool notice_held_ = false;      // begin()'s notice waits for the old generation's flights
    Ctl notice_;
    int bad_ = 0;                   // a message post() could not accept (reported by progress)
    std::string bad_why_;
};

/// Receiving half. Not thread-safe: used under the owning RecvComm's lock.
class VerbsRecvPath final : public RecvPath
{
public:
    VerbsRecvPath(std::unique_ptr<QpSet> qps, PathIdentity id);
    ~VerbsRecvPath() override;

    const PathIdentity &identity() const override { return eng_.identity(); }
    PathStatus progress(RecvSink &sink) override;
    void rearm(bool arm) override { eng_.qps().rearm(arm); }
    void advertise(const CtsGroup &g) override;
    /// RC completions are the sender's acks: nothing to send.
    void ack(uint64_t, uint32_t) override {}
    /// Sends the holding answer (Ctl::kHolding) the sender waits for before it replays.
    void answer(uint32_t gen, const Holding &h) override;
    void request_failover(uint32_t failed_slot) override;
    void heartbeat() override;
    void goodbye() override;
    void drain(RecvSink &sink) override;
    void fence(RecvSink &sink) override;
    void sabotage() override;
    int fd(size_t) const override { return qps_fd_; }
    size_t nfds() const override { return 1; }

private:
    /// A write with immediate completed: a short message (ShortImm) or a record.
    void on_write(const ibv_wc &w, RecvSink &sink, PathStatus *st);
    void on_record(uint32_t imm, RecvSink &sink, PathStatus *st);
    /// A short message's write with immediate (ShortImm) of `byte_len` bytes completed.
    void on_short(uint32_t imm, uint32_t byte_len, RecvSink &sink, PathStatus *st);
    /// A piece's write with immediate (PieceImm) of `byte_len` bytes completed.
    void on_piece(uint32_t imm, uint32_t byte_len, RecvSink &sink, PathStatus *st);
    /// The receiving core refused message `what` (whole() or whole_short() returned `rc`):
    /// the path fails, fatally, with one line saying why.
    void refused(PathStatus *st, int rc, const std::string &what);
    /// A control message from the sender (`len` bytes at `m`).
    void on_control(const uint8_t *m, size_t len, RecvSink &sink, PathStatus *st);

    PathEngine eng_;
    int qps_fd_;
    bool goodbye_seen_ = false;
    // The sender's generation on this path as its latest notice said, from the first (1),
    // which needs none: short messages carry none (whole() accepts any generation), pieces
    // only its residue (unwrapped at or below it).
    uint32_t gen_ = 1;
    // Control messages drain() met: handled by the next progress(), in order.
    std::deque<std::vector<uint8_t>> deferred_ctl_;
};

} // namespace vigil::net::verbs_fabric
