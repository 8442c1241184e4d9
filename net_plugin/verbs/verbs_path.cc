// SPDX-License-Identifier: Apache-2.0
// Verbs path data movement: RDMA writes into advertised buffers, records with immediate,
// control messages over SEND/RECV, completions as acks.
#include "verbs_path.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <random>
#include <unistd.h>

#include "handle.h"
#include "log.h"
#include "names.h"

namespace vigil::net::verbs_fabric {
namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
/// Largest payload of one RDMA write (InfiniBand allows 2^31; many ports say 2^30).
constexpr uint64_t kMaxWriteBytes = uint64_t{1} << 30;
static_assert(2 * kMaxInflight <= (1 << ShortImm::kSeqBits), "a short immediate's seq must unwrap unambiguously");

size_t page_size()
{
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
}

} // namespace

// ---- Hca ------------------------------------------------------------------------------------

int Hca::open(const verbs::Context *ctx, std::string name)
{
    ctx_ = ctx;
    name_ = std::move(name);
    return verbs::Pd::alloc(*ctx, &pd_);
}

int Hca::reg(void *data, size_t size, std::shared_ptr<FabricMr> *out)
{
    const uintptr_t p = reinterpret_cast<uintptr_t>(data);
    const uintptr_t begin = p & ~(page_size() - 1);
    const uintptr_t end = (p + std::max<size_t>(size, 1) + page_size() - 1) & ~(page_size() - 1);
    std::lock_guard<std::mutex> lock(mu_);
    for (Entry &e : cache_) {
        if (e.begin > begin || e.end < end) continue;
        if (std::shared_ptr<FabricMr> mr = e.mr.lock()) {
            *out = std::move(mr);
            return 0;
        }
    }
    std::erase_if(cache_, [](const Entry &e) { return e.mr.expired(); });
    auto mr = std::make_shared<VerbsMr>();
    if (int rc = verbs::Mr::reg(pd_, reinterpret_cast<void *>(begin), end - begin, kAccess, &mr->mr); rc != 0)
        return rc;
    mr->lkey = mr->mr.lkey();
    mr->rkey = mr->mr.rkey();
    cache_.push_back(Entry{begin, end, mr});
    *out = std::move(mr);
    return 0;
}

int Hca::reg_dmabuf(void *data, size_t size, uint64_t offset, int fd, std::shared_ptr<FabricMr> *out)
{
    auto mr = std::make_shared<VerbsMr>();
    if (int rc = verbs::Mr::reg_dmabuf(pd_, offset, size, reinterpret_cast<uintptr_t>(data), fd, kAccess, &mr->mr);
        rc != 0)
        return rc;
    mr->lkey = mr->mr.lkey();
    mr->rkey = mr->mr.rkey();
    *out = std::move(mr);
    return 0;
}

size_t Hca::cached() const
{
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<size_t>(std::count_if(cache_.begin(), cache_.end(), [](const Entry &e) { return !e.mr.expired(); }));
}

// ---- QpSet ----------------------------------------------------------------------------------

QpSet::~QpSet() = default;

int QpSet::create(const PortInfo &port, const QpConfig &cfg, std::string *why)
{
    port_ = port;
    cfg_ = cfg;
    auto bad = [&](int rc, const char *what) {
        *why = std::string(what) + " on " + port.hca->name() + ": " + strerror(-rc);
        return rc;
    };
    const verbs::Context &ctx = port.hca->ctx();
    if (int rc = verbs::CompChannel::create(ctx, &ch_); rc != 0) return bad(rc, "cannot create a completion channel");
    const int depth = cfg.nqps * static_cast<int>(kSendDepth + kRecvDepth);
    if (int rc = verbs::Cq::create(ctx, depth, &ch_, this, &cq_); rc != 0) return bad(rc, "cannot create a CQ");
    send_off_ = static_cast<size_t>(cfg.nqps) * kRecvDepth * kCtlBytes;
    out_off_ = send_off_ + kCtlSlots * kCtlBytes;
    ring_off_ = out_off_ + kMaxInflight * kRecordBytes;
    ctl_bytes_ = ring_off_ + kMaxInflight * kRecordBytes;
    ctl_.reset(new uint8_t[ctl_bytes_]());
    if (int rc = verbs::Mr::reg(port.hca->pd(), ctl_.get(), ctl_bytes_, kAccess, &mr_); rc != 0)
        return bad(rc, "cannot register the control memory");
    verbs::QpCaps caps;
    caps.max_send_wr = kSendDepth;
    caps.max_recv_wr = kRecvDepth;
    for (int i = 0; i < cfg.nqps; ++i) {
        verbs::Qp qp;
        if (int rc = verbs::Qp::create_rc(port.hca->pd(), cq_, cq_, caps, this, &qp); rc != 0)
            return bad(rc, "cannot create an RC QP");
        if (int rc = qp.to_init(port.port, kAccess); rc != 0) return bad(rc, "cannot move a QP to INIT");
        qps_.push_back(std::move(qp));
        for (uint32_t s = 0; s < kRecvDepth; ++s)
            if (int rc = repost(i, s); rc != 0) return bad(rc, "cannot post receives");
    }
    random_bytes(&psn_, sizeof(psn_));
    psn_ &= 0xffffff;
    return 0;
}

PathEnd QpSet::local_end() const
{
    PathEnd e;
    e.nqps = static_cast<uint8_t>(qps_.size());
    e.mtu = static_cast<uint8_t>(port_.active_mtu);
    e.lid = port_.lid;
    e.psn = psn_;
    e.gid = port_.gid;
    for (size_t i = 0; i < qps_.size(); ++i) e.qpn[i] = qps_[i].num();
    e.ring_addr = reinterpret_cast<uintptr_t>(ctl_.get() + ring_off_);
    e.ring_rkey = mr_.rkey();
    return e;
}

int QpSet::connect(const PathEnd &remote, std::string *why)
{
    if (remote.nqps != qps_.size()) {
        *why = "the peer has " + std::to_string(remote.nqps) + " QPs for this path, this end " +
               std::to_string(qps_.size()) + " (VIGIL_IB_QPS_PER_CONN differs)";
        return -EPROTO;
    }
    remote_ = remote;
    verbs::QpPathAttr attr;
    attr.port = port_.port;
    attr.gid_index = static_cast<uint8_t>(port_.gid_index);
    attr.global = !port_.infiniband;
    attr.mtu = std::min<int>(port_.active_mtu, remote.mtu);
    attr.timeout = cfg_.timeout;
    attr.retry_cnt = cfg_.retry_cnt;
    attr.sl = cfg_.sl;
    attr.traffic_class = cfg_.traffic_class;
    for (size_t i = 0; i < qps_.size(); ++i) {
        verbs::QpEndpoint ep;
        ep.qpn = remote.qpn[i];
        ep.psn = remote.psn;
        std::memcpy(ep.gid, remote.gid.data(), 16);
        ep.lid = remote.lid;
        if (int rc = qps_[i].to_rtr(attr, ep); rc != 0) {
            *why = std::string("cannot move QP to RTR: ") + strerror(-rc);
            return rc;
        }
        if (int rc = qps_[i].to_rts(attr, psn_); rc != 0) {
            *why = std::string("cannot move QP to RTS: ") + strerror(-rc);
            return rc;
        }
    }
    return 0;
}

void QpSet::to_error()
{
    if (dead_) return;
    dead_ = true;
    for (verbs::Qp &q : qps_) (void)q.to_error();
}

int QpSet::repost(int qp, uint32_t slot)
{
    ibv_sge sge{reinterpret_cast<uintptr_t>(recv_slot(qp, slot)), kCtlBytes, mr_.lkey()};
    ibv_recv_wr wr{};
    wr.wr_id = PathEngine::wr(PathEngine::kRecv, static_cast<uint64_t>(qp) << 24 | slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr *bad = nullptr;
    return qps_[static_cast<size_t>(qp)].post_recv(&wr, &bad);
}

void QpSet::rearm(bool arm)
{
    ibv_cq *cq = nullptr;
    while (ch_.wait(0, &cq) > 0) armed_ = false; // each event consumes the arm
    if (arm && !armed_ && !dead_ && cq_.arm() == 0) armed_ = true;
}

std::string QpSet::gid_text(bool local) const
{
    return verbs::gid_to_string(local ? port_.gid.data() : remote_.gid.data());
}

// ---- PathEngine -----------------------------------------------------------------------------

PathEngine::PathEngine(std::unique_ptr<QpSet> qps, PathIdentity id) : qps_(std::move(qps)), id_(std::move(id)) {}

void PathEngine::fail(PathStatus *st, int err, std::string detail, bool fatal)
{
    if (!failed_) {
        failure_.error = err;
        failure_.fatal = fatal;
        failure_.detail = std::move(detail);
        failed_ = true;
    }
    if (st->error == 0) {
        st->error = failure_.error;
        st->fatal = failure_.fatal;
        st->detail = failure_.detail;
    }
}

void PathEngine::control(const Ctl &h, const uint8_t *payload, size_t n)
{
    if (failed_) return;
    std::vector<uint8_t> m(Ctl::kSize + n);
    h.encode(m.data());
    if (n > 0) std::memcpy(m.data() + Ctl::kSize, payload, n);
    ctl_queue_.push_back(std::move(m));
    PathStatus ignored; // errors show on the next progress()
    flush_control(&ignored);
}

bool PathEngine::flush_control(PathStatus *st)
{
    while (!failed_ && !ctl_queue_.empty()) {
        uint32_t slot = 0;
        while (slot < kCtlSlots && ctl_busy_[slot]) ++slot;
        if (slot == kCtlSlots || sq_used(0) >= kSendDepth) return true; // later, as sends complete
        const std::vector<uint8_t> &m = ctl_queue_.front();
        std::memcpy(qps_->send_slot(slot), m.data(), m.size());
        ibv_sge sge{reinterpret_cast<uintptr_t>(qps_->send_slot(slot)), static_cast<uint32_t>(m.size()), qps_->lkey()};
        ibv_send_wr wr{};
        wr.wr_id = PathEngine::wr(kCtlSend, slot);
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_SEND;
        wr.send_flags = IBV_SEND_SIGNALED;
        ibv_send_wr *bad = nullptr;
        // Control goes on QP 0 only: CTS groups and notices keep their order.
        if (int rc = qps_->qp(0).post_send(&wr, &bad); rc != 0) {
            fail(st, rc, std::string("posting a control message failed: ") + strerror(-rc), false);
            return false;
        }
        ctl_busy_[slot] = true;
        ++ctl_in_flight_;
        ++sq_used(0);
        ctl_queue_.pop_front();
    }
    return !failed_;
}

namespace {

/// One line for a failed completion: QP, status name and number, vendor error, port, GIDs.
std::string describe_wc(const ibv_wc &w, const QpSet &q)
{
    char text[512];
    std::snprintf(text, sizeof(text),
                  "qp 0x%x status %s (%d) vendor err 0x%x on dev %s port %d, local gid %s, remote gid %s",
                  w.qp_num, verbs::wc_status_name(w.status), static_cast<int>(w.status), w.vendor_err,
                  q.port().hca->name().c_str(), q.port().port, q.gid_text(true).c_str(),
                  q.gid_text(false).c_str());
    return text;
}

} // namespace

template <class On> bool PathEngine::poll(PathStatus *st, On &&on)
{
    if (failed_) {
        fail(st, 0, {}, false); // reports the first failure again
        return false;
    }
    ibv_wc wc[32];
    for (;;) {
        const int n = qps_->cq().poll(32, wc);
        if (n < 0) {
            fail(st, n, std::string("polling the CQ failed: ") + strerror(-n), false);
            return false;
        }
        // Every completion polled is handled: a success after a failure in the same batch is
        // still a message that landed (another QP of the path), or a record the peer holds.
        bool stop = false;
        for (int k = 0; k < n; ++k) {
            const ibv_wc &w = wc[k];
            if (w.status != IBV_WC_SUCCESS) {
                if (!failed_) {
                    const bool fatal = verbs::classify_wc_status(w.status) == verbs::WcClass::Protection;
                    fail(st, fatal ? -EACCES : -ECONNRESET, describe_wc(w, *qps_), fatal);
                }
                continue;
            }
            if (!dispatch(w, st, on)) stop = true;
        }
        if (failed_ || stop) return false;
        if (n < 32) return true;
    }
}

template <class On> void PathEngine::drain(On &&on)
{
    ibv_wc wc[32];
    for (;;) {
        const int n = qps_->cq().poll(32, wc);
        if (n <= 0) return;
        for (int k = 0; k < n; ++k) {
            const ibv_wc &w = wc[k];
            PathStatus later; // a failure shows in the next poll()
            if (w.status != IBV_WC_SUCCESS) {
                // After to_error() every outstanding work request completes flushed.
                if (!failed_ && !qps_->dead()) {
                    const bool fatal = verbs::classify_wc_status(w.status) == verbs::WcClass::Protection;
                    fail(&later, fatal ? -EACCES : -ECONNRESET, describe_wc(w, *qps_), fatal);
                }
                continue;
            }
            (void)dispatch(w, &later, on);
        }
        if (n < 32) return;
    }
}

template <class On> bool PathEngine::dispatch(const ibv_wc &w, PathStatus *st, On &&on)
{
    int qi = 0;
    while (qi < qps_->nqps() && qps_->qp(qi).num() != w.qp_num) ++qi;
    const uint64_t kind = wr_kind(w.wr_id);
    if (kind == kCtlSend) {
        const uint64_t slot = wr_value(w.wr_id);
        if (slot < kCtlSlots && ctl_busy_[slot]) {
            ctl_busy_[slot] = false;
            --ctl_in_flight_;
            --sq_used(0);
        }
        st->heard = true; // the peer's HCA acknowledged it
        return true;
    }
    st->heard = true;
    const bool ok = on(w, qi);
    if (kind == kRecv && !qps_->dead()) {
        const uint64_t v = wr_value(w.wr_id);
        if (int rc = qps_->repost(static_cast<int>(v >> 24), static_cast<uint32_t>(v & 0xffffff)); rc != 0) {
            fail(st, rc, std::string("reposting a receive failed: ") + strerror(-rc), false);
            return false;
        }
    }
    return ok;
}

// ---- send -----------------------------------------------------------------------------------

VerbsSendPath::VerbsSendPath(std::unique_ptr<QpSet> qps, PathIdentity id)
    : eng_(std::move(qps), std::move(id)), qps_fd_(eng_.qps().fd())
{
    eng_.qps().rearm(true);
}

VerbsSendPath::~VerbsSendPath() = default;

void VerbsSendPath::begin(uint64_t first_seq, uint32_t gen, int abandoned, uint64_t abandoned_id)
{
    gen_ = gen;
    queue_.clear(); // the core posts every unacknowledged message again
    awaiting_holding_ = true;
    Ctl h;
    h.kind = Ctl::kGeneration;
    h.gen = gen;
    h.a = first_seq;
    h.b = abandoned_id;
    h.count = static_cast<uint8_t>(abandoned >= 0 ? abandoned + 1 : 0);
    eng_.control(h);
}

void VerbsSendPath::post(const OutMessage &m)
{
    queue_.push_back(m);
}

bool VerbsSendPath::idle() const
{
    return queue_.empty() && in_flight_n_ == 0 && !awaiting_holding_;
}

uint64_t VerbsSendPath::oldest_referenced() const
{
    if (in_flight_n_ == 0) return ~0ull;
    uint64_t oldest = ~0ull;
    for (const Flight &f : flight_)
        if (f.on) oldest = std::min(oldest, f.seq);
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

bool VerbsSendPath::transmit(const OutMessage &m, int *err, std::string *why)
{
    QpSet &q = eng_.qps();
    const int slot = eng_.identity().slot;
    const FabricMr *mr = m.mr != nullptr ? m.mr->on(eng_.identity().dev) : nullptr;
    if (m.size > 0 && (mr == nullptr || !m.mr->covers(m.data, m.size))) {
        *err = -EINVAL;
        *why = "isend of " + std::to_string(m.size) + " bytes from memory not registered on dev " +
               eng_.identity().dev_name + " (regMr with this comm first)";
        return false;
    }
    if (m.size > 0 && m.dest.rkey[static_cast<size_t>(slot)] == 0) {
        *err = -EINVAL;
        *why = "the receiver's buffer for seq " + std::to_string(m.seq) +
               " is not registered on the device of this path";
        return false;
    }
    // A message of at most ShortImm::kMaxSize bytes is one write with immediate into the
    // advertised buffer; a larger one is payload writes, then its record.
    const bool brief = ShortImm::fits(m.size);
    const uint64_t chunks = brief ? 0 : (m.size + kMaxWriteBytes - 1) / kMaxWriteBytes;
    const uint32_t wrs = static_cast<uint32_t>(chunks) + 1;
    const int qi = eng_.next_qp();
    if (eng_.sq_used(qi) + wrs > kSendDepth) return false; // full: later
    std::array<ibv_sge, 3> sge{};
    std::array<ibv_send_wr, 3> wr{};
    const uint32_t rkey = m.dest.rkey[static_cast<size_t>(slot)];
    // The one signaled work request, last on the QP: its completion is the message's ack.
    auto completing = [&](size_t k, uint64_t local, uint32_t len, uint32_t lkey, uint32_t imm, uint64_t raddr,
                          uint32_t rk) {
        sge[k] = ibv_sge{local, len, lkey};
        wr[k].wr_id = PathEngine::wr(PathEngine::kRecord, m.seq);
        wr[k].sg_list = &sge[k];
        wr[k].num_sge = len > 0 ? 1 : 0;
        wr[k].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
        wr[k].send_flags = IBV_SEND_SIGNALED;
        wr[k].imm_data = htonl(imm);
        wr[k].wr.rdma.remote_addr = raddr;
        wr[k].wr.rdma.rkey = rk;
    };
    if (brief) {
        completing(0, reinterpret_cast<uintptr_t>(m.data), static_cast<uint32_t>(m.size), mr != nullptr ? mr->lkey : 0,
                   ShortImm::encode(m.seq, m.entry), m.dest.addr, rkey);
    } else {
        size_t k = 0;
        for (uint64_t c = 0; c < chunks; ++c, ++k) {
            const uint64_t off = c * kMaxWriteBytes;
            const uint64_t len = std::min<uint64_t>(kMaxWriteBytes, m.size - off);
            sge[k] = ibv_sge{reinterpret_cast<uintptr_t>(m.data + off), static_cast<uint32_t>(len), mr->lkey};
            wr[k].wr_id = PathEngine::wr(PathEngine::kData, m.seq);
            wr[k].sg_list = &sge[k];
            wr[k].num_sge = 1;
            wr[k].opcode = IBV_WR_RDMA_WRITE;
            wr[k].wr.rdma.remote_addr = m.dest.addr + off;
            wr[k].wr.rdma.rkey = rkey;
        }
        Record rec;
        rec.seq = m.seq;
        rec.gen = gen_;
        rec.size = static_cast<uint32_t>(m.size);
        rec.tag = m.tag;
        rec.entry = static_cast<uint8_t>(m.entry);
        rec.encode(q.out_record(m.seq));
        completing(k, reinterpret_cast<uintptr_t>(q.out_record(m.seq)), kRecordBytes, q.lkey(),
                   static_cast<uint32_t>(m.seq) & Record::kImmSeqMask,
                   q.remote().ring_addr + (m.seq % kMaxInflight) * kRecordBytes, q.remote().ring_rkey);
    }
    for (size_t i = 0; i + 1 < wrs; ++i) wr[i].next = &wr[i + 1];
    ibv_send_wr *bad = nullptr;
    if (int rc = q.qp(qi).post_send(&wr[0], &bad); rc != 0) {
        *err = rc;
        *why = std::string("posting a message failed: ") + strerror(-rc);
        return false;
    }
    eng_.sq_used(qi) += wrs;
    flight_[m.seq % kMaxInflight] = Flight{m.seq, static_cast<uint8_t>(qi), static_cast<uint8_t>(wrs), true};
    ++in_flight_n_;
    return true;
}

void VerbsSendPath::on_record_done(uint64_t seq, SendSink &sink)
{
    Flight &f = flight_[seq % kMaxInflight];
    if (f.on && f.seq == seq) {
        // The record (a short message: its one write) was the last work request of the
        // message on its QP and the only signaled one: its completion retires the unsignaled
        // payload writes before it.
        f.on = false;
        --in_flight_n_;
        eng_.sq_used(f.qp) -= f.wrs;
    }
    sink.held(seq); // RC: the receiver's memory holds payload and record
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
        if (!awaiting_holding_ || h.gen != gen_) return; // the answer to an older generation
        const Holding hold = decode_holding(h, p);
        sink.acked(hold.floor);
        // Never write a message the receiver holds: its buffer may be NCCL's again.
        std::deque<OutMessage> keep;
        for (const OutMessage &m : queue_) {
            if (hold.has(m.seq)) sink.held(m.seq);
            else keep.push_back(m);
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
    auto on = [&](const ibv_wc &w, int) {
        const uint64_t kind = PathEngine::wr_kind(w.wr_id);
        if (kind == PathEngine::kRecord) {
            on_record_done(PathEngine::wr_value(w.wr_id), sink);
            return true;
        }
        if (kind == PathEngine::kRecv) {
            const uint64_t v = PathEngine::wr_value(w.wr_id);
            const uint8_t *m = eng_.qps().recv_slot(static_cast<int>(v >> 24), static_cast<uint32_t>(v & 0xffffff));
            Ctl h;
            if (w.opcode != IBV_WC_RECV) {
                eng_.fail(&st, -EPROTO, "a write with immediate arrived at the sending side", true);
                return false;
            }
            if (const char *bad = h.decode(m, w.byte_len)) {
                eng_.fail(&st, -EPROTO, std::string("control message from the receiver: ") + bad, true);
                return false;
            }
            on_control(h, m + Ctl::kSize, w.byte_len - Ctl::kSize, sink, &st);
            return !eng_.failed();
        }
        return true;
    };
    if (!eng_.poll(&st, on)) return st;
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
            queue_.pop_front();
        }
    }
    if (!eng_.flush_control(&st)) return st;
    if (!eng_.poll(&st, on)) return st;
    return st;
}

// ---- receive --------------------------------------------------------------------------------

VerbsRecvPath::VerbsRecvPath(std::unique_ptr<QpSet> qps, PathIdentity id)
    : eng_(std::move(qps), std::move(id)), qps_fd_(eng_.qps().fd())
{
    eng_.qps().rearm(true);
}

VerbsRecvPath::~VerbsRecvPath() = default;

void VerbsRecvPath::advertise(const CtsGroup &g)
{
    std::array<uint8_t, Ctl::kMaxEntries * Ctl::kEntrySize> p;
    Ctl h;
    const size_t n = encode_cts(g, &h, p.data());
    eng_.control(h, p.data(), n);
}

void VerbsRecvPath::request_failover(uint32_t failed_slot)
{
    Ctl h;
    h.kind = Ctl::kFailoverRequest;
    h.a = failed_slot;
    eng_.control(h);
}

void VerbsRecvPath::heartbeat()
{
    if (eng_.ctl_pending()) return; // something is on its way already
    Ctl h;
    h.kind = Ctl::kHeartbeat;
    eng_.control(h);
}

void VerbsRecvPath::goodbye()
{
    Ctl h;
    h.kind = Ctl::kGoodbye;
    eng_.control(h);
}

void VerbsRecvPath::drain(RecvSink &sink)
{
    eng_.drain([&](const ibv_wc &w, int) {
        if (PathEngine::wr_kind(w.wr_id) != PathEngine::kRecv) return true;
        if (w.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            PathStatus later; // a bad record fails the path: the next progress() says so
            on_write(w, sink, &later);
            return true;
        }
        // A control message may need a reply: it waits for progress(), in order.
        const uint64_t v = PathEngine::wr_value(w.wr_id);
        const uint8_t *m = eng_.qps().recv_slot(static_cast<int>(v >> 24), static_cast<uint32_t>(v & 0xffffff));
        deferred_ctl_.emplace_back(m, m + std::min<uint32_t>(w.byte_len, kCtlBytes));
        return true;
    });
}

void VerbsRecvPath::fence(RecvSink &sink)
{
    // No write of this path lands after this: its QPs drop whatever still arrives. What
    // landed before is in the CQ: it counts.
    eng_.qps().to_error();
    drain(sink);
}

void VerbsRecvPath::sabotage()
{
    eng_.qps().to_error();
}

void VerbsRecvPath::on_write(const ibv_wc &w, RecvSink &sink, PathStatus *st)
{
    const uint32_t imm = ntohl(w.imm_data);
    if (ShortImm::is_short(imm)) on_short(imm, w.byte_len, sink, st);
    else on_record(imm, sink, st);
}

void VerbsRecvPath::on_record(uint32_t imm, RecvSink &sink, PathStatus *st)
{
    Record rec;
    if (const char *bad = rec.decode(eng_.qps().in_record(imm), imm, kMaxMessageBytes)) {
        eng_.fail(st, -EPROTO, std::string("message record from the sender: ") + bad, true);
        return;
    }
    // The payload writes came before the record on its QP: the whole message is in place.
    if (int rc = sink.whole(rec.gen, rec.seq, rec.tag, rec.size, rec.entry); rc != 0)
        refused(st, rc,
                "message seq " + std::to_string(rec.seq) + " tag " + std::to_string(rec.tag) + " size " +
                    std::to_string(rec.size) + " for buffer " + std::to_string(rec.entry));
}

void VerbsRecvPath::refused(PathStatus *st, int rc, const std::string &what)
{
    eng_.fail(st, rc,
              what + (rc == -EMSGSIZE ? " larger than the posted receive buffer" : " matches no advertised receive"),
              true);
}

void VerbsRecvPath::on_short(uint32_t imm, uint32_t byte_len, RecvSink &sink, PathStatus *st)
{
    const ShortImm s = ShortImm::decode(imm);
    if (!ShortImm::fits(byte_len)) {
        eng_.fail(st, -EPROTO, "a short message's write of " + std::to_string(byte_len) + " bytes", true);
        return;
    }
    if (int rc = sink.whole_short(gen_, s.seq_low, ShortImm::kSeqBits, byte_len, s.entry); rc != 0)
        refused(st, rc,
                "short message seq " + std::to_string(s.seq_low) + " (mod 2^" + std::to_string(ShortImm::kSeqBits) +
                    ") size " + std::to_string(byte_len) + " for buffer " + std::to_string(s.entry));
}

void VerbsRecvPath::on_control(const uint8_t *m, size_t len, RecvSink &sink, PathStatus *st)
{
    Ctl h;
    if (const char *bad = h.decode(m, len)) {
        eng_.fail(st, -EPROTO, std::string("control message from the sender: ") + bad, true);
        return;
    }
    switch (h.kind) {
    case Ctl::kGeneration: {
        gen_ = std::max(gen_, h.gen);
        const Holding hold = sink.generation(h.gen, h.a, static_cast<int>(h.count) - 1, h.b);
        std::array<uint8_t, Ctl::kBitmapBytes> bits;
        Ctl a;
        const size_t n = encode_holding(hold, h.gen, &a, bits.data());
        eng_.control(a, bits.data(), n);
        return;
    }
    case Ctl::kProbe:
        return;
    case Ctl::kGoodbye:
        goodbye_seen_ = true;
        return;
    default:
        eng_.fail(st, -EPROTO, "unexpected control message from the sender", true);
        return;
    }
}

PathStatus VerbsRecvPath::progress(RecvSink &sink)
{
    PathStatus st;
    // What drain() met first, in the order it arrived.
    while (!deferred_ctl_.empty() && !eng_.failed()) {
        const std::vector<uint8_t> m = std::move(deferred_ctl_.front());
        deferred_ctl_.pop_front();
        st.heard = true;
        on_control(m.data(), m.size(), sink, &st);
    }
    auto on = [&](const ibv_wc &w, int) {
        if (PathEngine::wr_kind(w.wr_id) != PathEngine::kRecv) return true;
        if (w.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            on_write(w, sink, &st);
            return !eng_.failed();
        }
        const uint64_t v = PathEngine::wr_value(w.wr_id);
        on_control(eng_.qps().recv_slot(static_cast<int>(v >> 24), static_cast<uint32_t>(v & 0xffffff)),
                   w.byte_len, sink, &st);
        return !eng_.failed();
    };
    if (!eng_.poll(&st, on)) return st;
    if (!eng_.flush_control(&st)) return st;
    if (!eng_.poll(&st, on)) return st;
    if (goodbye_seen_) st.peer_closed = true;
    return st;
}

} // namespace vigil::net::verbs_fabric
