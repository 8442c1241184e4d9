// SPDX-License-Identifier: Apache-2.0
// Telemetry hooks of a connection: each path's registry entry and meter, and the NCCL
// profiler net events (windows, failovers, failbacks) a sendComm emits under NCCL's proxy
// steps.
#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <fcntl.h>
#include <unistd.h>

#include "clock.h"
#include "send_comm.h"
#include "telemetry/writer.h"

namespace vigil::net {

PathTelemetry::PathTelemetry(const TelemetryConfig &cfg, Direction dir, const PathIdentity &id,
                             uint64_t conn_id)
    : entry(telemetry::Registry::instance().acquire(static_cast<int>(dir), id.slot, id.dev,
                                                    id.dev_name, id.local, id.peer, conn_id)),
      sink(entry, (dir == Direction::kSend ? "send " : "recv ") + id.describe()),
      meter(cfg.window_ns, &sink, [&] {
          telemetry::DetectorConfig d = cfg.detector;
          if (id.dev >= 0 && static_cast<size_t>(id.dev) < cfg.link_bytes_per_s.size())
              d.link_bytes_per_s = cfg.link_bytes_per_s[static_cast<size_t>(id.dev)];
          return d;
      }(),
            telemetry::PortClock::of(dir == Direction::kSend ? 0 : 1, id.dev))
{
}

PathTelemetry::~PathTelemetry()
{
    // The path's last, partial window still reaches the ring, and the writer (if any) drains
    // the entry before it is reused.
    meter.flush(now_ns());
    telemetry::Registry::instance().release(entry, telemetry::writer_running());
}

std::unique_ptr<PathTelemetry> PathTelemetry::make(const TelemetryConfig &cfg, Direction dir,
                                                   const PathIdentity &id, const void *owner) noexcept
{
    if (cfg.window_ns == 0 || !telemetry::Registry::instance().is_open()) return nullptr;
    try {
        return std::make_unique<PathTelemetry>(cfg, dir, id, reinterpret_cast<uintptr_t>(owner));
    } catch (...) {
        return nullptr;
    }
}

// ---- sendComm: meters and profiler events --------------------------------------------------

namespace {
std::atomic<ncclProfilerCallback_t> g_profiler{nullptr};
} // namespace

void SendComm::set_profiler(ncclProfilerCallback_t cb) noexcept
{
    g_profiler.store(cb, std::memory_order_release);
}

void SendComm::meter_locked(int slot) noexcept
{
    PathSlot &sl = paths_[slot];
    sl.tm.reset();
    if (sl.path) sl.tm = PathTelemetry::make(tcfg_, Direction::kSend, sl.path->identity(), this);
}

// ---- sendComm: wait time --------------------------------------------------------------
//
// How long the end points made a path wait (DegradeDetector, "wait time"): the transfer was
// waiting for a thread at one end to run (on a busy host, for a CPU, or for a lock its holder
// was preempted with), not for the path.
//
//  - A fabric that can tell reports the wait with each ack (PathStatus::wait_ns; TCP measures
//    it with kernel receive timestamps: how long the newest bytes the ack covers sat unread at
//    the receiver, plus how long the ack sat unread here). The receiver's part is charged with
//    every ack that completes a message, whatever else is in flight: a reader that does not
//    run lets its socket buffer fill and the sender's window close, so the path stalls even
//    with more to carry, while bytes still arriving (a slow path) keep the newest arrival
//    recent and the delay short. This end's part only when nothing else is in flight: with
//    more queued in its sockets, its own lateness in reading an ack did not stall the path.
//    Where the path did carry other bytes meanwhile, a charge makes its bandwidth look
//    higher, never lower: it can hide some slowness, never invent it. Bounded by the time
//    since the newest message it covers was posted.
//  - Otherwise (verbs: an RC completion needs no thread at the receiver), this end's own
//    lateness, charged only when the acks of a pass complete the last message in flight (the
//    path had nothing left to carry): how long the thread that found the completion had been
//    runnable without a CPU since the previous progress pass (its run delay,
//    /proc/thread-self/schedstat, read at most every kRunDelayReadNs per thread: no system
//    call per message).
// A later copy of the same ack (a heartbeat, the other path's copy) is read while nothing is in
// flight; its unread time cost the path nothing and is not charged.

namespace {

constexpr uint64_t kRunDelayReadNs = 5'000'000; // 5 ms

// The calling thread's run delay (time runnable but waiting for a CPU), from
// /proc/thread-self/schedstat ("run_ns wait_ns slices"; kernel CONFIG_SCHED_INFO).
class ThreadRunDelay
{
public:
    ThreadRunDelay() = default;
    ThreadRunDelay(const ThreadRunDelay &) = delete;
    ThreadRunDelay &operator=(const ThreadRunDelay &) = delete;
    ~ThreadRunDelay()
    {
        if (fd_ >= 0) close(fd_);
    }
    /// Run delay accrued since this thread's previous read, ns; false when the previous read
    /// was less than kRunDelayReadNs ago (nothing is read) or the file cannot be read.
    bool delta(uint64_t now, uint64_t *out) noexcept
    {
        if (fd_ == -2) fd_ = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
        if (fd_ < 0 || now < read_ns_ + kRunDelayReadNs) return false;
        char buf[96];
        const ssize_t n = pread(fd_, buf, sizeof(buf) - 1, 0);
        if (n <= 0) return false;
        buf[n] = '\0';
        uint64_t run = 0, wait = 0;
        if (std::sscanf(buf, "%" SCNu64 " %" SCNu64, &run, &wait) != 2) return false;
        const bool first = read_ns_ == 0;
        *out = first || wait < wait_ns_ ? 0 : wait - wait_ns_;
        read_ns_ = now;
        wait_ns_ = wait;
        return !first;
    }

private:
    int fd_ = -2; // -2: not opened yet, -1: unavailable
    uint64_t read_ns_ = 0, wait_ns_ = 0;
};

thread_local ThreadRunDelay t_run_delay;

} // namespace

void SendComm::ack_wait_locked(int slot, const PathStatus &st, uint64_t now) noexcept
{
    uint64_t &seen = wait_ack_[static_cast<size_t>(slot)];
    if (st.wait_ack <= seen || st.wait_ack > next_seq_) return; // no new ack, or a bogus one
    seen = st.wait_ack;
    PathTelemetry *tm = paths_[slot].tm.get();
    if (tm == nullptr) return;
    // With more in flight, this end's own lateness in reading the ack did not stall the path
    // (its sockets still had data queued): only the reader's part counts. Each path's ack
    // says how long the bytes that path brought waited (multipath: the shared path's data
    // waits for the same reader and the same busy CPUs as the active one's).
    const bool drained = st.wait_ack == next_seq_;
    const uint64_t wait = std::min(drained ? st.wait_ns : st.wait_stalled_ns,
                                   since(now, at(st.wait_ack - 1).msg.posted_ns));
    if (wait > 0) tm->meter.on_wait(now, wait);
}

void SendComm::account_wait_locked(uint64_t now) noexcept
{
    const bool completed = acked_ != wait_acked_;
    const uint64_t since_pass = since(now, wait_pass_ns_);
    wait_acked_ = acked_;
    wait_pass_ns_ = now;
    // Only a pass whose acks completed the last message in flight (the paths had nothing
    // left to carry), for the carrying paths whose fabric reported no wait with it.
    if (!completed || acked_ == 0 || acked_ != next_seq_) return;
    bool read = false;
    uint64_t run_delay = 0;
    for (int i = 0; i < kMaxPaths; ++i) {
        const PathSlot &sl = paths_[i];
        PathTelemetry *tm = sl.tm.get();
        if (tm == nullptr || (sl.state != SlotState::kActive && sl.state != SlotState::kShared) ||
            wait_ack_[static_cast<size_t>(i)] >= acked_)
            continue;
        if (!read && !t_run_delay.delta(now, &run_delay)) run_delay = 0;
        read = true;
        const uint64_t wait = std::min(run_delay, since_pass);
        if (wait > 0) tm->meter.on_wait(now, wait);
    }
}

void SendComm::queue_event_locked(uint8_t type, int slot, uint64_t bytes) noexcept
{
    if (g_profiler.load(std::memory_order_relaxed) == nullptr || evq_n_ == kEventQueue) return;
    vigilNetProfDescr_v1_t &d = evq_[static_cast<size_t>(evq_n_++)];
    d = vigilNetProfDescr_v1_t{};
    d.type = type;
    d.slot = static_cast<uint8_t>(slot);
    d.generation = gen_;
    d.dev = paths_[slot].path ? paths_[slot].path->identity().dev : -1;
    d.start_ns = now_ns();
    d.bytes = bytes;
    d.conn = reinterpret_cast<uintptr_t>(this);
}

void SendComm::take_events_locked(void *phandle, NetEvents *ev) noexcept
{
    // Never an event without a parent.
    if (g_profiler.load(std::memory_order_acquire) == nullptr || phandle == nullptr) return;
    auto take = [&](const vigilNetProfDescr_v1_t &src) {
        vigilNetProfDescr_v1_t &d = descr_ring_[descr_next_++ % kDescrRing];
        d = src;
        ev->d[static_cast<size_t>(ev->n++)] = &d;
    };
    for (int i = 0; i < evq_n_; ++i) take(evq_[static_cast<size_t>(i)]);
    evq_n_ = 0;
    // The newest window of every path that carries (the active one and, with multipath, the
    // shared one), each with its share of the bytes of those windows.
    std::array<telemetry::WindowRecord, kMaxPaths> w{};
    std::array<bool, kMaxPaths> fresh{};
    uint64_t total = 0;
    for (int i = 0; i < kMaxPaths; ++i) {
        const PathSlot &sl = paths_[static_cast<size_t>(i)];
        if (sl.state != SlotState::kActive && sl.state != SlotState::kShared) continue;
        if (sl.tm == nullptr || sl.tm->entry == nullptr) continue;
        const uint64_t head = sl.tm->entry->ring.head.load(std::memory_order_relaxed);
        if (head == 0 || head == last_window_emitted_[static_cast<size_t>(i)]) continue;
        if (!telemetry::RegistryView::read(*sl.tm->entry, head - 1, &w[static_cast<size_t>(i)])) continue;
        last_window_emitted_[static_cast<size_t>(i)] = head;
        fresh[static_cast<size_t>(i)] = true;
        total += w[static_cast<size_t>(i)].bytes;
    }
    for (int i = 0; i < kMaxPaths; ++i) {
        if (!fresh[static_cast<size_t>(i)]) continue;
        const telemetry::WindowRecord &r = w[static_cast<size_t>(i)];
        vigilNetProfDescr_v1_t d{};
        d.type = vigilNetProfWindow;
        d.slot = static_cast<uint8_t>(i);
        d.degraded = r.degraded;
        d.state = r.state;
        d.generation = r.generation;
        d.dev = paths_[static_cast<size_t>(i)].path->identity().dev;
        d.window_us = r.window_us;
        d.start_ns = r.start_ns;
        d.bytes = r.bytes;
        d.busy_ns = r.busy_ns;
        d.lat_p99_ns = r.lat_p99_ns;
        d.conn = reinterpret_cast<uintptr_t>(this);
        d.share_permille = static_cast<uint16_t>(total == 0 ? 0 : r.bytes * 1000 / total);
        take(d);
    }
}

void SendComm::emit_events(const NetEvents &ev, void *phandle) noexcept
{
    if (ev.n == 0) return;
    ncclProfilerCallback_t cb = g_profiler.load(std::memory_order_acquire);
    if (cb == nullptr) return;
    for (int i = 0; i < ev.n; ++i) {
        void *h = nullptr; // NCCL leaves it untouched when the NetPlugin bit is off
        cb(&h, 0 /* start */, phandle, VIGIL_PROFILER_NET_ID, ev.d[static_cast<size_t>(i)]);
        if (h != nullptr) cb(&h, 1 /* stop */, nullptr, 0, nullptr);
    }
}

} // namespace vigil::net
