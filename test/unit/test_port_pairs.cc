// SPDX-License-Identifier: Apache-2.0
// PortPairs: liveness shared by the paths between two ports.
#include <catch2/catch.hpp>

#include <vector>

#include "comm.h"
#include "port_pairs.h"

namespace vn = vigil::net;

namespace {

struct Woken final : vn::PortPairs::Pair::Sleeper {
    int wakes = 0;
    void wake_from_pair() noexcept override { ++wakes; }
};

} // namespace

TEST_CASE("paths between the same two ports share one pair; others get their own", "[port_pairs]")
{
    vn::PortPairs pairs;
    auto a = pairs.get(0, "10.0.0.2");
    auto b = pairs.get(0, "10.0.0.2");
    auto other_dev = pairs.get(1, "10.0.0.2");
    auto other_peer = pairs.get(0, "10.0.0.3");
    CHECK(a == b);
    CHECK(a != other_dev);
    CHECK(a != other_peer);
    CHECK(pairs.size() == 3);
    // A fabric that cannot name the peer's port shares with nobody.
    CHECK(pairs.get(0, "") != pairs.get(0, ""));
}

TEST_CASE("a pair lives while a path holds it", "[port_pairs]")
{
    vn::PortPairs pairs;
    auto a = pairs.get(0, "fe80::1");
    a->heard(5);
    a.reset();
    CHECK(pairs.size() == 0);
    CHECK(pairs.get(0, "fe80::1")->last_heard() == 0); // a new pair: nothing heard yet
    // Many pairs made and dropped do not pile up.
    for (int i = 0; i < 1000; ++i) pairs.get(i % 7, "10.1.0." + std::to_string(i));
    CHECK(pairs.size() == 0);
}

TEST_CASE("one probe per pair and interval, whoever claims it", "[port_pairs]")
{
    vn::PortPairs::Pair p;
    const uint64_t iv = 100;
    CHECK(p.claim_probe(1000, iv));       // the first claim wins
    CHECK_FALSE(p.claim_probe(1000, iv)); // a second path in the same interval does not
    CHECK_FALSE(p.claim_probe(1099, iv));
    CHECK(p.claim_probe(1100, iv));       // one interval on
    CHECK_FALSE(p.claim_probe(1150, iv));
}

TEST_CASE("what any path hears keeps the latest time", "[port_pairs]")
{
    vn::PortPairs::Pair p;
    CHECK(p.last_heard() == 0);
    p.heard(500);
    p.heard(300); // a path that learned of an older arrival later
    CHECK(p.last_heard() == 500);
    p.heard(700);
    CHECK(p.last_heard() == 700);
}

TEST_CASE("a quiet comm's timer: the pair's prober every probe interval, the others every "
          "quarter of the stall timeout",
          "[port_pairs]")
{
    vn::FailoverConfig cfg; // probe 100 ms, stall 2 s
    constexpr uint64_t kFloor = 20'000'000;
    CHECK(vn::quiet_period(cfg, true, kFloor) == 100'000'000);
    CHECK(vn::quiet_period(cfg, false, kFloor) == 500'000'000);
    // Never below the probe interval, nor the floor (the busy period).
    cfg.stall_timeout_ns = 200'000'000;
    CHECK(vn::quiet_period(cfg, false, kFloor) == 100'000'000);
    cfg.probe_interval_ns = 1'000'000;
    CHECK(vn::quiet_period(cfg, true, kFloor) == kFloor);
    CHECK(vn::quiet_period(cfg, false, kFloor) == 50'000'000);
    // A quiet comm that does not probe comes back before a pair whose prober closed has gone
    // silent for the stall timeout at the peer.
    cfg = vn::FailoverConfig{};
    CHECK(vn::quiet_period(cfg, false, kFloor) + cfg.probe_interval_ns < cfg.stall_timeout_ns);
}

TEST_CASE("the sweep wakes one sleeper of a pair nobody probes, and every watcher of a silent "
          "one, once each",
          "[port_pairs]")
{
    vn::PortPairs::Pair p;
    const uint64_t iv = 100, stall = 2000;
    Woken a, b, standby;
    p.heard(1000);
    CHECK(p.claim_probe(1000, iv)); // someone probes at 1000
    p.sleep(&a, iv, stall, false, 1000);
    p.sleep(&b, iv, stall, false, 1000);
    CHECK(p.sleepers() == 2);
    CHECK(p.sweep(1150) == iv); // probed 150 ago: within two intervals
    CHECK(a.wakes + b.wakes == 0);
    CHECK(p.sweep(1201) == iv); // no probe for two intervals: one sleeper takes it over
    CHECK(a.wakes + b.wakes == 1);
    CHECK(p.sleepers() == 1);
    CHECK(p.claim_probe(1210, iv));
    p.sleep(&standby, iv, stall, true, 1000);
    p.sweep(1300);
    CHECK(a.wakes + b.wakes + standby.wakes == 1);
    // The probes go on, but the peer answers nothing for the stall timeout: the standby's
    // watcher wakes (for its verdict), the others sleep on.
    for (uint64_t t = 1300; t <= 3100; t += 50) { // silent beyond 3000
        p.claim_probe(t, iv);
        p.sweep(t);
    }
    CHECK(standby.wakes == 1);
    CHECK(a.wakes + b.wakes == 1);
    CHECK(p.sleepers() == 1);
}

TEST_CASE("a sleeper's own last word counts against the pair's silence; unsleep forgets it",
          "[port_pairs]")
{
    vn::PortPairs::Pair p; // never heard on the pair: a path fresh from its handshake
    Woken w;
    CHECK(p.claim_probe(5000, 100));
    p.sleep(&w, 100, 2000, true, 5000); // its path heard the peer at 5000
    CHECK(p.claim_probe(5950, 100));
    p.sweep(6000);
    CHECK(w.wakes == 0);
    p.sleep(&w, 100, 2000, false, 4000); // merged: still one sleeper, still watching
    CHECK(p.sleepers() == 1);
    CHECK(p.claim_probe(7000, 100));
    p.sweep(7001);
    CHECK(w.wakes == 1); // silent since 5000
    p.sleep(&w, 100, 2000, true, 7001);
    p.unsleep(&w);
    CHECK(p.sleepers() == 0);
    p.sweep(20000);
    CHECK(w.wakes == 1);
}

TEST_CASE("the process's sweep visits the pairs of its map", "[port_pairs]")
{
    vn::PortPairs pairs;
    auto a = pairs.get(0, "10.0.0.2");
    auto own = pairs.get(0, ""); // shared with nobody: not in the map
    CHECK(a->shared);
    CHECK_FALSE(own->shared);
    Woken w;
    a->sleep(&w, 40'000'000, 2'000'000'000, false, 0);
    const uint64_t now = 10'000'000'000ull;
    // Nobody ever probed the pair: the sleeper is woken; the next sweep an interval on.
    CHECK(pairs.sweep(now) == now + 100'000'000); // no sleeper left: the longest period
    CHECK(w.wakes == 1);
    a->sleep(&w, 40'000'000, 2'000'000'000, false, 0);
    CHECK(a->claim_probe(now, 40'000'000));
    CHECK(pairs.sweep(now + 1) == now + 1 + 40'000'000);
    CHECK(w.wakes == 1);
}
