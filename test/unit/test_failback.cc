// SPDX-License-Identifier: Apache-2.0
// Rebuild and failback in the transport core (comm.h): a primary and a backup path per
// connection over the in-process fake fabric of fake_fabric.h, with its fake
// PathRebuilder (refused while "the port is down", then a fresh path) and fake PathAcceptor
// that hands the receiving end of each rebuilt path to the RecvComm; the send half of a path
// can also be "stuck" (it holds what it is given and is not idle()). The core reads
// CLOCK_MONOTONIC, so the tests run in real time with small FailoverConfig values (hold 20 ms,
// backoff 5..40 ms).
// Every test checks exact delivery (bytes, sizes, each message placed exactly once), that no
// receive buffer is written after test() reported it done (canaries), and that
// isend/irecv/test return 0 throughout.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <vector>

#include "clock.h"
#include "fake_fabric.h"
#include "traffic.h"

namespace vn = vigil::net;
namespace tp = vigil::test::fake;
using vn::kBackup;
using vn::kPrimary;
using vn::Placement;

namespace {

// The fake fabric, its rebuilder and acceptor, and the traffic checks: fake_fabric.h.
using tp::kMs;
using tp::Lane;
using vigil::test::nap;
using tp::SeqGen;
using tp::SeqGens;

constexpr uint64_t kHoldMs = 20;
constexpr uint64_t kBackoffMinMs = 5;
constexpr uint64_t kBackoffMaxMs = 40;

vn::FailoverConfig config(uint64_t backoff_max_ms = kBackoffMaxMs)
{
    vn::FailoverConfig c;
    c.fatal_timeout_ns = 2000 * kMs;
    c.stall_timeout_ns = 500 * kMs;
    c.probe_interval_ns = 10 * kMs;
    c.failback_hold_ns = kHoldMs * kMs;
    c.rebuild_backoff_min_ns = kBackoffMinMs * kMs;
    c.rebuild_backoff_max_ns = backoff_max_ms * kMs;
    return c;
}

// A connection over two lanes (device of slot i: 10 + i) with the fake rebuilder and
// acceptor.
struct Net : tp::Net {
    explicit Net(const vn::FailoverConfig &cfg)
        : tp::Net(cfg, /*with_backup=*/true, /*rebuild=*/true)
    {
    }
};

// Traffic over it: run() gives up after 2 s by default (a bound on progress, not a timing claim).
struct Traffic : vigil::test::Traffic {
    explicit Traffic(Net &net) : vigil::test::Traffic(*net.send, *net.recv, /*run_limit_ms=*/2000), n(net) {}

    // One message and its receive; sizes vary with the id.
    int one(int32_t tag = 7)
    {
        const int id = next_id();
        const size_t size = 100 + 13 * static_cast<size_t>(id % 29);
        recv({512}, {tag}, {id});
        return send(size, tag);
    }
    Net &n;
};

// One round of progress: test() of every pending request (each must return 0), then both
// comms' on_ready() (the progress engine's tick), then a short sleep.
void step(Traffic &t)
{
    t.poll();
    t.n.send->on_ready();
    t.n.recv->on_ready();
    nap();
}

// Steps until one step has begun at or after `until_ns`, so the comms' last tick saw that
// time. (Stopping at the first clock read past it is not enough: on a loaded host a nap can
// oversleep, and the last tick then ran milliseconds before the deadline.)
void drive_until_ns(Traffic &t, uint64_t until_ns)
{
    for (;;) {
        const bool past = vigil::now_ns() >= until_ns;
        step(t);
        if (past) return;
    }
}

void drive_for(Traffic &t, uint64_t ms)
{
    drive_until_ns(t, vigil::now_ns() + ms * kMs);
}

template <class Pred>
void drive_until(Traffic &t, Pred done, uint64_t limit_ms, const char *what)
{
    const uint64_t deadline = vigil::now_ns() + limit_ms * kMs;
    while (!done()) {
        INFO("waiting for: " << what);
        REQUIRE(vigil::now_ns() < deadline);
        step(t);
    }
}

// Timing bounds for the backoff and hold checks. The core computes next_rebuild = now +
// backoff from a clock read that precedes the fake rebuilder's stamp of that attempt by an
// unbounded time on a loaded host (the thread may be preempted between the two), so the
// difference of two stamps proves nothing exact. The lower bounds are taken from clock reads
// known to come before the core's instead: the test's own, taken before the call that made
// the first attempt, or an earlier attempt's stamp (every attempt runs under the comm's lock,
// and each call reads the clock after taking it). kLateNs is how late a due attempt may come
// (the polling period on a loaded machine): upper bounds are only sanity checks, the
// structural claims are made with margins far above it.
constexpr uint64_t kLateNs = 60 * kMs;

// No later than the clock reading the path rebuilt by the last attempt for `slot` started its
// hold time from: the stamp of the attempt before that one.
uint64_t up_floor_ns(const Net &n, int slot)
{
    const auto &a = n.fab.attempts.at(static_cast<size_t>(slot));
    REQUIRE(a.size() >= 2);
    return a[a.size() - 2];
}

} // namespace

// ---- 1. The whole cycle --------------------------------------------------------------------

TEST_CASE("failback: refused rebuilds back off without limit, the rebuilt primary takes the "
          "traffic back after the hold",
          "[failback]")
{
    const auto cfg = config();
    Net n(cfg);
    Traffic t(n);
    n.fab.refuse[kPrimary] = true; // the primary's port is down from the failure on
    t.one();
    t.run();
    REQUIRE(n.send->stats().generation == 1);

    // Message 1 is in flight on the primary when its port fails.
    n.primary().hold = true;
    t.recv({2000}, {1}, {1});
    t.send(2000, 1);
    const uint64_t t_fail = vigil::now_ns(); // before the first attempt's clock read
    n.send->fail_path(kPrimary, "injected port failure", true);
    auto st = n.send->stats();
    CHECK(st.generation == 2);
    CHECK(st.failovers == 1);
    CHECK(st.replayed_messages == 1);
    CHECK(st.rebuilds == 0);
    CHECK(n.send->active_dev() == 11);
    CHECK(n.backup().begun() == SeqGens{{1, 2}});
    // The first rebuild attempt comes at once (inside fail_path); the live backup is never
    // rebuilt.
    CHECK(n.fab.attempts[kPrimary].size() == 1);
    CHECK(n.fab.refused[kPrimary].size() == 1);
    CHECK(n.fab.attempts[kBackup].empty());
    t.run();
    CHECK(n.backup().posted == SeqGens{{1, 2}});

    // Refused again and again; traffic goes on over the backup meanwhile.
    constexpr size_t kRefusals = 8;
    uint64_t next_msg = 0;
    drive_until(t, [&] {
        if (t.finished() && vigil::now_ns() >= next_msg) {
            t.one();
            next_msg = vigil::now_ns() + 5 * kMs;
        }
        return n.fab.refused[kPrimary].size() >= kRefusals;
    }, 1000, "eight refused rebuilds");
    t.run();
    uint64_t due = 0; // the sum of the backoffs so far
    {
        const auto &a = n.fab.refused[kPrimary];
        REQUIRE(a.size() == kRefusals);
        CHECK(n.fab.attempts[kPrimary].size() == kRefusals);
        // Backoffs 5, 10, 20, 40, 40, 40, 40 ms: doubling from the minimum, capped at the
        // maximum, and the attempts keep coming at the cap. Attempt k comes no sooner than the
        // sum of the backoffs before it (after t_fail), and each gap is at most its backoff
        // plus the polling delay.
        uint64_t expect = cfg.rebuild_backoff_min_ns;
        for (size_t k = 1; k < a.size(); ++k) {
            const uint64_t gap = a[k] - a[k - 1];
            due += expect;
            INFO("attempt " << k << ": gap " << gap / 1000 << " us, backoff " << expect / 1000
                            << " us, " << (a[k] - t_fail) / 1000 << " us after the failure");
            CHECK(a[k] - t_fail >= due);
            CHECK(gap <= expect + kLateNs);
            CHECK(gap <= cfg.rebuild_backoff_max_ns + kLateNs);
            expect = std::min(expect * 2, cfg.rebuild_backoff_max_ns);
        }
        // The last four gaps are at the cap: 4 x 40 ms. Uncapped they would take at least
        // 80 + 160 + 320 + 640 ms.
        CHECK(a[kRefusals - 1] - a[kRefusals - 5] < 2 * 4 * cfg.rebuild_backoff_max_ns);
    }
    st = n.send->stats();
    CHECK(st.rebuilds == 0);
    CHECK(st.generation == 2);
    CHECK(st.failbacks == 0);
    CHECK(n.fab.attempts[kBackup].empty());
    CHECK(n.send->active_dev() == 11);

    // The port comes back: one attempt in progress, then the path is up.
    n.fab.refuse[kPrimary] = false;
    n.fab.connecting[kPrimary] = 1;
    drive_until(t, [&] { return !n.fab.rebuilt[kPrimary].empty(); }, 2000, "the rebuild");
    CHECK(n.fab.attempts[kPrimary].size() == kRefusals + 2);
    CHECK(n.fab.attempts[kPrimary][kRefusals] - t_fail >= due + cfg.rebuild_backoff_max_ns);
    const uint64_t t_up = up_floor_ns(n, kPrimary);
    Lane &pl = n.rebuilt(kPrimary);
    st = n.send->stats();
    CHECK(st.rebuilds == 1);
    CHECK(st.failbacks == 0);
    CHECK(st.generation == 2);
    CHECK(n.send->active_dev() == 11);
    CHECK(pl.begins.empty());

    // Three messages the receiver will not get over the backup before the switch: their
    // generation-2 frames stay on the backup's wire, so they are not acked at the failback.
    n.backup().hold = true;
    const int x = t.next_id();
    t.recv({3000}, {2}, {x});
    t.recv({600, 800}, {2, 3}, {x + 1, x + 2}); // multi-recv
    t.send(3000, 2);
    t.send(500, 2);
    t.send(700, 3);
    const uint64_t sx = static_cast<uint64_t>(x);
    REQUIRE(n.backup().posted.size() >= 3);
    CHECK(SeqGens(n.backup().posted.end() - 3, n.backup().posted.end()) ==
          SeqGens{{sx, 2}, {sx + 1, 2}, {sx + 2, 2}});
    const size_t backup_posts = n.backup().posted.size();
    const uint64_t backup_bytes = n.backup().bytes_written;

    // Nothing moves back before the hold time: judged by the stamp of the failback's first
    // write on the rebuilt path (below), not by when this thread looks, as a tick may run
    // late on a loaded host.
    drive_until(t, [&] { return n.send->stats().failbacks == 1; }, 2000, "the failback");
    st = n.send->stats();
    CHECK(st.generation == 3); // failover + failback
    CHECK(st.failovers == 1);
    CHECK(st.failbacks == 1);
    CHECK(st.rebuilds == 1);
    CHECK(st.replayed_messages == 1 + 3);
    CHECK(n.send->active_dev() == 10);
    REQUIRE(pl.begun() == SeqGens{{sx, 3}});
    CHECK(pl.begins.at(0).at_ns >= t_up + cfg.failback_hold_ns);
    CHECK(pl.posted == SeqGens{{sx, 3}, {sx + 1, 3}, {sx + 2, 3}});
    t.run();
    CHECK(n.fab.accepted == std::vector<int>{kPrimary}); // the receiver took the new path
    CHECK(n.recv->generation() == 3);
    CHECK(pl.bytes_written == 3000 + 500 + 700);
    CHECK(n.backup().bytes_written == backup_bytes);

    // The stale generation-2 frames arrive late: discarded, the canaries survive.
    n.backup().hold = false;
    drive_for(t, 5);
    CHECK(n.backup().streams[0].empty());
    CHECK(n.backup().count(Placement::kDiscard, 2) == 3);
    CHECK(n.backup().bytes_written == backup_bytes);
    t.check_spent();

    // Later messages go over the primary only.
    for (int i = 0; i < 4; ++i) t.one();
    t.run();
    CHECK(n.backup().posted.size() == backup_posts);
    CHECK(pl.posted.size() == 3 + 4);
    for (const auto &[seq, gen] : pl.posted) CHECK(gen == 3);
    CHECK(pl.posted.back().first == static_cast<uint64_t>(t.next_id() - 1));
    REQUIRE_FALSE(pl.acks.empty());
    CHECK(pl.acks.back() == SeqGen{static_cast<uint64_t>(t.next_id()), 3});
    CHECK(n.send->stats().failbacks == 1);
    CHECK(n.send->stats().generation == 3);
    n.check_posting();
    n.check_exactly_once(static_cast<uint64_t>(t.next_id()), t.bytes());
    t.check_spent();
}

// ---- 2. Failback while the backup is busy ----------------------------------------------------

// One message over, the primary failed and rebuilt at once, the backup stuck (what it is
// given waits in its outbox: not idle) with message `a` on it, and the clock past the
// failback hold: the failback is due and waits for the backup to drain.
struct StuckDrain {
    uint64_t t_rebuilt; // when the primary was rebuilt (ns)
    int a;              // the message on the stuck backup
};
StuckDrain failback_due_on_stuck_backup(Net &n, Traffic &t, const vn::FailoverConfig &cfg)
{
    n.fab.refuse[kPrimary] = false;
    t.one();
    t.run();
    n.send->fail_path(kPrimary, "injected port failure", true);
    REQUIRE(n.fab.rebuilt[kPrimary].size() == 1);
    const uint64_t t_rebuilt = n.fab.rebuilt_ns[kPrimary][0];
    n.backup().stuck = true;
    const int a = t.one();
    drive_until_ns(t, t_rebuilt + cfg.failback_hold_ns + 3 * kMs);
    REQUIRE(n.send->stats().failbacks == 0);
    return {t_rebuilt, a};
}

TEST_CASE("failback waits until the backup is idle; messages posted meanwhile are replayed "
          "on the primary",
          "[failback]")
{
    const auto cfg = config();
    Net n(cfg);
    Traffic t(n);
    n.fab.refuse[kPrimary] = false; // the first attempt succeeds
    t.one();
    t.run();
    n.send->fail_path(kPrimary, "injected port failure", true);
    REQUIRE(n.send->stats().rebuilds == 1); // rebuilt inside fail_path
    REQUIRE(n.fab.rebuilt[kPrimary].size() == 1);
    const uint64_t t_rebuilt = n.fab.rebuilt_ns[kPrimary][0];
    Lane &pl = n.rebuilt(kPrimary);
    CHECK(n.send->stats().generation == 2);
    CHECK(n.send->active_dev() == 11);

    // The backup cannot write what it is given: not idle.
    n.backup().stuck = true;
    const int a = t.next_id();
    t.recv({4000}, {1}, {a});
    t.recv({1500}, {1}, {a + 1});
    t.send(4000, 1);
    t.send(1500, 1);
    const uint64_t sa = static_cast<uint64_t>(a);
    CHECK(n.backup().posted == SeqGens{{sa, 2}, {sa + 1, 2}});
    CHECK(n.backup().outbox.size() == 2);

    // The hold time passes: the failback is due, but the backup is mid-way.
    drive_until_ns(t, t_rebuilt + cfg.failback_hold_ns + 3 * kMs);
    CHECK(n.send->stats().failbacks == 0);
    CHECK(n.send->stats().generation == 2);
    CHECK(n.send->active_dev() == 11);
    CHECK(pl.posted.empty());

    // New messages are posted to neither path while the backup drains.
    t.recv({900, 16}, {4, 5}, {a + 2, a + 3});
    t.send(800, 4);
    t.send(0, 5); // an empty message
    drive_for(t, 10);
    CHECK(n.backup().posted.size() == 2);
    CHECK(pl.posted.empty());
    CHECK(n.send->stats().failbacks == 0);
    for (int i = a; i < a + 4; ++i) CHECK_FALSE(t.send_done(i));

    // The backup writes its frames: the switch happens at that frame boundary.
    n.backup().stuck = false;
    drive_until(t, [&] { return n.send->stats().failbacks == 1; }, 2000, "the failback");
    const auto st = n.send->stats();
    CHECK(st.generation == 3);
    CHECK(st.failovers == 1);
    CHECK(st.rebuilds == 1);
    CHECK(st.replayed_messages == 4);
    CHECK(n.send->active_dev() == 10);
    CHECK(n.backup().outbox.empty());
    CHECK(pl.begun() == SeqGens{{sa, 3}});
    CHECK(pl.posted == SeqGens{{sa, 3}, {sa + 1, 3}, {sa + 2, 3}, {sa + 3, 3}});
    CHECK(n.backup().posted == SeqGens{{sa, 2}, {sa + 1, 2}});
    t.run();
    CHECK(n.recv->generation() == 3);
    drive_for(t, 2); // whatever generation-2 frame is still on the backup's wire arrives
    CHECK(n.backup().streams[0].empty());
    t.one();
    t.run();
    CHECK(pl.posted.size() == 5);
    n.check_posting();
    n.check_exactly_once(static_cast<uint64_t>(t.next_id()), t.bytes());
    t.check_spent();
}

TEST_CASE("failback: a backup that does not finish its messages within the stall timeout is "
          "failed over as stalled, and the primary takes what is not acked",
          "[failback]")
{
    const auto cfg = config();
    Net n(cfg);
    Traffic t(n);
    // The backup heartbeats but never writes what it holds.
    const auto [t_rebuilt, a] = failback_due_on_stuck_backup(n, t, cfg);
    Lane &pl = n.rebuilt(kPrimary);
    const int b = t.one(); // held back by the drain
    drive_for(t, 10);
    CHECK(pl.posted.empty());
    CHECK_FALSE(t.send_done(b));

    // The receiver's heartbeats (an ack of what it has) keep the backup heard, so the stall
    // watchdog alone would wait for ever. Past the stall timeout the drain fails the backup
    // over as stalled; the primary replays both.
    uint64_t beat_ns = 0;
    drive_until(t, [&] {
                    if (vigil::now_ns() - beat_ns >= cfg.probe_interval_ns && n.send->active_dev() == 11) {
                        n.backup().heartbeat();
                        beat_ns = vigil::now_ns();
                    }
                    return n.send->stats().failovers == 2;
                },
                static_cast<int>(cfg.stall_timeout_ns / kMs) + 500, "the stalled backup's failover");
    CHECK(vigil::now_ns() - (t_rebuilt + cfg.failback_hold_ns) >= cfg.stall_timeout_ns); // not before
    CHECK(n.send->active_dev() == 10);
    CHECK(n.send->stats().failbacks == 0);
    CHECK(n.send->stats().generation == 3);
    const auto sa = static_cast<uint64_t>(a), sb = static_cast<uint64_t>(b);
    CHECK(pl.posted == SeqGens{{sa, 3}, {sb, 3}});
    t.run(200);
    CHECK(t.send_done(a));
    CHECK(t.send_done(b));
    CHECK(n.recv->generation() == 3);
    n.check_exactly_once(static_cast<uint64_t>(t.next_id()), t.bytes());
}

// ---- 3. The rebuilt primary dies during the hold -------------------------------------------

TEST_CASE("a rebuilt primary that dies during the hold time gets no failback; a later "
          "rebuild does",
          "[failback]")
{
    // A hold long enough that the rebuilt path surely breaks within it, on a loaded host too.
    auto cfg = config();
    cfg.failback_hold_ns = 200 * kMs;
    Net n(cfg);
    Traffic t(n);
    n.fab.refuse[kPrimary] = false;
    t.one();
    t.run();
    n.send->fail_path(kPrimary, "injected port failure", true);
    REQUIRE(n.fab.rebuilt[kPrimary].size() == 1);
    const uint64_t t_first = n.fab.rebuilt_ns[kPrimary][0];
    Lane &first = n.rebuilt(kPrimary, 0);
    t.one();
    t.run();

    // Half-way through the hold, the rebuilt path breaks; its port is down again.
    drive_until_ns(t, t_first + cfg.failback_hold_ns / 2);
    REQUIRE(n.send->stats().failbacks == 0);
    n.fab.refuse[kPrimary] = true;
    first.break_link();
    drive_until(t, [&] { return !n.fab.refused[kPrimary].empty(); }, 1000, "a refused rebuild");

    // Well past the first path's hold time: no failback, the traffic stays on the backup.
    uint64_t next_msg = 0;
    while (vigil::now_ns() < t_first + cfg.failback_hold_ns + 30 * kMs) {
        if (t.finished() && vigil::now_ns() >= next_msg) {
            t.one();
            next_msg = vigil::now_ns() + 3 * kMs;
        }
        step(t);
    }
    t.run();
    auto st = n.send->stats();
    CHECK(st.failbacks == 0);
    CHECK(st.generation == 2);
    CHECK(st.rebuilds == 1);
    CHECK(n.send->active_dev() == 11);
    CHECK(first.begins.empty());
    CHECK(first.posted.empty());
    CHECK(first.bytes_written == 0);
    const size_t backup_posts = n.backup().posted.size();
    CHECK(backup_posts == static_cast<size_t>(t.next_id() - 1)); // all but message 0
    for (const auto &[seq, gen] : n.backup().posted) CHECK(gen == 2);

    // The port comes back: a second rebuild (one attempt in progress first), and the failback
    // a hold time after it.
    n.fab.refuse[kPrimary] = false;
    n.fab.connecting[kPrimary] = 1;
    drive_until(t, [&] { return n.fab.rebuilt[kPrimary].size() == 2; }, 1000, "the second rebuild");
    const uint64_t t_second = up_floor_ns(n, kPrimary);
    Lane &second = n.rebuilt(kPrimary, 1);
    drive_until(t, [&] { return n.send->stats().failbacks == 1; }, 2000, "the failback");
    st = n.send->stats();
    CHECK(st.generation == 3);
    CHECK(st.rebuilds == 2);
    CHECK(st.failovers == 1);
    CHECK(n.send->active_dev() == 10);
    const uint64_t next = static_cast<uint64_t>(t.next_id());
    REQUIRE(second.begun() == SeqGens{{next, 3}}); // everything was acked: nothing to replay
    CHECK(second.begins.at(0).at_ns >= t_second + cfg.failback_hold_ns);
    CHECK(first.begins.empty());
    CHECK(n.fab.accepted == std::vector<int>{kPrimary, kPrimary});
    for (int i = 0; i < 3; ++i) t.one();
    t.run();
    CHECK(second.posted == SeqGens{{next, 3}, {next + 1, 3}, {next + 2, 3}});
    CHECK(n.backup().posted.size() == backup_posts);
    CHECK(n.recv->generation() == 3);
    n.check_posting();
    n.check_exactly_once(static_cast<uint64_t>(t.next_id()), t.bytes());
    t.check_spent();
}

// ---- 4. No path left, then a rebuild -------------------------------------------------------

TEST_CASE("both paths dead, a rebuild before fatal_timeout: the connection resumes on it",
          "[failback]")
{
    const int back = GENERATE(kPrimary, kBackup);
    INFO("the rebuilt slot: " << (back == kPrimary ? "primary" : "backup"));
    const auto cfg = config();
    Net n(cfg);
    Traffic t(n);
    // With the backup coming back, the primary has nowhere to be rebuilt to.
    if (back == kBackup) n.fab.rebuildable[kPrimary] = false;
    t.one();
    t.run();
    n.send->fail_path(kPrimary, "injected port failure", true);
    CHECK(n.send->stats().generation == 2);
    t.one();
    t.run();
    CHECK(n.backup().posted == SeqGens{{1, 2}});

    // Message 2 is in flight on the backup when it fails too: no path left.
    n.backup().hold = true;
    t.recv({1500}, {1}, {2});
    t.send(1500, 1);
    const uint64_t t_none = vigil::now_ns();
    n.send->fail_path(kBackup, "injected port failure", true);
    CHECK(n.send->active_dev() == -1);
    CHECK(n.send->stats().generation == 2);
    CHECK(n.send->stats().failovers == 1);

    // No path: isend/irecv/test return 0, nothing completes, nothing is posted anywhere, and
    // the rebuild attempts keep coming.
    t.recv({700, 64}, {1, 2}, {3, 4});
    t.send(600, 1);
    t.send(64, 2);
    drive_for(t, 60);
    for (int i = 2; i < 5; ++i) CHECK_FALSE(t.send_done(i));
    CHECK_FALSE(t.recv_done(2));
    CHECK_FALSE(t.recv_done(3));
    CHECK(n.primary().posted.size() == 1);
    CHECK(n.backup().posted == SeqGens{{1, 2}, {2, 2}});
    CHECK(n.fab.refused[static_cast<size_t>(back)].size() >= 3);
    if (back == kBackup) CHECK(n.fab.attempts[kPrimary].empty());
    CHECK(n.send->stats().rebuilds == 0);

    n.fab.refuse[static_cast<size_t>(back)] = false;
    drive_until(t, [&] { return n.send->stats().rebuilds == 1; }, 1000, "the rebuild");
    CHECK(vigil::now_ns() - t_none < cfg.fatal_timeout_ns);
    Lane &rl = n.rebuilt(back);
    const auto st = n.send->stats();
    CHECK(st.generation == 3);
    CHECK(st.failovers == 1);
    CHECK(st.failbacks == 0);
    // Message 2 is replayed; 3 and 4 waited for their CTS, which reaches the sender only
    // over the rebuilt path (the receiver advertises every open group on it first).
    CHECK(st.replayed_messages == 1);
    CHECK(n.send->active_dev() == 10 + back);
    CHECK(rl.begun() == SeqGens{{2, 3}});
    // The replay goes first. The CTS for 3 and 4 may already be in too (the engine thread
    // serves the rebuilt path in the background, and under a slow sanitizer it may do so
    // between the rebuild and this check): they follow it, never precede it.
    REQUIRE(!rl.posted.empty());
    CHECK(rl.posted.front() == SeqGen{2, 3});
    const SeqGens expect{{2, 3}, {3, 3}, {4, 3}};
    CHECK(std::equal(rl.posted.begin(), rl.posted.end(), expect.begin(),
                     expect.begin() + static_cast<long>(std::min(rl.posted.size(), expect.size()))));
    t.run();
    CHECK(rl.posted == expect);
    CHECK(n.recv->generation() == 3);
    CHECK(rl.bytes_written == 1500 + 600 + 64);

    // The connection goes on over the rebuilt path.
    t.one();
    t.run();
    CHECK(rl.posted.back() == SeqGen{5, 3});
    CHECK(n.send->stats().failbacks == 0);
    n.check_posting();
    n.check_exactly_once(static_cast<uint64_t>(t.next_id()), t.bytes());
    t.check_spent();
}

// ---- 5. port_up -----------------------------------------------------------------------------

TEST_CASE("port_up resets the rebuild backoff: the next attempt comes at once", "[failback]")
{
    const auto cfg = config(1000); // backoff up to one second
    Net n(cfg);
    Traffic t(n);
    t.one();
    t.run();
    const uint64_t t_fail = vigil::now_ns(); // before the first attempt's clock read
    n.send->fail_path(kPrimary, "injected port failure", true);
    const auto &a = n.fab.refused[kPrimary];
    // Gaps 5, 10, 20, 40, 80 ms: the next attempt is due 160 ms after the last.
    drive_until(t, [&] { return a.size() >= 6; }, 1000, "six refused rebuilds");
    REQUIRE(a.size() == 6);
    CHECK(a[5] - t_fail >= (5 + 10 + 20 + 40 + 80) * kMs);
    drive_for(t, 20);
    CHECK(a.size() == 6);

    // Other devices coming up change nothing: 12 is not used, 11 carries the live backup.
    n.send->port_up(12);
    n.send->port_up(11);
    CHECK(n.fab.attempts[kPrimary].size() == 6);
    CHECK(n.fab.attempts[kBackup].empty());

    // The primary's port comes up (still refusing): one attempt inside port_up...
    uint64_t t0 = vigil::now_ns();
    n.send->port_up(10);
    REQUIRE(a.size() == 7);
    CHECK(a[6] >= t0);
    CHECK(a[6] - a[5] < 160 * kMs);
    // ... and the backoff starts over from the minimum.
    drive_until(t, [&] { return a.size() >= 8; }, 150, "the next attempt");
    CHECK(a[7] - t0 >= cfg.rebuild_backoff_min_ns);
    CHECK(a[7] - a[6] <= cfg.rebuild_backoff_min_ns + kLateNs); // not 160 ms (or 320)

    // The port is really up now: port_up rebuilds at once.
    n.fab.refuse[kPrimary] = false;
    t0 = vigil::now_ns();
    n.send->port_up(10);
    CHECK(n.send->stats().rebuilds == 1);
    REQUIRE(n.fab.rebuilt[kPrimary].size() == 1);
    CHECK(n.fab.rebuilt_ns[kPrimary][0] >= t0);
    CHECK(n.fab.attempts[kPrimary].size() == 9);
    n.send->port_up(10); // the slot is alive: nothing to rebuild
    CHECK(n.fab.attempts[kPrimary].size() == 9);

    drive_until(t, [&] { return n.send->stats().failbacks == 1; }, 2000, "the failback");
    CHECK(n.send->active_dev() == 10);
    CHECK(n.send->stats().generation == 3);
    t.one();
    t.run();
    CHECK(n.rebuilt(kPrimary).posted == SeqGens{{1, 3}});
    n.check_posting();
    n.check_exactly_once(static_cast<uint64_t>(t.next_id()), t.bytes());
    t.check_spent();
}

TEST_CASE("note_port_up only notes: the comm's own next pass rebuilds, at once", "[failback]")
{
    const auto cfg = config(1000);
    Net n(cfg);
    Traffic t(n);
    t.one();
    t.run();
    n.send->fail_path(kPrimary, "injected port failure", true);
    // Let the backoff grow to its bound while the port is down: gaps 5, 10, ... 640 ms, and
    // the attempt after the ninth refused one is a second away. Then the port is back.
    const auto &a = n.fab.refused[kPrimary];
    drive_until(t, [&] { return a.size() >= 9; }, 3000, "nine refused rebuilds");
    REQUIRE(a.size() == 9);
    n.fab.refuse[kPrimary] = false;

    // What the port-event thread calls: no set-up work on the caller's thread.
    n.send->note_port_up(10);
    CHECK(n.fab.attempts[kPrimary].size() == 9);
    CHECK(n.send->stats().rebuilds == 0);
    // The comm's next pass starts the rebuild, not the backoff a second after the last try.
    drive_until(t, [&] { return n.send->stats().rebuilds == 1; }, 900, "the rebuild");
    REQUIRE(n.fab.rebuilt_ns[kPrimary].size() == 1);
    CHECK(n.fab.rebuilt_ns[kPrimary][0] - a[8] < 900 * kMs);
    CHECK(n.fab.attempts[kPrimary].size() == 10);
    drive_until(t, [&] { return n.send->stats().failbacks == 1; }, 2000, "the failback");
    CHECK(n.send->active_dev() == 10);
    t.one();
    t.run();
    n.check_posting();
    n.check_exactly_once(static_cast<uint64_t>(t.next_id()), t.bytes());
    t.check_spent();
}

// ---- Defects found in the core --------------------------------------------------------------

TEST_CASE("failback drain: the rebuilt primary dies while the backup drains; new messages "
          "must go on over the backup",
          "[failback]")
{
    // DEFECT (net_plugin/comm.cc at commit 9836e46: SendComm::rebuild_locked, line 312
    // `draining_ = true`; SendComm::failover_locked, lines 229-233, the `dead != active_`
    // early return; SendComm::isend, line 216 `... && !draining_`): once the hold time has
    // passed and the backup is not idle, rebuild_locked() sets draining_ = true and isend()
    // stops posting new messages (they wait for the switch). If the rebuilt primary then
    // dies before the backup becomes idle, failover_locked() takes the "dead != active_"
    // early return and never clears draining_, and rebuild_locked() only looks at draining_
    // while the primary is alive. So draining_ stays true with the backup as the only live,
    // Active path: every later isend() is held in the ring and posted nowhere. The receiver's
    // heartbeats keep the backup "heard", so neither the stall watchdog nor the fatal timeout
    // fires: the connection hangs silently until a primary is rebuilt and survives another
    // hold time (never, while its port stays down). (Same root cause, not exercised here:
    // both paths lost while draining_, then a resume through rebuild_locked()'s "no other
    // slot" switch, which does not clear draining_ either.)
    // Expected: the backup, the only live path, carries message `b` and it is delivered
    // exactly once.
    // Actual: `b` is never posted; its isend/irecv stay "not done" with test() returning 0.
    // Clearing draining_ alone is not enough: the messages held during the drain must then
    // be posted on the backup (or replayed by a switch); checked with such a patch, this
    // test then passes.
    const auto cfg = config();
    Net n(cfg);
    Traffic t(n);
    // The backup is mid-message when the failback falls due.
    const int a = failback_due_on_stuck_backup(n, t, cfg).a;
    Lane &pl = n.rebuilt(kPrimary);
    const int b = t.one(); // waits for the switch
    REQUIRE(n.backup().posted.size() == 1);

    // The rebuilt primary dies and stays down; the backup finishes its frame.
    n.fab.refuse[kPrimary] = true;
    pl.break_link();
    drive_until(t, [&] { return !n.fab.refused[kPrimary].empty(); }, 200, "the primary's loss");
    n.backup().stuck = false;
    drive_for(t, 20);
    CHECK(t.send_done(a));
    CHECK(n.send->active_dev() == 11);
    // (A fix may post `b` as it is or replay both at a new generation: either is fine.)
    CHECK(std::any_of(n.backup().posted.begin(), n.backup().posted.end(),
                      [&](const SeqGen &p) { return p.first == static_cast<uint64_t>(b); }));
    t.run(200);
    n.check_exactly_once(static_cast<uint64_t>(t.next_id()), t.bytes());
}
