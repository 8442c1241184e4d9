// SPDX-License-Identifier: Apache-2.0
// sendComm requests: CTS matching (a send binds to an entry with its tag in the oldest
// advertised group, as NCCL's IB transport matches its FIFO), dense sequence numbers,
// completion on the receiver's cumulative ack.
#include "send_comm.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "clock.h"
#include "log.h"

namespace vigil::net {
namespace {

// Striped paths that carry (Active or Shared), per local device of this process: the paths
// that share a port's queue bound (has_room_locked). Devices beyond the table are not counted.
constexpr int kCountedDevs = 64;
std::array<std::atomic<int>, kCountedDevs> g_carriers{};

} // namespace

SendComm::SendComm(SendPaths paths, const std::array<int, kMaxPaths> &devs,
                   const FailoverConfig &cfg, const TelemetryConfig &tcfg)
    : Comm(devs), cfg_(cfg), tcfg_(tcfg), rebuilder_(std::move(paths.rebuilder))
{
    const uint64_t now = now_ns();
    for (int i = 0; i < kMaxPaths; ++i) {
        PathSlot &sl = paths_[i];
        sl.sink.comm = this;
        sl.sink.slot = i;
        sl.backoff_ns = cfg_.rebuild_backoff_min_ns;
        if (!paths.paths[i]) continue;
        sl.path = std::move(paths.paths[i]);
        sl.desc = sl.path->identity().describe();
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
    for (uint64_t s = acked_; s < next_seq_; ++s) MemRegion::unref(msgs_[s % kMaxInflight].mr);
    for (int i = 0; i < kMaxPaths; ++i) set_state_locked(i, SlotState::kDead);
}

void SendComm::set_state_locked(int i, SlotState s) noexcept
{
    PathSlot &sl = paths_[i];
    sl.state = s;
    const bool carrying = s == SlotState::kActive || s == SlotState::kShared;
    if (carrying && sl.counted_dev < 0 && cfg_.multipath && sl.path && sl.path->stripes()) {
        const int dev = sl.path->identity().dev;
        if (dev >= 0 && dev < kCountedDevs) {
            sl.counted_dev = dev;
            g_carriers[static_cast<size_t>(dev)].fetch_add(1, std::memory_order_relaxed);
        }
    } else if (!carrying && sl.counted_dev >= 0) {
        g_carriers[static_cast<size_t>(sl.counted_dev)].fetch_sub(1, std::memory_order_relaxed);
        sl.counted_dev = -1;
    }
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
        if (held_[s % kMaxInflight]) continue;
        ++o.msgs;
        o.bytes += reqs_[s % kMaxInflight].size;
    }
    return o;
}

void SendComm::post_locked(int slot, uint64_t seq, size_t off, size_t len) noexcept
{
    const size_t i = seq % kMaxInflight;
    SendMsg &m = msgs_[i];
    const uint64_t now = now_ns();
    m.posted_ns = now;
    PathSlot &sl = paths_[slot];
    if ((m.on_slots >> slot & 1) == 0) {
        m.slot_posted_ns[static_cast<size_t>(slot)] = now;
        if (PathTelemetry *tm = sl.tm.get()) tm->meter.on_post(now, len);
    } else if (PathTelemetry *tm = sl.tm.get()) {
        tm->meter.on_more(now, len);
    }
    m.on_slots = static_cast<uint8_t>(m.on_slots | 1u << slot);
    m.slot_bytes[static_cast<size_t>(slot)] += len;
    OutMessage out{seq, m.tag, m.data, reqs_[i].size, off, len, m.mr, m.group, m.entry, m.dest};
    sl.path->post(out);
    if (slot != active_) ++stats_.pieces;
}

bool SendComm::striping() const noexcept
{
    if (!cfg_.multipath) return false;
    for (const PathSlot &sl : paths_)
        if (sl.path && !sl.path->stripes()) return false;
    return true;
}

bool SendComm::has_room_locked(int i, bool sockets) const noexcept
{
    const PathSlot &sl = paths_[i];
    const SendPath &p = *sl.path;
    if (!p.can_post()) return false;
    const uint64_t queued = p.backlog();
    if (queued >= 2 * cfg_.piece_bytes) return false;
    if (!sockets) return true;
    // The port's bound of about four pieces, divided among the striped paths carrying on it
    // (at least two pieces each up to two paths, never below half a piece).
    uint64_t limit = 2 * cfg_.piece_bytes;
    const int n = sl.counted_dev >= 0 ? g_carriers[static_cast<size_t>(sl.counted_dev)].load(std::memory_order_relaxed) : 0;
    if (n > 2) limit = std::max<uint64_t>(cfg_.piece_bytes / 2, 4 * cfg_.piece_bytes / static_cast<uint64_t>(n));
    return queued + p.unsent() < limit;
}

unsigned SendComm::distribute_locked() noexcept
{
    if (paths_[active_].state != SlotState::kActive || draining_) return 0;
    int shared = -1;
    for (int i = 0; i < kMaxPaths; ++i)
        if (paths_[i].state == SlotState::kShared) shared = i;
    if (assign_seq_ < acked_) { // acked from an older generation's copy: its slot may be reused
        assign_seq_ = acked_;
        assign_off_ = 0;
    }
    unsigned posted = 0;
    while (assign_seq_ < next_seq_) {
        const size_t size = reqs_[assign_seq_ % kMaxInflight].size;
        if (held_[assign_seq_ % kMaxInflight]) {
            ++assign_seq_; // seen held: complete, never sent again
            assign_off_ = 0;
            continue;
        }
        int to = active_;
        size_t len = size - assign_off_;
        if (shared >= 0) {
            // Pieces, each to the first carrying path whose queue has room: the active path
            // first, so a message that fits one piece takes the path a standby set-up would.
            // A whole piece also counts the sockets' unsent bytes: without them a slow port's
            // socket buffer holds megabytes that drain after the fast path finished its share.
            len = std::min<size_t>(len, cfg_.piece_bytes);
            const bool whole = len == cfg_.piece_bytes;
            if (!has_room_locked(active_, whole)) {
                if (!has_room_locked(shared, whole)) break;
                to = shared;
            }
        }
        post_locked(to, assign_seq_, assign_off_, len);
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
    // once, testing nothing while nothing is in flight. Completions, wait accounting, meters
    // and watchdogs are test()'s and the engine tick's.
    bool changed = false;
    if (cts_head_ == cts_next_) {
        move_locked(now_ns(), &carried_waits_, &changed);
        if (int e = error_.load(std::memory_order_relaxed)) return e;
    }
    if (!ring_free_locked()) return 0;
    int entry = -1;
    if (int rc = match_locked(tag, size, &entry); rc != 0 || entry < 0) return rc;
    Request &r = bind_locked(data, size, tag, mr, entry);
    ++next_seq_;
    // Posts it (with no live path, or while failback drains the backup, it waits in the ring
    // and the switch replays it); a TCP path's post() queues the frames its progress() writes.
    move_locked(now_ns(), &carried_waits_, &changed);
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
    if (next_seq_ - floor >= kMaxInflight) return false;
    // ... and NCCL has tested its request.
    return reqs_[next_seq_ % kMaxInflight].state.load(std::memory_order_acquire) == Request::kFree;
}

int SendComm::match_locked(int tag, size_t size, int *entry) noexcept
{
    *entry = -1;
    if (cts_head_ == cts_next_) {
        ++stats_.null_for_cts;
        cts_wanted_ = true;
        return 0; // the receiver has not posted a receive for it yet
    }
    const CtsGroup &grp = cts_[cts_head_ % kMaxCtsGroups];
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
    const CtsGroup &grp = cts_[cts_head_ % kMaxCtsGroups];
    head_bound_[static_cast<size_t>(entry)] = true;
    cts_wanted_ = false;
    const size_t i = next_seq_ % kMaxInflight;
    SendMsg &m = msgs_[i];
    m.data = static_cast<const uint8_t *>(data);
    m.mr = mr;
    if (mr != nullptr) mr->ref();
    m.tag = tag;
    m.group = grp.index;
    m.entry = entry;
    m.dest = grp.entries[static_cast<size_t>(entry)];
    m.landed = 0;
    m.landed_gen = 0;
    Request &r = reqs_[i];
    r.is_send = true;
    r.comm = this;
    r.seq = next_seq_;
    r.size = size;
    r.state.store(Request::kPending, std::memory_order_relaxed);
    if (--head_unbound_ == 0 && ++cts_head_ < cts_next_) {
        head_bound_ = {};
        head_unbound_ = cts_[cts_head_ % kMaxCtsGroups].n;
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

void SendComm::SlotSink::landed(uint64_t seq, uint64_t len, uint32_t gen)
{
    comm->on_landed(slot, seq, len, gen);
}

void SendComm::on_landed(int slot, uint64_t seq, uint64_t len, uint32_t gen) noexcept
{
    // An older generation's pieces do not count: the switch replays the message whole.
    if (gen != gen_ || seq < acked_ || seq < ack_seen_ || seq >= next_seq_ ||
        held_[seq % kMaxInflight])
        return;
    SendMsg &m = msgs_[seq % kMaxInflight];
    // The slot's share ends in its meter once its pieces landed (a later piece of the message
    // on it opens a new operation); first, as landing may complete the message.
    const size_t k = static_cast<size_t>(slot);
    if ((m.on_slots >> slot & 1) != 0 && (m.slot_landed[k] += len) >= m.slot_bytes[k]) {
        if (PathTelemetry *tm = paths_[slot].tm.get())
            tm->meter.on_complete(now_ns(), m.slot_posted_ns[k], m.slot_bytes[k]);
        m.drop_share(slot);
    }
    if (m.landed_gen != gen) {
        m.landed_gen = gen;
        m.landed = 0;
    }
    m.landed += len;
    if (m.landed >= reqs_[seq % kMaxInflight].size) on_held(seq);
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
    if (seq < acked_ || seq < ack_seen_ || held_[seq % kMaxInflight]) return;
    held_[seq % kMaxInflight] = true;
    complete_one_locked(seq, now_ns());
}

void SendComm::complete_one_locked(uint64_t seq, uint64_t now) noexcept
{
    const size_t i = seq % kMaxInflight;
    SendMsg &m = msgs_[i];
    for (int k = 0; k < kMaxPaths; ++k) // every path that carried pieces of it, with its bytes
        if ((m.on_slots >> k & 1) != 0)
            if (PathTelemetry *tm = paths_[k].tm.get())
                tm->meter.on_complete(now, m.posted_ns, m.slot_bytes[static_cast<size_t>(k)]);
    m.on_slots = 0;
    m.slot_bytes = {};
    m.slot_landed = {};
    MemRegion::unref(msgs_[i].mr);
    msgs_[i].mr = nullptr;
    reqs_[i].state.store(Request::kDone, std::memory_order_release);
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
            const CtsGroup &known = cts_[g.index % kMaxCtsGroups];
            if (known.first_seq != g.first_seq || known.n != g.n)
                return bad("differs from the same group received on another path");
        }
        return 0;
    }
    if (g.index > cts_next_) return bad("arrived before the groups preceding it");
    if (g.first_seq != cts_next_first_seq_) return bad("starts at an unexpected sequence number");
    if (cts_next_ - cts_head_ >= static_cast<uint64_t>(kMaxCtsGroups))
        return bad("exceeds the groups the receiver can have outstanding");
    for (int k = 0; k < g.n; ++k)
        if (g.entries[static_cast<size_t>(k)].size > kMaxMessageBytes)
            return bad("has a buffer beyond the message size limit");
    cts_[g.index % kMaxCtsGroups] = g;
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
    while (to < next_seq_ && held_[to % kMaxInflight]) ++to;
    if (to <= acked_) return;
    for (uint64_t s = acked_; s < to; ++s) {
        bool &h = held_[s % kMaxInflight];
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
    for (uint64_t s = acked_; s < next_seq_; ++s) {
        SendMsg &m = msgs_[s % kMaxInflight];
        if ((m.on_slots >> slot & 1) == 0) continue;
        ++o.msgs;
        o.bytes += m.slot_bytes[static_cast<size_t>(slot)];
        m.drop_share(slot);
    }
    if (PathTelemetry *tm = paths_[slot].tm.get(); tm != nullptr && o.msgs > 0)
        tm->meter.on_abandon(now, o.msgs, o.bytes);
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

bool SendComm::progress_path_locked(int i, uint64_t now, WaitReport *waits, bool *changed) noexcept
{
    PathSlot &s = paths_[i];
    PathStatus st = s.path->progress(s.sink);
    waits->note(st);
    if (st.heard) s.last_heard_ns = now;
    if (cts_error_ != 0) {
        fail_locked(cts_error_, s.desc + ": the receiver's CTS contradicts the protocol");
        return false;
    }
    if (st.error != 0 && st.fatal) {
        // A protection or access error, or a peer breaking the protocol: another path would
        // meet the same.
        fail_locked(st.error, s.desc + ": " + st.detail);
        return false;
    }
    if (st.error != 0) {
        failover_locked(i, st.detail + " (" + strerror(-st.error) + ")");
        *changed = true;
    } else if (st.peer_closed) {
        receiver_closed_locked();
        *changed = true;
    } else if (st.failover_requested && st.failed_slot < kMaxPaths &&
               static_cast<int>(st.failed_slot) != i && paths_[st.failed_slot].alive()) {
        failover_locked(static_cast<int>(st.failed_slot), "the receiver saw its port fail");
        *changed = true;
    }
    return true;
}

bool SendComm::move_locked(uint64_t now, WaitReport *waits, bool *changed) noexcept
{
    // Posting stamps its own times (after `now`): so do the timers after this then.
    if (distribute_locked() != 0) *changed = true;
    for (int i = 0; i < kMaxPaths; ++i)
        if (paths_[i].alive() && !progress_path_locked(i, now, waits, changed)) return false;
    // Multipath: paths that drained their queue take the next pieces, and write them now (a
    // socket with room left signals nothing more). Bounded: each round fills the queues.
    for (int round = 0; round < 4; ++round) {
        const unsigned posted = distribute_locked();
        if (posted == 0) break;
        *changed = true;
        for (int i = 0; i < kMaxPaths; ++i)
            if ((posted >> i & 1) != 0 && paths_[i].alive() &&
                !progress_path_locked(i, now, waits, changed))
                return false;
    }
    return true;
}

void SendComm::progress_locked() noexcept
{
    // One clock read per call unless a path changed state: a caller spinning on test() calls
    // this in a tight loop.
    const uint64_t now = now_ns();
    bool changed = false;
    WaitReport waits = std::exchange(carried_waits_, WaitReport{});
    if (!move_locked(now, &waits, &changed)) return;
    // A failover or a post above stamped times after `now`: the timers below must not run
    // backwards.
    const uint64_t later = changed ? now_ns() : now;
    complete_acked_locked(later);
    if (error_.load(std::memory_order_relaxed) != 0) return;
    account_wait_locked(waits, later);
    for (PathSlot &sl : paths_)
        if (sl.tm) sl.tm->meter.advance(later);
    if (!peer_closed_) watchdogs_locked(later);
}

} // namespace vigil::net
