// SPDX-License-Identifier: Apache-2.0
// The progress engine's threads: which thread serves a client (bind), that a client's
// callbacks always come from that one thread, that clients spread over the threads a node
// may have, tickers, and quiesce() after remove().
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <sys/eventfd.h>
#include <thread>
#include <unistd.h>
#include <vector>

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
