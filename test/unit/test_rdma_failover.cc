// SPDX-License-Identifier: Apache-2.0
// The failover core over a fabric that writes into the advertised buffers (the fake fabric's
// RDMA mode, fake_fabric.h): a payload lands before its record is polled, and the sender sees
// the record acknowledged, and completes the send, before the receiving core knows of it.
// Then no switch may write a completed message again (NCCL may have filled the send buffer
// anew), and every record that landed must complete its message, whatever its generation and
// whatever happened to its path since.
#include <catch2/catch.hpp>

#include "clock.h"
#include "fake_fabric.h"
#include "traffic.h"

namespace vn = vigil::net;
namespace tp = vigil::test::fake;
using tp::kMs;
using tp::Net;
using vigil::test::Traffic;
using vn::kBackup;
using vn::kPrimary;

namespace {

vn::FailoverConfig config()
{
    vn::FailoverConfig c;
    c.fatal_timeout_ns = 5000 * kMs;
    c.stall_timeout_ns = 5000 * kMs;
    c.probe_interval_ns = 1000 * kMs;
    c.failback_hold_ns = 20 * kMs;
    c.rebuild_backoff_min_ns = 1 * kMs;
    c.rebuild_backoff_max_ns = 5 * kMs;
    return c;
}

// Every lane of `n` (and every lane it rebuilds) in RDMA mode, with full records or short
// ones (whole_short: the verbs fabric's small messages).
void make_rdma(Net &n, bool short_records)
{
    for (tp::Lane &l : n.lane) {
        l.rdma = true;
        l.short_records = short_records;
    }
    n.fab.rdma = true;
    n.fab.short_records = short_records;
}

// Polls until every send posted so far completed (the sender saw each record acknowledged).
void until_sends_done(Traffic &t, const std::vector<int> &ids)
{
    const uint64_t deadline = vigil::now_ns() + 2000 * kMs;
    auto done = [&] {
        for (int id : ids)
            if (!t.send_done(id)) return false;
        return true;
    };
    while (!done()) {
        INFO(t.state());
        REQUIRE(vigil::now_ns() < deadline);
        t.poll();
        vigil::test::nap();
    }
}

} // namespace

TEST_CASE("rdma: failback never writes again what the backup delivered, though the receiver "
          "had not polled it", "[failover][rdma]")
{
    Net n(config(), true, true);
    make_rdma(n, GENERATE(false, true));
    n.fab.refuse = {{true, false}}; // the primary's port stays down until told otherwise
    Traffic t(*n.send, *n.recv);
    n.primary().break_link();
    for (int i = 0; i < 3; ++i) {
        const int id = t.send(4000, 1);
        t.recv({4096}, {1}, {id});
    }
    t.run();
    REQUIRE(n.send->stats().failovers == 1);
    // The backup delivers five more; the receiving core does not poll them yet, while the
    // sender sees them acknowledged, completes them and NCCL refills the send buffers.
    n.backup().hold = true;
    std::vector<int> ids, rids;
    for (int i = 0; i < 5; ++i) {
        ids.push_back(t.send(3000 + static_cast<size_t>(i), 1));
        rids.push_back(t.recv({4096}, {1}, {ids.back()}));
    }
    until_sends_done(t, ids);
    for (int r : rids) CHECK_FALSE(t.recv_done(r)); // not polled yet
    // The primary comes back and takes the traffic back (the backup is idle: every record it
    // wrote was acknowledged).
    n.fab.refuse[kPrimary] = false;
    const uint64_t deadline = vigil::now_ns() + 2000 * kMs;
    while (n.send->stats().failbacks == 0) {
        REQUIRE(vigil::now_ns() < deadline);
        t.poll();
        n.send->on_ready(); // no send pending: its test() does not progress it
        n.recv->on_ready();
        vigil::test::nap();
    }
    // Nothing of the five went out again: a replay would carry the refilled buffers.
    for (const vn::OutMessage &m : n.rebuilt(kPrimary).messages)
        for (int id : ids) CHECK(m.seq != static_cast<uint64_t>(id));
    // The answer to the failback's notice counted them (the backup was drained first), and
    // their records, of the older generation, completed the receives.
    CHECK(n.backup().drains >= 1);
    n.backup().hold = false;
    const int last = t.send(100, 1);
    t.recv({4096}, {1}, {last});
    t.run();
    CHECK(n.send->stats().generation == 3);
}

TEST_CASE("rdma: a receiver losing its port counts the records that had landed on it",
          "[failover][rdma]")
{
    Net n(config(), true, false);
    make_rdma(n, GENERATE(false, true));
    Traffic t(*n.send, *n.recv);
    // Records land on the primary, the sender completes the sends, the receiving core has
    // not polled them when its port goes down.
    n.primary().hold = true;
    std::vector<int> ids;
    for (int i = 0; i < 4; ++i) {
        ids.push_back(t.send(1000 * static_cast<size_t>(i + 1), 2));
        t.recv({8192}, {2}, {ids.back()});
    }
    until_sends_done(t, ids);
    n.recv->port_down(10, "test: port down");
    CHECK(n.primary().fences == 1);
    // They complete without any replay (the sender has nothing left to send).
    t.run();
    CHECK(n.send->stats().replayed_messages == 0);
    // Traffic goes on over the backup after the receiver's request.
    const int id = t.send(5000, 2);
    t.recv({8192}, {2}, {id});
    t.run();
    CHECK(n.send->stats().failovers == 1);
}

TEST_CASE("rdma: a record of an older generation polled after the switch completes its "
          "message", "[failover][rdma]")
{
    Net n(config(), true, false);
    make_rdma(n, GENERATE(false, true));
    Traffic t(*n.send, *n.recv);
    n.primary().hold = true;
    std::vector<int> ids;
    for (int i = 0; i < 3; ++i) {
        ids.push_back(t.send(2048, 4));
        t.recv({2048}, {4}, {ids.back()});
    }
    until_sends_done(t, ids);
    // The sender leaves the primary (its port went down); the notice on the backup names
    // it, and the receiver fences it: the three records it had count.
    n.send->port_down(10, "test: port down");
    t.run();
    CHECK(n.primary().fences == 1);
    CHECK(n.primary().wholes == 3);
    CHECK(n.send->stats().replayed_messages == 0);
    const int id = t.send(64, 4);
    t.recv({64}, {4}, {id});
    t.run();
    CHECK(n.backup().posted.size() == 1);
}

TEST_CASE("rdma: a replay skips the messages the sender already saw held", "[failover][rdma]")
{
    Net n(config(), true, false);
    make_rdma(n, GENERATE(false, true));
    Traffic t(*n.send, *n.recv);
    // The first message vanishes on the primary; the four after it land and are acknowledged
    // (their sends complete, NCCL refills the buffers), unpolled by the receiving core.
    n.primary().hold = true;
    n.primary().lose_records = 1;
    std::vector<int> ids;
    for (int i = 0; i < 5; ++i) {
        ids.push_back(t.send(1500, 6));
        t.recv({2048}, {6}, {ids.back()});
    }
    until_sends_done(t, {ids.begin() + 1, ids.end()});
    REQUIRE_FALSE(t.send_done(ids[0]));
    // The sender leaves the primary: only the first message goes out again.
    n.send->fail_path(kPrimary, "test: stalled", false);
    t.run();
    REQUIRE(n.backup().posted.size() == 1);
    CHECK(n.backup().posted[0] == std::make_pair(uint64_t{0}, uint32_t{2}));
    CHECK(n.send->stats().replayed_messages == 1);
    CHECK(n.primary().wholes == 4); // counted when the notice fenced the primary
}

TEST_CASE("rdma: short records unwrap their sequence numbers past 2^11, across a failover and "
          "its replay", "[failover][rdma]")
{
    Net n(config(), true, true);
    make_rdma(n, true);
    Traffic t(*n.send, *n.recv);
    // 2600 messages: the residues (mod 2^11 in the fake) wrap once, right after the failover,
    // so the backup's records unwrap around a floor crossing 2048.
    for (int batch = 0; batch < 26; ++batch) {
        if (batch == 20) n.primary().break_link();
        for (int i = 0; i < 100; ++i) {
            const int id = t.send(1 + static_cast<size_t>(batch * 100 + i) % 3000, 1);
            t.recv({4096}, {1}, {id});
        }
        t.run();
    }
    CHECK(n.send->stats().failovers == 1);
    CHECK(n.backup().wholes >= 600);
}
