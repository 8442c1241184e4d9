// SPDX-License-Identifier: Apache-2.0
// The sending half of a verbs path: RDMA writes into the advertised buffers, the record with
// immediate after each payload (or a piece's own immediate), completions as acks, the holding
// answer after a generation.
#include "verbs_path.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstring>

#include "log.h"

namespace vigil::net::verbs_fabric {
namespace {

/// Largest payload of one RDMA write (InfiniBand allows 2^31; many ports say 2^30).
constexpr uint64_t kMaxWriteBytes = uint64_t{1} << 30;
static_assert(2 * kMaxInflight <= (1 << ShortImm::kSeqBits), "a short immediate's seq must unwrap unambiguously");
static_assert(2 * kMaxInflight <= (1 << PieceImm::kSeqBits),
              "a piece immediate's seq must unwrap unambiguously");
static_assert(kFlightRing >= kDataDepth && (kFlightRing & (kFlightRing - 1)) == 0,
              "a flight per data work request at most, indexed by a wrapping 32-bit count");

} // namespace

VerbsSendPath::VerbsSendPath(std::unique_ptr<QpSet> qps, PathIdentity id)
    : eng_(std::move(qps), std::move(id)), qps_fd_(eng_.qps().fd()), nqps_(eng_.qps().nqps()),
      flight_(static_cast<size_t>(nqps_) * kFlightRing)
{
    eng_.qps().rearm(true);
}

VerbsSendPath::~VerbsSendPath() = default;

void VerbsSendPath::begin(uint64_t first_seq, uint32_t gen, int abandoned, uint64_t abandoned_id)
{
    gen_ = gen;
    queue_.clear(); // the core posts every unacknowledged message again
    queued_bytes_ = 0;
    awaiting_holding_ = true;
    notice_ = Ctl{};
    notice_.kind = Ctl::kGeneration;
    notice_.gen = gen;
    notice_.a = first_seq;
    notice_.b = abandoned_id;
    notice_.count = static_cast<uint8_t>(abandoned >= 0 ? abandoned + 1 : 0);
    // A striping path may still have the old generation's writes on its QPs: the notice
    // waits for them, so the receiver's answer counts every one that lands and nothing of
    // the old generation lands after the replay began (an RDMA write cannot be recalled).
    notice_held_ = true;
    if (in_flight_n_ == 0) send_notice();
}

void VerbsSendPath::send_notice()
{
    notice_held_ = false;
    eng_.control(notice_);
}

void VerbsSendPath::post(const OutMessage &m)
{
    queue_.push_back(m);
    queued_bytes_ += m.length;
}

bool VerbsSendPath::idle() const
{
    return queue_.empty() && in_flight_n_ == 0 && !awaiting_holding_;
}

uint64_t VerbsSendPath::oldest_referenced() const
{
    if (in_flight_n_ == 0) return ~0ull;
    uint64_t oldest = ~0ull;
    for (int i = 0; i < nqps_; ++i) {
        const size_t q = static_cast<size_t>(i);
        if (fl_head_[q] != fl_tail_[q]) // the head is the ring's oldest (seqs increase along it)
            oldest = std::min(oldest, flight_[q * kFlightRing + fl_head_[q] % kFlightRing].seq);
    }
    return oldest;
}

void VerbsSendPath::probe()
{
    if (!idle() || eng_.ctl_pending()) return;
    Ctl h;
    h.kind = Ctl::kProbe;
    h.gen = gen_;
    eng_.control(h);
}

void VerbsSendPath::goodbye()
{
    Ctl h;
    h.kind = Ctl::kGoodbye;
    eng_.control(h);
}

void VerbsSendPath::sabotage()
{
    eng_.qps().to_error();
}

bool VerbsSendPath::sendable(const OutMessage &m, const FabricMr *mr, bool middle, std::string *why) const
{
    const int slot = eng_.identity().slot;
    if (m.length > 0 && (mr == nullptr || !m.mr->covers(m.data + m.offset, m.length))) {
        *why = "isend of " + std::to_string(m.size) + " bytes from memory not registered on dev " +
               eng_.identity().dev_name + " (regMr with this comm first)";
        return false;
    }
    if (m.size > 0 && m.dest.rkey[static_cast<size_t>(slot)] == 0) {
        *why = "the receiver's buffer for seq " + std::to_string(m.seq) +
               " is not registered on the device of this path";
        return false;
    }
    if (middle && m.length > kMaxWriteBytes) {
        *why = "a piece of " + std::to_string(m.length) + " bytes exceeds one RDMA write";
        return false;
    }
    return true;
}

namespace {

/// The work requests of one posting (at most a payload split in two, then its completing
/// write), chained in order. Only the last is signaled: its completion is the message's (the
/// piece's) ack.
struct WrChain {
    std::array<ibv_sge, 3> sge{};
    std::array<ibv_send_wr, 3> wr{};
    uint32_t n = 0;

    /// A plain RDMA WRITE of `len` bytes at `local` to `raddr`.
    void write(uint64_t seq, const uint8_t *local, uint64_t len, uint32_t lkey, uint64_t raddr,
               uint32_t rkey)
    {
        ibv_send_wr &w = add(reinterpret_cast<uintptr_t>(local), len, lkey);
        w.wr_id = WrId::make(WrId::kData, seq);
        w.opcode = IBV_WR_RDMA_WRITE;
        w.wr.rdma.remote_addr = raddr;
        w.wr.rdma.rkey = rkey;
    }
    /// The signaled RDMA WRITE_WITH_IMM that completes the posting.
    void completing(uint64_t seq, uint64_t local, uint64_t len, uint32_t lkey, uint32_t imm,
                    uint64_t raddr, uint32_t rkey)
    {
        ibv_send_wr &w = add(local, len, lkey);
        w.wr_id = WrId::make(WrId::kRecord, seq);
        w.num_sge = len > 0 ? 1 : 0;
        w.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        w.send_flags = IBV_SEND_SIGNALED;
        w.imm_data = htonl(imm);
        w.wr.rdma.remote_addr = raddr;
        w.wr.rdma.rkey = rkey;
    }
    ibv_send_wr *head()
    {
        for (uint32_t i = 0; i + 1 < n; ++i) wr[i].next = &wr[i + 1];
        return &wr[0];
    }

private:
    ibv_send_wr &add(uint64_t local, uint64_t len, uint32_t lkey)
    {
        sge[n] = ibv_sge{local, static_cast<uint32_t>(len), lkey};
        ibv_send_wr &w = wr[n++];
        w.sg_list = &sge[n - 1];
        w.num_sge = 1;
        return w;
    }
};

} // namespace

bool VerbsSendPath::transmit(const OutMessage &m, int *err, std::string *why)
{
    QpSet &q = eng_.qps();
    const FabricMr *mr = m.mr != nullptr ? m.mr->on(eng_.identity().dev) : nullptr;
    // A whole message of at most ShortImm::kMaxSize bytes, and a piece other than a message's
    // last, is one write with immediate into the advertised buffer; anything else is payload
    // writes, then its record.
    const bool whole = m.offset == 0 && m.length == m.size;
    const bool brief = whole && ShortImm::fits(m.size);
    const bool middle = !whole && m.offset + m.length < m.size;
    if (!sendable(m, mr, middle, why)) {
        *err = -EINVAL;
        return false;
    }
    const uint64_t chunks = brief || middle ? 0 : (m.length + kMaxWriteBytes - 1) / kMaxWriteBytes;
    const uint32_t wrs = static_cast<uint32_t>(chunks) + 1;
    const int qi = eng_.next_qp();
    if (eng_.sq_used(qi) + wrs > kDataDepth) return false; // full: later
    const uint8_t *from = m.data + m.offset;
    const uint32_t rkey = m.dest.rkey[static_cast<size_t>(eng_.identity().slot)];
    const uint32_t lkey = mr != nullptr ? mr->lkey : 0;
    const uint64_t local = reinterpret_cast<uintptr_t>(from);
    WrChain c;
    if (brief) {
        c.completing(m.seq, local, m.length, lkey, ShortImm::encode(m.seq, m.entry), m.dest.addr,
                     rkey);
    } else if (middle) {
        c.completing(m.seq, local, m.length, lkey, PieceImm::encode(m.seq, gen_, m.entry),
                     m.dest.addr + m.offset, rkey);
    } else {
        for (uint64_t off = 0; off < m.length; off += kMaxWriteBytes)
            c.write(m.seq, from + off, std::min<uint64_t>(kMaxWriteBytes, m.length - off), lkey,
                    m.dest.addr + m.offset + off, rkey);
        Record rec;
        rec.seq = m.seq;
        rec.gen = gen_;
        rec.size = static_cast<uint32_t>(m.size);
        rec.tag = m.tag;
        rec.entry = static_cast<uint8_t>(m.entry);
        rec.offset = static_cast<uint32_t>(m.offset);
        rec.encode(q.out_record(m.seq));
        const uint64_t ring_slot = q.remote().ring_addr + (m.seq % kMaxInflight) * kRecordBytes;
        c.completing(m.seq, reinterpret_cast<uintptr_t>(q.out_record(m.seq)), kRecordBytes,
                     q.lkey(), static_cast<uint32_t>(m.seq) & Record::kImmSeqMask, ring_slot,
                     q.remote().rkey);
    }
    ibv_send_wr *bad = nullptr;
    if (int rc = q.qp(qi).post_send(c.head(), &bad); rc != 0) {
        *err = rc;
        *why = std::string("posting a message failed: ") + strerror(-rc);
        return false;
    }
    eng_.sq_used(qi) += wrs;
    const size_t r = static_cast<size_t>(qi);
    flight_[r * kFlightRing + fl_tail_[r]++ % kFlightRing] =
        Flight{m.seq, static_cast<uint32_t>(m.length), gen_, static_cast<uint8_t>(wrs), !whole};
    ++in_flight_n_;
    flight_bytes_ += m.length;
    return true;
}

void VerbsSendPath::on_done(int qi, SendSink &sink)
{
    const size_t r = static_cast<size_t>(qi);
    if (qi < 0 || qi >= nqps_ || fl_head_[r] == fl_tail_[r]) return;
    // The completing work request was the last of its message (piece) on its QP and the only
    // signaled one: its completion retires the unsignaled payload writes before it. A QP
    // completes its signaled work requests in order: it is the ring's head.
    const Flight f = flight_[r * kFlightRing + fl_head_[r]++ % kFlightRing];
    --in_flight_n_;
    flight_bytes_ -= f.len;
    eng_.sq_used(qi) -= f.wrs;
    // RC: the receiver's memory holds what the write carried.
    if (f.piece)
        sink.landed(f.seq, f.len, f.gen, 0);
    else
        sink.held(f.seq);
    // The old generation's last write landed: begin()'s notice may go.
    if (in_flight_n_ == 0 && notice_held_) send_notice();
}

void VerbsSendPath::on_control(const Ctl &h, const uint8_t *p, size_t len, SendSink &sink, PathStatus *st)
{
    (void)len;
    switch (h.kind) {
    case Ctl::kCts: {
        const CtsGroup g = decode_cts(h, p);
        if (sink.cts(g) != 0)
            eng_.fail(st, -EPROTO, "the receiver's CTS group " + std::to_string(g.index) + " contradicts the protocol", true);
        return;
    }
    case Ctl::kHolding: {
        if (!awaiting_holding_ || notice_held_ || h.gen != gen_) return; // an older generation's
        const Holding hold = decode_holding(h, p);
        sink.acked(hold.floor);
        // Never write a message the receiver holds: its buffer may be NCCL's again.
        std::deque<OutMessage> keep;
        for (const OutMessage &m : queue_) {
            if (hold.has(m.seq)) {
                sink.held(m.seq);
                queued_bytes_ -= m.length;
            } else {
                keep.push_back(m);
            }
        }
        queue_.swap(keep);
        awaiting_holding_ = false;
        return;
    }
    case Ctl::kHeartbeat:
        return;
    case Ctl::kFailoverRequest:
        st->failover_requested = true;
        st->failed_slot = static_cast<uint32_t>(h.a);
        return;
    case Ctl::kGoodbye:
        st->peer_closed = true;
        return;
    default:
        eng_.fail(st, -EPROTO, "unexpected control message from the receiver", true);
        return;
    }
}

PathStatus VerbsSendPath::progress(SendSink &sink)
{
    PathStatus st;
    if (bad_ != 0) {
        eng_.fail(&st, bad_, bad_why_, true);
        return st;
    }
    auto on = [&](const ibv_wc &w, int qi) {
        const uint64_t kind = WrId::kind(w.wr_id);
        if (kind == WrId::kRecord) {
            on_done(qi, sink);
            return true;
        }
        if (kind == WrId::kRecv) { // the engine took control messages and credits
            eng_.fail(&st, -EPROTO, "a message write arrived at the sending side", true);
            return false;
        }
        return true;
    };
    auto on_ctl = [&](const uint8_t *m, size_t len) {
        Ctl h;
        if (const char *bad = h.decode(m, len)) {
            eng_.fail(&st, -EPROTO, std::string("control message from the receiver: ") + bad, true);
            return false;
        }
        on_control(h, m + Ctl::kSize, len - Ctl::kSize, sink, &st);
        return !eng_.failed();
    };
    if (!eng_.poll(&st, on, on_ctl)) return st;
    if (!awaiting_holding_) {
        while (!queue_.empty()) {
            int err = 0;
            std::string why;
            if (!transmit(queue_.front(), &err, &why)) {
                if (err != 0) {
                    eng_.fail(&st, err, why, err == -EINVAL);
                    return st;
                }
                break; // no room on the QP: after completions
            }
            queued_bytes_ -= queue_.front().length;
            queue_.pop_front();
        }
    }
    if (!eng_.flush_control(&st)) return st;
    if (!eng_.poll(&st, on, on_ctl)) return st;
    return st;
}

} // namespace vigil::net::verbs_fabric
