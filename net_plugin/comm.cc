// SPDX-License-Identifier: Apache-2.0
// Requests, sequencing, ack window and multi-recv matching of one connection.
#include "comm.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "clock.h"
#include "log.h"
#include "telemetry/writer.h"

#include <unistd.h>

namespace vigil::net {

// ---- Comm -------------------------------------------------------------------------------

int Comm::test(Request *r, int *done, int *sizes) noexcept
{
    *done = 0;
    if (r->state.load(std::memory_order_acquire) != Request::kDone) {
        // Progress inline when nobody else is (cuts a thread hand-off from latency); the
        // engine thread covers the case where NCCL polls slowly or not at all.
        if (mu_.try_lock()) {
            progress_locked();
            mu_.unlock();
        }
        if (r->state.load(std::memory_order_acquire) != Request::kDone)
            return error_.load(std::memory_order_acquire);
    }
    if (sizes != nullptr) {
        if (r->is_send) sizes[0] = static_cast<int>(r->size);
        else
            for (int i = 0; i < r->n; ++i) sizes[i] = static_cast<int>(r->msg_size[i]);
    }
    *done = 1;
    r->state.store(Request::kFree, std::memory_order_release);
    return 0;
}

int Comm::attach() noexcept
{
    {
        std::lock_guard<std::mutex> g(mu_);
        for (size_t i = 0; i < nfds(); ++i) {
            int rc = ProgressEngine::instance().add(fd(i), this);
            if (rc != 0) {
                for (size_t k = 0; k < i; ++k) ProgressEngine::instance().remove(fd(k));
                ProgressEngine::instance().quiesce();
                return rc;
            }
        }
    }
    // Last: from here on the engine may call in (callers must not hold locks the comm's
    // progress takes, such as a listener's).
    ProgressEngine::instance().add_ticker(this);
    return 0;
}

void Comm::detach() noexcept
{
    // Before taking mu_: the engine holds its ticker lock only while copying the list.
    ProgressEngine::instance().remove_ticker(this);
    {
        std::lock_guard<std::mutex> g(mu_);
        detached_ = true;
        for (size_t i = 0; i < nfds(); ++i) ProgressEngine::instance().remove(fd(i));
    }
    ProgressEngine::instance().quiesce();
}

void Comm::on_ready() noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    if (!detached_) progress_locked();
}

void Comm::on_tick() noexcept
{
    const uint64_t now = now_ns();
    if (now < next_timer_ns_.load(std::memory_order_relaxed)) return;
    next_timer_ns_.store(now + kTimerNs, std::memory_order_relaxed);
    on_ready();
}

void Comm::fail_locked(int err, const std::string &what) noexcept
{
    if (error_.load(std::memory_order_relaxed) != 0) return;
    error_.store(err, std::memory_order_release);
    telemetry::record_event(telemetry::EventType::kFatal, what + " (" + strerror(-err) + ")");
    telemetry::flush_writer(); // the last windows and the failover history reach the disk now
    VLOG_WARN("connection failed, no path left: %s (%s); pending requests fail", what.c_str(),
              strerror(-err));
}

// ---- telemetry ---------------------------------------------------------------------------

namespace {

// Pulls "dev NAME" and "LOCAL -> PEER" out of a path's description.
void parse_desc(const std::string &d, std::string *dev, std::string *local, std::string *peer)
{
    const size_t dv = d.find("dev ");
    if (dv != std::string::npos) *dev = d.substr(dv + 4, d.find(' ', dv + 4) - dv - 4);
    const size_t arrow = d.find(" -> ");
    if (arrow == std::string::npos) return;
    const size_t ls = d.rfind(' ', arrow - 1);
    *local = d.substr(ls == std::string::npos ? 0 : ls + 1, arrow - (ls == std::string::npos ? 0 : ls + 1));
    *peer = d.substr(arrow + 4, d.find(' ', arrow + 4) - arrow - 4);
}

} // namespace

PathTelemetry::PathTelemetry(const FailoverConfig &cfg, int kind, int slot, int dev,
                             const std::string &desc, uint64_t conn_id)
    : entry([&] {
          std::string d, l, p;
          parse_desc(desc, &d, &l, &p);
          return telemetry::Registry::instance().acquire(kind, slot, dev, d, l, p, conn_id);
      }()),
      sink(entry, (kind == 0 ? "send " : "recv ") + desc),
      meter(cfg.window_ns, &sink, [&] {
          telemetry::DetectorConfig d = cfg.detector;
          if (dev >= 0 && static_cast<size_t>(dev) < cfg.link_bytes_per_s.size())
              d.link_bytes_per_s = cfg.link_bytes_per_s[static_cast<size_t>(dev)];
          return d;
      }())
{
}

PathTelemetry::~PathTelemetry()
{
    // The path's last, partial window still reaches the ring, and the writer (if any) drains
    // the entry before it is reused.
    meter.flush(now_ns());
    telemetry::Registry::instance().release(entry, telemetry::writer_running());
}

namespace {

/// Starts (on) or stops the progress engine watching every socket of `path` for `client`.
template <class Path> void watch(const Path &path, ProgressClient *client, bool on) noexcept
{
    for (size_t k = 0; k < path.nfds(); ++k) {
        if (on) ProgressEngine::instance().add(path.fd(k), client);
        else ProgressEngine::instance().remove(path.fd(k));
    }
}

/// A path's telemetry, or null when telemetry is off or its set-up failed: telemetry is best
/// effort, the data path does not depend on it.
std::unique_ptr<PathTelemetry> make_telemetry(const FailoverConfig &cfg, int kind, int slot, int dev,
                                              const std::string &desc, const void *owner) noexcept
{
    if (cfg.window_ns == 0 || !telemetry::Registry::instance().is_open()) return nullptr;
    try {
        return std::make_unique<PathTelemetry>(cfg, kind, slot, dev, desc, reinterpret_cast<uintptr_t>(owner));
    } catch (...) {
        return nullptr;
    }
}

} // namespace

// ---- SendComm ---------------------------------------------------------------------------

namespace {

/// a - b, or 0 when b is later (timestamps taken on different lines may cross).
uint64_t since(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

const char *host_name()
{
    static const std::string name = [] {
        char h[256] = "?";
        gethostname(h, sizeof(h) - 1);
        return std::string(h);
    }();
    return name.c_str();
}

} // namespace

SendComm::SendComm(std::array<std::unique_ptr<SendPath>, kMaxPaths> paths, const FailoverConfig &cfg,
                   std::unique_ptr<PathRebuilder> rebuilder)
    : cfg_(cfg), rebuilder_(std::move(rebuilder))
{
    const uint64_t now = now_ns();
    for (int i = 0; i < kMaxPaths; ++i) {
        if (!paths[i]) continue;
        slots_[i].desc = paths[i]->describe();
        slots_[i].path = std::move(paths[i]);
        slots_[i].alive = true;
        slots_[i].last_heard_ns = slots_[i].last_sent_ns = slots_[i].up_since_ns = now;
    }
    for (Slot &sl : slots_) sl.backoff_ns = cfg_.rebuild_backoff_min_ns;
    for (int i = 0; i < kMaxPaths; ++i) meter_locked(i);
    if (slots_[kBackup].tm) slots_[kBackup].tm->meter.set_state(now, telemetry::kStandby, gen_);
}

void SendComm::meter_locked(int slot) noexcept
{
    Slot &sl = slots_[slot];
    sl.tm.reset();
    if (sl.path) sl.tm = make_telemetry(cfg_, 0, slot, sl.path->local_dev(), sl.desc, this);
}

uint64_t SendComm::unacked_bytes_locked() const noexcept
{
    uint64_t bytes = 0;
    for (uint64_t s = acked_; s < next_seq_; ++s) bytes += reqs_[s % kMaxInflight].size;
    return bytes;
}

std::string SendComm::describe() const
{
    return slots_[kPrimary].desc;
}

size_t SendComm::nfds() const noexcept
{
    size_t n = 0;
    for (const Slot &s : slots_)
        if (s.path) n += s.path->nfds();
    return n;
}

int SendComm::fd(size_t i) const noexcept
{
    for (const Slot &s : slots_) {
        if (!s.path) continue;
        if (i < s.path->nfds()) return s.path->fd(i);
        i -= s.path->nfds();
    }
    return -1;
}

SendComm::Stats SendComm::stats() noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    return stats_;
}

int SendComm::active_dev() noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    return slots_[active_].alive ? slots_[active_].path->local_dev() : -1;
}

void SendComm::fail_path(int slot, const std::string &cause, bool sabotage) noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    if (slot < 0 || slot >= kMaxPaths || !slots_[slot].alive) return;
    if (sabotage) slots_[slot].path->sabotage();
    failover_locked(slot, cause);
    progress_locked();
}

void SendComm::port_down(int dev, const std::string &cause) noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    // The backup first, so a failover never lands on a path that is going down too.
    for (int i : {kBackup, kPrimary})
        if (slots_[i].alive && slots_[i].path->local_dev() == dev) failover_locked(i, cause);
    progress_locked();
}

void SendComm::port_up(int dev) noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    for (Slot &sl : slots_) {
        if (sl.alive || !sl.path || sl.path->local_dev() != dev) continue;
        sl.next_rebuild_ns = 0;
        sl.backoff_ns = cfg_.rebuild_backoff_min_ns;
    }
    progress_locked();
}

void SendComm::post_locked(uint64_t seq) noexcept
{
    const size_t i = seq % kMaxInflight;
    if (PathTelemetry *tm = slots_[active_].tm.get()) {
        const uint64_t now = now_ns();
        posted_ns_[i] = now;
        tm->meter.on_post(now, reqs_[i].size);
    }
    slots_[active_].path->post(OutMessage{seq, tag_[i], static_cast<const uint8_t *>(data_[i]),
                                          reqs_[i].size});
}

namespace {
std::atomic<ncclProfilerCallback_t> g_profiler{nullptr};
} // namespace

void SendComm::set_profiler(ncclProfilerCallback_t cb) noexcept
{
    g_profiler.store(cb, std::memory_order_release);
}

void SendComm::queue_event_locked(uint8_t type, int slot, uint64_t bytes) noexcept
{
    if (g_profiler.load(std::memory_order_relaxed) == nullptr || evq_n_ == kEventQueue) return;
    vigilNetProfDescr_v1_t &d = evq_[static_cast<size_t>(evq_n_++)];
    d = vigilNetProfDescr_v1_t{};
    d.type = type;
    d.slot = static_cast<uint8_t>(slot);
    d.generation = gen_;
    d.dev = slots_[slot].path ? slots_[slot].path->local_dev() : -1;
    d.start_ns = now_ns();
    d.bytes = bytes;
    d.conn = reinterpret_cast<uintptr_t>(this);
}

void SendComm::emit_events_locked(void *phandle) noexcept
{
    ncclProfilerCallback_t cb = g_profiler.load(std::memory_order_acquire);
    if (cb == nullptr || phandle == nullptr) return; // never start an event without a parent
    auto emit = [&](const vigilNetProfDescr_v1_t &src) {
        vigilNetProfDescr_v1_t &d = descr_ring_[descr_next_++ % kDescrRing];
        d = src;
        void *h = nullptr; // NCCL leaves it untouched when the NetPlugin bit is off
        cb(&h, 0 /* start */, phandle, VIGIL_PROFILER_NET_ID, &d);
        if (h != nullptr) cb(&h, 1 /* stop */, nullptr, 0, nullptr);
    };
    for (int i = 0; i < evq_n_; ++i) emit(evq_[static_cast<size_t>(i)]);
    evq_n_ = 0;
    const Slot &a = slots_[active_];
    if (a.tm == nullptr || a.tm->entry == nullptr) return;
    const uint64_t head = a.tm->entry->ring.head.load(std::memory_order_relaxed);
    if (head == 0 || head == last_window_emitted_[active_]) return;
    telemetry::WindowRecord w;
    if (!telemetry::RegistryView::read(*a.tm->entry, head - 1, &w)) return;
    last_window_emitted_[active_] = head;
    vigilNetProfDescr_v1_t d{};
    d.type = vigilNetProfWindow;
    d.slot = static_cast<uint8_t>(active_);
    d.degraded = w.degraded;
    d.state = w.state;
    d.generation = w.generation;
    d.dev = a.path->local_dev();
    d.window_us = w.window_us;
    d.start_ns = w.start_ns;
    d.bytes = w.bytes;
    d.busy_ns = w.busy_ns;
    d.lat_p99_ns = w.lat_p99_ns;
    d.conn = reinterpret_cast<uintptr_t>(this);
    emit(d);
}

int SendComm::isend(const void *data, size_t size, int tag, Request **out, void *phandle) noexcept
{
    *out = nullptr;
    std::lock_guard<std::mutex> g(mu_);
    emit_events_locked(phandle);
    if (int e = error_.load(std::memory_order_relaxed)) return e;
    if (peer_closed_) {
        fail_locked(-ECONNRESET, describe() + ": isend after the peer closed the connection");
        return error_.load(std::memory_order_relaxed);
    }
    if (size > kMaxMessageBytes) {
        VLOG_WARN("isend of %zu bytes exceeds the %llu-byte message limit (%s)", size,
                  static_cast<unsigned long long>(kMaxMessageBytes), describe().c_str());
        return -EMSGSIZE;
    }
    // A slot is reused only when it is acked *and* no path still reads it (a stream can be
    // mid-frame on a message the receiver already completed from another path).
    uint64_t floor = acked_;
    for (const Slot &sl : slots_)
        if (sl.alive) floor = std::min(floor, sl.path->oldest_referenced());
    if (next_seq_ - floor >= kMaxInflight) return 0;
    const size_t i = next_seq_ % kMaxInflight;
    Request &r = reqs_[i];
    if (r.state.load(std::memory_order_acquire) != Request::kFree) return 0; // not tested yet
    r.is_send = true;
    r.comm = this;
    r.seq = next_seq_;
    r.size = size;
    data_[i] = data;
    tag_[i] = tag;
    r.state.store(Request::kPending, std::memory_order_relaxed);
    // With no live path, or while failback drains the backup, the message waits in the
    // ring; the switch replays it.
    if (slots_[active_].alive && !draining_) post_locked(next_seq_);
    ++next_seq_;
    progress_locked();
    *out = &r;
    return 0;
}

void SendComm::failover_locked(int dead, const std::string &cause) noexcept
{
    const uint64_t t0 = now_ns();
    Slot &d = slots_[dead];
    d.alive = false;
    if (d.tm) {
        if (dead == active_) d.tm->meter.on_abandon(t0, next_seq_ - acked_, unacked_bytes_locked());
        d.tm->meter.on_error(t0);
        d.tm->meter.set_state(t0, telemetry::kDead, gen_);
        if (d.tm->entry) d.tm->entry->failovers.fetch_add(1, std::memory_order_relaxed);
    }
    watch(*d.path, this, false);
    if (dead != active_) {
        cancel_drain_locked();
        VLOG_WARN("host %s: standby path lost: %s: %s; the connection has no standby now",
                  host_name(), d.desc.c_str(), cause.c_str());
        return;
    }
    int next = -1;
    for (int i = 0; i < kMaxPaths; ++i)
        if (slots_[i].alive) next = i;
    if (next < 0) {
        no_path_since_ns_ = t0;
        VLOG_WARN("host %s: path lost: %s: %s; no path left, waiting up to %llu ms for one",
                  host_name(), d.desc.c_str(), cause.c_str(),
                  static_cast<unsigned long long>(cfg_.fatal_timeout_ns / 1000000));
        return;
    }
    const uint64_t bytes = switch_to_locked(next);
    Slot &a = slots_[next];
    draining_ = false;
    backup_since_ns_ = t0;
    ++stats_.failovers;
    failover_t0_ns_ = t0;
    queue_event_locked(vigilNetProfFailover, dead, bytes);
    telemetry::record_event(telemetry::EventType::kFailover,
                            d.desc + " -> " + a.desc + ": " + cause + ", generation " +
                                std::to_string(gen_) + ", replaying " +
                                std::to_string(next_seq_ - acked_) + " messages");
    failover_probe_seq_ = acked_ + 1;
    failover_timing_ = next_seq_ > acked_;
    VLOG_WARN("host %s: failover: %s: %s; now on %s, generation %u, replaying %llu messages "
              "(seq %llu..%llu, %llu bytes), switch took %.1f us",
              host_name(), d.desc.c_str(), cause.c_str(), a.desc.c_str(), gen_,
              static_cast<unsigned long long>(next_seq_ - acked_),
              static_cast<unsigned long long>(acked_), static_cast<unsigned long long>(next_seq_),
              static_cast<unsigned long long>(bytes), static_cast<double>(now_ns() - t0) / 1e3);
}

void SendComm::cancel_drain_locked() noexcept
{
    if (!draining_) return;
    draining_ = false;
    if (slots_[active_].alive)
        for (uint64_t s = std::max(drain_from_seq_, acked_); s < next_seq_; ++s) post_locked(s);
}

uint64_t SendComm::switch_to_locked(int slot) noexcept
{
    draining_ = false; // the replay below covers anything held back
    const uint64_t now = now_ns();
    Slot &old = slots_[active_];
    if (active_ != slot && old.alive && old.tm) { // failback: the backup goes back to standby
        old.tm->meter.on_abandon(now, next_seq_ - acked_, unacked_bytes_locked());
        old.tm->meter.set_state(now, telemetry::kStandby, gen_ + 1);
    }
    ++gen_;
    active_ = slot;
    Slot &a = slots_[slot];
    if (a.tm) {
        a.tm->meter.set_state(now, telemetry::kActive, gen_);
        a.tm->meter.on_replay(now, static_cast<uint32_t>(next_seq_ - acked_));
    }
    a.path->begin(acked_, gen_);
    for (uint64_t s = acked_; s < next_seq_; ++s) post_locked(s);
    const uint64_t bytes = unacked_bytes_locked();
    a.last_heard_ns = now_ns(); // the stall clock of the new active path starts now
    stats_.generation = gen_;
    stats_.replayed_messages += next_seq_ - acked_;
    return bytes;
}

void SendComm::rebuild_locked(uint64_t now) noexcept
{
    for (int i = 0; i < kMaxPaths; ++i) {
        Slot &sl = slots_[i];
        if (sl.alive || !rebuilder_->can_rebuild(i) || now < sl.next_rebuild_ns) continue;
        std::unique_ptr<SendPath> p;
        if (rebuilder_->progress(i, &p) != 0) {
            sl.next_rebuild_ns = now + sl.backoff_ns;
            sl.backoff_ns = std::min(sl.backoff_ns * 2, cfg_.rebuild_backoff_max_ns);
            continue;
        }
        if (!p) continue; // attempt in progress
        if (sl.path)
            watch(*sl.path, this, false);
        sl.path = std::move(p);
        watch(*sl.path, this, true);
        sl.desc = sl.path->describe();
        sl.alive = true;
        sl.up_since_ns = sl.last_heard_ns = sl.last_sent_ns = now;
        sl.backoff_ns = cfg_.rebuild_backoff_min_ns;
        ++stats_.rebuilds;
        telemetry::record_event(telemetry::EventType::kRebuild, sl.desc);
        meter_locked(i);
        if (sl.tm) sl.tm->meter.set_state(now, telemetry::kStandby, gen_);
        bool other = false;
        for (int k = 0; k < kMaxPaths; ++k) other = other || (k != i && slots_[k].alive);
        VLOG_INFO(NCCL_NET, "host %s: path rebuilt: %s%s", host_name(), sl.desc.c_str(),
                  other ? "" : "; it carries the connection now");
        if (!other) {
            const uint64_t bytes = switch_to_locked(i);
            VLOG_WARN("host %s: connection resumed on %s, generation %u, replaying %llu bytes",
                      host_name(), sl.desc.c_str(), gen_, static_cast<unsigned long long>(bytes));
        }
    }
    // Failback: a primary that stayed alive for the hold time takes the traffic back, once the
    // backup stands at a frame boundary.
    Slot &pri = slots_[kPrimary];
    if (active_ == kBackup && pri.alive && since(now, pri.up_since_ns) >= cfg_.failback_hold_ns) {
        if (!draining_) drain_from_seq_ = next_seq_;
        draining_ = true;
        if (!slots_[kBackup].alive || slots_[kBackup].path->idle()) {
            draining_ = false;
            const uint64_t bytes = switch_to_locked(kPrimary);
            ++stats_.failbacks;
            queue_event_locked(vigilNetProfFailback, kPrimary, bytes);
            telemetry::record_event(telemetry::EventType::kFailback,
                                    pri.desc + ", generation " + std::to_string(gen_));
            VLOG_INFO(NCCL_NET, "host %s: failback to %s after %.1f ms on the backup, generation "
                      "%u, replaying %llu bytes", host_name(), pri.desc.c_str(),
                      static_cast<double>(since(now, backup_since_ns_)) / 1e6, gen_,
                      static_cast<unsigned long long>(bytes));
        }
    }
}

void SendComm::progress_locked() noexcept
{
    const uint64_t now = now_ns();
    uint64_t ack = acked_;
    for (int i = 0; i < kMaxPaths; ++i) {
        Slot &s = slots_[i];
        if (!s.alive) continue;
        PathStatus st = s.path->progress(&ack);
        if (st.heard) s.last_heard_ns = now;
        if (st.receiver_bound >= 0 && s.tm) s.tm->meter.set_receiver_bound(now, st.receiver_bound == 1);
        if (st.error != 0) {
            failover_locked(i, st.detail + " (" + strerror(-st.error) + ")");
        } else if (st.peer_closed) {
            // `ack` holds this call's acks: the last ack and the close often arrive together.
            if (ack < next_seq_) {
                failover_locked(i, "peer closed the path with sends unacknowledged");
            } else {
                peer_closed_ = true; // orderly closeRecv with nothing outstanding
                s.alive = false;
                watch(*s.path, this, false);
            }
        } else if (st.failover_requested && st.failed_slot < kMaxPaths &&
                   static_cast<int>(st.failed_slot) != i && slots_[st.failed_slot].alive) {
            failover_locked(static_cast<int>(st.failed_slot), "the receiver saw its port fail");
        }
    }
    if (ack > next_seq_) {
        fail_locked(-EPROTO, describe() + ": ack for seq " + std::to_string(ack) +
                                 " beyond the last sent " + std::to_string(next_seq_));
        return;
    }
    const uint64_t later = now_ns(); // a failover above may have stamped times after `now`
    PathTelemetry *atm = slots_[active_].tm.get();
    for (uint64_t s = acked_; s < ack; ++s) {
        const size_t i = s % kMaxInflight;
        if (atm != nullptr) atm->meter.on_complete(later, posted_ns_[i], reqs_[i].size);
        reqs_[i].state.store(Request::kDone, std::memory_order_release);
    }
    acked_ = ack;
    for (Slot &sl : slots_) {
        if (sl.alive) sl.path->skip_to(acked_);
        if (sl.tm) sl.tm->meter.advance(later);
    }
    if (failover_timing_ && acked_ >= failover_probe_seq_) {
        failover_timing_ = false;
        VLOG_INFO(NCCL_NET, "host %s: first replayed message acknowledged %.1f us after the "
                  "failure was detected (generation %u, detected at monotonic %.6f s, acked at "
                  "%.6f s)", host_name(), static_cast<double>(since(later, failover_t0_ns_)) / 1e3,
                  gen_, static_cast<double>(failover_t0_ns_) / 1e9, static_cast<double>(later) / 1e9);
    }
    Slot &a = slots_[active_];
    if (a.alive) {
        // Stall watchdog: data the receiver has not acked and nothing heard for too long.
        const uint64_t quiet = since(later, a.last_heard_ns);
        if (acked_ < next_seq_ && quiet > cfg_.stall_timeout_ns)
            failover_locked(active_, "stalled: nothing heard for " +
                                         std::to_string(quiet / 1000000) + " ms with data in flight");
    }
    // A standby hears the receiver's heartbeats every probe interval; silence means dead.
    for (int i = 0; i < kMaxPaths; ++i) {
        Slot &sb = slots_[i];
        const uint64_t quiet = since(later, sb.last_heard_ns);
        if (i != active_ && sb.alive && quiet > cfg_.stall_timeout_ns)
            failover_locked(i, "silent: no heartbeat for " + std::to_string(quiet / 1000000) + " ms");
    }
    for (Slot &s : slots_) {
        if (s.alive && since(later, s.last_sent_ns) > cfg_.probe_interval_ns) {
            s.path->probe();
            s.last_sent_ns = later;
        }
    }
    if (rebuilder_) rebuild_locked(later);
    bool any = false;
    for (const Slot &s : slots_) any = any || s.alive;
    if (any) no_path_since_ns_ = 0;
    else if (!peer_closed_ && no_path_since_ns_ != 0 && acked_ < next_seq_ &&
             since(later, no_path_since_ns_) > cfg_.fatal_timeout_ns)
        fail_locked(-ECONNRESET, describe() + ": no path to the peer for " +
                                     std::to_string(cfg_.fatal_timeout_ns / 1000000) + " ms");
}

// ---- RecvComm ---------------------------------------------------------------------------

RecvComm::RecvComm(std::array<std::unique_ptr<RecvPath>, kMaxPaths> paths, const FailoverConfig &cfg,
                   std::unique_ptr<PathAcceptor> acceptor)
    : cfg_(cfg), acceptor_(std::move(acceptor))
{
    const uint64_t now = now_ns();
    for (int i = 0; i < kMaxPaths; ++i) {
        if (!paths[i]) continue;
        paths_[i].desc = paths[i]->describe();
        paths_[i].path = std::move(paths[i]);
        paths_[i].alive = true;
        paths_[i].last_heard_ns = now;
        paths_[i].tm = make_telemetry(cfg_, 1, i, paths_[i].path->local_dev(), paths_[i].desc, this);
        if (i == kBackup && paths_[i].tm) paths_[i].tm->meter.set_state(now, telemetry::kStandby, gen_);
    }
}

std::string RecvComm::describe() const
{
    return paths_[kPrimary].desc;
}

uint32_t RecvComm::generation() noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    return gen_;
}

size_t RecvComm::nfds() const noexcept
{
    size_t n = 0;
    for (const PathSlot &s : paths_)
        if (s.path) n += s.path->nfds();
    return n;
}

int RecvComm::fd(size_t i) const noexcept
{
    for (const PathSlot &s : paths_) {
        if (!s.path) continue;
        if (i < s.path->nfds()) return s.path->fd(i);
        i -= s.path->nfds();
    }
    return -1;
}

void RecvComm::fail_path(int slot, const std::string &cause) noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    if (slot < 0 || slot >= kMaxPaths || !paths_[slot].alive) return;
    for (int i = 0; i < kMaxPaths; ++i)
        if (i != slot && paths_[i].alive) paths_[i].path->request_failover(static_cast<uint32_t>(slot));
    lose_path_locked(slot, cause, false);
    progress_locked();
}

void RecvComm::port_down(int dev, const std::string &cause) noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    for (int slot = 0; slot < kMaxPaths; ++slot) {
        if (!paths_[slot].alive || paths_[slot].path->local_dev() != dev) continue;
        for (int i = 0; i < kMaxPaths; ++i)
            if (i != slot && paths_[i].alive && paths_[i].path->local_dev() != dev)
                paths_[i].path->request_failover(static_cast<uint32_t>(slot));
        lose_path_locked(slot, cause, false);
    }
    progress_locked();
}

void RecvComm::lose_path_locked(int i, const std::string &why, bool orderly) noexcept
{
    PathSlot &p = paths_[i];
    p.alive = false;
    p.orderly = orderly;
    if (p.tm) p.tm->meter.set_state(now_ns(), telemetry::kDead, gen_);
    watch(*p.path, this, false);
    bool any = false;
    for (const PathSlot &s : paths_) any = any || s.alive;
    if (!orderly) {
        telemetry::record_event(telemetry::EventType::kPathLost, p.desc + ": " + why);
        VLOG_WARN("host %s: path lost: %s: %s%s", host_name(), p.desc.c_str(), why.c_str(),
                  any ? "; the connection goes on over its other path" : "; no path left");
    }
    if (!any) no_path_since_ns_ = now_ns();
}

int RecvComm::irecv(int n, void *const *data, const size_t *sizes, const int *tags,
                    Request **out) noexcept
{
    *out = nullptr;
    if (n < 1 || n > kMaxRecvs) {
        VLOG_WARN("irecv with %d buffers; 1..%d supported", n, kMaxRecvs);
        return -EINVAL;
    }
    std::lock_guard<std::mutex> g(mu_);
    if (int e = error_.load(std::memory_order_relaxed)) return e;
    if (peer_closed_) {
        fail_locked(-ECONNRESET, describe() + ": irecv after the peer closed the connection");
        return error_.load(std::memory_order_relaxed);
    }
    if (next_post_seq_ + static_cast<uint64_t>(n) - floor_ > kMaxInflight) return 0;
    Request *r = nullptr;
    for (Request &c : reqs_) {
        if (c.state.load(std::memory_order_acquire) == Request::kFree) {
            r = &c;
            break;
        }
    }
    if (r == nullptr) return 0;
    r->is_send = false;
    r->comm = this;
    r->seq = next_post_seq_;
    r->n = n;
    r->remaining = n;
    for (int i = 0; i < n; ++i) {
        r->data[i] = static_cast<uint8_t *>(data[i]);
        r->capacity[i] = sizes[i];
        r->tags[i] = tags[i];
        r->msg_size[i] = 0;
        r->bound[i] = false;
        slots_[(next_post_seq_ + static_cast<uint64_t>(i)) % kMaxInflight] = Slot{r, -1, 0, false};
    }
    next_post_seq_ += static_cast<uint64_t>(n);
    r->state.store(Request::kPending, std::memory_order_relaxed);
    progress_locked();
    *out = r;
    return 0;
}

void RecvComm::progress_locked() noexcept
{
    const uint64_t now = now_ns();
    waiting_for_post_ = false;
    for (int i = 0; i < kMaxPaths; ++i) {
        PathSlot &p = paths_[i];
        if (!p.alive) continue;
        if (since(now, p.last_beat_ns) > cfg_.probe_interval_ns) {
            p.path->heartbeat();
            p.last_beat_ns = now;
        }
        cur_path_ = i;
        PathStatus st = p.path->progress(*this);
        if (p.tm) p.tm->meter.advance(now_ns());
        if (st.heard) p.last_heard_ns = now;
        if (st.error == -EMSGSIZE || st.error == -EPROTO) {
            // The peer broke the protocol: no other path can make this right.
            fail_locked(st.error, p.desc + ": " + st.detail);
            return;
        }
        if (st.error != 0) lose_path_locked(i, st.detail + " (" + strerror(-st.error) + ")", false);
        else if (st.peer_closed) lose_path_locked(i, "peer closed the path", true);
        else if (next_post_seq_ > floor_ && since(now_ns(), p.last_heard_ns) > cfg_.stall_timeout_ns)
            // The sender probes quiet paths every probe interval: with receives pending,
            // silence this long means the path (or the peer) is gone.
            lose_path_locked(i, "silent: nothing heard for " +
                                    std::to_string(since(now_ns(), p.last_heard_ns) / 1000000) +
                                    " ms with receives pending", false);
    }
    for (PathSlot &ps : paths_)
        if (ps.alive) ps.path->set_app_bound(waiting_for_post_);
    // Paths the sender rebuilt (failback, a lost backup), polled at the engine's tick rate.
    if (acceptor_ && now >= next_accept_poll_ns_) {
        next_accept_poll_ns_ = now + ProgressEngine::kTickNs;
        std::unique_ptr<RecvPath> np;
        int slot = -1;
        acceptor_->poll(&np, &slot);
        if (np && slot >= 0 && slot < kMaxPaths) {
            PathSlot &ps = paths_[slot];
            if (ps.path)
                watch(*ps.path, this, false);
            ps.path = std::move(np);
            watch(*ps.path, this, true);
            ps.desc = ps.path->describe();
            ps.tm.reset();
            ps.tm = make_telemetry(cfg_, 1, slot, ps.path->local_dev(), ps.desc, this);
            ps.alive = true;
            ps.orderly = false;
            ps.last_heard_ns = ps.last_beat_ns = now;
            ps.path->ack(floor_, gen_);
            VLOG_INFO(NCCL_NET, "host %s: path rebuilt by the peer: %s", host_name(), ps.desc.c_str());
        }
    }
    bool any = false, all_orderly = true;
    for (const PathSlot &p : paths_) {
        if (!p.path) continue;
        any = any || p.alive;
        all_orderly = all_orderly && (p.alive || p.orderly);
    }
    if (any) {
        no_path_since_ns_ = 0;
        return;
    }
    const bool pending = next_post_seq_ > floor_;
    if (all_orderly && !peer_closed_) {
        // Every path closed in order: the peer's closeSend.
        peer_closed_ = true;
        if (pending)
            fail_locked(-ECONNRESET, describe() + ": peer closed the connection with " +
                                         std::to_string(next_post_seq_ - floor_) +
                                         " receives outstanding");
    } else if (!all_orderly && pending && since(now_ns(), no_path_since_ns_) > cfg_.fatal_timeout_ns) {
        fail_locked(-ECONNRESET, describe() + ": no path to the peer for " +
                                     std::to_string(cfg_.fatal_timeout_ns / 1000000) + " ms");
    }
}

Placement RecvComm::locate(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size)
{
    Placement p;
    if (gen < gen_) return p.kind = Placement::kDiscard, p; // stale: its generation was replayed
    if (gen > gen_) {
        // The sender failed over and replays every message it has no ack for, whole: forget
        // partial progress of incomplete messages (their bytes get rewritten identically).
        gen_ = gen;
        for (uint64_t s = floor_; s < next_post_seq_; ++s) {
            Slot &sl = slots_[s % kMaxInflight];
            if (!sl.complete) sl.got = 0;
        }
    }
    if (seq < floor_) return p.kind = Placement::kDiscard, p; // replay of a completed message
    if (seq - floor_ >= kMaxInflight) {
        p.kind = Placement::kError;
        p.error = -EPROTO;
        return p;
    }
    if (seq >= next_post_seq_) { // kNotPosted: the application has not posted this receive
        waiting_for_post_ = true;
        return p;
    }
    Slot &s = slots_[seq % kMaxInflight];
    if (s.complete) return p.kind = Placement::kDiscard, p;
    Request *r = s.req;
    if (s.buf < 0) {
        // Bind in sequence order: every earlier message of this irecv must be bound first.
        int nbound = 0;
        for (int i = 0; i < r->n; ++i) nbound += r->bound[i] ? 1 : 0;
        if (seq - r->seq != static_cast<uint64_t>(nbound)) return p; // wait (kNotPosted)
        int pick = -1;
        for (int i = 0; i < r->n && pick < 0; ++i)
            if (!r->bound[i] && r->tags[i] == tag) pick = i;
        if (pick < 0) {
            p.kind = Placement::kError;
            p.error = -EPROTO;
            return p;
        }
        if (size > r->capacity[pick]) {
            p.kind = Placement::kError;
            p.error = -EMSGSIZE;
            return p;
        }
        r->bound[pick] = true;
        r->msg_size[pick] = size;
        s.buf = pick;
    } else if (r->tags[s.buf] != tag || r->msg_size[s.buf] != size) {
        p.kind = Placement::kError;
        p.error = -EPROTO;
        return p;
    }
    p.kind = Placement::kPlace;
    p.dest = r->data[s.buf];
    return p;
}

bool RecvComm::still_wanted(uint32_t gen, uint64_t seq)
{
    return gen == gen_ && seq >= floor_ && seq < next_post_seq_ && !slots_[seq % kMaxInflight].complete;
}

int RecvComm::landed(uint64_t seq, uint64_t len, uint32_t gen)
{
    if (!still_wanted(gen, seq)) return 0; // a frame overtaken by a newer generation
    if (PathTelemetry *tm = paths_[cur_path_].tm.get()) {
        const uint64_t now = now_ns();
        tm->meter.on_complete(now, now, len); // receive side: bytes per path, no latency
        if (tm->entry && tm->entry->state.load(std::memory_order_relaxed) != telemetry::kActive) {
            // data arrives here now: this path is the active one, the other stands by
            tm->meter.set_state(now, telemetry::kActive, gen_);
            PathTelemetry *other = paths_[1 - cur_path_].tm.get();
            if (other && paths_[1 - cur_path_].alive) other->meter.set_state(now, telemetry::kStandby, gen_);
        }
    }
    Slot &s = slots_[seq % kMaxInflight];
    Request *r = s.req;
    s.got += len;
    if (s.got > r->msg_size[s.buf]) return -EPROTO;
    if (s.got < r->msg_size[s.buf]) return 0;
    s.complete = true;
    if (--r->remaining == 0) r->state.store(Request::kDone, std::memory_order_release);
    const uint64_t old = floor_;
    while (floor_ < next_post_seq_ && slots_[floor_ % kMaxInflight].complete)
        slots_[floor_++ % kMaxInflight] = Slot{};
    if (floor_ != old)
        for (PathSlot &p : paths_)
            if (p.alive) p.path->ack(floor_, gen_);
    return 0;
}

} // namespace vigil::net
