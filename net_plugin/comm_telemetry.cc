// SPDX-License-Identifier: Apache-2.0
// Telemetry hooks of a connection: each path's registry entry and meter, and the NCCL
// profiler net events (windows, failovers, failbacks) a sendComm emits under NCCL's proxy
// steps.
#include <atomic>

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
    const PathSlot &a = paths_[active_];
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
    d.dev = a.path->identity().dev;
    d.window_us = w.window_us;
    d.start_ns = w.start_ns;
    d.bytes = w.bytes;
    d.busy_ns = w.busy_ns;
    d.lat_p99_ns = w.lat_p99_ns;
    d.conn = reinterpret_cast<uintptr_t>(this);
    emit(d);
}

} // namespace vigil::net
