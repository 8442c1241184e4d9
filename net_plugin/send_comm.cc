// SPDX-License-Identifier: Apache-2.0
// sendComm requests: CTS matching (a send binds to an entry with its tag in the oldest
// advertised group, as NCCL's IB transport matches its FIFO), dense sequence numbers,
// completion on the receiver's cumulative ack.
#include "send_comm.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "clock.h"
#include "log.h"

namespace vigil::net {

SendComm::SendComm(SendPaths paths, const std::array<int, kMaxPaths> &devs,
                   const FailoverConfig &cfg, const TelemetryConfig &tcfg, PortAccount &ports)
    : Comm(devs), cfg_(cfg), tcfg_(tcfg), striper_(cfg.piece_bytes, &ports),
      rebuilder_(std::move(paths.rebuilder))
{
    ring_store_.reserve(8); // kMinRing doubled to kMaxInflight: 5 blocks; push_back never throws
    ring_store_.push_back(std::make_unique<RingSlot[]>(kMinRing));
    for (size_t i = 0; i < kMinRing; ++i) ring_.push_back(&ring_store_[0][i]);
    const uint64_t now = now_ns();
    for (int i = 0; i < kMaxPaths; ++i) {
        PathSlot &sl = paths_[i];
        sl.sink.comm = this;
        sl.sink.slot = i;
        sl.backoff_ns = cfg_.rebuild_backoff_min_ns;
        if (!paths.paths[i]) continue;
        sl.path = std::move(paths.paths[i]);
        sl.desc = sl.path->identity().describe();
        sl.pair = pair_of(sl.path->identity());
        set_state_locked(i, i == kPrimary ? SlotState::kActive : SlotState::kStandby);
        sl.last_heard_ns = sl.last_sent_ns = sl.up_since_ns = now;
        meter_locked(i);
        if (sl.tm && i != kPrimary) sl.tm->meter.set_state(now, telemetry::kStandby, gen_);
    }
    share_locked(now); // multipath: the backup carries from the first message on
}

SendComm::~SendComm()
{
    // Messages still pending (a close with sends in flight) hold a reference to their region.
    for (uint64_t s = acked_; s < next_seq_; ++s) MemRegion::unref(at(s).msg.mr);
    for (int i = 0; i < kMaxPaths; ++i) set_state_locked(i, SlotState::kDead);
}

void SendComm::set_state_locked(int i, SlotState s) noexcept
{
    PathSlot &sl = paths_[i];
    sl.state = s;
    const bool carrying = s == SlotState::kActive || s == SlotState::kShared;
    const bool striped = cfg_.multipath && sl.path && sl.path->stripes();
    striper_.set_carrying(i, sl.path ? sl.path->identity().dev : -1, carrying && striped, now_ns());
}

std::string SendComm::describe() const
{
    return paths_[kPrimary].desc;
}

std::string SendComm::describe_paths() const
{
    return paths_[kPrimary].desc + ", " + (paths_[kBackup].path ? paths_[kBackup].desc : std::string("no backup"));
}

size_t SendComm::nfds() const noexcept
{
    return path_fds(paths_);
}

int SendComm::fd(size_t i) const noexcept
{
    return path_fd(paths_, i);
}

SendComm::Stats SendComm::stats() noexcept
{
    Locked g(*this);
    Stats s = stats_;
    for (const PathSlot &sl : paths_) s.alive_paths += sl.alive() ? 1 : 0;
    s.ring_slots = static_cast<uint32_t>(ring_.size());
    s.cts_slots = static_cast<uint32_t>(cts_.size());
    return s;
}

int SendComm::active_dev() noexcept
{
    Locked g(*this);
    return paths_[active_].alive() ? paths_[active_].path->identity().dev : -1;
}

SendComm::Outstanding SendComm::outstanding_locked() const noexcept
{
    Outstanding o;
    for (uint64_t s = acked_; s < next_seq_; ++s) {
        if (at(s).held) continue;
        ++o.msgs;
        o.bytes += at(s).req.size;
    }
    return o;
}

void SendComm::post_locked(int slot, uint64_t seq, size_t off, size_t len, uint64_t now) noexcept
{
    RingSlot &rs = at(seq);
    SendMsg &m = rs.msg;
    m.posted_ns = now;
    PathSlot &sl = paths_[slot];
    SendMsg::Share &sh = m.shares[static_cast<size_t>(slot)];
    if (!sh.open) {
        sh.open = true;
        sh.posted_ns = now;
        if (PathTelemetry *tm = sl.tm.get()) tm->meter.on_post(now, len);
    } else if (PathTelemetry *tm = sl.tm.get()) {
        tm->meter.on_more(now, len);
    }
    sh.bytes += len;
    striper_.on_post(slot, len, now);
    sl.path->post(OutMessage{.seq = seq, .tag = m.tag, .data = m.data, .size = rs.req.size,
                             .offset = off, .length = len, .mr = m.mr, .group = m.group,
                             .entry = m.entry, .dest = m.dest});
    if (slot != active_) ++stats_.pieces;
}

void SendComm::share_landed_locked(SendMsg &m, int slot, uint64_t landed, uint64_t now,
                                   uint64_t late) noexcept
{
    SendMsg::Share &sh = m.shares[static_cast<size_t>(slot)];
    if (!sh.open) return;
    landed = std::min(landed, sh.bytes - sh.landed);
    sh.landed += landed;
    late = std::min(late, since(now, sh.posted_ns));
    const uint64_t landed_at = now - late; // no earlier than the share's post
    striper_.on_landed(slot, landed, landed_at);
    PathTelemetry *tm = paths_[slot].tm.get();
    // What landed counts in the meter's window now, not all at the share's end.
    if (tm != nullptr && landed > 0) tm->meter.on_progress(now, landed, landed_at);
    if (sh.landed < sh.bytes) return;
    if (tm != nullptr) {
        tm->meter.on_complete(now, sh.posted_ns, 0);
        // The path had nothing more of this comm to carry while the news came back: its busy
        // clock ran on an idle path (a report queued behind the receiver's own outgoing data).
        // With more in flight it carried that meanwhile, and nothing is charged.
        if (late > 0 && tm->meter.inflight_ops() == 0) tm->meter.on_wait(now, late);
    }
    sh = SendMsg::Share{};
}

bool SendComm::striping() const noexcept
{
    if (!cfg_.multipath) return false;
    for (const PathSlot &sl : paths_)
        if (sl.path && !sl.path->stripes()) return false;
    return true;
}

unsigned SendComm::distribute_locked() noexcept
{
    if (paths_[active_].state != SlotState::kActive || draining_) return 0;
    bool shared = false;
    for (const PathSlot &sl : paths_) shared = shared || sl.state == SlotState::kShared;
    if (assign_seq_ < acked_) { // acked from an older generation's copy: its slot may be reused
        assign_seq_ = acked_;
        assign_off_ = 0;
    }
    const uint64_t now = now_ns();
    // Multipath: what is bound and not yet posted (the Striper's `remaining`), and which
    // carrying paths take a piece now.
    uint64_t remaining = 0;
    std::array<bool, kMaxPaths> room{};
    auto has_room = [&](int i) {
        return striper_.carrying(i) && found_[static_cast<size_t>(i)].error == 0 &&
               paths_[i].path->can_post(striper_.room_limit(i));
    };
    if (shared) {
        for (uint64_t s = assign_seq_; s < next_seq_; ++s)
            if (!at(s).held) remaining += at(s).req.size - (s == assign_seq_ ? assign_off_ : 0);
        for (int i = 0; i < kMaxPaths; ++i) room[static_cast<size_t>(i)] = has_room(i);
    }
    unsigned posted = 0;
    while (assign_seq_ < next_seq_) {
        const size_t size = at(assign_seq_).req.size;
        if (at(assign_seq_).held) {
            ++assign_seq_; // seen held: complete, never sent again
            assign_off_ = 0;
            continue;
        }
        int to = active_;
        size_t len = size - assign_off_;
        if (shared) {
            const Striper::Pick pick = striper_.next(len, remaining, room, active_, now);
            if (pick.slot < 0) break; // the paths that should take it are full: later
            to = pick.slot;
            len = pick.len;
            remaining -= len;
        }
        post_locked(to, assign_seq_, assign_off_, len, now);
        if (shared) room[static_cast<size_t>(to)] = has_room(to);
        posted |= 1u << to;
        assign_off_ += len;
        if (assign_off_ >= size) {
            ++assign_seq_;
            assign_off_ = 0;
        }
    }
    return posted;
}

int SendComm::isend(const void *data, size_t size, int tag, MemRegion *mr, Request **out,
                    void *phandle) noexcept
{
    *out = nullptr;
    NetEvents ev;
    int rc;
    {
        Locked g(*this);
        take_port_events_locked(); // nothing is posted to a path whose port went down
        take_events_locked(phandle, &ev);
        rc = isend_locked(data, size, tag, mr, out);
    }
    emit_events(ev, phandle); // NCCL's profiler runs its own code: never under the comm lock
    return rc;
}

int SendComm::isend_locked(const void *data, size_t size, int tag, MemRegion *mr, Request **out) noexcept
{
    if (int e = error_.load(std::memory_order_relaxed)) return e;
    if (peer_closed_) {
        fail_locked(-ECONNRESET, describe() + ": isend after the receiver closed the connection");
        return error_.load(std::memory_order_relaxed);
    }
    if (size > kMaxMessageBytes) {
        VLOG_WARN("isend of %zu bytes exceeds the %llu-byte message limit (%s)", size,
                  static_cast<unsigned long long>(kMaxMessageBytes), describe().c_str());
        return -EMSGSIZE;
    }
    // Only what NCCL's IB transport does here (read its FIFO slot, post): CTS groups that
    // arrived since the last pass wait in a socket over TCP, and NCCL retries a NULL isend at
    // once, testing nothing while nothing is in flight. What the pass finds (a failed path)
    // is acted on, and wait accounting, meters and watchdogs run, in test() and the engine's
    // tick.
    if (cts_head_ == cts_next_) move_locked(now_ns());
    if (!ring_free_locked() && !(grow_ring_locked() && ring_free_locked())) return 0;
    int entry = -1;
    if (int rc = match_locked(tag, size, &entry); rc != 0 || entry < 0) return rc;
    Request &r = bind_locked(data, size, tag, mr, entry);
    ++next_seq_;
    // Posts it (with no live path, or while failback drains the backup, it waits in the ring
    // and the switch replays it); a TCP path's post() queues the frames its progress() writes.
    move_locked(now_ns());
    *out = &r;
    return 0;
}

bool SendComm::ring_free_locked() const noexcept
{
    // A ring slot is reused only when it is acked *and* no path still reads it (a stream can
    // be mid-frame on a message the receiver already completed from another path).
    uint64_t floor = acked_;
    for (const PathSlot &sl : paths_)
        if (sl.alive()) floor = std::min(floor, sl.path->oldest_referenced());
    if (next_seq_ - floor >= ring_.size()) return false;
    // ... and NCCL has tested its request.
    return at(next_seq_).req.state.load(std::memory_order_acquire) == Request::kFree;
}

bool SendComm::grow_ring_locked() noexcept
{
    const size_t n = ring_.size(), mask = 2 * n - 1;
    if (n >= static_cast<size_t>(kMaxInflight)) return false;
    try {
        auto fresh = std::make_unique<RingSlot[]>(n);
        std::vector<RingSlot *> next(2 * n, nullptr), spare;
        spare.reserve(2 * n);
        // A bound slot holds the newest seq bound there, congruent to its place modulo n:
        // theirs are distinct modulo 2n. Unbound slots and the fresh ones fill the rest.
        for (RingSlot *rs : ring_) {
            if (rs->req.comm != nullptr) next[rs->req.seq & mask] = rs;
            else spare.push_back(rs);
        }
        for (size_t i = 0; i < n; ++i) spare.push_back(&fresh[i]);
        size_t k = 0;
        for (RingSlot *&rs : next)
            if (rs == nullptr) rs = spare[k++];
        ring_store_.push_back(std::move(fresh)); // reserved: never throws
        ring_ = std::move(next);
        return true;
    } catch (...) {
        return false;
    }
}

int SendComm::match_locked(int tag, size_t size, int *entry) noexcept
{
    *entry = -1;
    if (cts_head_ == cts_next_) {
        ++stats_.null_for_cts;
        cts_wanted_ = true;
        return 0; // the receiver has not posted a receive for it yet
    }
    const CtsGroup &grp = cts_at(cts_head_);
    int e = -1;
    for (int k = 0; k < grp.n && e < 0; ++k)
        if (!head_bound_[static_cast<size_t>(k)] && grp.entries[static_cast<size_t>(k)].tag == tag) e = k;
    if (e < 0) {
        // Tags select a buffer only within the oldest group (NCCL's net plugin contract): this
        // send belongs after the sends that complete it.
        ++stats_.null_for_cts;
        cts_wanted_ = true;
        return 0;
    }
    const CtsEntry &dest = grp.entries[static_cast<size_t>(e)];
    if (size > dest.size) {
        VLOG_WARN("isend of %zu bytes with tag %d: the receiver posted a %llu-byte buffer for it "
                  "(group %llu, buffer %d); nothing sent (%s)", size, tag,
                  static_cast<unsigned long long>(dest.size),
                  static_cast<unsigned long long>(grp.index), e, describe().c_str());
        return -EMSGSIZE;
    }
    *entry = e;
    return 0;
}

Request &SendComm::bind_locked(const void *data, size_t size, int tag, MemRegion *mr, int entry) noexcept
{
    const CtsGroup &grp = cts_at(cts_head_);
    head_bound_[static_cast<size_t>(entry)] = true;
    cts_wanted_ = false;
    RingSlot &rs = at(next_seq_);
    SendMsg &m = rs.msg;
    m.data = static_cast<const uint8_t *>(data);
    m.mr = mr;
    if (mr != nullptr) mr->ref();
    m.tag = tag;
    m.group = grp.index;
    m.entry = entry;
    m.dest = grp.entries[static_cast<size_t>(entry)];
    m.landed = 0;
    m.landed_gen = 0;
    Request &r = rs.req;
    r.is_send = true;
    r.comm = this;
    r.seq = next_seq_;
    r.size = size;
    r.state.store(Request::kPending, std::memory_order_relaxed);
    if (--head_unbound_ == 0 && ++cts_head_ < cts_next_) {
        head_bound_ = {};
        head_unbound_ = cts_at(cts_head_).n;
    }
    return r;
}

void SendComm::SlotSink::acked(uint64_t seq)
{
    comm->on_acked(seq);
}

int SendComm::SlotSink::cts(const CtsGroup &g)
{
    return comm->on_cts(slot, g);
}

void SendComm::SlotSink::held(uint64_t seq)
{
    comm->on_held(seq);
}

void SendComm::SlotSink::landed(uint64_t seq, uint64_t len, uint32_t gen, uint64_t late_ns)
{
    comm->on_landed(slot, seq, len, gen, late_ns);
}

void SendComm::on_landed(int slot, uint64_t seq, uint64_t len, uint32_t gen, uint64_t late_ns) noexcept
{
    // An older generation's pieces do not count: the switch replays the message whole.
    if (gen != gen_ || seq < acked_ || seq < ack_seen_ || seq >= next_seq_ ||
        at(seq).held)
        return;
    SendMsg &m = at(seq).msg;
    // The slot's share ends in its meter once its pieces landed (a later piece of the message
    // on it opens a new operation); first, as landing may complete the message.
    share_landed_locked(m, slot, len, now_ns(), late_ns);
    if (m.landed_gen != gen) {
        m.landed_gen = gen;
        m.landed = 0;
    }
    m.landed += len;
    if (m.landed >= at(seq).req.size) on_held(seq);
}

void SendComm::on_acked(uint64_t seq) noexcept
{
    ack_seen_ = std::max(ack_seen_, seq);
}

void SendComm::on_held(uint64_t seq) noexcept
{
    if (seq >= next_seq_) {
        VLOG_WARN("host %s: %s: the receiver reports holding seq %llu, beyond the last sent %llu",
                  host_name(), describe().c_str(), static_cast<unsigned long long>(seq),
                  static_cast<unsigned long long>(next_seq_));
        cts_error_ = -EPROTO;
        return;
    }
    if (seq < acked_ || seq < ack_seen_ || at(seq).held) return;
    at(seq).held = true;
    complete_one_locked(seq, now_ns());
}

void SendComm::complete_one_locked(uint64_t seq, uint64_t now) noexcept
{
    RingSlot &rs = at(seq);
    SendMsg &m = rs.msg;
    for (int k = 0; k < kMaxPaths; ++k) // every path still carrying pieces of it: they landed
        share_landed_locked(m, k, ~0ull, now);
    MemRegion::unref(m.mr);
    m.mr = nullptr;
    rs.req.state.store(Request::kDone, std::memory_order_release);
}

int SendComm::on_cts(int slot, const CtsGroup &g) noexcept
{
    auto bad = [&](const char *why) {
        VLOG_WARN("host %s: %s: CTS group %llu from the receiver %s", host_name(),
                  paths_[slot].desc.c_str(), static_cast<unsigned long long>(g.index), why);
        cts_error_ = -EPROTO;
        return -EPROTO;
    };
    if (g.n < 1 || g.n > kMaxRecvs) return bad("has a bad buffer count");
    if (g.index < cts_next_) {
        // Every path carries every group: a repeat of one another path delivered.
        ++stats_.cts_duplicates;
        if (g.index >= cts_head_) {
            const CtsGroup &known = cts_at(g.index);
            if (known.first_seq != g.first_seq || known.n != g.n)
                return bad("differs from the same group received on another path");
        }
        return 0;
    }
    if (g.index > cts_next_) return bad("arrived before the groups preceding it");
    if (g.first_seq != cts_next_first_seq_) return bad("starts at an unexpected sequence number");
    if (cts_next_ - cts_head_ >= static_cast<uint64_t>(kMaxCtsGroups))
        return bad("exceeds the groups the receiver can have outstanding");
    // The ring doubles (to kMaxCtsGroups) while full, each known group moving to its index's
    // place.
    if (cts_next_ - cts_head_ >= cts_.size() &&
        !cts_.grow(cts_head_, cts_next_, static_cast<size_t>(kMaxCtsGroups))) {
        VLOG_WARN("host %s: %s: out of memory for CTS group %llu", host_name(),
                  paths_[slot].desc.c_str(), static_cast<unsigned long long>(g.index));
        cts_error_ = -ENOMEM;
        return -ENOMEM;
    }
    for (int k = 0; k < g.n; ++k)
        if (g.entries[static_cast<size_t>(k)].size > kMaxMessageBytes)
            return bad("has a buffer beyond the message size limit");
    cts_at(g.index) = g;
    if (cts_head_ == cts_next_) {
        head_bound_ = {};
        head_unbound_ = g.n;
    }
    ++cts_next_;
    cts_next_first_seq_ = g.first_seq + static_cast<uint64_t>(g.n);
    ++stats_.cts_groups;
    return 0;
}

void SendComm::complete_acked_locked(uint64_t now) noexcept
{
    if (ack_seen_ > next_seq_) {
        fail_locked(-EPROTO, describe() + ": ack for seq " + std::to_string(ack_seen_) +
                                 " beyond the last sent " + std::to_string(next_seq_));
        return;
    }
    // Messages held individually ahead of the ack extend it when they are contiguous.
    uint64_t to = std::max(ack_seen_, acked_);
    while (to < next_seq_ && at(to).held) ++to;
    if (to <= acked_) return;
    for (uint64_t s = acked_; s < to; ++s) {
        bool &h = at(s).held;
        if (!h) complete_one_locked(s, now);
        h = false;
    }
    acked_ = ack_seen_ = to;
    for (PathSlot &sl : paths_)
        if (sl.alive()) sl.path->skip_to(acked_);
    if (failover_timing_ && acked_ >= failover_probe_seq_) {
        failover_timing_ = false;
        VLOG_INFO(NCCL_NET, "host %s: first replayed message acknowledged %.1f us after the "
                  "failure was detected (generation %u, detected at monotonic %.6f s, acked at "
                  "%.6f s)", host_name(), static_cast<double>(since(now, failover_t0_ns_)) / 1e3,
                  gen_, static_cast<double>(failover_t0_ns_) / 1e9, static_cast<double>(now) / 1e9);
    }
}

SendComm::Outstanding SendComm::abandon_locked(int slot, uint64_t now) noexcept
{
    Outstanding o;
    uint64_t unlanded = 0;
    for (uint64_t s = acked_; s < next_seq_; ++s) {
        SendMsg::Share &sh = at(s).msg.shares[static_cast<size_t>(slot)];
        if (!sh.open) continue;
        ++o.msgs;
        o.bytes += sh.bytes;
        unlanded += sh.bytes - sh.landed;
        striper_.on_dropped(slot, sh.bytes - sh.landed);
        sh = SendMsg::Share{};
    }
    if (PathTelemetry *tm = paths_[slot].tm.get(); tm != nullptr && o.msgs > 0)
        tm->meter.on_abandon(now, o.msgs, unlanded); // what landed already left its count
    return o;
}

void SendComm::receiver_closed_locked() noexcept
{
    if (peer_closed_) return;
    // Acks that arrived with the goodbye count: the close is judged on what the receiver holds.
    complete_acked_locked(now_ns());
    peer_closed_ = true;
    for (int i = 0; i < kMaxPaths; ++i) {
        PathSlot &sl = paths_[i];
        if (!sl.alive()) continue;
        set_state_locked(i, SlotState::kDead);
        watch(*sl.path, false);
    }
    draining_ = false;
    if (acked_ < next_seq_)
        fail_locked(-ECONNRESET, describe() + ": the receiver closed the connection with " +
                                     std::to_string(next_seq_ - acked_) +
                                     " sends unacknowledged (seq " + std::to_string(acked_) + ".." +
                                     std::to_string(next_seq_ - 1) + "); they fail now");
    else
        VLOG_INFO(NCCL_NET, "host %s: %s: the receiver closed the connection", host_name(),
                  describe().c_str());
}

void SendComm::rearm_locked(bool arm) noexcept
{
    for (PathSlot &sl : paths_)
        if (sl.alive()) sl.path->rearm(arm);
}

void SendComm::goodbye_locked() noexcept
{
    for (PathSlot &sl : paths_)
        if (sl.alive()) sl.path->goodbye();
}

void SendComm::progress_path_locked(int i, uint64_t now) noexcept
{
    PathSlot &s = paths_[i];
    PathStatus st = s.path->progress(s.sink);
    if (st.wait_ack != 0) ack_wait_locked(i, st, now);
    if (st.heard) {
        s.last_heard_ns = now;
        if (s.pair) s.pair->heard(now);
    }
    if (cts_error_ != 0 && st.error == 0) {
        st.error = cts_error_;
        st.fatal = true;
        st.detail = "the receiver's CTS contradicts the protocol";
    }
    if (needs_action(st) && !needs_action(found_[static_cast<size_t>(i)]))
        found_[static_cast<size_t>(i)] = std::move(st);
}

bool SendComm::move_locked(uint64_t now) noexcept
{
    // A path whose last pass found something to act on is left alone until it is acted on.
    auto pass = [&](int i) {
        if (paths_[i].alive() && !needs_action(found_[static_cast<size_t>(i)]))
            progress_path_locked(i, now);
    };
    bool posted_any = distribute_locked() != 0;
    for (int i = 0; i < kMaxPaths; ++i) pass(i);
    // Multipath: paths whose pieces landed take the next ones, and write them now (a socket
    // with room left signals nothing more). Bounded: each round fills the paths' room.
    for (int round = 0; round < 4; ++round) {
        const unsigned posted = distribute_locked();
        if (posted == 0) break;
        posted_any = true;
        for (int i = 0; i < kMaxPaths; ++i)
            if ((posted >> i & 1) != 0) pass(i);
    }
    return posted_any;
}

bool SendComm::act_locked() noexcept
{
    bool changed = false;
    for (int i = 0; i < kMaxPaths; ++i) {
        const PathStatus st = std::exchange(found_[static_cast<size_t>(i)], PathStatus{});
        if (!needs_action(st) || !paths_[i].alive() || error_.load(std::memory_order_relaxed) != 0)
            continue;
        changed = true;
        if (st.error != 0 && st.fatal) {
            // A protection or access error, or a peer breaking the protocol: another path
            // would meet the same.
            fail_locked(st.error, paths_[i].desc + ": " + st.detail);
        } else if (st.error != 0) {
            failover_locked(i, st.detail + " (" + strerror(-st.error) + ")");
        } else if (st.peer_closed) {
            receiver_closed_locked();
        } else if (st.failed_slot < kMaxPaths && static_cast<int>(st.failed_slot) != i &&
                   paths_[st.failed_slot].alive()) {
            failover_locked(static_cast<int>(st.failed_slot), "the receiver saw its port fail");
        } else {
            changed = false;
        }
    }
    return changed;
}

void SendComm::progress_locked() noexcept
{
    take_port_events_locked();
    // One clock read per call unless something was posted or a path changed state: a caller
    // spinning on test() calls this in a tight loop.
    const uint64_t now = now_ns();
    bool changed = move_locked(now);
    if (act_locked()) {
        changed = true;
        // The switch posted its replay: write it now, not at the next call.
        if (error_.load(std::memory_order_relaxed) == 0) move_locked(now_ns());
        act_locked();
    }
    if (error_.load(std::memory_order_relaxed) != 0) return;
    // Posts and switches above stamped times after `now`: the timers below must not run
    // backwards.
    const uint64_t later = changed ? now_ns() : now;
    complete_acked_locked(later);
    if (error_.load(std::memory_order_relaxed) != 0) return;
    account_wait_locked(later);
    for (PathSlot &sl : paths_)
        if (sl.tm) sl.tm->meter.advance(later);
    if (!peer_closed_) watchdogs_locked(later);
}

} // namespace vigil::net
