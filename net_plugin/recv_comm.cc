// SPDX-License-Identifier: Apache-2.0
// recvComm: posting receives (CTS advertisement), frame placement and completion, acks,
// iflush, and the progress loop. The failover state machine is in recv_failover.cc.
#include "recv_comm.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "clock.h"
#include "log.h"
#include "nccl_abi/net_common.h"
#include "telemetry/writer.h"

namespace vigil::net {

RecvComm::RecvComm(RecvPaths paths, const std::array<int, kMaxPaths> &devs,
                   const FailoverConfig &cfg, const TelemetryConfig &tcfg)
    : Comm(devs), cfg_(cfg), tcfg_(tcfg), acceptor_(std::move(paths.acceptor)),
      flushers_(std::move(paths.flushers))
{
    const uint64_t now = now_ns();
    notices_.reserve(2 * kMaxPaths); // a notice per path per progress, nearly always
    // Reserved whole, so growing the pool never throws past its block's allocation.
    reqs_.reserve(kMaxRequests);
    req_store_.reserve(8); // kMinRequests doubled to kMaxRequests: 3 blocks
    for (int i = 0; i < kMaxPaths; ++i) {
        PathSlot &p = paths_[i];
        p.sink.comm = this;
        p.sink.slot = i;
        if (!paths.paths[i]) continue;
        p.path = std::move(paths.paths[i]);
        p.desc = p.path->identity().describe();
        p.pair = pair_of(p.path->identity());
        p.state = RecvSlotState::kLive;
        p.last_heard_ns = now;
        p.tm = PathTelemetry::make(tcfg_, Direction::kRecv, p.path->identity(), this);
        if (i != kPrimary && p.tm) p.tm->meter.set_state(now, telemetry::kStandby, gen_);
    }
    // A path the sender rebuilt may come while this comm is parked (it saw no loss: it had
    // nothing posted): its timer takes it (quiet_tick_locked).
    if (acceptor_) acceptor_->set_wake([this] { wake_timer(); });
}

RecvComm::~RecvComm()
{
    for (RecvRequest *r : reqs_)
        if (r->state.load(std::memory_order_relaxed) == Request::kPending)
            for (int i = 0; i < r->n; ++i) MemRegion::unref(r->mr[static_cast<size_t>(i)]);
}

std::string RecvComm::describe() const
{
    return paths_[kPrimary].desc;
}

std::string RecvComm::describe_paths() const
{
    return paths_[kPrimary].desc + ", " + (paths_[kBackup].path ? paths_[kBackup].desc : std::string("no backup"));
}

uint32_t RecvComm::generation() noexcept
{
    Locked g(*this);
    return gen_;
}

size_t RecvComm::nfds() const noexcept
{
    return path_fds(paths_);
}

int RecvComm::fd(size_t i) const noexcept
{
    return path_fd(paths_, i);
}

// ---- Posting receives ------------------------------------------------------------------------

int RecvComm::irecv(int n, void *const *data, const size_t *sizes, const int *tags,
                    MemRegion *const *mrs, Request **out) noexcept
{
    *out = nullptr;
    if (n < 1 || n > kMaxRecvs) {
        VLOG_WARN("irecv with %d buffers; 1..%d supported", n, kMaxRecvs);
        return -EINVAL;
    }
    Locked g(*this);
    take_port_events_locked(); // no CTS goes out on a path whose port went down
    if (int e = error_.load(std::memory_order_relaxed)) return e;
    if (peer_closed_) {
        fail_locked(-ECONNRESET, describe() + ": irecv after the sender closed the connection");
        return error_.load(std::memory_order_relaxed);
    }
    if (next_post_seq_ + static_cast<uint64_t>(n) - floor_ > kMaxInflight) return 0;
    // The ring doubles (to kMaxInflight) while the window would not fit, each message of
    // [floor_, next_post_seq_) moving to its seq's place.
    while (next_post_seq_ + static_cast<uint64_t>(n) - floor_ > msgs_.size())
        if (!msgs_.grow(floor_, next_post_seq_, static_cast<size_t>(kMaxInflight)))
            return 0; // out of memory: as a full window
    RecvRequest *r = free_request();
    if (r == nullptr) return 0;
    r->is_send = false;
    r->is_flush = false;
    r->comm = this;
    r->seq = next_post_seq_;
    r->n = n;
    r->remaining = n;
    CtsGroup &cts = r->cts;
    cts.index = next_group_++;
    cts.first_seq = next_post_seq_;
    cts.n = n;
    for (int i = 0; i < n; ++i) {
        const size_t k = static_cast<size_t>(i);
        MemRegion *mr = mrs != nullptr ? mrs[i] : nullptr;
        if (mr != nullptr) mr->ref();
        r->mr[k] = mr;
        r->data[k] = static_cast<uint8_t *>(data[i]);
        r->msg_size[k] = 0;
        r->bound[k] = false;
        CtsEntry &e = cts.entries[k];
        e.addr = reinterpret_cast<uintptr_t>(data[i]);
        // A buffer larger than any message we carry is fine; the sender never needs more.
        e.size = std::min<uint64_t>(sizes[i], kMaxMessageBytes);
        e.tag = tags[i];
        for (int s = 0; s < kMaxPaths; ++s) {
            const FabricMr *fmr = mr != nullptr ? mr->on(devs_[static_cast<size_t>(s)]) : nullptr;
            e.rkey[static_cast<size_t>(s)] = fmr != nullptr ? fmr->rkey : 0;
        }
        msg(next_post_seq_ + static_cast<uint64_t>(i)) = MsgSlot{r, -1, 0, false};
    }
    next_post_seq_ += static_cast<uint64_t>(n);
    r->state.store(Request::kPending, std::memory_order_relaxed);
    // Clear to send, on every live path: whichever survives, the sender has the group.
    // Nothing else: what arrives is read by test() and the progress engine.
    for (PathSlot &p : paths_)
        if (p.live()) p.path->advertise(cts);
    *out = r;
    return 0;
}

RecvRequest *RecvComm::free_request() noexcept
{
    for (RecvRequest *c : reqs_)
        if (c->state.load(std::memory_order_acquire) == Request::kFree) return c;
    // Every request is NCCL's: a block as large as the pool (the first, kMinRequests).
    const size_t n = reqs_.empty() ? kMinRequests : reqs_.size();
    if (reqs_.size() + n > static_cast<size_t>(kMaxRequests)) return nullptr;
    try {
        auto block = std::make_unique<RecvRequest[]>(n);
        for (size_t i = 0; i < n; ++i) reqs_.push_back(&block[i]); // reserved: never throws
        RecvRequest *first = &block[0];
        req_store_.push_back(std::move(block));                    // reserved: never throws
        return first;
    } catch (...) {
        return nullptr;
    }
}

RecvComm::Slots RecvComm::slots() noexcept
{
    Locked g(*this);
    return {static_cast<uint32_t>(reqs_.size()), static_cast<uint32_t>(msgs_.size())};
}

int RecvComm::iflush(int n, void *const *data, const int *sizes, MemRegion *const *mrs,
                     Request **out) noexcept
{
    *out = nullptr;
    // As NCCL's IB transport: one read of the last buffer that received data, where that
    // buffer is device memory (host memory is coherent with the NIC's writes).
    int last = -1;
    for (int i = n - 1; i >= 0 && last < 0 && mrs != nullptr && sizes != nullptr; --i)
        if (sizes[i] > 0 && mrs[i] != nullptr && mrs[i]->type != NCCL_PTR_HOST) last = i;
    if (last < 0) return 0;
    Locked g(*this);
    if (int e = error_.load(std::memory_order_relaxed)) return e;
    RecvRequest *r = free_request();
    if (r == nullptr) {
        // NCCL tests a receive before flushing it, so a request is free unless it flushes
        // more than kMaxRequests receives at once; a NULL here would mean "done".
        fail_locked(-ENOBUFS, describe() + ": iflush with every request in use");
        return error_.load(std::memory_order_relaxed);
    }
    r->is_send = false;
    r->is_flush = true;
    r->n = 0;
    r->remaining = 0;
    r->comm = this;
    for (int s = 0; s < kMaxPaths; ++s) {
        const size_t k = static_cast<size_t>(s);
        r->flush_on[k] = false;
        const FabricMr *fmr = mrs[last]->on(devs_[k]);
        if (!flushers_[k] || fmr == nullptr) continue;
        if (int rc = flushers_[k]->start(data[last], *fmr, &r->flush_ticket[k]); rc != 0) {
            VLOG_WARN("host %s: %s: iflush on dev %d failed to start (%s); the data path will see "
                      "that device's failure", host_name(), describe().c_str(), devs_[k], strerror(-rc));
            continue;
        }
        r->flush_on[k] = true;
        ++r->remaining;
    }
    if (r->remaining == 0) return 0; // nothing read: nothing to wait for
    ++flushes_pending_;
    r->state.store(Request::kPending, std::memory_order_relaxed);
    *out = r;
    return 0;
}

void RecvComm::progress_flushes_locked() noexcept
{
    if (flushes_pending_ == 0) return;
    std::array<uint64_t, kMaxPaths> completed{};
    std::array<bool, kMaxPaths> failed{};
    for (size_t k = 0; k < kMaxPaths; ++k)
        if (flushers_[k]) failed[k] = flushers_[k]->progress(&completed[k]) != 0;
    for (RecvRequest *r : reqs_) {
        if (!r->is_flush || r->state.load(std::memory_order_relaxed) != Request::kPending) continue;
        bool all = true;
        for (size_t k = 0; k < kMaxPaths; ++k)
            all = all && (!r->flush_on[k] || failed[k] || completed[k] > r->flush_ticket[k]);
        if (!all) continue;
        --flushes_pending_;
        r->state.store(Request::kDone, std::memory_order_release);
    }
}

void RecvComm::readvertise_locked(int i) noexcept
{
    std::array<const RecvRequest *, kMaxRequests> open{};
    size_t n = 0;
    for (const RecvRequest *r : reqs_)
        if (r->state.load(std::memory_order_relaxed) == Request::kPending && r->remaining > 0 && !r->is_flush)
            open[n++] = r;
    std::sort(open.begin(), open.begin() + static_cast<long>(n),
              [](const RecvRequest *a, const RecvRequest *b) { return a->cts.index < b->cts.index; });
    for (size_t k = 0; k < n; ++k) paths_[i].path->advertise(open[k]->cts);
}

void RecvComm::complete_locked(RecvRequest *r) noexcept
{
    for (int i = 0; i < r->n; ++i) {
        MemRegion::unref(r->mr[static_cast<size_t>(i)]);
        r->mr[static_cast<size_t>(i)] = nullptr;
    }
    r->state.store(Request::kDone, std::memory_order_release);
}

// ---- Placement (called by the paths through their SlotSink) ---------------------------------
// A sink call only changes this comm: what it means for other paths waits for settle_locked().

Placement RecvComm::SlotSink::locate(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry)
{
    return comm->locate(slot, gen, seq, tag, size, entry);
}

bool RecvComm::SlotSink::still_wanted(uint32_t gen, uint64_t seq)
{
    return comm->still_wanted(gen, seq);
}

int RecvComm::SlotSink::landed(uint64_t seq, uint64_t len, uint32_t gen)
{
    return comm->landed(slot, seq, len, gen);
}

int RecvComm::SlotSink::whole(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry)
{
    return comm->whole(slot, gen, seq, tag, size, entry);
}

int RecvComm::SlotSink::whole_short(uint32_t gen, uint64_t seq_residue, int bits, uint64_t size, int entry)
{
    return comm->whole_short(slot, gen, seq_residue, bits, size, entry);
}

int RecvComm::SlotSink::piece(uint32_t gen, uint64_t seq_residue, int bits, uint64_t len, int entry)
{
    uint64_t seq = 0;
    int32_t tag = 0;
    if (int rc = comm->unwrap_locked(seq_residue, bits, entry, &seq, &tag); rc != 0)
        return rc < 0 ? rc : 0;
    return comm->piece(slot, gen, seq, tag, kUnsized, entry, len);
}

int RecvComm::SlotSink::piece_last(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size,
                                   int entry, uint64_t len)
{
    if (size == kUnsized || len > size) return -EPROTO;
    return comm->piece(slot, gen, seq, tag, size, entry, len);
}

Holding RecvComm::holding_locked() const noexcept
{
    Holding h;
    h.floor = floor_;
    for (uint64_t s = floor_; s < next_post_seq_; ++s) {
        const uint64_t k = s - floor_;
        if (msg(s).complete) h.complete[k / 64] |= uint64_t{1} << (k % 64);
    }
    return h;
}

RecvComm::Fate RecvComm::classify_locked(int slot, uint32_t gen, uint64_t seq, Asking asking) noexcept
{
    const bool stream = asking == Asking::kStream || asking == Asking::kWanted;
    if (gen > gen_) {
        if (asking == Asking::kWanted) return Fate::kStale; // a frame's generation was adopted at its header
        adopt_generation_locked(slot, gen);
    }
    if (stream && gen < gen_) return Fate::kStale; // its generation was replayed
    if (seq < floor_) return Fate::kStale;         // a replay of a completed message
    // The sender only sends what a CTS entry allowed: anything else breaks the protocol.
    if (seq >= next_post_seq_ || seq - floor_ >= kMaxInflight)
        return asking == Asking::kWanted ? Fate::kStale : Fate::kBad;
    const MsgSlot &s = msg(seq);
    if (s.complete) return Fate::kStale;
    if (asking == Asking::kPiece && gen < s.gen) return Fate::kStale; // rewritten by a replay
    return Fate::kLive;
}

Placement RecvComm::locate(int slot, uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry)
{
    Placement p;
    switch (classify_locked(slot, gen, seq, Asking::kStream)) {
    case Fate::kStale:
        p.kind = Placement::kDiscard;
        return p;
    case Fate::kBad:
        p.error = -EPROTO;
        return p; // kError
    case Fate::kLive:
        break;
    }
    if (int rc = bind_locked(seq, tag, size, entry); rc != 0) {
        p.error = rc;
        return p; // kError
    }
    MsgSlot &s = msg(seq);
    restart_count_locked(s, gen);
    p.kind = Placement::kPlace;
    p.dest = s.req->data[static_cast<size_t>(entry)];
    return p;
}

int RecvComm::bind_locked(uint64_t seq, int32_t tag, uint64_t size, int entry) noexcept
{
    MsgSlot &s = msg(seq);
    RecvRequest *r = s.req;
    if (entry < 0 || entry >= r->n) return -EPROTO;
    const size_t e = static_cast<size_t>(entry);
    if (r->cts.entries[e].tag != tag) return -EPROTO;
    if (size != kUnsized && size > r->cts.entries[e].size) return -EMSGSIZE;
    if (s.buf < 0) {
        if (r->bound[e]) return -EPROTO; // two messages for one buffer
        r->bound[e] = true;
        s.buf = entry;
    } else if (s.buf != entry || (s.sized && size != kUnsized && r->msg_size[e] != size)) {
        return -EPROTO;
    }
    if (size != kUnsized && !s.sized) {
        if (s.got > size) return -EPROTO; // pieces beyond the size its last piece says
        r->msg_size[e] = size;
        s.sized = true;
    }
    return 0;
}

int RecvComm::whole(int slot, uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry)
{
    // Any generation: the bytes are in the buffer (they came before the record on one QP),
    // and a sender that saw the record acknowledged will not send them again.
    const Fate f = classify_locked(slot, gen, seq, Asking::kWhole);
    if (f != Fate::kLive) return f == Fate::kBad ? -EPROTO : 0;
    if (int rc = bind_locked(seq, tag, size, entry); rc != 0) return rc;
    return add_bytes_locked(slot, seq, size - msg(seq).got);
}

int RecvComm::unwrap_locked(uint64_t residue, int bits, int entry, uint64_t *seq,
                            int32_t *tag) const noexcept
{
    if (bits < 2 || bits > 32 || (uint64_t{1} << (bits - 1)) <= static_cast<uint64_t>(kMaxInflight)) return -EPROTO;
    const uint64_t mod = uint64_t{1} << bits, half = mod / 2;
    // The one seq with this residue in [floor_ - half, floor_ + half).
    const uint64_t base = floor_ >= half ? floor_ - half : 0;
    *seq = base + ((residue - base) & (mod - 1));
    if (*seq < floor_) return 1; // a replay of a completed message
    if (*seq >= next_post_seq_ || *seq - floor_ >= kMaxInflight) return -EPROTO;
    const RecvRequest *r = msg(*seq).req;
    if (entry < 0 || entry >= r->n) return -EPROTO;
    *tag = r->cts.entries[static_cast<size_t>(entry)].tag;
    return 0;
}

int RecvComm::whole_short(int slot, uint32_t gen, uint64_t seq_residue, int bits, uint64_t size,
                          int entry)
{
    uint64_t seq = 0;
    int32_t tag = 0;
    if (int rc = unwrap_locked(seq_residue, bits, entry, &seq, &tag); rc != 0)
        return rc < 0 ? rc : 0;
    return whole(slot, gen, seq, tag, size, entry);
}

int RecvComm::piece(int slot, uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry,
                    uint64_t len)
{
    const Fate f = classify_locked(slot, gen, seq, Asking::kPiece);
    if (f != Fate::kLive) return f == Fate::kBad ? -EPROTO : 0;
    if (int rc = bind_locked(seq, tag, size, entry); rc != 0) return rc;
    restart_count_locked(msg(seq), gen);
    return add_bytes_locked(slot, seq, len);
}

void RecvComm::restart_count_locked(MsgSlot &s, uint32_t gen) noexcept
{
    if (gen > s.gen) {
        s.got = 0; // the sender replays it whole in this generation
        s.gen = gen;
    }
}

bool RecvComm::still_wanted(uint32_t gen, uint64_t seq)
{
    // The slot does not matter: this call never adopts a generation.
    return classify_locked(kPrimary, gen, seq, Asking::kWanted) == Fate::kLive;
}

int RecvComm::landed(int slot, uint64_t seq, uint64_t len, uint32_t gen)
{
    if (!still_wanted(gen, seq)) return 0; // a frame overtaken by a newer generation
    const int rc = add_bytes_locked(slot, seq, len);
    return rc < 0 ? rc : 1;
}

int RecvComm::add_bytes_locked(int slot, uint64_t seq, uint64_t len) noexcept
{
    if (PathTelemetry *tm = paths_[slot].tm.get()) {
        const uint64_t now = now_ns();
        tm->meter.on_complete(now, now, len); // receive side: bytes per path, no latency
        // Multipath: a path that carries pieces beside the active one is active too.
        if (slot != active_path_ && !paths_[slot].carrying) {
            paths_[slot].carrying = true;
            tm->meter.set_state(now, telemetry::kActive, gen_);
        }
    }
    MsgSlot &s = msg(seq);
    RecvRequest *r = s.req;
    s.got += len;
    const size_t e = static_cast<size_t>(s.buf);
    // Until the size is known (pieces ahead of a striped message's last one), the buffer's
    // capacity bounds what may land.
    const uint64_t want = s.sized ? r->msg_size[e] : r->cts.entries[e].size;
    if (s.got > want) return s.sized ? -EPROTO : -EMSGSIZE;
    if (s.got < want || !s.sized) return 0;
    s.complete = true;
    if (--r->remaining == 0) complete_locked(r);
    const uint64_t old = floor_;
    while (floor_ < next_post_seq_ && msg(floor_).complete)
        msg(floor_++) = MsgSlot{};
    if (floor_ != old) ack_due_ = true; // told to every live path by settle_locked()
    return 0;
}

void RecvComm::rearm_locked(bool arm) noexcept
{
    for (PathSlot &p : paths_)
        if (p.live()) p.path->rearm(arm);
}

void RecvComm::goodbye_locked() noexcept
{
    for (PathSlot &p : paths_)
        if (p.live()) p.path->goodbye();
}

void RecvComm::progress_locked() noexcept
{
    take_port_events_locked();
    // One clock read per call: a caller spinning on test() calls this in a tight loop.
    const uint64_t now = now_ns();
    for (int i = 0; i < kMaxPaths; ++i) {
        PathSlot &p = paths_[i];
        if (!p.live()) continue;
        heartbeat_locked(i, now);
        const PathStatus st = p.path->progress(p.sink);
        settle_locked(); // what the sink queued, now that the path's call returned
        if (p.tm) p.tm->meter.advance(now);
        if (st.heard) {
            p.last_heard_ns = now;
            if (p.pair) p.pair->heard(now);
        }
        if (!judge_path_locked(i, st, now)) return;
    }
    accept_rebuilt_locked(now);
    settle_locked();
    progress_flushes_locked();
    judge_connection_locked(now);
}

} // namespace vigil::net
