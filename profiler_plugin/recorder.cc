// SPDX-License-Identifier: Apache-2.0
// Per-thread event pools and the SPSC hand-off rings (see recorder.h).
#include "recorder.h"

#include <sys/mman.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <new>

namespace vigil::prof {

namespace {

// Handle layout: tag (8) | pool (12) | slot (20) | generation (24).
constexpr unsigned kPoolBits = 12, kSlotBits = 20, kGenBits = 24;
constexpr uint64_t kGenMask = (1ull << kGenBits) - 1;
constexpr uint32_t kMaxPools = 1u << kPoolBits;
constexpr uint32_t kMaxSlots = 1u << kSlotBits;

uint64_t encode(uint32_t pool, uint32_t slot, uint32_t gen)
{
    return (0x5aull << 56) | (static_cast<uint64_t>(pool) << (kSlotBits + kGenBits)) |
           (static_cast<uint64_t>(slot) << kGenBits) | (gen & kGenMask);
}

} // namespace

struct Slot {
    std::atomic<uint32_t> gen{0}; // odd: open
    uint32_t pad = 0;
    Record rec;
};

struct Pool {
    std::atomic<uint32_t> owned{0};
    uint32_t index = 0;
    uint32_t cursor = 0; // owner only
    uint32_t slot_mask = 0;
    uint32_t ring_mask = 0;
    Slot *slots = nullptr;
    Record *ring = nullptr;
    std::atomic<uint64_t> events{0};
    std::atomic<uint64_t> dropped_pool{0};
    std::atomic<uint64_t> dropped_ring{0};
    std::atomic<uint64_t> leaked{0};
    alignas(64) std::atomic<uint64_t> head{0}; // producer: the owning thread
    alignas(64) std::atomic<uint64_t> tail{0}; // consumer: the writer
};

/// The calling thread's claim on a pool, given back when the thread exits (the next thread
/// to claim it inherits its ring; the release/acquire pair on `owned` orders the handover).
struct ThreadPoolRef {
    Pool *pool = nullptr;
    bool failed = false;
    ~ThreadPoolRef()
    {
        if (pool) pool->owned.store(0, std::memory_order_release);
    }
};

namespace {
thread_local ThreadPoolRef t_pool;
} // namespace

Recorder &Recorder::instance()
{
    static Recorder *r = new Recorder; // never destroyed: threads may record during exit
    return *r;
}

int Recorder::configure(const RecorderConfig &cfg)
{
    if (configured()) return 0;
    RecorderConfig c = cfg;
    c.threads = std::min(std::max(c.threads, 1u), kMaxPools);
    c.pool = std::bit_ceil(std::min(std::max(c.pool, 2u), kMaxSlots));
    c.ring = std::bit_ceil(std::max(c.ring, 2u));
    const size_t slots_bytes = static_cast<size_t>(c.pool) * sizeof(Slot);
    const size_t ring_bytes = static_cast<size_t>(c.ring) * sizeof(Record);
    const size_t bytes = static_cast<size_t>(c.threads) * (sizeof(Pool) + slots_bytes + ring_bytes);
    void *mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) return -ENOMEM;
    // Anonymous memory is zero: a zero Slot (generation 0, free) and a zero Record are valid,
    // so only the Pool headers need constructing.
    auto *base = static_cast<uint8_t *>(mem);
    Pool *pools = reinterpret_cast<Pool *>(base);
    uint8_t *data = base + static_cast<size_t>(c.threads) * sizeof(Pool);
    for (uint32_t i = 0; i < c.threads; ++i) {
        Pool *p = new (&pools[i]) Pool();
        p->index = i;
        p->slot_mask = c.pool - 1;
        p->ring_mask = c.ring - 1;
        p->slots = reinterpret_cast<Slot *>(data);
        data += slots_bytes;
        p->ring = reinterpret_cast<Record *>(data);
        data += ring_bytes;
    }
    cfg_ = c;
    bytes_ = bytes;
    pools_.store(pools, std::memory_order_release);
    return 0;
}

Pool *Recorder::pool_at(uint32_t i) const noexcept
{
    Pool *p = pools_.load(std::memory_order_acquire);
    return p && i < cfg_.threads ? &p[i] : nullptr;
}

Pool *Recorder::my_pool() noexcept
{
    if (t_pool.pool) return t_pool.pool;
    if (t_pool.failed) return nullptr;
    Pool *pools = pools_.load(std::memory_order_acquire);
    if (pools == nullptr) return nullptr;
    for (uint32_t i = 0; i < cfg_.threads; ++i) {
        uint32_t expect = 0;
        if (pools[i].owned.load(std::memory_order_relaxed) == 0 &&
            pools[i].owned.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) {
            t_pool.pool = &pools[i];
            return t_pool.pool;
        }
    }
    t_pool.failed = true; // not retried: every later event of this thread is counted instead
    return nullptr;
}

Record *Recorder::open(Kind kind, uint64_t now, uint64_t *handle) noexcept
{
    *handle = 0;
    Pool *p = my_pool();
    if (p == nullptr) {
        dropped_threads_.fetch_add(1, std::memory_order_relaxed);
        return nullptr;
    }
    // A free slot first (the next one, nearly always). Only when every slot is open is a stale
    // proxy step reclaimed: NCCL restarts a step without stopping the first start
    // (docs/nccl-abi.md, "Profiler calls and handles"), and only steps leak that way; any other
    // event may legitimately stay open for as long as a rank is late.
    uint32_t i = 0, g = 0;
    bool found = false;
    for (uint32_t n = 0; n <= p->slot_mask && !found; ++n) {
        i = p->cursor;
        p->cursor = (p->cursor + 1) & p->slot_mask;
        g = p->slots[i].gen.load(std::memory_order_acquire);
        found = !(g & 1);
    }
    for (uint32_t n = 0; n <= p->slot_mask && !found; ++n) {
        i = (p->cursor + n) & p->slot_mask;
        Slot &s = p->slots[i];
        g = s.gen.load(std::memory_order_acquire);
        if (s.rec.kind == Kind::kProxyStep && now - s.rec.start_ns >= cfg_.stale_ns &&
            s.gen.compare_exchange_strong(g, g + 1)) {
            p->leaked.fetch_add(1, std::memory_order_relaxed);
            ++g;
            found = true;
        }
    }
    if (found) {
        Slot &s = p->slots[i];
        s.gen.store(g + 1, std::memory_order_relaxed);
        Record &r = s.rec;
        std::memset(static_cast<void *>(&r), 0, sizeof(r));
        r.kind = kind;
        r.thread = static_cast<uint16_t>(p->index);
        r.start_ns = now;
        r.id = encode(p->index, i, g + 1);
        p->events.store(p->events.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        *handle = r.id;
        return &r;
    }
    // Exhausted: every open costs a scan of the pool until a slot frees up.
    p->dropped_pool.store(p->dropped_pool.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return nullptr;
}

Record *Recorder::peek(uint64_t handle) const noexcept
{
    if (!is_ours(handle)) return nullptr;
    const uint32_t pi = static_cast<uint32_t>(handle >> (kSlotBits + kGenBits)) & (kMaxPools - 1);
    const uint32_t si = static_cast<uint32_t>(handle >> kGenBits) & (kMaxSlots - 1);
    Pool *p = pool_at(pi);
    if (p == nullptr || si > p->slot_mask) return nullptr;
    Slot &s = p->slots[si];
    const uint32_t g = s.gen.load(std::memory_order_acquire);
    if (!(g & 1) || (g & kGenMask) != (handle & kGenMask)) return nullptr;
    return &s.rec;
}

Record *Recorder::peek_own(uint64_t handle) const noexcept
{
    // Only the calling thread writes its own pool's slots, so reading one of them races with
    // nothing; another thread's slot may be reused under the reader at any time.
    const Pool *mine = t_pool.pool;
    if (mine == nullptr || !is_ours(handle)) return nullptr;
    const uint32_t pi = static_cast<uint32_t>(handle >> (kSlotBits + kGenBits)) & (kMaxPools - 1);
    return pi == mine->index ? peek(handle) : nullptr;
}

Record *Recorder::find(uint64_t handle) noexcept
{
    if (handle == 0) return nullptr;
    Record *r = peek(handle);
    if (r == nullptr) foreign_.fetch_add(1, std::memory_order_relaxed);
    return r;
}

void Recorder::close(Record *r, uint64_t now) noexcept
{
    r->stop_ns = now;
    Slot *s = reinterpret_cast<Slot *>(reinterpret_cast<uint8_t *>(r) - offsetof(Slot, rec));
    const uint32_t g = static_cast<uint32_t>(r->id & kGenMask);
    if (Pool *p = my_pool()) {
        const uint64_t h = p->head.load(std::memory_order_relaxed);
        if (h - p->tail.load(std::memory_order_acquire) > p->ring_mask) {
            p->dropped_ring.store(p->dropped_ring.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        } else {
            std::memcpy(static_cast<void *>(&p->ring[h & p->ring_mask]), r, sizeof(Record));
            p->head.store(h + 1, std::memory_order_release);
        }
    } else {
        dropped_threads_.fetch_add(1, std::memory_order_relaxed);
    }
    // Free the slot. The CAS fails only if the owner reclaimed it as leaked meanwhile.
    uint32_t cur = s->gen.load(std::memory_order_relaxed);
    if ((cur & kGenMask) == g && (cur & 1)) s->gen.compare_exchange_strong(cur, cur + 1, std::memory_order_release);
}

size_t Recorder::drain_pool(Pool &p, void (*fn)(void *, const Record &), void *arg)
{
    uint64_t t = p.tail.load(std::memory_order_relaxed);
    const uint64_t h = p.head.load(std::memory_order_acquire);
    const size_t n = h - t;
    for (; t < h; ++t) fn(arg, p.ring[t & p.ring_mask]);
    p.tail.store(t, std::memory_order_release);
    return n;
}

size_t Recorder::drain_all(void (*fn)(void *, const Record &), void *arg)
{
    size_t n = 0;
    for (uint32_t i = 0; i < cfg_.threads; ++i)
        if (Pool *p = pool_at(i)) n += drain_pool(*p, fn, arg);
    return n;
}

bool Recorder::release() noexcept
{
    Pool *pools = pools_.load(std::memory_order_acquire);
    if (pools == nullptr) return true;
    for (uint32_t i = 0; i < cfg_.threads; ++i)
        if (pools[i].owned.load(std::memory_order_acquire)) return false;
    pools_.store(nullptr, std::memory_order_release);
    munmap(pools, bytes_);
    return true;
}

RecorderCounters Recorder::counters() const noexcept
{
    RecorderCounters c;
    for (uint32_t i = 0; i < cfg_.threads; ++i) {
        Pool *p = pool_at(i);
        if (p == nullptr) break;
        c.events += p->events.load(std::memory_order_relaxed);
        c.dropped_pool += p->dropped_pool.load(std::memory_order_relaxed);
        c.dropped_ring += p->dropped_ring.load(std::memory_order_relaxed);
        c.leaked += p->leaked.load(std::memory_order_relaxed);
    }
    c.dropped_threads = dropped_threads_.load(std::memory_order_relaxed);
    c.foreign_handles = foreign_.load(std::memory_order_relaxed);
    return c;
}

} // namespace vigil::prof
