// SPDX-License-Identifier: Apache-2.0
// The recorder: preallocated per-thread event pools and lock-free hand-off of finished events
// to one writer thread.
//
// Each recording thread claims one Pool on its first event (an atomic flag; no allocation:
// every pool is reserved when the recorder is configured). A pool has
//   * `slots`: events open right now. A slot's generation is odd while the event is open.
//     The handle given to NCCL encodes (tag, pool, slot, generation), so a stale handle (the
//     event was stopped, or its slot reused) or a handle we never issued is recognised and
//     ignored instead of corrupting another event. Only the owning thread allocates slots;
//     any thread may stop an event (CAS on the generation).
//   * `ring`: a single-producer/single-consumer ring of finished Records. The producer is the
//     thread that *stops* an event (it pushes to its own pool's ring), the consumer the
//     writer thread.
// Nothing on the hot path allocates, locks or makes a system call (the clock is the vDSO).
// Exhaustion is counted, never silent: `dropped_pool` (no free slot), `dropped_ring` (the
// writer fell behind), `dropped_threads` (more threads than pools), `leaked` (with every slot
// open, a proxy step older than the stale age was reclaimed: NCCL restarts proxy steps
// without stopping them, docs/nccl-abi.md, "Profiler calls and handles").
//
// Memory: threads x (pool x 120 + ring x 112) bytes, reserved with mmap(MAP_NORESERVE) and
// resident only once touched. Defaults 64 x (4096 x 120 + 16384 x 112) = 142 MiB virtual;
// a thread that has recorded more than 16384 events has touched its 2.2 MiB.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "event.h"

namespace vigil::prof {

/// Sizes of the recorder. `pool` and `ring` are rounded up to powers of two.
struct RecorderConfig {
    uint32_t threads = 64;
    uint32_t pool = 4096;
    uint32_t ring = 16384;
    uint64_t stale_ns = 10'000'000'000; ///< an open event older than this may be reclaimed
};

/// Totals over every pool (monotonic counters).
struct RecorderCounters {
    uint64_t events = 0;          ///< events started
    uint64_t dropped_pool = 0;
    uint64_t dropped_ring = 0;
    uint64_t dropped_threads = 0;
    uint64_t leaked = 0;
    uint64_t foreign_handles = 0; ///< stop/record calls with a handle we did not issue or
                                  ///< that was already stopped (NULL excluded)
};

struct Pool;

/// The process's recorder. Thread-safe as described in the file comment; configure() and
/// shutdown() are serialised by the caller (the profiler's init/finalize lock).
class Recorder
{
public:
    static Recorder &instance();

    /// Reserves every pool (idempotent: a second call keeps the first sizes). Returns 0 or
    /// -ENOMEM.
    int configure(const RecorderConfig &cfg);
    bool configured() const { return pools_.load(std::memory_order_acquire) != nullptr; }

    /// Opens an event: claims a slot of the calling thread's pool, stamps `kind`, `id`,
    /// `thread` and `start_ns`, and returns the record for the caller to fill, with *handle
    /// set to the value to give NCCL. Returns nullptr (and *handle = 0) when the event is
    /// dropped; the drop is counted. Hot path.
    Record *open(Kind kind, uint64_t now, uint64_t *handle) noexcept;

    /// The open event `handle` refers to, or nullptr (0, not ours, or already stopped; the
    /// latter two are counted as foreign). Hot path.
    Record *find(uint64_t handle) noexcept;
    /// Like find() without counting a miss.
    Record *peek(uint64_t handle) const noexcept;
    /// peek() limited to events the calling thread opened (its own pool): the only records a
    /// thread may read without racing their reuse (for parent lookups on the proxy thread,
    /// where a step's ProxyOp and a net event's step are the caller's own).
    Record *peek_own(uint64_t handle) const noexcept;

    /// Unmaps the pools when no thread owns one, for a library about to be unloaded with
    /// every communicator finalized (glibc unloads it only once no thread holds a pool's
    /// thread_local). Returns false, keeping them, when a pool is still owned. The caller
    /// guarantees no event is recorded any more.
    bool release() noexcept;

    /// Stops the open event `r` (from find()): stamps `stop_ns`, hands the record to the
    /// writer through the calling thread's ring, frees the slot. Hot path.
    void close(Record *r, uint64_t now) noexcept;

    /// Writer side: calls `fn(const Record&)` for every finished record, pool by pool.
    /// Single consumer. Returns how many.
    template <class Fn> size_t drain(Fn &&fn);

    RecorderCounters counters() const noexcept;

    /// True when `handle` has the recorder's tag (issued by some Recorder, maybe stale).
    static bool is_ours(uint64_t handle) noexcept { return (handle >> 56) == kTag; }

private:
    static constexpr uint64_t kTag = 0x5a;
    Pool *my_pool() noexcept;
    Pool *pool_at(uint32_t i) const noexcept;
    size_t drain_pool(Pool &p, void (*fn)(void *, const Record &), void *arg);
    size_t drain_all(void (*fn)(void *, const Record &), void *arg);

    std::atomic<Pool *> pools_{nullptr};
    size_t bytes_ = 0;
    RecorderConfig cfg_{};
    std::atomic<uint64_t> dropped_threads_{0};
    std::atomic<uint64_t> foreign_{0};
    friend struct ThreadPoolRef;
};

template <class Fn> size_t Recorder::drain(Fn &&fn)
{
    return drain_all([](void *a, const Record &r) { (*static_cast<Fn *>(a))(r); }, &fn);
}

} // namespace vigil::prof
