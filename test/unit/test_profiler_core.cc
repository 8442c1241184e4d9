// SPDX-License-Identifier: Apache-2.0
// The profiler core (profiler_plugin/): the Recorder's tagged handles, per-thread pools, SPSC
// rings and their drop/leak counters on synthetic timestamps; VIGIL_PROFILE_EVENTS parsing;
// nccl-tests' bus-bandwidth factors; context validation through a real init/finalize.
//
// The Recorder is one per process and configured once. Every test that touches it calls
// rec() first, which configures it with the small sizes below (kThreads pools of kPool
// slots and kRing ring entries, kStale reclaim age); the init test calls rec() before
// init, so init finds it configured and keeps these sizes. Every Recorder test drains the
// rings when it starts and closes what it opened when it ends (RAII, failures included), so
// the tests do not depend on their order. The writer thread that init starts is the rings'
// consumer only between that test's init and finalize (which joins it).
#include <catch2/catch.hpp>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <future>
#include <iterator>
#include <latch>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "clock.h"
#include "event.h"
#include "profiler.h"
#include "recorder.h"
#include "writer.h"

namespace {

namespace vp = vigil::prof;
using vp::Kind;

constexpr uint32_t kThreads = 8;
constexpr uint32_t kPool = 64;
constexpr uint32_t kRing = 256;
constexpr uint64_t kStale = 50'000'000; // 50 ms

// Handle layout (recorder.cc): tag (8) | pool (12) | slot (20) | generation (24).
constexpr uint64_t make_handle(uint64_t tag, uint64_t pool, uint64_t slot, uint64_t gen)
{
    return (tag << 56) | (pool << 44) | (slot << 24) | (gen & 0xffffff);
}
constexpr uint64_t slot_bits(uint64_t h) { return h >> 24; } // tag|pool|slot, no generation
constexpr uint32_t pool_of(uint64_t h) { return static_cast<uint32_t>(h >> 44) & 0xfff; }

vp::Recorder &rec()
{
    vp::Recorder &r = vp::Recorder::instance();
    // Configured here, first, by this file: anything else configuring it first would leave
    // sizes these tests do not know.
    static const bool ours = [&r] {
        if (r.configured()) return false;
        vp::RecorderConfig c;
        c.threads = kThreads;
        c.pool = kPool;
        c.ring = kRing;
        c.stale_ns = kStale;
        return r.configure(c) == 0;
    }();
    REQUIRE(ours);
    REQUIRE(r.configured());
    return r;
}

std::vector<vp::Record> drain()
{
    std::vector<vp::Record> v;
    rec().drain([&v](const vp::Record &r) { v.push_back(r); });
    return v;
}

/// Events opened by a test; whatever is still open at scope exit is closed (without
/// counting foreign handles) and the rings drained, so a failed test leaves a clean pool.
struct Opened {
    std::vector<uint64_t> handles;
    uint64_t close_ns;
    explicit Opened(uint64_t t) : close_ns(t) {}
    ~Opened()
    {
        for (uint64_t h : handles)
            if (vp::Record *r = vp::Recorder::instance().peek(h)) vp::Recorder::instance().close(r, close_ns);
        vp::Recorder::instance().drain([](const vp::Record &) {});
    }
    vp::Record *open(Kind k, uint64_t now, uint64_t *h)
    {
        vp::Record *r = vp::Recorder::instance().open(k, now, h);
        if (r != nullptr) handles.push_back(*h);
        return r;
    }
};

/// The pool index of the calling thread (claims one when it has none yet).
uint16_t my_pool_index()
{
    uint64_t h = 0;
    vp::Record *r = rec().open(Kind::kGroup, vigil::now_ns(), &h);
    REQUIRE(r != nullptr);
    const uint16_t i = r->thread;
    rec().close(r, r->start_ns);
    drain();
    return i;
}

} // namespace

// ---------------------------------------------------------------------------------------
// Recorder
// ---------------------------------------------------------------------------------------

TEST_CASE("recorder: handles carry the tag and resolve to their record until closed", "[profiler][recorder]")
{
    vp::Recorder &r = rec();
    drain();
    const uint64_t t = vigil::now_ns();
    Opened ev(t);
    uint64_t h1 = 0, h2 = 0;
    vp::Record *r1 = ev.open(Kind::kColl, t, &h1);
    vp::Record *r2 = ev.open(Kind::kProxyStep, t + 5, &h2);
    REQUIRE(r1 != nullptr);
    REQUIRE(r2 != nullptr);
    CHECK(h1 != 0);
    CHECK(h2 != 0);
    CHECK(h1 != h2);
    CHECK(vp::Recorder::is_ours(h1));
    CHECK(vp::Recorder::is_ours(h2));
    CHECK(h1 >> 56 == 0x5a);
    CHECK(r1->id == h1);
    CHECK(r1->kind == Kind::kColl);
    CHECK(r1->start_ns == t);
    CHECK(r1->stop_ns == 0);
    CHECK(r1->thread < kThreads);
    CHECK(pool_of(h1) == r1->thread);
    CHECK(r2->kind == Kind::kProxyStep);
    CHECK(r2->start_ns == t + 5);
    CHECK(r2->thread == r1->thread); // one thread, one pool

    const vp::RecorderCounters c0 = r.counters();
    CHECK(r.find(h1) == r1);
    CHECK(r.find(h2) == r2);
    CHECK(r.peek(h1) == r1);
    CHECK(r.counters().foreign_handles == c0.foreign_handles); // hits are not foreign

    // Closing: the record goes to the ring with its stop time; the handle is dead.
    r1->coll.seq = 77;
    r.close(r1, t + 100);
    CHECK(r.find(h1) == nullptr);
    CHECK(r.peek(h1) == nullptr);
    CHECK(r.counters().foreign_handles == c0.foreign_handles + 1); // find() counted it, peek() not
    CHECK(r.find(h2) == r2);                                        // the other one is untouched
    std::vector<vp::Record> out = drain();
    REQUIRE(out.size() == 1);
    CHECK(out[0].id == h1);
    CHECK(out[0].kind == Kind::kColl);
    CHECK(out[0].start_ns == t);
    CHECK(out[0].stop_ns == t + 100);
    CHECK(out[0].coll.seq == 77);
    CHECK(drain().empty()); // drained once

    // find(0) is not foreign (NCCL passes NULL for events it did not get).
    const uint64_t f = r.counters().foreign_handles;
    CHECK(r.find(0) == nullptr);
    CHECK(r.counters().foreign_handles == f);
}

TEST_CASE("recorder: a slot reused after close gets a new handle", "[profiler][recorder]")
{
    vp::Recorder &r = rec();
    drain();
    const uint64_t t = vigil::now_ns();
    uint64_t old = 0;
    {
        Opened ev(t);
        vp::Record *a = ev.open(Kind::kColl, t, &old);
        REQUIRE(a != nullptr);
        r.close(a, t + 1);
    }
    // The pool is empty again: kPool opens take every slot, the old one's included.
    Opened ev(t);
    std::vector<uint64_t> hs;
    for (uint32_t i = 0; i < kPool; ++i) {
        uint64_t h = 0;
        REQUIRE(ev.open(Kind::kP2p, t + 10 + i, &h) != nullptr);
        hs.push_back(h);
    }
    CHECK(std::find(hs.begin(), hs.end(), old) == hs.end());
    CHECK(std::set<uint64_t>(hs.begin(), hs.end()).size() == kPool);
    const auto same_slot = std::count_if(hs.begin(), hs.end(), [&](uint64_t h) { return slot_bits(h) == slot_bits(old); });
    CHECK(same_slot == 1);
    for (uint64_t h : hs)
        if (slot_bits(h) == slot_bits(old)) {
            CHECK((h & 0xffffff) != (old & 0xffffff)); // only the generation tells them apart
            REQUIRE(r.peek(h) != nullptr);
            CHECK(r.peek(h)->kind == Kind::kP2p);
        }
    // The old handle names the reused slot but must not resolve to the new event.
    CHECK(r.peek(old) == nullptr);
    CHECK(r.find(old) == nullptr);
}

TEST_CASE("recorder: handles it did not issue are rejected and counted", "[profiler][recorder]")
{
    vp::Recorder &r = rec();
    drain();
    const uint64_t t = vigil::now_ns();
    Opened ev(t);
    uint64_t h = 0;
    vp::Record *a = ev.open(Kind::kColl, t, &h);
    REQUIRE(a != nullptr);
    const uint64_t pool = pool_of(h), slot = (h >> 24) & 0xfffff, gen = h & 0xffffff;
    REQUIRE(make_handle(0x5a, pool, slot, gen) == h); // the layout this test assumes

    int local = 0;
    const uint64_t bad[] = {
        make_handle(0x5b, pool, slot, gen),         // wrong tag, otherwise the live handle
        h & ((1ull << 56) - 1),                      // no tag
        reinterpret_cast<uint64_t>(&local),          // a pointer (another profiler's handle)
        make_handle(0x5a, kThreads, slot, gen),      // pool out of range
        make_handle(0x5a, 0xfff, slot, gen),         // pool out of range (the largest)
        make_handle(0x5a, pool, kPool, gen),         // slot out of range
        make_handle(0x5a, pool, 0xfffff, gen),       // slot out of range (the largest)
        make_handle(0x5a, pool, slot, gen + 1),      // live slot, wrong (even) generation
        make_handle(0x5a, pool, slot, gen + 2),      // live slot, a future generation
        make_handle(0x5a, pool, (slot + 1) % kPool, 1), // a free slot
    };
    CHECK_FALSE(vp::Recorder::is_ours(bad[0]));
    CHECK_FALSE(vp::Recorder::is_ours(bad[1]));
    CHECK_FALSE(vp::Recorder::is_ours(bad[2]));
    CHECK(vp::Recorder::is_ours(bad[3])); // tagged but stale/bogus: is_ours says "maybe"
    const uint64_t f0 = r.counters().foreign_handles;
    int i = 0;
    for (uint64_t b : bad) {
        INFO("bad handle #" << i++ << " 0x" << std::hex << b);
        CHECK(r.peek(b) == nullptr);
        CHECK(r.find(b) == nullptr);
    }
    CHECK(r.counters().foreign_handles == f0 + std::size(bad));
    CHECK(r.find(h) == a); // the live event is unharmed
    CHECK(a->kind == Kind::kColl);
    CHECK(a->start_ns == t);
}

TEST_CASE("recorder: pool exhaustion drops the excess and counts it exactly", "[profiler][recorder]")
{
    vp::Recorder &r = rec();
    drain();
    const uint64_t t = vigil::now_ns();
    Opened ev(t);
    const vp::RecorderCounters c0 = r.counters();
    std::vector<uint64_t> hs;
    for (uint32_t i = 0; i < kPool; ++i) {
        uint64_t h = 0;
        vp::Record *x = ev.open(Kind::kProxyStep, t + i, &h);
        REQUIRE(x != nullptr);
        hs.push_back(h);
    }
    constexpr int kExtra = 5;
    for (int i = 0; i < kExtra; ++i) {
        uint64_t h = 12345;
        CHECK(r.open(Kind::kProxyStep, t + kPool + i, &h) == nullptr); // none is stale yet
        CHECK(h == 0);
    }
    vp::RecorderCounters c1 = r.counters();
    CHECK(c1.dropped_pool - c0.dropped_pool == kExtra);
    CHECK(c1.events - c0.events == kPool);
    CHECK(c1.leaked == c0.leaked);
    CHECK(c1.dropped_threads == c0.dropped_threads);
    // Every open event still resolves to itself.
    for (size_t i = 0; i < hs.size(); ++i) {
        vp::Record *x = r.peek(hs[i]);
        REQUIRE(x != nullptr);
        CHECK(x->start_ns == t + i);
    }
    // Closing one frees exactly one slot.
    vp::Record *tenth = r.find(hs[10]);
    REQUIRE(tenth != nullptr);
    r.close(tenth, t + 1000);
    uint64_t h = 0;
    CHECK(ev.open(Kind::kProxyStep, t + 1001, &h) != nullptr);
    CHECK(r.open(Kind::kProxyStep, t + 1002, &h) == nullptr);
    CHECK(r.counters().dropped_pool - c0.dropped_pool == kExtra + 1);
}

TEST_CASE("recorder: ring overflow drops the newest and keeps the first ring's worth in order",
          "[profiler][recorder]")
{
    vp::Recorder &r = rec();
    drain();
    const uint64_t t = vigil::now_ns();
    Opened ev(t);
    const vp::RecorderCounters c0 = r.counters();
    constexpr uint32_t kExtra = 7;
    std::vector<uint64_t> hs;
    for (uint32_t i = 0; i < kRing + kExtra; ++i) {
        uint64_t h = 0;
        vp::Record *x = ev.open(Kind::kColl, t + 2 * i, &h);
        REQUIRE(x != nullptr);
        x->coll.seq = i;
        hs.push_back(h);
        r.close(x, t + 2 * i + 1);
    }
    const vp::RecorderCounters c1 = r.counters();
    CHECK(c1.dropped_ring - c0.dropped_ring == kExtra);
    CHECK(c1.events - c0.events == kRing + kExtra);
    CHECK(c1.dropped_pool == c0.dropped_pool); // every slot was freed, dropped or not
    const std::vector<vp::Record> out = drain();
    REQUIRE(out.size() == kRing);
    for (uint32_t i = 0; i < kRing; ++i) {
        INFO("record " << i);
        CHECK(out[i].id == hs[i]);
        CHECK(out[i].coll.seq == i);
        CHECK(out[i].start_ns == t + 2 * i);
        CHECK(out[i].stop_ns == t + 2 * i + 1);
    }
    // Drained: room again, and nothing of the dropped ones reappears.
    uint64_t h = 0;
    vp::Record *x = ev.open(Kind::kColl, t + 10'000, &h);
    REQUIRE(x != nullptr);
    r.close(x, t + 10'001);
    const std::vector<vp::Record> again = drain();
    REQUIRE(again.size() == 1);
    CHECK(again[0].id == h);
    CHECK(r.counters().dropped_ring - c0.dropped_ring == kExtra);
}

TEST_CASE("recorder: an event open longer than the stale age is reclaimed when the pool is full",
          "[profiler][recorder]")
{
    vp::Recorder &r = rec();
    drain();
    const uint64_t t0 = vigil::now_ns();
    const uint64_t t1 = t0 + kStale / 2;
    Opened ev(t0);
    const vp::RecorderCounters c0 = r.counters();
    uint64_t old = 0;
    REQUIRE(ev.open(Kind::kProxyStep, t0, &old) != nullptr);
    for (uint32_t i = 1; i < kPool; ++i) {
        uint64_t h = 0;
        REQUIRE(ev.open(Kind::kProxyStep, t1, &h) != nullptr);
    }
    // Full; the old one is not stale yet (open kStale - 1 ns): dropped, nothing reclaimed.
    uint64_t h = 0;
    CHECK(r.open(Kind::kProxyStep, t0 + kStale - 1, &h) == nullptr);
    CHECK(r.counters().dropped_pool - c0.dropped_pool == 1);
    CHECK(r.counters().leaked == c0.leaked);
    CHECK(r.peek(old) != nullptr);

    // Open longer than kStale: its slot is taken over, the others (kStale/2 old) are not.
    const uint64_t t2 = t0 + kStale + 1;
    vp::Record *n = ev.open(Kind::kColl, t2, &h);
    REQUIRE(n != nullptr);
    const vp::RecorderCounters c1 = r.counters();
    CHECK(c1.leaked - c0.leaked == 1);
    CHECK(c1.dropped_pool - c0.dropped_pool == 1);
    CHECK(slot_bits(h) == slot_bits(old)); // the stale event's slot
    CHECK(h != old);
    CHECK(n->id == h);
    CHECK(n->kind == Kind::kColl);
    CHECK(n->start_ns == t2);
    CHECK(n->stop_ns == 0);
    CHECK(r.peek(old) == nullptr);
    CHECK(r.find(old) == nullptr);
    CHECK(r.counters().foreign_handles - c0.foreign_handles == 1);
    CHECK(r.find(h) == n);
    // Still full (the others are only kStale/2 + 1 old): the next one is dropped.
    uint64_t h2 = 0;
    CHECK(r.open(Kind::kProxyStep, t2, &h2) == nullptr);
    CHECK(r.counters().leaked - c0.leaked == 1);
    CHECK(r.counters().dropped_pool - c0.dropped_pool == 2);
    // A late stop of the reclaimed event (NCCL stopping the old handle) changes nothing.
    CHECK(r.find(old) == nullptr);
    CHECK(r.find(h) == n);
    CHECK(drain().empty()); // a reclaimed event is never handed to the writer as stopped
}

TEST_CASE("recorder: an event stopped on another thread arrives in the stopping thread's ring",
          "[profiler][recorder]")
{
    vp::Recorder &r = rec();
    drain();
    const uint16_t mine = my_pool_index(); // B: this thread, holding its pool
    const uint64_t t = vigil::now_ns();

    struct Opened2 {
        uint64_t hx = 0, hy = 0;
        uint16_t thread = 0xffff;
        bool ok = false;
    };
    std::promise<Opened2> opened;
    std::promise<void> done;
    std::shared_future<void> done_f = done.get_future().share();
    // A: opens two events and keeps its pool (stays alive) until B is done.
    std::thread a([&opened, done_f, t] {
        Opened2 o;
        vp::Record *x = vp::Recorder::instance().open(Kind::kProxyStep, t, &o.hx);
        vp::Record *y = vp::Recorder::instance().open(Kind::kProxyOp, t + 1, &o.hy);
        o.ok = x != nullptr && y != nullptr;
        if (x) {
            o.thread = x->thread;
            x->step.step = 42;
        }
        opened.set_value(o);
        done_f.wait();
    });
    struct Join {
        std::promise<void> &done;
        std::thread &th;
        ~Join()
        {
            try {
                done.set_value();
            } catch (...) {
            }
            th.join();
        }
    } join{done, a};

    const Opened2 o = opened.get_future().get();
    Opened ev(t); // closes A's events if a check below fails
    ev.handles = {o.hx, o.hy};
    REQUIRE(o.ok);
    CHECK(o.thread != mine);
    CHECK(pool_of(o.hx) == o.thread);

    vp::Record *x = r.find(o.hx);
    REQUIRE(x != nullptr);
    r.close(x, t + 500);
    CHECK(r.peek(o.hx) == nullptr);
    std::vector<vp::Record> out = drain();
    REQUIRE(out.size() == 1);
    CHECK(out[0].id == o.hx);
    CHECK(out[0].kind == Kind::kProxyStep);
    CHECK(out[0].thread == o.thread); // the thread that started it
    CHECK(out[0].start_ns == t);
    CHECK(out[0].stop_ns == t + 500);
    CHECK(out[0].step.step == 42);

    // Which ring: fill B's ring, then stop A's second event from B. It must be dropped on
    // B's full ring (A's ring is empty: had it gone there, it would be drained).
    const vp::RecorderCounters c0 = r.counters();
    for (uint32_t i = 0; i < kRing; ++i) {
        uint64_t h = 0;
        vp::Record *z = r.open(Kind::kColl, t + 1000 + i, &h);
        REQUIRE(z != nullptr);
        r.close(z, t + 1000 + i);
    }
    CHECK(r.counters().dropped_ring == c0.dropped_ring);
    vp::Record *y = r.find(o.hy);
    REQUIRE(y != nullptr);
    CHECK(y->kind == Kind::kProxyOp);
    r.close(y, t + 5000);
    CHECK(r.counters().dropped_ring - c0.dropped_ring == 1);
    CHECK(r.peek(o.hy) == nullptr); // the slot is freed even though the record was dropped
    out = drain();
    CHECK(out.size() == kRing);
    CHECK(std::none_of(out.begin(), out.end(), [&](const vp::Record &q) { return q.id == o.hy; }));
    for (const vp::Record &q : out) CHECK(q.thread == mine);
}

TEST_CASE("recorder: each thread gets its own pool; threads beyond the pools are counted",
          "[profiler][recorder]")
{
    vp::Recorder &r = rec();
    drain();
    const uint16_t mine = my_pool_index(); // this thread holds one pool: kThreads - 1 are left
    const uint64_t t = vigil::now_ns();
    const vp::RecorderCounters c0 = r.counters();

    constexpr int kN = kThreads + 4; // 5 more threads than free pools
    std::latch all_opened(kN);
    struct Result {
        bool ok = false;
        uint16_t thread = 0xffff;
        uint64_t h = 0;
        uint64_t h_after = 1; // a second open on a thread without a pool
    };
    std::vector<Result> res(kN);
    std::vector<std::thread> th;
    for (int i = 0; i < kN; ++i)
        th.emplace_back([&, i] {
            vp::Recorder &rr = vp::Recorder::instance();
            vp::Record *x = rr.open(Kind::kColl, t + i, &res[i].h);
            res[i].ok = x != nullptr;
            if (x) res[i].thread = x->thread;
            all_opened.arrive_and_wait(); // every thread holds its pool (or has none) here
            if (x) {
                rr.close(x, t + 100 + i);
            } else {
                rr.open(Kind::kColl, t + i, &res[i].h_after);
            }
        });
    for (std::thread &x : th) x.join();

    int ok = 0;
    std::set<uint16_t> pools;
    for (const Result &x : res) {
        if (!x.ok) {
            CHECK(x.h == 0);
            CHECK(x.h_after == 0);
            continue;
        }
        ++ok;
        CHECK(x.thread < kThreads);
        CHECK(x.thread != mine);
        CHECK(pool_of(x.h) == x.thread);
        pools.insert(x.thread);
    }
    CHECK(ok == static_cast<int>(kThreads) - 1);
    CHECK(pools.size() == kThreads - 1); // no two live threads share a pool
    const vp::RecorderCounters c1 = r.counters();
    const int failed = kN - ok;
    CHECK(c1.dropped_threads - c0.dropped_threads == 2u * static_cast<unsigned>(failed)); // both opens
    CHECK(c1.events - c0.events == static_cast<uint64_t>(ok));
    // Their records wait in their (now released) pools' rings.
    const std::vector<vp::Record> out = drain();
    CHECK(out.size() == static_cast<size_t>(ok));
    std::set<uint16_t> seen;
    for (const vp::Record &q : out) seen.insert(q.thread);
    CHECK(seen == pools);

    // The threads are gone: their pools are free again for new threads.
    std::atomic<bool> got{false};
    std::thread late([&] {
        uint64_t h = 0;
        vp::Record *x = vp::Recorder::instance().open(Kind::kColl, t, &h);
        got = x != nullptr;
        if (x) vp::Recorder::instance().close(x, t);
    });
    late.join();
    CHECK(got);
    CHECK(drain().size() == 1);
}

// ---------------------------------------------------------------------------------------
// VIGIL_PROFILE_EVENTS
// ---------------------------------------------------------------------------------------

namespace {
// Always recorded: groups, collectives and p2p tasks, and the user's calls of both (their
// enqueue times).
constexpr uint32_t kGroupCollP2p = vp::bit(Kind::kGroup) | vp::bit(Kind::kColl) | vp::bit(Kind::kP2p) |
                                   vp::bit(Kind::kCollApi) | vp::bit(Kind::kP2pApi);
constexpr uint32_t kAllKinds = 0xfffu | vp::bit(Kind::kKernelPhase); // 0-11 and 15
constexpr uint32_t kApi =
    vp::bit(Kind::kGroupApi) | vp::bit(Kind::kCollApi) | vp::bit(Kind::kP2pApi) | vp::bit(Kind::kKernelLaunch);

vp::Selection parse_ok(const std::string &s)
{
    vp::Selection sel;
    std::string why;
    INFO("'" << s << "'");
    CHECK(vp::parse_events(s, &sel, &why));
    CHECK(why.empty());
    return sel;
}
} // namespace

TEST_CASE("parse_events: names, dependencies, numbers and bad lists", "[profiler][events]")
{
    static_assert(kApi == 0xf00);
    vp::Selection s = parse_ok("coll");
    CHECK(s.traced == vp::bit(Kind::kColl));
    CHECK(s.recorded == kGroupCollP2p);

    s = parse_ok("p2p");
    CHECK(s.traced == vp::bit(Kind::kP2p));
    CHECK(s.recorded == kGroupCollP2p);

    s = parse_ok("net");
    CHECK(s.traced == vp::bit(Kind::kNet));
    CHECK(s.recorded ==
          (kGroupCollP2p | vp::bit(Kind::kNet) | vp::bit(Kind::kProxyStep) | vp::bit(Kind::kProxyOp)));

    s = parse_ok("proxy-step");
    CHECK(s.traced == vp::bit(Kind::kProxyStep));
    CHECK(s.recorded == (kGroupCollP2p | vp::bit(Kind::kProxyStep) | vp::bit(Kind::kProxyOp)));

    s = parse_ok("kernel-ch");
    CHECK(s.traced == vp::bit(Kind::kKernelCh));
    CHECK(s.recorded == (kGroupCollP2p | vp::bit(Kind::kKernelCh)));

    s = parse_ok("all");
    CHECK(s.traced == kAllKinds);
    CHECK(s.recorded == kAllKinds);

    s = parse_ok("kernel-phase"); // v7: brings its kernel channels
    CHECK(s.traced == vp::bit(Kind::kKernelPhase));
    CHECK(s.recorded == (kGroupCollP2p | vp::bit(Kind::kKernelCh) | vp::bit(Kind::kKernelPhase)));

    s = parse_ok("api");
    CHECK(s.traced == kApi);
    CHECK(s.recorded == (kApi | kGroupCollP2p));

    s = parse_ok("4095");
    CHECK(s.traced == 0xfffu);
    CHECK(s.recorded == 0xfffu);

    s = parse_ok("65535"); // every bit of v7: the copy-engine ones (12-14) are never recorded
    CHECK(s.traced == kAllKinds);

    s = parse_ok("6");
    CHECK(s.traced == (vp::bit(Kind::kColl) | vp::bit(Kind::kP2p)));
    CHECK(s.recorded == kGroupCollP2p);

    s = parse_ok("128"); // net, by number: the same dependencies as by name
    CHECK(s.traced == vp::bit(Kind::kNet));
    CHECK(s.recorded == parse_ok("net").recorded);

    s = parse_ok(" coll , p2p ,");
    CHECK(s.traced == (vp::bit(Kind::kColl) | vp::bit(Kind::kP2p)));
    CHECK(s.recorded == kGroupCollP2p);

    s = parse_ok(",,coll,,  ,proxy-op,");
    CHECK(s.traced == (vp::bit(Kind::kColl) | vp::bit(Kind::kProxyOp)));

    s = parse_ok("coll,all");
    CHECK(s.traced == kAllKinds);

    // Bad lists: false, with a reason naming the culprit.
    vp::Selection keep;
    std::string why;
    CHECK_FALSE(vp::parse_events("coll,bogus", &keep, &why));
    CHECK_THAT(why, Catch::Contains("'bogus'"));

    why.clear();
    CHECK_FALSE(vp::parse_events("70000", &keep, &why)); // bits beyond NCCL's 16 event types
    CHECK_THAT(why, Catch::Contains("70000"));
    why.clear();
    CHECK_FALSE(vp::parse_events("65536", &keep, &why)); // bit 16: the first one beyond
    CHECK_FALSE(why.empty());
    why.clear();
    CHECK_FALSE(vp::parse_events("coll,,nett", &keep, &why));
    CHECK_THAT(why, Catch::Contains("'nett'"));
}

TEST_CASE("events_text: the list form of a mask parses back to it", "[profiler][events]")
{
    CHECK(vp::events_text(vp::bit(Kind::kColl)) == "coll");
    CHECK(vp::events_text(vp::bit(Kind::kColl) | vp::bit(Kind::kNet)) == "coll,net");
    CHECK(vp::events_text(kApi) == "api");
    CHECK(vp::events_text(0) == "none");
    CHECK(vp::events_text(0xfff) == "group,coll,p2p,proxy-op,proxy-step,proxy-ctrl,kernel-ch,net,api");
    const uint32_t masks[] = {
        vp::bit(Kind::kColl),
        vp::bit(Kind::kColl) | vp::bit(Kind::kP2p) | vp::bit(Kind::kProxyOp) | vp::bit(Kind::kKernelCh) |
            vp::bit(Kind::kNet),
        vp::bit(Kind::kProxyCtrl) | vp::bit(Kind::kProxyStep),
        vp::bit(Kind::kGroup) | kApi,
        0xfff,
    };
    for (uint32_t m : masks) {
        INFO("mask 0x" << std::hex << m);
        vp::Selection s;
        std::string why;
        const std::string text = vp::events_text(m);
        REQUIRE(vp::parse_events(text, &s, &why));
        CHECK(s.traced == m);
        CHECK(vp::events_text(s.traced) == text);
    }
}

// ---------------------------------------------------------------------------------------
// nccl-tests bus bandwidth
// ---------------------------------------------------------------------------------------

TEST_CASE("datatype_bytes and bus_factor follow nccl-tests", "[profiler][busbw]")
{
    CHECK(vp::datatype_bytes("ncclInt8") == 1);
    CHECK(vp::datatype_bytes("ncclUint8") == 1);
    CHECK(vp::datatype_bytes("ncclFloat16") == 2);
    CHECK(vp::datatype_bytes("ncclBfloat16") == 2);
    CHECK(vp::datatype_bytes("ncclInt32") == 4);
    CHECK(vp::datatype_bytes("ncclFloat32") == 4);
    CHECK(vp::datatype_bytes("ncclUint64") == 8);
    CHECK(vp::datatype_bytes("ncclFloat64") == 8);
    CHECK(vp::datatype_bytes("ncclFloat8e4m3") == 1);
    CHECK(vp::datatype_bytes("ncclBogus") == 0);
    CHECK(vp::datatype_bytes("") == 0);
    CHECK(vp::datatype_bytes(nullptr) == 0);

    const uint64_t count = 1000;
    const int f32 = vp::datatype_bytes("ncclFloat32");
    uint64_t size = 1;

    CHECK(vp::bus_factor("AllReduce", count, f32, 8, &size) == Approx(2.0 * 7 / 8));
    CHECK(size == count * 4);
    CHECK(vp::bus_factor("AllReduce", count, f32, 2, &size) == Approx(1.0));

    size = 1;
    CHECK(vp::bus_factor("AllGather", count, f32, 8, &size) == Approx(7.0 / 8));
    CHECK(size == count * 4 * 8);
    size = 1;
    CHECK(vp::bus_factor("ReduceScatter", count, 2, 4, &size) == Approx(3.0 / 4));
    CHECK(size == count * 2 * 4);

    size = 1;
    CHECK(vp::bus_factor("Broadcast", count, f32, 8, &size) == Approx(1.0));
    CHECK(size == count * 4);
    size = 1;
    CHECK(vp::bus_factor("Reduce", count, 8, 8, &size) == Approx(1.0));
    CHECK(size == count * 8);

    // Unknown datatype: zero bytes, whatever the factor.
    size = 1;
    vp::bus_factor("AllReduce", count, vp::datatype_bytes("ncclBogus"), 8, &size);
    CHECK(size == 0);
    size = 1;
    vp::bus_factor("AllGather", count, 0, 8, &size);
    CHECK(size == 0);

    // One rank: no bus traffic for AllReduce/AllGather/ReduceScatter.
    size = 1;
    CHECK(vp::bus_factor("AllReduce", count, f32, 1, &size) == 0.0);
    CHECK(size == count * 4);
    CHECK(vp::bus_factor("AllGather", count, f32, 1, &size) == 0.0);
    CHECK(size == count * 4);
    CHECK(vp::bus_factor("ReduceScatter", count, f32, 1, &size) == 0.0);
}

// ---------------------------------------------------------------------------------------
// Contexts, through a real init/finalize
// ---------------------------------------------------------------------------------------

namespace {
/// Restores an environment variable at scope exit.
struct EnvVar {
    std::string name;
    bool had = false;
    std::string old;
    EnvVar(const char *n, const char *value) : name(n)
    {
        if (const char *v = std::getenv(n)) {
            had = true;
            old = v;
        }
        if (value) setenv(n, value, 1);
        else unsetenv(n);
    }
    ~EnvVar()
    {
        if (had) setenv(name.c_str(), old.c_str(), 1);
        else unsetenv(name.c_str());
    }
};

/// Removes this process's profiler counters segment (/dev/shm/vigilprof-<uid>-<pid>-*),
/// which the writer creates and a real process keeps for its life.
void remove_prof_segment()
{
    const std::string pre = "vigilprof-" + std::to_string(getuid()) + "-" + std::to_string(getpid()) + "-";
    if (DIR *d = opendir("/dev/shm")) {
        while (dirent *e = readdir(d))
            if (std::strncmp(e->d_name, pre.c_str(), pre.size()) == 0) unlink(("/dev/shm/" + std::string(e->d_name)).c_str());
        closedir(d);
    }
}
} // namespace

TEST_CASE("context_of accepts only live contexts from init", "[profiler][context]")
{
    vp::Recorder &r = rec(); // before init: init then keeps these sizes
    drain();
    EnvVar events("VIGIL_PROFILE_EVENTS", "coll");
    EnvVar dir("VIGIL_PROFILE_DIR", nullptr);

    // Before any init, and whatever else happens: nothing but a context from init passes.
    int local = 0;
    CHECK(vp::context_of(nullptr) == nullptr);
    CHECK(vp::context_of(&local) == nullptr);
    vp::Context forged; // the right magic, live, but not in the table
    forged.magic = vp::kContextMagic;
    forged.live = true;
    CHECK(vp::context_of(&forged) == nullptr);

    void *ctx = nullptr;
    int mask = -1;
    REQUIRE(vp::init(&ctx, 0xabcdef0123ull, &mask, "unit-comm", 1, 4, 2, nullptr, 6) == ncclSuccess);
    struct Fin {
        void *c;
        ~Fin()
        {
            vp::finalize(c);
            remove_prof_segment();
        }
    } fin{ctx};
    REQUIRE(ctx != nullptr);
    CHECK(mask == static_cast<int>(kGroupCollP2p));

    vp::Context *c = vp::context_of(ctx);
    REQUIRE(c == ctx);
    CHECK(c->magic == vp::kContextMagic);
    CHECK(c->comm_hash == 0xabcdef0123ull);
    CHECK(std::string(c->name) == "unit-comm");
    CHECK(c->rank == 2);
    CHECK(c->nranks == 4);
    CHECK(c->nnodes == 1);
    CHECK(c->abi == 6);
    CHECK(c->index > 0);
    CHECK(vp::context_at(c->index) == c);
    CHECK(vp::context_at(0) == nullptr);

    // Pointers near it are not it.
    auto *bytes = static_cast<char *>(ctx);
    CHECK(vp::context_of(bytes + 1) == nullptr);
    CHECK(vp::context_of(bytes + 8) == nullptr);
    CHECK(vp::context_of(bytes + sizeof(vp::Context) / 2) == nullptr);
    CHECK(vp::context_of(bytes - 8) == nullptr);
    CHECK(vp::context_of(c + 1) == nullptr); // the next table entry: never initialised
    CHECK(vp::context_of(&local) == nullptr);

    // The calibration init did: realtime = monotonic + offset, to within a millisecond.
    {
        timespec rt;
        const uint64_t mono = vigil::now_ns();
        clock_gettime(CLOCK_REALTIME, &rt);
        const int64_t real = rt.tv_sec * 1'000'000'000ll + rt.tv_nsec;
        const int64_t err = static_cast<int64_t>(mono) + vp::mono_to_realtime_ns() - real;
        CHECK(std::llabs(err) < 1'000'000);
    }

    // Events through the context: only the recorded kinds, only with a live context.
    const vp::RecorderCounters c0 = r.counters();
    void *eh = reinterpret_cast<void *>(1);
    vp::Record *coll = vp::open_event(ctx, Kind::kColl, nullptr, &eh);
    REQUIRE(coll != nullptr);
    CHECK(eh == reinterpret_cast<void *>(coll->id));
    CHECK(vp::Recorder::is_ours(coll->id));
    CHECK(coll->kind == Kind::kColl);
    CHECK(coll->ctx == c->index);
    coll->coll.func = "AllReduce";
    coll->coll.datatype = "ncclFloat32";
    coll->coll.count = 1024;
    void *other = reinterpret_cast<void *>(1);
    CHECK(vp::open_event(ctx, Kind::kProxyOp, eh, &other) == nullptr); // not selected by "coll"
    CHECK(other == nullptr);
    other = reinterpret_cast<void *>(1);
    CHECK(vp::open_event(&local, Kind::kColl, nullptr, &other) == nullptr); // not a context
    CHECK(other == nullptr);
    CHECK(vp::open_event(&forged, Kind::kP2p, nullptr, &other) == nullptr);
    CHECK(other == nullptr);
    CHECK(r.counters().events - c0.events == 1);

    vp::stop_event(nullptr);                                       // tolerated, not foreign
    vp::stop_event(reinterpret_cast<void *>(make_handle(0x5a, kThreads, 0, 1))); // foreign
    vp::record_state(reinterpret_cast<void *>(0x1234), 9, 0, false);              // foreign
    CHECK(r.peek(coll->id) == coll);
    const uint64_t id = coll->id;
    vp::stop_event(eh);
    CHECK(r.peek(id) == nullptr);
    vp::stop_event(eh); // twice: foreign, ignored
    CHECK(r.counters().foreign_handles - c0.foreign_handles == 3);

    // finalize: the context is no longer accepted (but its entry stays, never reused).
    REQUIRE(vp::finalize(ctx) == ncclSuccess);
    CHECK(vp::context_of(ctx) == nullptr);
    CHECK(vp::context_at(c->index) == c);
    CHECK(vp::open_event(ctx, Kind::kColl, nullptr, &other) == nullptr);
    CHECK(other == nullptr);
    CHECK(vp::finalize(ctx) == ncclSuccess); // a second finalize is harmless

    // A communicator created after the last one was destroyed: the finalized context's slot
    // is reused (contexts are recycled, so a long job that keeps re-creating communicators
    // never runs out), the writer restarted, the same mask.
    void *ctx2 = nullptr;
    mask = -1;
    REQUIRE(vp::init(&ctx2, 0x77ull, &mask, "unit-comm-2", 1, 2, 0, nullptr, 5) == ncclSuccess);
    fin.c = ctx2;
    REQUIRE(ctx2 != nullptr);
    CHECK(ctx2 == ctx);
    CHECK(mask == static_cast<int>(kGroupCollP2p));
    vp::Context *c2 = vp::context_of(ctx2);
    REQUIRE(c2 == ctx2);
    CHECK(c2->index == c->index);
    CHECK(c2->comm_hash == 0x77ull);
    CHECK(c2->abi == 5);
    // While it is live, a second one takes another slot.
    void *ctx3 = nullptr;
    REQUIRE(vp::init(&ctx3, 0x78ull, &mask, "unit-comm-3", 1, 2, 1, nullptr, 5) == ncclSuccess);
    REQUIRE(ctx3 != nullptr);
    CHECK(ctx3 != ctx2);
    REQUIRE(vp::finalize(ctx3) == ncclSuccess);
    CHECK(vp::context_of(ctx3) == nullptr); // finalized: dead until reused
    other = nullptr;
    vp::Record *p2p = vp::open_event(ctx2, Kind::kP2p, nullptr, &other);
    REQUIRE(p2p != nullptr);
    CHECK(p2p->ctx == c2->index);
    vp::stop_event(other);
    CHECK(r.peek(reinterpret_cast<uint64_t>(other)) == nullptr);
    REQUIRE(vp::finalize(ctx2) == ncclSuccess);
    CHECK(vp::context_of(ctx2) == nullptr);
}
