// SPDX-License-Identifier: Apache-2.0
// The receiving side's failover state machine (recv_comm.h): generations, the paths a
// sender's notice fences, local port failures, paths the sender rebuilt, and the verdict on
// the connection. What the paths' sinks queue is applied here, after their calls return.
#include "recv_comm.h"

#include <cerrno>
#include <cstring>

#include "clock.h"
#include "log.h"
#include "telemetry/writer.h"

namespace vigil::net {
namespace {

// A port event (here, or at the sender: its generation notice) loses a path of every
// connection on it at once: the first lines in a window are WARNs, the rest INFO.
log::Burst g_paths_lost("receive paths lost");

} // namespace

// ---- Generations ------------------------------------------------------------------------------

void RecvComm::SlotSink::generation(uint32_t gen, uint64_t /*first_seq*/, int abandoned,
                                    uint64_t abandoned_id)
{
    // This comm's own state at once, so the frames that follow on this path are judged by
    // the newest generation; the fence, the drain and the answer touch other paths and wait
    // for settle_locked().
    if (gen > comm->gen_) comm->adopt_generation_locked(slot, gen);
    // A notice overtaken by a later switch fences nothing (the later one names what to).
    const bool current = gen >= comm->gen_;
    comm->notices_.push_back(Notice{slot, gen, current ? abandoned : -1, abandoned_id});
}

void RecvComm::adopt_generation_locked(int slot, uint32_t gen) noexcept
{
    // The sender switched paths and replays every message it has not seen held, whole: each
    // restarts its count on its first bytes of this generation (RecvComm::restart_count_locked).
    gen_ = gen;
    const uint64_t now = now_ns();
    // The other paths show standby until pieces of this generation land on them (multipath).
    for (int i = 0; i < kMaxPaths; ++i) {
        PathSlot &p = paths_[i];
        if (i != slot && (i == active_path_ || p.carrying) && p.live() && p.tm)
            p.tm->meter.set_state(now, telemetry::kStandby, gen_);
        p.carrying = false;
    }
    active_path_ = slot;
    if (PathTelemetry *tm = paths_[slot].tm.get()) tm->meter.set_state(now, telemetry::kActive, gen_);
}

void RecvComm::settle_locked() noexcept
{
    // Index loop: nothing below reports a notice (drain() and fence() leave control
    // messages to the next progress()), but the vector is this comm's and stays valid.
    for (size_t k = 0; k < notices_.size(); ++k) {
        const Notice n = notices_[k];
        const int a = n.abandoned;
        // A notice that lagged behind a rebuild names the path the slot held then, not this
        // one. Otherwise the sender left that path after a failure and replays its messages
        // on the notice's path: whatever the old path still carries must never reach a
        // buffer again (an RDMA write cannot be discarded once it lands); losing it fences it.
        if (a >= 0 && a < kMaxPaths && a != n.slot && paths_[a].live() &&
            (n.abandoned_id == 0 || paths_[a].path->identity().id == n.abandoned_id))
            lose_path_locked(a, "the sender left it (generation " + std::to_string(n.gen) + ")",
                             RecvSlotState::kLost);
        // Writes that landed on another path (a backup left at failback, idle at the sender
        // but not yet polled here) count before the answer: the sender must not write them
        // again.
        drain_others_locked(n.slot);
        if (paths_[n.slot].live()) paths_[n.slot].path->answer(n.gen, holding_locked());
    }
    notices_.clear();
    if (ack_due_) {
        ack_due_ = false;
        for (PathSlot &p : paths_)
            if (p.live()) p.path->ack(floor_, gen_);
    }
}

void RecvComm::drain_others_locked(int except) noexcept
{
    for (int i = 0; i < kMaxPaths; ++i)
        if (i != except && paths_[i].live()) paths_[i].path->drain(paths_[i].sink);
}

// ---- Paths ------------------------------------------------------------------------------------

void RecvComm::fail_path(int slot, const std::string &cause) noexcept
{
    Locked g(*this);
    if (slot < 0 || slot >= kMaxPaths || !paths_[slot].live()) return;
    for (int i = 0; i < kMaxPaths; ++i)
        if (i != slot && paths_[i].live()) paths_[i].path->request_failover(static_cast<uint32_t>(slot));
    lose_path_locked(slot, cause, RecvSlotState::kLost);
    progress_locked();
}

void RecvComm::port_down(int dev, const std::string &cause) noexcept
{
    Locked g(*this);
    port_down_locked(dev, cause);
    progress_locked();
}

void RecvComm::port_down_locked(int dev, const std::string &cause) noexcept
{
    for (int slot = 0; slot < kMaxPaths; ++slot) {
        if (!paths_[slot].live() || paths_[slot].path->identity().dev != dev) continue;
        for (int i = 0; i < kMaxPaths; ++i)
            if (i != slot && paths_[i].live() && paths_[i].path->identity().dev != dev)
                paths_[i].path->request_failover(static_cast<uint32_t>(slot));
        lose_path_locked(slot, cause, RecvSlotState::kLost);
    }
}

void RecvComm::lose_path_locked(int i, const std::string &why, RecvSlotState to) noexcept
{
    PathSlot &p = paths_[i];
    p.state = to;
    // Nothing of this path may land after this; what landed before still counts (through
    // the sink: acks it makes due go out in settle_locked()).
    p.path->fence(p.sink);
    if (p.tm) p.tm->meter.set_state(now_ns(), telemetry::kDead, gen_);
    watch(*p.path, false);
    bool any = false;
    for (const PathSlot &s : paths_) any = any || s.live();
    if (to == RecvSlotState::kClosed) {
        peer_closed_ = true;
    } else {
        telemetry::record_event(telemetry::EventType::kPathLost, p.desc + ": " + why);
        VLOG_BURST(g_paths_lost, "host %s: path lost: %s: %s%s", host_name(), p.desc.c_str(), why.c_str(),
                   any ? "; the connection goes on over its other path" : "; no path left");
    }
    if (!any) no_path_since_ns_ = now_ns();
}

void RecvComm::accept_rebuilt_locked(uint64_t now) noexcept
{
    if (!acceptor_ || now < next_accept_poll_ns_) return;
    // Paths the sender rebuilt (failback, a lost backup), polled at the engine's tick rate.
    next_accept_poll_ns_ = now + ProgressEngine::kTickNs;
    std::unique_ptr<RecvPath> np;
    acceptor_->poll(&np);
    if (!np) return;
    const int slot = np->identity().slot;
    if (slot < 0 || slot >= kMaxPaths) return;
    PathSlot &ps = paths_[slot];
    // The sender gave up the path this one replaces, whatever this side has seen of that.
    if (ps.live()) lose_path_locked(slot, "replaced by a path the sender rebuilt", RecvSlotState::kLost);
    ps.path = std::move(np);
    watch(*ps.path, true);
    ps.desc = ps.path->identity().describe();
    ps.pair = pair_of(ps.path->identity());
    ps.tm.reset();
    ps.tm = PathTelemetry::make(tcfg_, Direction::kRecv, ps.path->identity(), this);
    if (ps.tm) ps.tm->meter.set_state(now, telemetry::kStandby, gen_);
    ps.state = RecvSlotState::kLive;
    ps.last_heard_ns = ps.last_beat_ns = now;
    ps.path->ack(floor_, gen_);
    readvertise_locked(slot);
    VLOG_INFO(NCCL_NET, "host %s: path rebuilt by the peer: %s", host_name(), ps.desc.c_str());
}

// ---- Verdicts ---------------------------------------------------------------------------------

bool RecvComm::judge_path_locked(int i, const PathStatus &st, uint64_t now) noexcept
{
    PathSlot &p = paths_[i];
    if (st.error != 0 && (st.fatal || st.error == -EMSGSIZE || st.error == -EPROTO)) {
        // The peer broke the protocol: no other path can make this right.
        fail_locked(st.error, p.desc + ": " + st.detail);
        return false;
    }
    if (st.error != 0)
        lose_path_locked(i, st.detail + " (" + strerror(-st.error) + ")",
                         st.peer_eof ? RecvSlotState::kGone : RecvSlotState::kLost);
    else if (st.peer_closed)
        lose_path_locked(i, "closed by the sender", RecvSlotState::kClosed);
    else if (next_post_seq_ > floor_ && since(now, p.heard()) > cfg_.stall_timeout_ns)
        // The sender probes quiet port pairs every probe interval: with receives pending,
        // silence this long means the path's port pair (or the peer) is gone.
        lose_path_locked(i, "silent: nothing heard for " +
                                std::to_string(since(now, p.heard()) / 1000000) +
                                " ms with receives pending", RecvSlotState::kLost);
    return true;
}

void RecvComm::judge_connection_locked(uint64_t now) noexcept
{
    bool any = false, all_gone = true;
    for (const PathSlot &p : paths_) {
        if (p.state == RecvSlotState::kNone) continue;
        any = any || p.live();
        all_gone = all_gone && p.state == RecvSlotState::kGone;
    }
    if (any && !peer_closed_) {
        no_path_since_ns_ = 0;
        return;
    }
    const uint64_t outstanding = next_post_seq_ - floor_;
    if (peer_closed_) {
        // The sender's closeSend: receives it never matched will not be.
        if (outstanding > 0 && !any)
            fail_locked(-ECONNRESET, describe() + ": the sender closed the connection with " +
                                         std::to_string(outstanding) + " receives outstanding");
        return;
    }
    if (outstanding == 0) return;
    if (all_gone)
        fail_locked(-ECONNRESET, describe() + ": every path was closed without a goodbye (the "
                                              "sender's process is gone)");
    else if (since(now, no_path_since_ns_) > cfg_.fatal_timeout_ns)
        fail_locked(-ECONNRESET, describe() + ": no path to the peer for " +
                                     std::to_string(cfg_.fatal_timeout_ns / 1000000) + " ms");
}

} // namespace vigil::net

namespace vigil::net {

bool RecvComm::quiet_locked() const noexcept
{
    if (next_post_seq_ != floor_ || flushes_pending_ != 0) return false;
    // A lost path waits for the sender's rebuild: its acceptor is polled by the timer.
    for (const PathSlot &p : paths_)
        if (p.state != RecvSlotState::kNone && !p.live() && !peer_closed_) return false;
    return true;
}

int RecvComm::pair_uses_locked(std::array<PairUse, kMaxPaths> *out) const noexcept
{
    int n = 0;
    for (const PathSlot &p : paths_)
        if (p.live()) (*out)[static_cast<size_t>(n++)] = PairUse{p.pair, false, p.heard()};
    return n;
}

void RecvComm::heartbeat_locked(int i, uint64_t now) noexcept
{
    // One heartbeat per port pair and interval, by whichever path of the pair, of any comm,
    // claims it first.
    PathSlot &p = paths_[i];
    if (since(now, p.last_beat_ns) >= probe_spacing(cfg_) &&
        (!p.pair || p.pair->claim_probe(now, probe_spacing(cfg_)))) {
        p.path->heartbeat();
        p.last_beat_ns = now;
        probed_ = true;
    }
}

void RecvComm::quiet_tick_locked(uint64_t now) noexcept
{
    // Quiet: nothing posted, so no silence verdict is due either (judge_path_locked).
    for (int i = 0; i < kMaxPaths; ++i)
        if (paths_[i].live()) heartbeat_locked(i, now);
    // A path the sender rebuilt while this side saw no loss (the acceptor woke this timer).
    accept_rebuilt_locked(now);
}

} // namespace vigil::net
