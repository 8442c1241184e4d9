// SPDX-License-Identifier: Apache-2.0
// PortPairs: liveness shared by the paths between two ports.
#include <catch2/catch.hpp>

#include "comm.h"
#include "port_pairs.h"

namespace vn = vigil::net;

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
