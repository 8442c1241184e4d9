// SPDX-License-Identifier: Apache-2.0
// One end of a verbs path as resources: its RC QPs, CQ, completion channel and registered
// control memory, and the QP state changes INIT -> RTR -> RTS (net_ib's connect code).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../fabric.h"
#include "cq.h"
#include "hca.h"
#include "qp.h"
#include "verbs_wire.h"

namespace vigil::net::verbs_fabric {

/// Which way an end's path carries data. A path carries it one way, so each end has one deep
/// queue and one shallow one: the sending end's send queue takes the data (records, short
/// messages, pieces) and its receive queue only the peer's control messages and credits; the
/// receiving end's receive queue takes every write with immediate of the sender, and its send
/// queue only control messages (CTS) and credits.
enum class End { kSender, kReceiver };
/// Queue depths. Providers round a queue up to a power of two (rxe after adding one slot, in
/// the kernel's rxe_queue_init), so each depth, and the CQ's (both queues of every QP of the
/// set), is one below one: under rxe 576 send WRs took 1,024 slots.
/// The deep queue of an end: a sender's send queue, a receiver's receive queue (one receive,
/// without a buffer, for each write with immediate the sender may have outstanding). With
/// the shallow queue it fills a CQ of 256 slots (255 entries): the send queue takes 256 slots
/// under rxe at 191 as at 255, the CQ half of 512.
inline constexpr uint32_t kDeepDepth = 191;
/// The shallow queue of an end: a receiver's send queue, a sender's receive queue. Each side
/// has at most kCtlSlots control messages outstanding (the peer hands slots back in credits)
/// and one credit.
inline constexpr uint32_t kShallowDepth = 63;
/// Of the sender's send work requests, the ones data may use: control messages (kCtlSlots)
/// and one credit always find room. A message takes one or more; a send that finds the QP
/// full waits in the path's queue for completions (VerbsSendPath: "full: later"), so this
/// bounds what is on the wire, not what NCCL may post (kMaxInflight).
inline constexpr uint32_t kDataDepth = kDeepDepth - kCtlSlots - 1;
/// NCCL's proxy keeps at most NCCL_STEPS (8, `src/include/device.h`) requests of a connection
/// in flight, each of up to kMaxRecvs messages.
inline constexpr uint32_t kProxyWindow = 8 * kMaxRecvs;
static_assert(kDataDepth >= 2 * kProxyWindow, "what NCCL's proxy keeps in flight fits a QP twice as short writes");
static_assert(kShallowDepth >= kCtlSlots + 1, "every control message the credits allow and a credit fit");
static_assert(kDeepDepth + kShallowDepth <= 255, "a QP's completions fit a CQ of 256 slots");
/// Send and receive depths of an end's QPs.
constexpr uint32_t send_depth(End e) { return e == End::kSender ? kDeepDepth : kShallowDepth; }
constexpr uint32_t recv_depth(End e) { return e == End::kSender ? kShallowDepth : kDeepDepth; }
static_assert(recv_depth(End::kReceiver) >= send_depth(End::kSender) &&
                  recv_depth(End::kSender) >= send_depth(End::kReceiver),
              "each write with immediate the peer may have outstanding on a QP finds a receive");

/// A work request's wr_id: its kind in the top 8 bits, a value below (a sequence number, a
/// control message's count, or a receive's QP index).
struct WrId {
    static constexpr uint64_t kRecord = 1, kCtlSend = 2, kRecv = 3, kData = 4, kCredit = 5;
    static uint64_t make(uint64_t kind, uint64_t value) { return kind << 56 | value; }
    static uint64_t kind(uint64_t id) { return id >> 56; }
    static uint64_t value(uint64_t id) { return id & ((uint64_t{1} << 56) - 1); }
};

/// The port a path end uses, as set-up code hands it over. Plain data.
struct PortInfo {
    Hca *hca = nullptr;
    uint8_t port = 1;
    int gid_index = 0;
    std::array<uint8_t, 16> gid{};
    uint16_t lid = 0;
    int active_mtu = 3; ///< enum ibv_mtu
    bool infiniband = false;
};

/// QP choices from the VIGIL_IB_* variables. Plain data.
struct QpConfig {
    int nqps = 1;
    uint8_t timeout = 20;
    uint8_t retry_cnt = 7;
    uint8_t sl = 0;
    uint8_t traffic_class = 0;
};

/// What one end of a path is made of: its RC QPs, one CQ with a completion channel (the fd
/// the progress engine watches), and one registered block of control memory: the control ring
/// the peer writes (kCtlSlots slots), the slots this end writes its own control messages from,
/// and kMaxInflight records (a sender's outgoing ones, or the ring a receiver's peer writes):
/// 26 KiB. Receives carry no buffer.
/// Owned by one path object; not thread-safe.
class QpSet
{
public:
    ~QpSet();
    /// Creates the QPs in INIT, with queues as deep as `end` needs (send_depth, recv_depth) and
    /// their receives posted. 0 or -errno with *why.
    int create(const PortInfo &port, const QpConfig &cfg, End end, std::string *why);
    /// This end as the peer needs it.
    PathEnd local_end() const;
    /// Drives every QP to RTR towards `remote`, then to RTS. 0 or -errno with *why.
    int connect(const PathEnd &remote, std::string *why);
    /// Every QP to the error state (outstanding work completes with flush errors). Idempotent.
    void to_error();
    /// True after to_error().
    bool dead() const { return dead_; }

    int nqps() const { return static_cast<int>(qps_.size()); }
    /// Send work requests each QP holds (send_depth of this end's End).
    uint32_t send_depth() const { return send_depth_; }
    const verbs::Qp &qp(int i) const { return qps_[static_cast<size_t>(i)]; }
    const verbs::Cq &cq() const { return cq_; }
    int fd() const { return ch_.fd(); }
    const PortInfo &port() const { return port_; }
    const PathEnd &remote() const { return remote_; }
    /// Control message `n` from the peer (its slot in this end's control ring).
    const uint8_t *ctl_in(uint64_t n) const { return ctl_.get() + (n % kCtlSlots) * kCtlBytes; }
    /// Where this end's control message `n` is written from, and where it goes in the peer's ring.
    uint8_t *ctl_out(uint64_t n) { return ctl_.get() + send_off_ + (n % kCtlSlots) * kCtlBytes; }
    uint64_t ctl_remote(uint64_t n) const { return remote_.ctl_addr + (n % kCtlSlots) * kCtlBytes; }
    /// The records: a sender's, written from here; a receiver's record ring, written by the
    /// sender (one region, as an end is one or the other).
    uint8_t *out_record(uint64_t seq) { return ctl_.get() + rec_off_ + (seq % kMaxInflight) * kRecordBytes; }
    const uint8_t *in_record(uint64_t seq) const { return ctl_.get() + rec_off_ + (seq % kMaxInflight) * kRecordBytes; }
    uint32_t lkey() const { return mr_.lkey(); }
    /// Posts one receive (no buffer) on QP `qp`. 0 or -errno.
    int repost(int qp);
    /// Takes the completion channel's events and, when `arm`, arms the CQ again once an event
    /// consumed the previous arm (the first call arms it). Never blocks. Called before the
    /// progress engine polls the CQ; the caller polls the CQ after it, so a completion that
    /// came before the arm is seen by that poll and one after it raises an event.
    void rearm(bool arm);
    std::string gid_text(bool local) const;

private:
    PortInfo port_;
    QpConfig cfg_;
    PathEnd remote_;
    uint32_t psn_ = 0;
    uint32_t send_depth_ = 0;
    verbs::CompChannel ch_;
    verbs::Cq cq_;
    std::vector<verbs::Qp> qps_;
    std::unique_ptr<uint8_t[]> ctl_;
    size_t send_off_ = 0, rec_off_ = 0, ctl_bytes_ = 0;
    verbs::Mr mr_;
    bool armed_ = false;
    bool dead_ = false;
};

} // namespace vigil::net::verbs_fabric
