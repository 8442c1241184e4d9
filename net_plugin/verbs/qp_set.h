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

/// Receive work requests kept posted per QP (records and control messages both consume one).
inline constexpr uint32_t kRecvDepth = 512;
/// Control messages a path end may have in flight (send slots).
inline constexpr uint32_t kCtlSlots = 64;
/// Send work requests per QP: a payload and a record per message in flight, plus control.
inline constexpr uint32_t kSendDepth = 2 * kMaxInflight + kCtlSlots;

/// A work request's wr_id: its kind in the top 8 bits, a value below (a sequence number, a
/// control send slot, or a receive's QP << 24 | slot).
struct WrId {
    static constexpr uint64_t kRecord = 1, kCtlSend = 2, kRecv = 3, kData = 4;
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

} // namespace vigil::net::verbs_fabric
