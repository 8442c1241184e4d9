// SPDX-License-Identifier: Apache-2.0
// The progress engine's threads: which thread serves a client (bind), that a client's
// callbacks always come from that one thread, that clients spread over the threads a node
// may have, tickers, quiesce() after remove(), the cpulist parser behind NUMA pinning, and
// the comm's kick hand-off between an engine thread and the lock's holder.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sys/eventfd.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "clock.h"
#include "comm.h"
#include "progress.h"

namespace vn = vigil::net;

namespace {

// A client with an eventfd: each write to it is one readiness edge. Records the threads its
// callbacks ran on.
class Probe final : public vn::ProgressClient
{
public:
    Probe() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) { REQUIRE(fd_ >= 0); }
    ~Probe() { ::close(fd_); }
    void on_ready() noexcept override
    {
        uint64_t v;
        while (read(fd_, &v, sizeof(v)) > 0) {}
        note();
        ready.fetch_add(1);
    }
    void on_tick() noexcept override
    {
        note();
        ticks.fetch_add(1);
    }
    uint64_t next_tick_ns() const noexcept override
    {
        const uint64_t p = period_ns.load();
        return p == 0 ? 0 : p == kParked ? kParked : vigil::now_ns() + p;
    }
    std::atomic<uint64_t> period_ns{0}; // 0: every engine tick; kParked: none until woken
    void poke()
    {
        const uint64_t one = 1;
        REQUIRE(write(fd_, &one, sizeof(one)) == sizeof(one));
    }
    int fd() const { return fd_; }
    std::set<std::thread::id> threads()
    {
        std::lock_guard<std::mutex> g(mu_);
        return seen_;
    }
    std::atomic<int> ready{0};
    std::atomic<int> ticks{0};

private:
    void note()
    {
        std::lock_guard<std::mutex> g(mu_);
        seen_.insert(std::this_thread::get_id());
    }
    int fd_;
    std::mutex mu_;
    std::set<std::thread::id> seen_;
};

template <class F> bool eventually(F f)
{
    for (int i = 0; i < 2000; ++i) {
        if (f()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return f();
}

// Pokes every probe `rounds` times and waits until each saw a callback per round.
void poke_all(std::vector<Probe> &probes, int rounds)
{
    for (int r = 0; r < rounds; ++r)
        for (Probe &p : probes) {
            const int before = p.ready.load();
            p.poke();
            REQUIRE(eventually([&] { return p.ready.load() > before; }));
        }
}

} // namespace

TEST_CASE("with one thread every client is served by the one engine thread", "[progress]")
{
    vn::ProgressEngine e;
    REQUIRE(e.start(1) == 0);
    CHECK(e.threads() == 1);
    std::vector<Probe> probes(4);
    for (Probe &p : probes) {
        e.bind(&p, -1);
        REQUIRE(e.add(p.fd(), &p) == 0);
    }
    poke_all(probes, 3);
    std::set<std::thread::id> all;
    for (Probe &p : probes) {
        CHECK(p.threads().size() == 1);
        for (auto t : p.threads()) all.insert(t);
    }
    CHECK(all.size() == 1);
    CHECK(all.count(std::this_thread::get_id()) == 0);
    for (Probe &p : probes) {
        e.remove(p.fd(), &p);
        e.unbind(&p);
    }
    e.quiesce();
    e.stop();
}

TEST_CASE("clients spread over the threads a node may have, each always on its own", "[progress]")
{
    vn::ProgressEngine e;
    REQUIRE(e.start(3) == 0);
    CHECK(e.threads() == 3);
    std::vector<Probe> probes(6);
    for (Probe &p : probes) {
        e.bind(&p, -1);
        REQUIRE(e.add(p.fd(), &p) == 0);
    }
    poke_all(probes, 5);
    std::map<std::thread::id, int> per_thread;
    for (Probe &p : probes) {
        const auto ts = p.threads();
        REQUIRE(ts.size() == 1); // never two threads for one client: no concurrent callbacks
        ++per_thread[*ts.begin()];
    }
    // Three threads (thread 0 counts for the unknown node), two clients each.
    CHECK(per_thread.size() == 3);
    for (const auto &[t, n] : per_thread) CHECK(n == 2);

    SECTION("a client unbound and bound again goes to the least loaded thread")
    {
        e.remove(probes[0].fd(), &probes[0]);
        e.quiesce();
        e.unbind(&probes[0]);
        Probe late;
        e.bind(&late, -1);
        REQUIRE(e.add(late.fd(), &late) == 0);
        late.poke();
        REQUIRE(eventually([&] { return late.ready.load() > 0; }));
        CHECK(late.threads() == probes[0].threads());
        e.remove(late.fd(), &late);
        e.quiesce();
        e.unbind(&late);
    }
    for (size_t i = 1; i < probes.size(); ++i) {
        e.remove(probes[i].fd(), &probes[i]);
        e.unbind(&probes[i]);
    }
    e.quiesce();
    e.stop();
}

TEST_CASE("a node the machine does not have gets threads of its own, unpinned", "[progress]")
{
    vn::ProgressEngine e;
    REQUIRE(e.start(2) == 0);
    Probe a, b, c;
    e.bind(&a, -1);
    e.bind(&b, 4000); // no /sys/devices/system/node/node4000: runs anywhere
    e.bind(&c, 4000);
    for (Probe *p : {&a, &b, &c}) REQUIRE(e.add(p->fd(), p) == 0);
    for (Probe *p : {&a, &b, &c}) {
        p->poke();
        REQUIRE(eventually([&] { return p->ready.load() > 0; }));
    }
    CHECK(a.threads() != b.threads());
    CHECK(b.threads() != c.threads()); // node 4000 may have two threads
    for (Probe *p : {&a, &b, &c}) {
        e.remove(p->fd(), p);
        e.unbind(p);
    }
    e.quiesce();
    e.stop();
}

TEST_CASE("tickers run on their client's thread; none runs after remove_ticker and quiesce", "[progress]")
{
    vn::ProgressEngine e;
    REQUIRE(e.start(2) == 0);
    Probe a, b;
    e.bind(&a, -1);
    e.bind(&b, -1);
    REQUIRE(e.add(a.fd(), &a) == 0);
    REQUIRE(e.add(b.fd(), &b) == 0);
    e.add_ticker(&a);
    e.add_ticker(&b);
    REQUIRE(eventually([&] { return a.ticks.load() >= 3 && b.ticks.load() >= 3; }));
    a.poke();
    b.poke();
    REQUIRE(eventually([&] { return a.ready.load() > 0 && b.ready.load() > 0; }));
    CHECK(a.threads().size() == 1); // ticks and events of a client: one thread
    CHECK(b.threads().size() == 1);
    CHECK(a.threads() != b.threads());
    e.remove_ticker(&a);
    e.remove(a.fd(), &a);
    e.quiesce();
    const int ticks = a.ticks.load(), ready = a.ready.load();
    a.poke();
    std::this_thread::sleep_for(std::chrono::milliseconds(50)); // five ticks of the engine
    CHECK(a.ticks.load() == ticks);
    CHECK(a.ready.load() == ready);
    CHECK(b.ticks.load() > 3); // the other thread goes on
    e.remove_ticker(&b);
    e.remove(b.fd(), &b);
    e.unbind(&a);
    e.unbind(&b);
    e.quiesce();
    e.stop();
}

TEST_CASE("a ticker is called when its next tick is due, not at every engine tick", "[progress]")
{
    // Counts, not durations: the slow ticker's calls are bounded by the time that actually
    // passed, however slowly the engine thread ran.
    vn::ProgressEngine e;
    REQUIRE(e.start(1) == 0);
    Probe fast, slow;
    slow.period_ns = 200'000'000; // 200 ms: 20 engine ticks
    e.bind(&fast, -1);
    e.bind(&slow, -1);
    const uint64_t t0 = vigil::now_ns();
    e.add_ticker(&fast);
    e.add_ticker(&slow);
    REQUIRE(eventually([&] { return fast.ticks.load() >= 40; }));
    auto bound = [](uint64_t since) { return static_cast<int>((vigil::now_ns() - since) / 200'000'000) + 2; };
    CHECK(slow.ticks.load() >= 1); // due at once when added
    CHECK(slow.ticks.load() <= bound(t0));

    // Removed and added again at once (the same client, so its old heap entry is still
    // there): still one timer, not two.
    e.remove_ticker(&slow);
    const int before = slow.ticks.load();
    const uint64_t t1 = vigil::now_ns();
    e.add_ticker(&slow);
    const int f = fast.ticks.load();
    REQUIRE(eventually([&] { return fast.ticks.load() >= f + 60; }));
    CHECK(slow.ticks.load() - before >= 1);
    CHECK(slow.ticks.load() - before <= bound(t1));

    e.remove_ticker(&fast);
    e.remove_ticker(&slow);
    e.quiesce();
    const int fast_after = fast.ticks.load(), slow_after = slow.ticks.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(fast.ticks.load() == fast_after);
    CHECK(slow.ticks.load() == slow_after);
    e.unbind(&fast);
    e.unbind(&slow);
    e.stop();
}

TEST_CASE("a parked ticker is called only when woken; a wake moves a timer sooner, never later",
          "[progress]")
{
    // Counts, not durations: what a parked client gets is exactly the calls it was woken for.
    vn::ProgressEngine e;
    REQUIRE(e.start(1) == 0);
    Probe fast, parked;
    parked.period_ns = vn::ProgressClient::kParked;
    e.bind(&fast, -1);
    e.bind(&parked, -1);
    e.add_ticker(&fast);
    e.add_ticker(&parked);
    REQUIRE(eventually([&] { return parked.ticks.load() == 1; })); // due at once when added
    int f = fast.ticks.load();
    REQUIRE(eventually([&] { return fast.ticks.load() >= f + 20; }));
    CHECK(parked.ticks.load() == 1); // 20 engine ticks, none for it

    for (int k = 2; k <= 4; ++k) { // each wake is one call, and it parks again after it
        e.wake(&parked, vigil::now_ns());
        REQUIRE(eventually([&] { return parked.ticks.load() == k; }));
        f = fast.ticks.load();
        REQUIRE(eventually([&] { return fast.ticks.load() >= f + 5; }));
        CHECK(parked.ticks.load() == k);
    }
    // Two wakes before the call: one call.
    e.wake(&parked, vigil::now_ns() + 30'000'000);
    e.wake(&parked, vigil::now_ns() + 30'000'000);
    REQUIRE(eventually([&] { return parked.ticks.load() == 5; }));
    f = fast.ticks.load();
    REQUIRE(eventually([&] { return fast.ticks.load() >= f + 10; }));
    CHECK(parked.ticks.load() == 5);

    // A timer due in 10 s: a wake for later leaves it, a wake for now brings it forward.
    parked.period_ns = 10'000'000'000ull;
    e.wake(&parked, 0);
    REQUIRE(eventually([&] { return parked.ticks.load() == 6; }));
    e.wake(&parked, vigil::now_ns() + 20'000'000'000ull);
    f = fast.ticks.load();
    REQUIRE(eventually([&] { return fast.ticks.load() >= f + 10; }));
    CHECK(parked.ticks.load() == 6);
    e.wake(&parked, 0);
    REQUIRE(eventually([&] { return parked.ticks.load() == 7; }));

    // Removed: a wake does nothing.
    e.remove_ticker(&parked);
    e.quiesce();
    e.wake(&parked, 0);
    f = fast.ticks.load();
    REQUIRE(eventually([&] { return fast.ticks.load() >= f + 10; }));
    CHECK(parked.ticks.load() == 7);
    e.remove_ticker(&fast);
    e.quiesce();
    e.unbind(&fast);
    e.unbind(&parked);
    e.stop();
}

TEST_CASE("stop and start again: a fresh thread 0 serves new clients", "[progress]")
{
    vn::ProgressEngine e;
    REQUIRE(e.start(2) == 0);
    REQUIRE(e.start(2) == 0); // idempotent
    e.stop();
    e.stop();
    REQUIRE(e.start(1) == 0);
    Probe p;
    e.bind(&p, -1);
    REQUIRE(e.add(p.fd(), &p) == 0);
    p.poke();
    REQUIRE(eventually([&] { return p.ready.load() > 0; }));
    e.remove(p.fd(), &p);
    e.unbind(&p);
    e.quiesce();
    e.stop();
}

TEST_CASE("quiesce() waits for a callback fetched before the removal", "[progress]")
{
    // A client whose callback blocks until released: quiesce() must not return meanwhile.
    class Blocking final : public vn::ProgressClient
    {
    public:
        void on_ready() noexcept override
        {
            entered.store(true);
            while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
            left.store(true);
        }
        std::atomic<bool> entered{false}, release{false}, left{false};
    };
    vn::ProgressEngine e;
    REQUIRE(e.start(2) == 0);
    Probe other; // makes the blocking client the second thread's
    e.bind(&other, -1);
    Blocking b;
    e.bind(&b, -1);
    const int fd = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC); // readable from the start
    REQUIRE(fd >= 0);
    REQUIRE(e.add(fd, &b) == 0);
    REQUIRE(eventually([&] { return b.entered.load(); }));
    e.remove(fd, &b);
    std::atomic<bool> returned{false};
    std::thread q([&] {
        e.quiesce();
        returned.store(true);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(returned.load()); // the callback still runs
    b.release.store(true);
    q.join();
    CHECK(b.left.load()); // quiesce() returned only after the callback ended
    e.unbind(&b);
    e.unbind(&other);
    ::close(fd);
    e.stop();
}

TEST_CASE("parse_cpulist: ranges and lists, limited to the allowed CPUs", "[progress]")
{
    cpu_set_t all, some, out;
    CPU_ZERO(&all);
    for (int c = 0; c < 64; ++c) CPU_SET(c, &all);
    CPU_ZERO(&some);
    CPU_SET(2, &some);
    CPU_SET(9, &some);
    auto cpus = [](const cpu_set_t &s) {
        std::vector<int> v;
        for (int c = 0; c < 64; ++c)
            if (CPU_ISSET(c, &s)) v.push_back(c);
        return v;
    };
    REQUIRE(vn::parse_cpulist("0-3,8,10-11\n", all, &out));
    CHECK(cpus(out) == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
    REQUIRE(vn::parse_cpulist("0-3,8-9", some, &out));
    CHECK(cpus(out) == std::vector<int>{2, 9});
    CHECK_FALSE(vn::parse_cpulist("4-7", some, &out)); // none of the node's CPUs is ours
    CHECK(CPU_COUNT(&out) == 0);
    CHECK_FALSE(vn::parse_cpulist("", all, &out)); // a node with memory only
    for (const char *bad : {"3-1", "a", "1,,2", "1-", "-1", "0-3x", "1 2"}) {
        INFO(bad);
        CHECK_FALSE(vn::parse_cpulist(bad, all, &out));
        CHECK(CPU_COUNT(&out) == 0);
    }
}

namespace {

// A comm with no paths that counts its progress passes, to drive the kick hand-off.
class KickComm final : public vn::Comm
{
public:
    KickComm() : Comm(std::array<int, vn::kMaxPaths>{}) {}
    /// Runs f with the comm's lock held, as isend/irecv/test would.
    void holding(const std::function<void()> &f)
    {
        Locked g(*this);
        f();
    }
    std::atomic<int> passes{0};
    std::atomic<bool> quiet{false};
    std::atomic<int> quiet_ticks{0};
    std::shared_ptr<vn::PortPairs::Pair> pair; // its one path's, when set (before attach)
    vn::FailoverConfig cfg;
    // Quiet ticks that probe (as a pair's prober does: it keeps its timer) and their period.
    std::atomic<bool> probes{false};
    std::atomic<uint64_t> quiet_ns{kTimerNs};
    std::mutex tick_mu;
    std::vector<uint64_t> probe_ticks; // when each probing quiet tick ran (ns)

protected:
    void progress_locked() noexcept override { passes.fetch_add(1); }
    void rearm_locked(bool) noexcept override {}
    void goodbye_locked() noexcept override {}
    size_t nfds() const noexcept override { return 0; }
    int fd(size_t) const noexcept override { return -1; }
    bool quiet_locked() const noexcept override { return quiet.load(); }
    uint64_t quiet_period_ns(bool) const noexcept override { return quiet_ns.load(); }
    void quiet_tick_locked(uint64_t now) noexcept override
    {
        quiet_ticks.fetch_add(1);
        if (!probes.load()) return;
        probed_ = true;
        std::lock_guard<std::mutex> g(tick_mu);
        probe_ticks.push_back(now);
    }
    void port_down_locked(int, const std::string &) noexcept override {}
    int pair_uses_locked(std::array<PairUse, vn::kMaxPaths> *out) const noexcept override
    {
        if (!pair) return 0;
        (*out)[0] = PairUse{pair, false, vigil::now_ns()};
        return 1;
    }
    const vn::FailoverConfig &failover_config() const noexcept override { return cfg; }
};

} // namespace

TEST_CASE("an fd event on a locked comm is served by the lock's holder when it lets go", "[progress][comm]")
{
    vn::ProgressEngine &e = vn::ProgressEngine::instance();
    REQUIRE(e.start(2) == 0); // several threads: the kick hand-off
    REQUIRE(e.threads() == 2);
    KickComm k;

    SECTION("a free comm progresses at once on the engine's thread")
    {
        k.on_ready();
        CHECK(k.passes.load() == 1);
    }
    SECTION("a held comm: the engine thread does not wait, the holder progresses after unlocking")
    {
        k.holding([&] {
            std::thread engine([&] { k.on_ready(); }); // must return although the lock is taken
            engine.join();
            CHECK(k.passes.load() == 0);
        });
        CHECK(k.passes.load() == 1); // served by the holder, with no further event or tick
    }
    SECTION("kicks while held are served once")
    {
        k.holding([&] {
            for (int i = 0; i < 3; ++i) {
                std::thread engine([&] { k.on_ready(); });
                engine.join();
            }
        });
        CHECK(k.passes.load() == 1);
    }
    e.stop();
    CHECK(e.threads() == 1);
    // One thread: the engine's callback takes the lock itself; there are no kicks.
    const int before = k.passes.load();
    k.on_ready();
    CHECK(k.passes.load() == before + 1);
}

TEST_CASE("a quiet comm parks on its port pair: no timer until it posts, or its pair needs a "
          "prober",
          "[progress][comm][port_pairs]")
{
    // Counts of calls, not durations: a parked comm is called for nothing at all.
    vn::ProgressEngine &e = vn::ProgressEngine::instance();
    REQUIRE(e.start(1) == 0);
    vn::PortPairs &pairs = vn::PortPairs::process();
    pairs.start_sweeper();
    KickComm k;
    k.pair = pairs.get(7, "192.0.2.7");
    k.quiet = true;
    std::atomic<bool> probing{true}; // another comm of the process probes the pair meanwhile
    std::thread prober([&] {
        while (probing.load()) {
            k.pair->claim_probe(vigil::now_ns(), k.cfg.probe_interval_ns);
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    });
    REQUIRE(k.attach() == 0);
    REQUIRE(eventually([&] { return k.pair->sleepers() == 1; })); // its first tick parked it
    const int quiet_ticks = k.quiet_ticks.load(), passes = k.passes.load();
    std::this_thread::sleep_for(std::chrono::milliseconds(300)); // 3 probe intervals
    CHECK(k.quiet_ticks.load() == quiet_ticks);
    CHECK(k.passes.load() == passes);

    // A post makes it busy: it leaves the pair and its timer runs again.
    k.holding([&] { k.quiet = false; });
    CHECK(k.pair->sleepers() == 0);
    REQUIRE(eventually([&] { return k.passes.load() >= passes + 3; }));
    // Quiet again: parked again at its next tick.
    k.holding([&] { k.quiet = true; });
    REQUIRE(eventually([&] { return k.pair->sleepers() == 1; }));

    // The pair's prober goes away: the sweep wakes it to take the probes over.
    probing = false;
    prober.join();
    const int before = k.quiet_ticks.load();
    REQUIRE(eventually([&] { return k.quiet_ticks.load() > before; }));

    k.close();
    CHECK(k.pair->sleepers() == 0);
    pairs.stop_sweeper();
    e.stop();
}

TEST_CASE("background timers go on the engine's grid: at most a tick early, never moved twice",
          "[progress]")
{
    using E = vn::ProgressEngine;
    constexpr uint64_t kGrid = E::kCoalesceNs, kTick = E::kTickNs;
    const uint64_t now = 1'234'567'891'234;
    // Shorter than the grid: where it was asked for.
    CHECK(E::coalesced(now + kGrid - 1, now) == now + kGrid - 1);
    CHECK(E::coalesced(now + kTick, now) == now + kTick);
    CHECK(E::coalesced(vn::ProgressClient::kParked, now) == vn::ProgressClient::kParked);
    for (uint64_t due : {now + kGrid, now + kGrid + 1, now + kGrid + kTick, now + kGrid + kTick + 1,
                         now + 2 * kGrid - 1, now + 7 * kGrid + 12'345}) {
        INFO(due);
        const uint64_t at = E::coalesced(due, now);
        CHECK(at % kGrid == 0);
        CHECK(at + kTick >= due);  // at most a tick early
        CHECK(at < due + kGrid);   // less than a grid step late
        CHECK(E::coalesced(at, now) == at); // what a client stored is where the engine runs it
    }
}

TEST_CASE("a quiet prober stays on the engine's grid: each probe a whole interval less a tick "
          "after the last",
          "[progress][comm]")
{
    // Its own due time is the grid's: the engine's call is never too early for the comm's
    // check, so the comm never runs its probe a moment later, off the grid. Counts and
    // stored values, not durations: a late engine only makes the gaps longer.
    vn::ProgressEngine &e = vn::ProgressEngine::instance();
    REQUIRE(e.start(1) == 0);
    KickComm k; // no pair: it cannot park, so its timer runs on
    k.quiet = true;
    k.probes = true;
    k.quiet_ns = vn::ProgressEngine::kCoalesceNs; // the default probe interval
    REQUIRE(k.attach() == 0);
    REQUIRE(eventually([&] { return k.quiet_ticks.load() >= 4; }));
    k.holding([&] { CHECK(k.next_tick_ns() % vn::ProgressEngine::kCoalesceNs == 0); });
    k.close();
    std::lock_guard<std::mutex> g(k.tick_mu);
    REQUIRE(k.probe_ticks.size() >= 4);
    for (size_t i = 1; i < k.probe_ticks.size(); ++i) {
        INFO(i);
        CHECK(k.probe_ticks[i] - k.probe_ticks[i - 1] + vn::ProgressEngine::kTickNs >=
              vn::ProgressEngine::kCoalesceNs);
    }
    e.stop();
}
