// SPDX-License-Identifier: Apache-2.0
// The sendComm's failover state machine (states and transitions: send_comm.h): leaving a
// failed path, replaying on another, watchdogs, rebuilding dead paths and failing back.
#include <algorithm>
#include <cstring>

#include "clock.h"
#include "log.h"
#include "send_comm.h"
#include "telemetry/writer.h"

namespace vigil::net {
namespace {

// A port event fails over every connection on the port at once: the first lines of each kind
// in a window are WARNs, the rest INFO (log::Burst).
log::Burst g_failovers("failovers");
log::Burst g_standbys_lost("standby paths lost");
log::Burst g_no_path("connections left without a path");
log::Burst g_resumed("connections resumed");

} // namespace

void SendComm::fail_path(int slot, const std::string &cause, bool sabotage) noexcept
{
    Locked g(*this);
    if (slot < 0 || slot >= kMaxPaths || !paths_[slot].alive()) return;
    if (sabotage) paths_[slot].path->sabotage();
    failover_locked(slot, cause);
    progress_locked();
}

void SendComm::fail_active(const std::string &cause, bool sabotage) noexcept
{
    Locked g(*this);
    if (paths_[active_].state != SlotState::kActive) return;
    if (sabotage) paths_[active_].path->sabotage();
    failover_locked(active_, cause);
    progress_locked();
}

void SendComm::port_down(int dev, const std::string &cause) noexcept
{
    Locked g(*this);
    port_down_locked(dev, cause);
    progress_locked();
}

void SendComm::port_down_locked(int dev, const std::string &cause) noexcept
{
    // The standby first, so a failover never lands on a path that is going down too.
    for (int i : {kBackup, kPrimary})
        if (paths_[i].alive() && paths_[i].state != SlotState::kActive &&
            paths_[i].path->identity().dev == dev)
            failover_locked(i, cause);
    for (int i : {kBackup, kPrimary})
        if (paths_[i].alive() && paths_[i].path->identity().dev == dev) failover_locked(i, cause);
}

void SendComm::port_up(int dev) noexcept
{
    Locked g(*this);
    port_up_locked(dev);
    progress_locked();
}

void SendComm::port_up_locked(int dev) noexcept
{
    for (PathSlot &sl : paths_) {
        if (sl.alive() || devs_[static_cast<size_t>(&sl - paths_.data())] != dev) continue;
        sl.next_rebuild_ns = 0;
        sl.backoff_ns = cfg_.rebuild_backoff_min_ns;
    }
}

void SendComm::failover_locked(int dead, const std::string &cause) noexcept
{
    const uint64_t t0 = now_ns();
    PathSlot &d = paths_[dead];
    found_[static_cast<size_t>(dead)] = PathStatus{}; // nothing more to act on: it is left
    const bool was_active = d.state == SlotState::kActive;
    const bool was_shared = d.state == SlotState::kShared;
    set_state_locked(dead, SlotState::kDead);
    abandon_locked(dead, t0);
    if (d.tm) {
        d.tm->meter.on_error(t0);
        d.tm->meter.set_state(t0, telemetry::kDead, gen_);
        if (d.tm->entry) telemetry::count_failover(*d.tm->entry);
    }
    watch(*d.path, false);
    int next = -1;
    if (was_shared) {
        // Pieces it carried may have landed in part: the active path starts a new generation
        // (its notice names this path, which the receiver fences) and what is not acked is
        // distributed again.
        next = active_;
    } else if (!was_active) {
        cancel_drain_locked();
        VLOG_BURST(g_standbys_lost, "host %s: standby path lost: %s: %s; the connection has no standby now",
                   host_name(), d.desc.c_str(), cause.c_str());
        return;
    } else {
        // A shared path carries already: it takes over first.
        for (int i = 0; i < kMaxPaths; ++i)
            if (paths_[i].alive() && (next < 0 || paths_[i].state == SlotState::kShared)) next = i;
        if (next < 0) {
            no_path_since_ns_ = t0;
            // The path a rebuilt one takes over from: the receiver must fence it, if it has not.
            orphan_slot_ = dead;
            orphan_id_ = d.path->identity().id;
            VLOG_BURST(g_no_path, "host %s: path lost: %s: %s; no path left, waiting up to %llu ms for one",
                       host_name(), d.desc.c_str(), cause.c_str(),
                       static_cast<unsigned long long>(cfg_.fatal_timeout_ns / 1000000));
            return;
        }
        backup_since_ns_ = t0;
    }
    const Outstanding replay = switch_to_locked(next, dead, d.path->identity().id);
    PathSlot &a = paths_[next];
    ++stats_.failovers;
    failover_t0_ns_ = t0;
    queue_event_locked(vigilNetProfFailover, dead, replay.bytes);
    telemetry::record_event(telemetry::EventType::kFailover,
                            d.desc + " -> " + a.desc + ": " + cause + ", generation " +
                                std::to_string(gen_) + ", replaying " +
                                std::to_string(replay.msgs) + " messages");
    failover_probe_seq_ = acked_ + 1;
    failover_timing_ = replay.msgs > 0;
    VLOG_BURST(g_failovers, "host %s: failover: %s%s: %s; %s %s, generation %u, replaying %llu messages "
               "(of seq %llu..%llu, %llu bytes), switch took %.1f us",
               host_name(), was_shared ? "shared path lost: " : "", d.desc.c_str(), cause.c_str(),
               was_shared ? "all traffic on" : "now on", a.desc.c_str(), gen_,
               static_cast<unsigned long long>(replay.msgs),
               static_cast<unsigned long long>(acked_), static_cast<unsigned long long>(next_seq_),
               static_cast<unsigned long long>(replay.bytes), static_cast<double>(now_ns() - t0) / 1e3);
}

void SendComm::cancel_drain_locked() noexcept
{
    if (!draining_) return;
    draining_ = false;
    distribute_locked(); // what was held back
}

SendComm::Outstanding SendComm::switch_to_locked(int slot, int abandoned, uint64_t abandoned_id) noexcept
{
    draining_ = false; // the replay below covers anything held back
    const uint64_t now = now_ns();
    const Outstanding replay = outstanding_locked();
    PathSlot &old = paths_[active_];
    for (int i = 0; i < kMaxPaths; ++i) abandon_locked(i, now); // all of it is posted again
    if (active_ != slot && old.state == SlotState::kActive) { // failback: old goes back to standby
        set_state_locked(active_, SlotState::kStandby);
        if (old.tm) old.tm->meter.set_state(now, telemetry::kStandby, gen_ + 1);
    }
    ++gen_;
    active_ = slot;
    PathSlot &a = paths_[slot];
    set_state_locked(slot, SlotState::kActive);
    if (a.tm) {
        a.tm->meter.set_state(now, telemetry::kActive, gen_);
        a.tm->meter.on_replay(now, static_cast<uint32_t>(replay.msgs));
    }
    a.path->begin(acked_, gen_, abandoned, abandoned_id);
    for (int i = 0; i < kMaxPaths; ++i)
        if (i != slot && paths_[i].state == SlotState::kShared) paths_[i].path->begin(acked_, gen_, -1, 0);
    // Everything not acked again, over the carrying paths; a message seen held is complete
    // (NCCL may have its buffer back) and never sent again.
    assign_seq_ = acked_;
    assign_off_ = 0;
    distribute_locked();
    a.last_heard_ns = now_ns(); // the stall clock of the new active path starts now
    stats_.generation = gen_;
    stats_.replayed_messages += replay.msgs;
    return replay;
}

void SendComm::watchdogs_locked(uint64_t now) noexcept
{
    // Stall watchdog: data the receiver has not acked and nothing heard for too long on a
    // carrying path (the receiver acks on every live path). A shared path first, so the
    // active one is left for last.
    auto stall = [&](int i) {
        const uint64_t quiet = since(now, paths_[i].heard());
        if (acked_ < next_seq_ && quiet > cfg_.stall_timeout_ns)
            failover_locked(i, "stalled: nothing heard for " + std::to_string(quiet / 1000000) +
                                   " ms with data in flight");
    };
    for (int i = 0; i < kMaxPaths; ++i)
        if (paths_[i].state == SlotState::kShared) stall(i);
    if (paths_[active_].state == SlotState::kActive) stall(active_);
    // A standby's port pair hears the receiver's heartbeats every probe interval; silence
    // means dead.
    for (int i = 0; i < kMaxPaths; ++i) {
        PathSlot &sb = paths_[i];
        const uint64_t quiet = since(now, sb.heard());
        if (sb.state == SlotState::kStandby && quiet > cfg_.stall_timeout_ns)
            failover_locked(i, "silent: no heartbeat for " + std::to_string(quiet / 1000000) + " ms");
    }
    // One probe per port pair and interval, by whichever path of the pair claims it first.
    for (PathSlot &s : paths_) {
        if (s.alive() && since(now, s.last_sent_ns) >= probe_spacing(cfg_) &&
            (!s.pair || s.pair->claim_probe(now, probe_spacing(cfg_)))) {
            s.path->probe();
            s.last_sent_ns = now;
            probed_ = true;
        }
    }
    if (rebuilder_) {
        rebuild_locked(now);
        failback_locked(now);
    }
    share_locked(now);
    bool any = false;
    for (const PathSlot &s : paths_) any = any || s.alive();
    if (any) no_path_since_ns_ = 0;
    else if (no_path_since_ns_ != 0 && (acked_ < next_seq_ || cts_wanted_) &&
             since(now, no_path_since_ns_) > cfg_.fatal_timeout_ns)
        fail_locked(-ECONNRESET, describe() + ": no path to the peer for " +
                                     std::to_string(cfg_.fatal_timeout_ns / 1000000) + " ms");
}

void SendComm::install_locked(int i, std::unique_ptr<SendPath> p, uint64_t now) noexcept
{
    PathSlot &sl = paths_[i];
    if (sl.path) watch(*sl.path, false);
    found_[static_cast<size_t>(i)] = PathStatus{}; // what the old path found died with it
    sl.path = std::move(p);
    watch(*sl.path, true);
    sl.desc = sl.path->identity().describe();
    sl.pair = pair_of(sl.path->identity());
    set_state_locked(i, SlotState::kStandby);
    sl.rebuilt = true;
    sl.up_since_ns = sl.last_heard_ns = sl.last_sent_ns = now;
    sl.backoff_ns = cfg_.rebuild_backoff_min_ns;
    ++stats_.rebuilds;
    telemetry::record_event(telemetry::EventType::kRebuild, sl.desc);
    meter_locked(i);
    if (sl.tm) sl.tm->meter.set_state(now, telemetry::kStandby, gen_);
}

void SendComm::rebuild_locked(uint64_t now) noexcept
{
    for (int i = 0; i < kMaxPaths; ++i) {
        PathSlot &sl = paths_[i];
        if (sl.alive() || !rebuilder_->can_rebuild(i) || now < sl.next_rebuild_ns) continue;
        std::unique_ptr<SendPath> p;
        if (rebuilder_->progress(i, &p) != 0) {
            sl.next_rebuild_ns = now + sl.backoff_ns;
            sl.backoff_ns = std::min(sl.backoff_ns * 2, cfg_.rebuild_backoff_max_ns);
            continue;
        }
        if (!p) continue; // attempt in progress
        install_locked(i, std::move(p), now);
        bool other = false;
        for (int k = 0; k < kMaxPaths; ++k) other = other || (k != i && paths_[k].alive());
        VLOG_INFO(NCCL_NET, "host %s: path rebuilt: %s%s", host_name(), sl.desc.c_str(),
                  other ? "" : "; it carries the connection now");
        if (!other) {
            const Outstanding replay = switch_to_locked(i, orphan_slot_, orphan_id_);
            orphan_slot_ = -1;
            VLOG_BURST(g_resumed, "host %s: connection resumed on %s, generation %u, replaying %llu bytes",
                       host_name(), sl.desc.c_str(), gen_, static_cast<unsigned long long>(replay.bytes));
        }
    }
}

void SendComm::failback_locked(uint64_t now) noexcept
{
    // A primary that stayed alive for the hold time takes the traffic back, once the backup has
    // nothing left in flight (so no write of the old generation can land after the switch).
    PathSlot &pri = paths_[kPrimary];
    if (active_ != kBackup || pri.state != SlotState::kStandby ||
        since(now, pri.up_since_ns) < cfg_.failback_hold_ns)
        return;
    if (!draining_) drain_since_ns_ = now;
    draining_ = true; // distribute_locked() holds new messages back
    if (paths_[kBackup].alive() && !paths_[kBackup].path->idle()) {
        // A backup that heartbeats but does not finish what it holds would hold every new
        // message back for ever: past the stall timeout it is failed over as stalled, and
        // the primary takes what is not acked (the receiver fences the backup).
        const uint64_t took = since(now, drain_since_ns_);
        if (took > cfg_.stall_timeout_ns)
            failover_locked(kBackup, "stalled: failback waited " + std::to_string(took / 1000000) +
                                         " ms for it to finish its messages");
        return;
    }
    draining_ = false;
    const uint64_t bytes = switch_to_locked(kPrimary, -1, 0).bytes;
    ++stats_.failbacks;
    if (pri.tm && pri.tm->entry) telemetry::count_failback(*pri.tm->entry);
    queue_event_locked(vigilNetProfFailback, kPrimary, bytes);
    telemetry::record_event(telemetry::EventType::kFailback,
                            pri.desc + ", generation " + std::to_string(gen_));
    VLOG_INFO(NCCL_NET, "host %s: failback to %s after %.1f ms on the backup, generation %u, "
              "replaying %llu bytes", host_name(), pri.desc.c_str(),
              static_cast<double>(since(now, backup_since_ns_)) / 1e6, gen_,
              static_cast<unsigned long long>(bytes));
}

} // namespace vigil::net

namespace vigil::net {

void SendComm::share_locked(uint64_t now) noexcept
{
    if (draining_ || paths_[active_].state != SlotState::kActive || !striping()) return;
    for (int i = 0; i < kMaxPaths; ++i) {
        PathSlot &sl = paths_[i];
        if (sl.state != SlotState::kStandby) continue;
        if (i == kPrimary && active_ != kPrimary) continue; // failback takes it back whole
        if (sl.rebuilt && since(now, sl.up_since_ns) < cfg_.failback_hold_ns) continue;
        set_state_locked(i, SlotState::kShared);
        set_state_locked(active_, SlotState::kActive); // the Striper's view of it, again
        sl.last_heard_ns = now; // its stall clock starts now
        sl.path->begin(assign_seq_, gen_, -1, 0);
        if (sl.tm) sl.tm->meter.set_state(now, telemetry::kActive, gen_);
        VLOG_INFO(NCCL_NET, "host %s: multipath: %s carries pieces beside %s (generation %u)",
                  host_name(), sl.desc.c_str(), paths_[active_].desc.c_str(), gen_);
    }
}

} // namespace vigil::net

namespace vigil::net {

int SendComm::pair_uses_locked(std::array<PairUse, kMaxPaths> *out) const noexcept
{
    int n = 0;
    for (const PathSlot &sl : paths_)
        if (sl.alive())
            (*out)[static_cast<size_t>(n++)] = PairUse{sl.pair, sl.state == SlotState::kStandby, sl.heard()};
    return n;
}

bool SendComm::quiet_locked() const noexcept
{
    if (acked_ != next_seq_ || cts_wanted_ || draining_ || active_ != kPrimary) return false;
    for (int i = 0; i < kMaxPaths; ++i) {
        const PathSlot &sl = paths_[i];
        // A path to rebuild, or a rebuilt one waiting out its hold before it shares.
        if (!sl.alive() && sl.path && rebuilder_ && rebuilder_->can_rebuild(i)) return false;
        if (sl.rebuilt && sl.state == SlotState::kStandby && striping()) return false;
    }
    return true;
}

} // namespace vigil::net
