// SPDX-License-Identifier: Apache-2.0
// The verbs fabric's path: RC QPs on one HCA port (VIGIL_IB_QPS_PER_CONN of them) between two
// devices. The sender RDMA-writes a message's payload straight into the receive buffer the
// receiver advertised in its CTS entry, then RDMA-writes (with immediate) the message's record
// into the receiver's record ring on the same QP; the write's RC completion is the ack (the
// receiver holds the data). A message of at most ShortImm::kMaxSize bytes is one write with
// immediate into the buffer, the immediate standing in for the record. Control messages (CTS
// groups, generation notices and the holding answer, probes, heartbeats, failover requests,
// goodbyes) travel as SEND/RECV on the same QPs. After a generation notice the sender waits for
// the receiver's holding answer and never writes a message the receiver already holds (an RDMA
// write cannot be discarded once it lands, and the buffer may be NCCL's again).
#pragma once

#include <array>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../fabric.h"
#include "cq.h"
#include "device.h"
#include "mr.h"
#include "qp.h"
#include "verbs_wire.h"

namespace vigil::net::verbs_fabric {

/// Receive work requests kept posted per QP (records and control messages both consume one).
inline constexpr uint32_t kRecvDepth = 512;
/// Control messages a path end may have in flight (send slots).
inline constexpr uint32_t kCtlSlots = 64;
/// Send work requests per QP: a payload and a record per message in flight, plus control.
inline constexpr uint32_t kSendDepth = 2 * kMaxInflight + kCtlSlots;

/// An HCA as the fabric uses it: its open context (owned by the port registry), one PD for
/// every path and registration on it, and the registration cache (regIsGlobal: a buffer
/// registered once is found again, whole pages, while any user holds it). Thread-safe.
class Hca
{
public:
    /// Allocates the PD. 0 or -errno.
    int open(const verbs::Context *ctx, std::string name);
    const verbs::Context &ctx() const { return *ctx_; }
    const verbs::Pd &pd() const { return pd_; }
    const std::string &name() const { return name_; }
    /// A registration covering [data, data + size): a cached one, or a new one of the whole
    /// pages. 0 or -errno.
    int reg(void *data, size_t size, std::shared_ptr<FabricMr> *out);
    /// As reg() for a DMA-BUF (never cached). 0 or -errno (-EOPNOTSUPP where unsupported).
    int reg_dmabuf(void *data, size_t size, uint64_t offset, int fd, std::shared_ptr<FabricMr> *out);
    /// Registrations alive in the cache (tests).
    size_t cached() const;

private:
    struct Entry {
        uintptr_t begin, end;
        std::weak_ptr<FabricMr> mr;
    };
    const verbs::Context *ctx_ = nullptr;
    verbs::Pd pd_;
    std::string name_;
    mutable std::mutex mu_;
    std::vector<Entry> cache_;
};

/// A registration: the verbs MR behind a FabricMr.
struct VerbsMr final : FabricMr {
    verbs::Mr mr;
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
/// the progress engine watches), and one registered block of control memory (receive slots,
/// send slots, the outgoing records and, receiver side, the record ring the peer writes).
/// Owned by one path object; not thread-safe.
class QpSet
{
public:
    ~QpSet();
    /// Creates the QPs in INIT with their receives posted. 0 or -errno with *why.
    int create(const PortInfo &port, const QpConfig &cfg, std::string *why);
    /// This end as the peer needs it.
    PathEnd local_end() const;
    /// Drives every QP to RTR towards `remote`, then to RTS. 0 or -errno with *why.
    int connect(const PathEnd &remote, std::string *why);
    /// Every QP to the error state (outstanding work completes with flush errors). Idempotent.
    void to_error();
    /// True after to_error().
    bool dead() const { return dead_; }

    int nqps() const { return static_cast<int>(qps_.size()); }
    const verbs::Qp &qp(int i) const { return qps_[static_cast<size_t>(i)]; }
    const verbs::Cq &cq() const { return cq_; }
    int fd() const { return ch_.fd(); }
    const PortInfo &port() const { return port_; }
    const PathEnd &remote() const { return remote_; }
    uint8_t *recv_slot(int qp, uint32_t slot) { return ctl_.get() + (static_cast<size_t>(qp) * kRecvDepth + slot) * kCtlBytes; }
    uint8_t *send_slot(uint32_t slot) { return ctl_.get() + send_off_ + static_cast<size_t>(slot) * kCtlBytes; }
    uint8_t *out_record(uint64_t seq) { return ctl_.get() + out_off_ + (seq % kMaxInflight) * kRecordBytes; }
    const uint8_t *in_record(uint64_t seq) const { return ctl_.get() + ring_off_ + (seq % kMaxInflight) * kRecordBytes; }
    uint32_t lkey() const { return mr_.lkey(); }
    /// Posts receive slot `slot` of QP `qp` again. 0 or -errno.
    int repost(int qp, uint32_t slot);
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
    verbs::CompChannel ch_;
    verbs::Cq cq_;
    std::vector<verbs::Qp> qps_;
    std::unique_ptr<uint8_t[]> ctl_;
    size_t send_off_ = 0, out_off_ = 0, ring_off_ = 0, ctl_bytes_ = 0;
    verbs::Mr mr_;
    bool armed_ = false;
    bool dead_ = false;
};

/// What both halves do with a QP set: control sends, polling, receive reposting, and the one
/// WARN for a failed completion. Not thread-safe (used under the owning comm's lock).
class PathEngine
{
public:
    PathEngine(std::unique_ptr<QpSet> qps, PathIdentity id);
    /// Queues a control message (header + payload); sent when a send slot is free. Never blocks.
    void control(const Ctl &h, const uint8_t *payload = nullptr, size_t n = 0);
    /// Polls the CQ, calling `on(wc, qp index)` for each successful completion (it returns
    /// false to stop: the path failed). A failed completion fills *st (error, fatal by
    /// class) with one line naming QP, status, vendor error and both GIDs; the successful
    /// completions polled with it are still handed to `on`, then the call ends. Receive
    /// slots are posted again after `on`. Returns false when the path failed now or before.
    template <class On> bool poll(PathStatus *st, On &&on);
    /// Hands every successful completion still in the CQ to `on`, whatever happened to the
    /// path; failed ones are dropped after to_error() (the flush), else they fail the path
    /// as poll() would. Reports nothing: a failure shows in the next poll(). Receives are
    /// posted again only while the QPs live.
    template <class On> void drain(On &&on);
    /// Posts queued control messages while send slots are free. False after filling *st
    /// when posting failed.
    bool flush_control(PathStatus *st);
    QpSet &qps() { return *qps_; }
    const PathIdentity &identity() const { return id_; }
    bool failed() const { return failed_; }
    /// The path failed: the first failure is kept, copied into *st (unless it holds one),
    /// and reported again by every later poll().
    void fail(PathStatus *st, int err, std::string detail, bool fatal);
    /// The QP this path's next message goes on (round robin).
    int next_qp() { return static_cast<int>(rr_++ % static_cast<uint64_t>(qps_->nqps())); }
    /// Send work requests outstanding on QP i, and its budget.
    uint32_t &sq_used(int i) { return sq_used_[static_cast<size_t>(i)]; }
    bool ctl_pending() const { return !ctl_queue_.empty() || ctl_in_flight_ > 0; }

    /// wr_id kinds.
    static constexpr uint64_t kRecord = 1, kCtlSend = 2, kRecv = 3, kData = 4;
    static uint64_t wr(uint64_t kind, uint64_t value) { return kind << 56 | value; }
    static uint64_t wr_kind(uint64_t id) { return id >> 56; }
    static uint64_t wr_value(uint64_t id) { return id & ((uint64_t{1} << 56) - 1); }

private:
    /// One successful completion: send-slot accounting for control sends, `on` for the rest,
    /// then the receive slot posted again. False when `on` or the repost failed.
    template <class On> bool dispatch(const ibv_wc &w, PathStatus *st, On &&on);

    std::unique_ptr<QpSet> qps_;
    PathIdentity id_;
    std::deque<std::vector<uint8_t>> ctl_queue_;
    std::array<bool, kCtlSlots> ctl_busy_{};
    uint32_t ctl_in_flight_ = 0;
    std::array<uint32_t, kMaxQps> sq_used_{};
    uint64_t rr_ = 0;
    bool failed_ = false;
    PathStatus failure_; // the first failure
};

/// Sending half of a verbs path. Not thread-safe: used under the owning SendComm's lock.
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
    PathStatus progress(SendSink &sink) override;
    void rearm(bool arm) override { eng_.qps().rearm(arm); }
    int fd(size_t) const override { return qps_fd_; }
    size_t nfds() const override { return 1; }

private:
    /// Posts the payload and record of `m` on one QP. False when the QP has no room (the
    /// message stays queued); sets *err on a failure.
    bool transmit(const OutMessage &m, int *err, std::string *why);
    void on_control(const Ctl &h, const uint8_t *payload, size_t len, SendSink &sink, PathStatus *st);
    /// The record of message `seq` completed: the receiver's memory holds the message, and
    /// its work requests have left the send queue.
    void on_record_done(uint64_t seq, SendSink &sink);

    /// A message whose record is not completed yet: its send-queue use.
    struct Flight {
        uint64_t seq = 0;
        uint8_t qp = 0;
        uint8_t wrs = 0; // payload writes + the record
        bool on = false;
    };

    PathEngine eng_;
    int qps_fd_;
    uint32_t gen_ = 1;
    std::deque<OutMessage> queue_;            // posted, not yet on a QP
    std::array<Flight, kMaxInflight> flight_{}; // slot seq % kMaxInflight
    uint32_t in_flight_n_ = 0;
    bool awaiting_holding_ = false; // after begin(): the receiver's answer comes first
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
    /// The receiving core refused message `what` (whole() or whole_short() returned `rc`):
    /// the path fails, fatally, with one line saying why.
    void refused(PathStatus *st, int rc, const std::string &what);
    /// A control message from the sender (`len` bytes at `m`).
    void on_control(const uint8_t *m, size_t len, RecvSink &sink, PathStatus *st);

    PathEngine eng_;
    int qps_fd_;
    bool goodbye_seen_ = false;
    // The sender's generation on this path as its latest notice said (short messages carry
    // none; whole() accepts any generation, so an older one is only never adopted).
    uint32_t gen_ = 0;
    // Control messages drain() met: handled by the next progress(), in order.
    std::deque<std::vector<uint8_t>> deferred_ctl_;
};

} // namespace vigil::net::verbs_fabric
