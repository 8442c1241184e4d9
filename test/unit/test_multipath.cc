// SPDX-License-Identifier: Apache-2.0
// Multipath (send_comm.h): a connection stripes its messages, piece by piece, over the active
// path and a shared one, each taking the next piece while its own queue is short, over the
// in-process fake fabric of fake_fabric.h. A "stuck" lane is a slow port: what is written
// waits in its outbox, so its queue grows and the other path takes the pieces. Every test
// checks exact delivery (Traffic compares every byte), that no buffer is written after
// test() reported it done, and that failures of either path under striping lose nothing.
#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>
#include <vector>

#include "fake_fabric.h"
#include "telemetry/registry.h"
#include "telemetry_support.h"
#include "traffic.h"

namespace vn = vigil::net;
namespace tp = vigil::test::fake;
using vn::kBackup;
using vn::kPrimary;
using vn::Placement;

namespace {

using tp::kMs;
using tp::Net;
using vigil::test::Traffic;

constexpr uint64_t kPiece = 1000;

vn::FailoverConfig config(bool multipath = true)
{
    vn::FailoverConfig c;
    c.fatal_timeout_ns = 5000 * kMs;
    c.stall_timeout_ns = 5000 * kMs;
    c.probe_interval_ns = 1000 * kMs;
    c.multipath = multipath;
    c.piece_bytes = kPiece;
    return c;
}

// Both lanes stripe, in frames of one piece; the backup becomes shared on the next progress.
void striping(Net &n)
{
    for (int i : {kPrimary, kBackup}) {
        n.lane[static_cast<size_t>(i)].stripes = true;
        n.lane[static_cast<size_t>(i)].chunk = kPiece;
    }
    n.send->on_ready();
}

// Both lanes stripe as the verbs fabric does: pieces are writes, each one's landing reported.
void striping_rdma(Net &n)
{
    for (int i : {kPrimary, kBackup}) {
        n.lane[static_cast<size_t>(i)].rdma = true;
        n.lane[static_cast<size_t>(i)].stripes = true;
    }
    n.send->on_ready();
}

// Bytes of the pieces posted on `l` in generation `gen` (0: any).
uint64_t piece_bytes(const tp::Lane &l, uint32_t gen = 0)
{
    uint64_t b = 0;
    for (size_t k = 0; k < l.messages.size(); ++k)
        if (gen == 0 || l.posted[k].second == gen) b += l.messages[k].length;
    return b;
}

} // namespace

TEST_CASE("multipath: a slow path's queue stays short and the other path takes the rest",
          "[multipath]")
{
    Net n(config());
    striping(n);
    Traffic t(*n.send, *n.recv);
    n.primary().stuck = true; // a slow port: its frames wait
    t.recv({10000}, {1}, {0});
    t.send(10000, 1);
    for (int k = 0; k < 100 && piece_bytes(n.backup()) < 8 * kPiece; ++k) t.poll();
    // The active path took pieces until two waited on it (nothing lands there); the rest went
    // to the shared one as its pieces landed.
    CHECK(piece_bytes(n.primary()) == 2 * kPiece);
    CHECK(piece_bytes(n.backup()) == 8 * kPiece);
    // Every piece the shared path took counts (the end of a message goes in finer pieces).
    CHECK(n.send->stats().pieces == n.backup().posted.size());
    CHECK(n.backup().posted.size() >= 8);
    CHECK_FALSE(t.recv_done(0)); // two pieces still wait on the slow port
    n.primary().stuck = false;
    t.run();
    CHECK(n.primary().bytes_written == 2 * kPiece);
    CHECK(n.backup().bytes_written == 8 * kPiece);
    CHECK(n.primary().count(Placement::kDiscard) == 0);
    CHECK(n.backup().count(Placement::kDiscard) == 0);
    const auto st = n.send->stats();
    CHECK(st.generation == 1);
    CHECK(st.failovers == 0);
    t.check_spent();
}

TEST_CASE("multipath: with both paths fast, a message that fits one piece takes the active "
          "path",
          "[multipath]")
{
    Net n(config());
    striping(n);
    Traffic t(*n.send, *n.recv);
    for (int k = 0; k < 20; ++k) {
        t.recv({8}, {1}, {k});
        t.send(8, 1);
    }
    t.run();
    CHECK(n.primary().posted.size() == 20);
    CHECK(n.backup().posted.empty());
    CHECK(n.send->stats().pieces == 0);
}

TEST_CASE("multipath: the shared path fails mid-message: a new generation on the active path "
          "replays what was not acknowledged, exactly once",
          "[multipath][failover]")
{
    const bool rdma = GENERATE(false, true); // TCP streams, or pieces as RDMA writes
    Net n(config());
    if (rdma)
        striping_rdma(n);
    else
        striping(n);
    Traffic t(*n.send, *n.recv);
    n.primary().stuck = true;
    t.recv({10000}, {1}, {0});
    t.recv({3000}, {2}, {1});
    t.send(10000, 1);
    t.send(3000, 2);
    t.poll();
    REQUIRE(piece_bytes(n.backup()) > 0);
    n.recv->on_ready(); // some of the backup's pieces land
    if (rdma) REQUIRE(n.backup().pieces_told > 0);

    SECTION("the link breaks: both ends see it")
    {
        n.backup().break_link();
        t.poll();
    }
    SECTION("the sender's port fails (fail_path)")
    {
        n.send->fail_path(kBackup, "injected port failure", true);
    }
    const auto st = n.send->stats();
    CHECK(st.failovers == 1);
    CHECK(st.generation == 2);
    CHECK(n.send->active_dev() == 10);
    REQUIRE_FALSE(n.primary().begins.empty());
    CHECK(n.primary().begins.back().gen == 2);
    CHECK(n.primary().begins.back().abandoned == kBackup);
    n.primary().stuck = false;
    t.run();
    CHECK(n.recv->generation() == 2);
    // Generation 2 is the primary's alone, and carries the first message whole, not the
    // second, whose pieces had all landed on the shared path: the sender learned it (over
    // RDMA each write completing, over TCP the receiver's landed report) and never replays
    // into a buffer the receiver may have handed back.
    CHECK(piece_bytes(n.primary(), 2) == 10000u);
    t.check_spent();

    // The connection goes on over the primary.
    t.recv({100}, {4}, {2});
    t.send(77, 4);
    t.run();
}

TEST_CASE("multipath: the active path fails mid-message: the shared path becomes active and "
          "replays",
          "[multipath][failover]")
{
    const bool rdma = GENERATE(false, true);
    Net n(config());
    if (rdma)
        striping_rdma(n);
    else
        striping(n);
    Traffic t(*n.send, *n.recv);
    n.primary().stuck = true;
    t.recv({10000}, {1}, {0});
    t.send(10000, 1);
    t.poll();
    n.recv->on_ready(); // the shared path's pieces of generation 1 land
    n.primary().break_link();
    t.poll();
    const auto st = n.send->stats();
    CHECK(st.failovers == 1);
    CHECK(st.generation == 2);
    CHECK(n.send->active_dev() == 11);
    REQUIRE_FALSE(n.backup().begins.empty());
    CHECK(n.backup().begins.back().gen == 2);
    CHECK(n.backup().begins.back().abandoned == kPrimary);
    t.run();
    CHECK(piece_bytes(n.backup(), 2) == 10000);
    CHECK(n.recv->generation() == 2);
    t.check_spent();
}

TEST_CASE("multipath: off, or a fabric that does not stripe, keeps the backup a standby",
          "[multipath]")
{
    const bool multipath = GENERATE(false, true);
    Net n(config(multipath));
    if (!multipath) striping(n);   // lanes stripe, the connection does not
    else n.send->on_ready();       // multipath on, lanes that do not stripe
    Traffic t(*n.send, *n.recv);
    n.primary().stuck = true;
    t.recv({10000}, {1}, {0});
    t.send(10000, 1);
    t.poll();
    n.primary().stuck = false;
    t.run();
    CHECK(n.backup().posted.empty());
    CHECK(n.primary().posted.size() == 1);
    CHECK(n.send->stats().pieces == 0);
    n.check_posting();
}

TEST_CASE("multipath over RDMA: a message's pieces land over both paths and complete it at "
          "both ends",
          "[multipath][rdma]")
{
    Net n(config());
    striping_rdma(n);
    Traffic t(*n.send, *n.recv);
    n.primary().stuck = true; // a slow port: its pieces wait, so the shared path takes more
    t.recv({10000}, {1}, {0});
    t.send(10000, 1);
    t.poll();
    CHECK(piece_bytes(n.primary()) == 2 * kPiece);
    CHECK(piece_bytes(n.backup()) == 8 * kPiece);
    n.recv->on_ready();
    CHECK_FALSE(t.recv_done(0)); // its pieces on the slow port have not landed
    CHECK_FALSE(t.send_done(0));
    n.primary().stuck = false;
    t.run();
    CHECK(n.primary().bytes_written + n.backup().bytes_written == 10000);
    // Every piece told once, whichever path it came on (the last with the size).
    CHECK(static_cast<size_t>(n.primary().pieces_told + n.backup().pieces_told) ==
          n.primary().posted.size() + n.backup().posted.size());
    CHECK(n.primary().wholes + n.backup().wholes == 0);
    CHECK(n.send->stats().generation == 1);
    t.check_spent();

    // Small messages still go whole, on one path (the one the Striper finds faster: the
    // primary held its pieces for a while).
    t.recv({8}, {2}, {1});
    t.send(8, 2);
    t.run();
    CHECK(n.primary().wholes + n.backup().wholes == 1);
    t.check_spent();
}

namespace {

// Sum of `field` over every window the registry holds for the send path of `comm` in `slot`.
template <typename F>
uint64_t send_windows_sum(const vn::SendComm *comm, int slot, F field)
{
    vt::RegistryView v;
    std::string why;
    REQUIRE(v.open(vt::Registry::instance().path(), &why) == 0);
    for (uint32_t i = 0; i < v.entries(); ++i) {
        const vt::PathEntry &e = v.entry(i);
        if (e.in_use.load() == 0 || e.conn_id != reinterpret_cast<uintptr_t>(comm) || e.kind != 0 ||
            e.slot != slot)
            continue;
        uint64_t sum = 0;
        const uint64_t head = e.ring.head.load();
        for (uint64_t k = head > vt::kRingCapacity ? head - vt::kRingCapacity : 0; k < head; ++k) {
            vt::WindowRecord w;
            if (vt::RegistryView::read(e, k, &w)) sum += field(w);
        }
        return sum;
    }
    FAIL("no send path in slot " << slot << " in the registry");
    return 0;
}

// Busy time (ns) over the send path's windows.
uint64_t send_busy_ns(const vn::SendComm *comm, int slot)
{
    return send_windows_sum(comm, slot, [](const vt::WindowRecord &w) { return w.busy_ns; });
}

// Wait time (us) charged to the send path's windows.
uint64_t send_wait_us(const vn::SendComm *comm, int slot)
{
    return send_windows_sum(comm, slot, [](const vt::WindowRecord &w) { return uint64_t{w.wait_us}; });
}

} // namespace

TEST_CASE("multipath: a path's meter ends its share of a message when its pieces land, not "
          "when the slow path's do",
          "[multipath][rdma][telemetry]")
{
    // Over RDMA a piece's write completing says it landed; over streams the receiver reports
    // what each path brought (the TCP fabric's landed report), as a cumulative ack cannot.
    const bool rdma = GENERATE(false, true);
    CAPTURE(rdma);
    registry();
    vn::TelemetryConfig tc;
    tc.window_ns = kW;
    Net n(config(), true, false, tc);
    if (rdma) striping_rdma(n);
    else striping(n);
    Traffic t(*n.send, *n.recv);
    n.primary().stuck = true; // a slow port: its pieces wait 200 ms
    t.recv({10000}, {1}, {0});
    t.send(10000, 1);
    t.run_for(200);
    CHECK(piece_bytes(n.backup()) == 8 * kPiece); // landed at once
    CHECK_FALSE(t.send_done(0));
    n.primary().stuck = false;
    t.run();
    t.run_for(3); // the last windows close
    // The shared path carried its pieces in well under a millisecond; the slow one was busy
    // for the whole wait. Charged to both (one meter operation per message), the shared path
    // would show the 200 ms too, and look as slow as the port it stripes with. The bound
    // leaves room for a test thread descheduled on a loaded host (24 ms seen under ASan
    // beside stress-ng).
    CHECK(send_busy_ns(n.send.get(), kPrimary) >= 175 * kW);
    CHECK(send_busy_ns(n.send.get(), kBackup) < 100 * kW);
    t.check_spent();
}

TEST_CASE("multipath: news of a landing late on its way back is the path's wait when it left "
          "the path idle",
          "[multipath][telemetry]")
{
    // The TCP fabric says how much longer than its floor a landed report took on the way back
    // (ReturnDelay); here every landed report says 30 ms. Both ports are slow at first; the
    // primary's pieces land 40 ms after their post while the backup still holds the rest of
    // the message, so no ack ends the primary's share: its own report does, and leaves the
    // path with nothing in flight, so the report's 30 ms are charged as wait. Not dated, the
    // path's busy time would hold them, and nothing would be charged beyond the end points'
    // own lateness. (With another operation in flight on the path nothing is charged: the
    // path carried that meanwhile.)
    registry();
    vn::TelemetryConfig tc;
    tc.window_ns = kW;
    Net n(config(), true, false, tc);
    striping(n);
    constexpr uint64_t kLateUs = 30'000;
    for (tp::Lane *l : {&n.primary(), &n.backup()}) {
        l->landed_late_ns = kLateUs * 1000;
        l->stuck = true;
    }
    Traffic t(*n.send, *n.recv);
    t.recv({10000}, {1}, {0});
    t.send(10000, 1);
    t.run_for(40);
    REQUIRE(piece_bytes(n.primary()) > 0);
    n.primary().stuck = false;
    t.run_for(20);
    REQUIRE_FALSE(t.send_done(0)); // the backup holds pieces of it: no ack yet
    n.backup().stuck = false;
    t.run();
    t.run_for(3); // the last windows close
    const uint64_t slow = send_wait_us(n.send.get(), kPrimary);
    INFO("wait charged to the primary: " << slow << " us");
    CHECK(slow >= kLateUs);
    // The end points' own lateness (a descheduled test thread) may add some.
    CHECK(slow < 2 * kLateUs);
    t.check_spent();
}
