// SPDX-License-Identifier: Apache-2.0
// Telemetry (common/telemetry): PathMeter's window arithmetic on synthetic timestamps (no clock).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "telemetry/window.h"
#include "telemetry_support.h"

using vt::DetectorConfig;
using vt::PathMeter;
using vt::WindowRecord;

namespace {

constexpr uint64_t kT = 1'000 * kW;  // a window-aligned synthetic "now"

// ---- meter helpers ------------------------------------------------------------------------

class RecordingSink final : public vt::WindowSink
{
public:
    std::vector<WindowRecord> windows;
    std::vector<std::pair<bool, uint64_t>> verdicts; // (degraded, seq of the window)
    std::vector<std::pair<int, uint32_t>> states;    // (PathState, generation)

    void push(const WindowRecord &w) noexcept override { windows.push_back(w); }
    void verdict(bool degraded, const WindowRecord &w) noexcept override { verdicts.emplace_back(degraded, w.seq); }
    void state(vt::PathState s, uint32_t generation) noexcept override { states.emplace_back(static_cast<int>(s), generation); }
};

} // namespace

// =========================================================================================
// PathMeter window arithmetic
// =========================================================================================

TEST_CASE("meter: overlapping operations count the union of their busy time", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    m.on_post(kT + 100'000, 1000);                  // A
    m.on_post(kT + 200'000, 2000);                  // B overlaps A
    m.on_complete(kT + 300'000, kT + 100'000, 1000); // A: 200 us
    m.on_complete(kT + 500'000, kT + 200'000, 2000); // B: 300 us
    m.on_post(kT + 800'000, 500);                   // C alone
    m.on_complete(kT + 850'000, kT + 800'000, 500);  // C: 50 us
    m.advance(kT + kW - 1);
    CHECK(s.windows.empty()); // the window is not over yet
    m.advance(kT + kW);
    REQUIRE(s.windows.size() == 1);
    const WindowRecord &w = s.windows[0];
    CHECK(w.seq == 0);
    CHECK(w.start_ns == kT);
    CHECK(w.window_us == 1000);
    CHECK(w.bytes == 3500);
    CHECK(w.ops == 3);
    CHECK(w.busy_ns == 450'000); // union 100..500 + 800..850 (the sum of the ops would be 550 us)
    CHECK(w.peak_inflight_bytes == 3000);
    CHECK(w.lat_max_ns == 300'000);
    CHECK(w.lat_p99_ns == 300'000);                               // clamped to the max
    CHECK(w.lat_p50_ns >= 200'000);                               // 2nd of 50, 200, 300 us
    CHECK(static_cast<double>(w.lat_p50_ns) <= 200'000 * 1.125);
    CHECK(w.replays == 0);
    CHECK(w.errors == 0);
    CHECK(w.state == vt::kActive);
    CHECK(w.generation == 1);
    CHECK(w.degraded == 0);
    CHECK(w.busy_bandwidth() == Approx(3500 * 1e9 / 450'000));
    // Mean bytes in flight while busy: (1000 x 200 us + 2000 x 300 us + 500 x 50 us) / 450 us.
    CHECK(w.avg_queued_bytes == (1000 * 200'000 + 2000 * 300'000 + 500 * 50'000) / 450'000);
    m.advance(kT + 10 * kW);
    CHECK(s.windows.size() == 1); // nothing happened since
}

TEST_CASE("meter: an operation spanning windows splits its busy time exactly", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    SECTION("one operation over four windows")
    {
        m.on_post(kT + 700'000, 10'000);
        m.on_complete(kT + 3 * kW + 200'000, kT + 700'000, 10'000);
        m.advance(kT + 4 * kW);
        REQUIRE(s.windows.size() == 4);
        const uint64_t busy[] = {300'000, kW, kW, 200'000};
        uint64_t total = 0;
        for (size_t i = 0; i < 4; ++i) {
            const WindowRecord &w = s.windows[i];
            INFO("window " << i);
            CHECK(w.seq == i);
            CHECK(w.start_ns == kT + i * kW);
            CHECK(w.busy_ns == busy[i]);
            CHECK(w.peak_inflight_bytes == 10'000);
            CHECK(w.ops == (i == 3 ? 1u : 0u)); // attributed to the window of completion
            CHECK(w.bytes == (i == 3 ? 10'000u : 0u));
            CHECK(w.lat_max_ns == (i == 3 ? 2'500'000u : 0u));
            CHECK(w.avg_queued_bytes == 10'000);
            total += w.busy_ns;
        }
        CHECK(total == 2'500'000);
        m.advance(kT + 20 * kW);
        CHECK(s.windows.size() == 4);
    }
    SECTION("two overlapping operations completing in different windows")
    {
        m.on_post(kT + 400'000, 100);
        m.on_post(kT + 600'000, 300);
        m.on_complete(kT + 900'000, kT + 400'000, 100);
        m.on_complete(kT + 2 * kW + 100'000, kT + 600'000, 300);
        m.advance(kT + 3 * kW);
        REQUIRE(s.windows.size() == 3);
        CHECK(s.windows[0].busy_ns == 600'000);
        CHECK(s.windows[0].bytes == 100);
        CHECK(s.windows[0].ops == 1);
        CHECK(s.windows[0].peak_inflight_bytes == 400);
        CHECK(s.windows[1].busy_ns == kW);
        CHECK(s.windows[1].bytes == 0);
        CHECK(s.windows[1].ops == 0);
        CHECK(s.windows[1].peak_inflight_bytes == 300);
        CHECK(s.windows[2].busy_ns == 100'000);
        CHECK(s.windows[2].bytes == 300);
        CHECK(s.windows[2].ops == 1);
        CHECK(s.windows[2].lat_max_ns == 1'500'000);
    }
}

TEST_CASE("meter: idle gaps emit no windows and do not consume sequence numbers", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    m.on_post(kT + 100, 100);
    m.on_complete(kT + 200'100, kT + 100, 100);
    for (uint64_t i = 1; i < 30; ++i) m.advance(kT + i * kW + 5); // a tick in every idle window
    REQUIRE(s.windows.size() == 1);
    CHECK(s.windows[0].seq == 0);
    CHECK(s.windows[0].busy_ns == 200'000);

    m.on_post(kT + 50 * kW + 10, 64);
    m.on_complete(kT + 50 * kW + 1'010, kT + 50 * kW + 10, 64);
    m.on_error(kT + 100 * kW + 5);       // a window with only an error is emitted
    m.on_replay(kT + 200 * kW + 7, 3);   // a window with only replays is emitted
    m.advance(kT + 300 * kW);
    REQUIRE(s.windows.size() == 4);
    const uint64_t starts[] = {kT, kT + 50 * kW, kT + 100 * kW, kT + 200 * kW};
    for (size_t i = 0; i < 4; ++i) {
        INFO("window " << i);
        CHECK(s.windows[i].seq == i);
        CHECK(s.windows[i].start_ns == starts[i]);
    }
    CHECK(s.windows[1].busy_ns == 1'000);
    CHECK(s.windows[1].bytes == 64);
    CHECK(s.windows[2].errors == 1);
    CHECK(s.windows[2].ops == 0);
    CHECK(s.windows[2].busy_ns == 0);
    CHECK(s.windows[3].replays == 3);
    CHECK(s.windows[3].errors == 0);
    // Windows stay aligned to multiples of the window length whatever the first event.
    for (const WindowRecord &w : s.windows) CHECK(w.start_ns % kW == 0);
}

TEST_CASE("meter: peak in-flight bytes, replays, errors, state and generation", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    m.on_post(kT + 10, 100);
    m.on_post(kT + 20, 200);
    m.on_post(kT + 30, 400);                // 700 in flight
    m.on_complete(kT + 40, kT + 10, 100);   // 600
    m.on_post(kT + 50, 50);                 // 650
    m.on_replay(kT + 60, 5);
    m.on_replay(kT + 70, 2);
    m.on_error(kT + 80);
    m.on_error(kT + 90);
    m.on_error(kT + 95);
    m.advance(kT + kW);
    REQUIRE(s.windows.size() == 1);
    CHECK(s.windows[0].peak_inflight_bytes == 700);
    CHECK(s.windows[0].replays == 7);
    CHECK(s.windows[0].errors == 3);
    CHECK(s.windows[0].state == vt::kActive);
    CHECK(s.windows[0].generation == 1);

    m.on_complete(kT + kW + 10, kT + 20, 200);
    m.on_complete(kT + kW + 20, kT + 30, 400);
    m.on_complete(kT + kW + 30, kT + 50, 50);
    // The state change is published at once; windows that closed before it keep the old one.
    m.set_state(kT + 2 * kW + 5, vt::kStandby, 4);
    REQUIRE(s.states.size() == 1);
    CHECK(s.states[0] == std::make_pair(static_cast<int>(vt::kStandby), 4u));
    REQUIRE(s.windows.size() == 2);
    CHECK(s.windows[1].peak_inflight_bytes == 650); // carried over from the previous window
    CHECK(s.windows[1].busy_ns == 30);
    CHECK(s.windows[1].ops == 3);
    CHECK(s.windows[1].replays == 0);
    CHECK(s.windows[1].errors == 0);
    CHECK(s.windows[1].state == vt::kActive);
    CHECK(s.windows[1].generation == 1);

    m.on_post(kT + 2 * kW + 10, 10);
    m.on_complete(kT + 2 * kW + 20, kT + 2 * kW + 10, 10);
    m.on_error(kT + 2 * kW + 30);
    m.advance(kT + 3 * kW);
    REQUIRE(s.windows.size() == 3);
    CHECK(s.windows[2].peak_inflight_bytes == 10);
    CHECK(s.windows[2].state == vt::kStandby);
    CHECK(s.windows[2].generation == 4);
    CHECK(s.windows[2].errors == 1);

    m.set_state(kT + 3 * kW + 1, vt::kDead, 5); // nothing else happens: no window
    m.advance(kT + 10 * kW);
    CHECK(s.windows.size() == 3);
    REQUIRE(s.states.size() == 2);
    CHECK(s.states[1] == std::make_pair(static_cast<int>(vt::kDead), 5u));
}

TEST_CASE("meter: abandoned operations end the busy time", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    SECTION("all in flight abandoned")
    {
        m.on_post(kT + 100'000, 100);
        m.on_post(kT + 150'000, 200);
        m.on_abandon(kT + 400'000, 2, 300);
        m.advance(kT + 5 * kW);
        REQUIRE(s.windows.size() == 1); // busy time stopped: no busy-only windows follow
        CHECK(s.windows[0].busy_ns == 300'000);
        CHECK(s.windows[0].ops == 0);
        CHECK(s.windows[0].bytes == 0);
        CHECK(s.windows[0].peak_inflight_bytes == 300);
        // The meter is reusable afterwards.
        m.on_post(kT + 6 * kW + 10, 1);
        m.on_complete(kT + 6 * kW + 20, kT + 6 * kW + 10, 1);
        m.advance(kT + 7 * kW);
        REQUIRE(s.windows.size() == 2);
        CHECK(s.windows[1].busy_ns == 10);
        CHECK(s.windows[1].peak_inflight_bytes == 1);
    }
    SECTION("part abandoned, the rest completes later")
    {
        m.on_post(kT + 100'000, 100);
        m.on_post(kT + 100'000, 200);
        m.on_post(kT + 100'000, 400);
        m.on_abandon(kT + 200'000, 1, 400); // still busy
        m.on_complete(kT + 2 * kW + 300'000, kT + 100'000, 100);
        m.on_complete(kT + 2 * kW + 600'000, kT + 100'000, 200);
        m.advance(kT + 10 * kW);
        REQUIRE(s.windows.size() == 3);
        CHECK(s.windows[0].busy_ns == 900'000);
        CHECK(s.windows[0].peak_inflight_bytes == 700);
        CHECK(s.windows[1].busy_ns == kW);
        CHECK(s.windows[1].peak_inflight_bytes == 300);
        CHECK(s.windows[2].busy_ns == 600'000);
        CHECK(s.windows[2].bytes == 300);
        CHECK(s.windows[2].ops == 2);
    }
    SECTION("a completion with nothing in flight counts bytes but no busy time")
    {
        m.on_complete(kT + 500, kT, 4096);
        m.advance(kT + kW);
        REQUIRE(s.windows.size() == 1);
        CHECK(s.windows[0].bytes == 4096);
        CHECK(s.windows[0].ops == 1);
        CHECK(s.windows[0].busy_ns == 0);
        CHECK(s.windows[0].peak_inflight_bytes == 0);
    }
}

TEST_CASE("meter: the detector's verdict reaches the windows and the sink", "[telemetry]")
{
    DetectorConfig cfg;
    cfg.k = 4;
    cfg.warmup = 4;
    RecordingSink s;
    PathMeter m(kW, &s, cfg);
    uint64_t t = kT;
    auto window_of = [&](uint64_t bytes) { // 900 us busy per window: loaded
        m.on_post(t + 50'000, bytes);
        m.on_complete(t + 950'000, t + 50'000, bytes);
        t += kW;
    };
    for (int i = 0; i < 30; ++i) window_of(1'000'000);
    for (int i = 0; i < 30; ++i) window_of(100'000);
    for (int i = 0; i < 30; ++i) window_of(1'000'000);
    m.advance(t);
    REQUIRE(s.windows.size() == 90);
    REQUIRE(s.verdicts.size() == 2);
    const auto [deg, s1] = s.verdicts[0];
    const auto [heal, s2] = s.verdicts[1];
    CHECK(deg);
    CHECK_FALSE(heal);
    CHECK(s1 >= 30);
    CHECK(s1 <= 30 + 4 + 2);
    CHECK(s2 >= s1 + 4); // held for k loaded windows
    CHECK(s2 <= 60 + 4 + 2);
    CHECK(m.degraded() == false);
    for (const WindowRecord &w : s.windows) {
        INFO("window " << w.seq);
        CHECK(w.degraded == (w.seq >= s1 && w.seq < s2 ? 1 : 0));
    }
    const double x = 1e6 * 1e9 / 900'000; // bytes/s over busy time at full rate
    CHECK(static_cast<double>(s.windows[29].baseline_bps) == Approx(x).epsilon(0.01));
    // No baseline is published before the warm-up is over: the first `settle` loaded windows
    // are no evidence, judging starts with a full span of k after them, and learning takes
    // `warmup` judgements (window index settle + k - 2 + warmup is the first published).
    const int first = cfg.settle + cfg.k - 2 + cfg.warmup;
    for (int i = 0; i < 30; ++i) CHECK((s.windows[static_cast<size_t>(i)].baseline_bps == 0) == (i < first));
}

TEST_CASE("meter: a receiver-bound report marks the window and the detector skips it", "[telemetry]")
{
    struct Sink : vt::WindowSink {
        std::vector<vt::WindowRecord> w;
        void push(const vt::WindowRecord &r) noexcept override { w.push_back(r); }
        void verdict(bool, const vt::WindowRecord &) noexcept override {}
    } sink;
    vt::PathMeter m(1'000'000, &sink);
    m.on_post(1'000'000'000, 4096);
    m.set_receiver_bound(1'000'100'000, true);
    m.on_complete(1'000'200'000, 1'000'000'000, 4096);
    m.advance(1'001'000'000); // closes the first window
    m.on_post(1'001'100'000, 4096);
    m.set_receiver_bound(1'001'200'000, false); // bound at this window's start: still marked
    m.on_complete(1'001'300'000, 1'001'100'000, 4096);
    m.advance(1'002'000'000);
    m.on_post(1'002'100'000, 4096); // a window with no receiver-bound time at all
    m.on_complete(1'002'300'000, 1'002'100'000, 4096);
    m.advance(1'003'000'000);
    REQUIRE(sink.w.size() == 3);
    CHECK(sink.w[0].receiver_bound == 1);
    CHECK(sink.w[1].receiver_bound == 1);
    CHECK(sink.w[2].receiver_bound == 0);
}

TEST_CASE("meter: wait time lands in the window of its report", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    m.on_post(kT + 100'000, 4096);
    m.on_complete(kT + 200'000, kT + 100'000, 4096);
    m.on_wait(kT + 200'000, 150'000);
    m.on_wait(kT + 300'000, 2'500'000); // more than the window: the detector's to place
    m.advance(kT + kW);
    m.on_wait(kT + kW + 10, 7'000); // a window with nothing but a wait report is emitted
    m.advance(kT + 2 * kW);
    REQUIRE(s.windows.size() == 2);
    CHECK(s.windows[0].wait_us == 2'650);
    CHECK(s.windows[1].wait_us == 7);
    CHECK(s.windows[1].ops == 0);
}

// =========================================================================================
// Paths sharing a port (PortClock)
// =========================================================================================

TEST_CASE("port clock: advances at 1/n of real time while n paths are busy, not at all while "
          "none is",
          "[telemetry]")
{
    vt::PortClock c;
    constexpr double kMs = 1e6;
    CHECK(c.enter(kT) == 0);                                   // A alone ...
    CHECK(c.read(kT + 10'000'000) == Approx(10 * kMs));       // ... all of the time
    CHECK(c.enter(kT + 10'000'000) == Approx(10 * kMs));      // B too ...
    CHECK(c.busy() == 2);
    CHECK(c.read(kT + 30'000'000) == Approx(20 * kMs));       // ... half each
    CHECK(c.leave(kT + 30'000'000) == Approx(20 * kMs));      // A leaves
    CHECK(c.leave(kT + 40'000'000) == Approx(30 * kMs));      // B alone, then leaves
    CHECK(c.busy() == 0);
    CHECK(c.read(kT + 50'000'000) == Approx(30 * kMs));       // idle: stands still
    // A reading at an earlier time than one already taken (two threads' clock reads cross)
    // never moves it back.
    CHECK(c.enter(kT + 45'000'000) == Approx(30 * kMs));
    CHECK(c.read(kT + 60'000'000) == Approx(40 * kMs));
    CHECK(c.leave(kT + 60'000'000) == Approx(40 * kMs));
    // The bytes its paths carried.
    c.carried(1000);
    c.carried(500);
    CHECK(c.carried_total() == 1500);
    // Per direction and device; none outside the table.
    CHECK(vt::PortClock::of(0, 1) != vt::PortClock::of(1, 1));
    CHECK(vt::PortClock::of(0, 1) == vt::PortClock::of(0, 1));
    CHECK(vt::PortClock::of(0, -1) == nullptr);
    CHECK(vt::PortClock::of(0, vt::PortClock::kDevs) == nullptr);
}

TEST_CASE("meter: a path sharing its port with another is judged on its share of the port",
          "[telemetry]")
{
    // Path A learns its baseline alone on the port; then path B of another connection is
    // busy beside it all the time; A moves 40 % of what it moved alone, B 60 % (multipath:
    // each port carries the active path of one connection and the shared path of another).
    // The port is as fast as before: A is healthy. Then the port slows to a fifth: A is
    // degraded.
    // Without the port's clock (as before it existed), A was flagged as soon as B joined.
    const bool clock = GENERATE(true, false);
    CAPTURE(clock);
    DetectorConfig cfg;
    cfg.k = 4;
    cfg.warmup = 4;
    vt::PortClock port;
    RecordingSink sa, sb;
    PathMeter a(kW, &sa, cfg, clock ? &port : nullptr), b(kW, &sb, cfg, clock ? &port : nullptr);
    uint64_t t = kT;
    auto window_of = [&](uint64_t a_bytes, uint64_t b_bytes) { // 900 us busy per window
        a.on_post(t + 50'000, a_bytes);
        if (b_bytes > 0) b.on_post(t + 50'000, b_bytes);
        a.on_complete(t + 950'000, t + 50'000, a_bytes);
        if (b_bytes > 0) b.on_complete(t + 950'000, t + 50'000, b_bytes);
        t += kW;
    };
    for (int i = 0; i < 30; ++i) window_of(1'000'000, 0);
    for (int i = 0; i < 30; ++i) window_of(400'000, 600'000); // not quite fair, either
    a.advance(t);
    const double x = 1e6 * 1e9 / 900'000; // the port's rate over busy time
    REQUIRE(sa.windows.size() == 60);
    CHECK(static_cast<double>(sa.windows[29].baseline_bps) == Approx(x).epsilon(0.01));
    if (!clock) {
        REQUIRE(sa.verdicts.size() == 1); // 0.4 of the baseline: flagged
        CHECK(sa.verdicts[0].first);
        return;
    }
    CHECK(sa.verdicts.empty());
    // What the windows publish is the path's own rate, in the baseline's terms (a NIC's
    // fraction is read from it): its share of the port only decides the verdict.
    CHECK(static_cast<double>(sa.windows.back().judged_bps) == Approx(0.4 * x).epsilon(0.01));
    for (int i = 0; i < 30; ++i) window_of(100'000, 100'000);
    a.advance(t);
    REQUIRE(sa.verdicts.size() == 1);
    CHECK(sa.verdicts[0].first);
    CHECK(sa.verdicts[0].second >= 60);
}

TEST_CASE("meter: a path that a first-in first-out port serves unevenly is judged on the port's "
          "rate",
          "[telemetry]")
{
    // As above, but the port's queue is not fair: while both are busy, A gets a tenth of the
    // port's bytes and B the rest (A's pieces wait behind B's). The port moves as much as
    // before: A is healthy. Judged on its fair share alone (half the busy time), A read a fifth
    // of its baseline and was flagged. Then the port slows to a fifth (A and B a tenth each):
    // A is degraded.
    DetectorConfig cfg;
    cfg.k = 4;
    cfg.warmup = 4;
    vt::PortClock port;
    RecordingSink sa, sb;
    PathMeter a(kW, &sa, cfg, &port), b(kW, &sb, cfg, &port);
    uint64_t t = kT;
    auto window_of = [&](uint64_t a_bytes, uint64_t b_bytes) { // 900 us busy per window
        a.on_post(t + 50'000, a_bytes);
        if (b_bytes > 0) b.on_post(t + 50'000, b_bytes);
        // First in, first out: B's bytes, queued first, land before A's.
        if (b_bytes > 0) b.on_complete(t + 940'000, t + 50'000, b_bytes);
        a.on_complete(t + 950'000, t + 50'000, a_bytes);
        t += kW;
    };
    for (int i = 0; i < 30; ++i) window_of(1'000'000, 0);
    for (int i = 0; i < 30; ++i) window_of(100'000, 900'000);
    a.advance(t);
    b.advance(t);
    CHECK(sa.verdicts.empty());
    CHECK(sb.verdicts.empty());
    for (int i = 0; i < 30; ++i) window_of(100'000, 100'000);
    a.advance(t);
    REQUIRE(sa.verdicts.size() == 1);
    CHECK(sa.verdicts[0].first);
}

TEST_CASE("detector: the port's figures are judged over the span, not window by window",
          "[telemetry]")
{
    // Two paths share a port cut to a fifth of its rate, and their bytes are reported in
    // lumps: in every other window the other path's bytes land, in the next this path's.
    // Window by window, this path would be charged nothing in one (the port moved only the
    // other's bytes) and the port's whole time in the next, and read twice the port's rate.
    // Over the span it reads the port's rate, a fifth of its baseline: degraded.
    DetectorConfig cfg;
    cfg.k = 4;
    cfg.warmup = 4;
    vt::DegradeDetector d(cfg);
    auto win = [](uint64_t bytes) {
        WindowRecord w{};
        w.window_us = 1000;
        w.busy_ns = 900'000;
        w.bytes = bytes;
        w.ops = bytes > 0 ? 1 : 0;
        w.avg_queued_bytes = 1 << 20;
        return w;
    };
    int degraded = 0;
    for (int i = 0; i < 40; ++i) // alone, 1 MB a window
        degraded += d.feed(win(1'000'000), 900'000, 1'000'000);
    REQUIRE(degraded == 0);
    for (int i = 0; i < 40; ++i) {
        const bool mine = i % 2 == 1; // 200 kB of this path every other window, the other's between
        degraded += d.feed(win(mine ? 200'000 : 0), 450'000, 200'000);
    }
    CHECK(degraded == 1);
    CHECK(d.degraded());
}

TEST_CASE("meter: bytes reported landed count in the window they landed, not where the operation "
          "completes",
          "[telemetry]")
{
    // One operation of 3 windows whose bytes land a third in each (a message striped in
    // pieces, each reported as it lands): each window holds what landed in it, and the
    // completion adds only what was not reported yet. Credited at completion, the last window
    // held all of them and the two before none, though all three were busy.
    RecordingSink s;
    PathMeter m(kW, &s);
    m.on_post(kT, 3000);
    m.on_progress(kT + 500'000, 1000);
    m.on_progress(kT + kW + 500'000, 1000);
    m.on_progress(kT + 2 * kW + 400'000, 1000);
    m.on_complete(kT + 2 * kW + 500'000, kT, 0);
    m.advance(kT + 3 * kW);
    REQUIRE(s.windows.size() == 3);
    for (const WindowRecord &w : s.windows) {
        INFO("window " << w.seq);
        CHECK(w.bytes == 1000);
    }
    CHECK(s.windows[0].busy_ns == kW);
    CHECK(s.windows[2].busy_ns == 500'000);
    CHECK(s.windows[0].ops + s.windows[1].ops == 0);
    CHECK(s.windows[2].ops == 1);
    // The bytes still in flight fall as they land (the mean queued over the first window:
    // 3000 for half of it, 2000 for the other half).
    CHECK(s.windows[0].avg_queued_bytes == 2500);
}

TEST_CASE("meter: bytes whose news arrives late count in the window they landed, and not at all "
          "when that window did not count",
          "[telemetry]")
{
    // A path at 100 kB per window (100 MB/s) is busy for windows 0 to 9 with 1 MB. The
    // landings of windows 0 to 5 are reported in one lump in window 8 (a receiver's reports
    // held up), those of windows 6 to 9 as they land. The detector skips the first
    // `settle` = 8 windows of a busy period and judges the last k = 2: windows 8 and 9, which
    // moved 200 kB. Undated, the lump counted there too and the span read 4 times the path's
    // rate; the baseline learns such spans.
    DetectorConfig det;
    det.k = 2;
    det.settle = 8;
    det.warmup = 1;
    det.min_learn_ops = 1;
    auto run = [&](bool dated) {
        RecordingSink s;
        PathMeter m(kW, &s, det);
        m.on_post(kT, 1'000'000);
        auto land = [&](uint64_t at_window, uint64_t in_window, uint64_t bytes) {
            const uint64_t now = kT + at_window * kW + 900'000;
            const uint64_t landed_at = kT + in_window * kW + 500'000;
            if (dated) m.on_progress(now, bytes, landed_at);
            else m.on_progress(now, bytes);
        };
        for (uint64_t w = 6; w < 10; ++w) {
            if (w == 8)
                for (uint64_t early = 0; early < 6; ++early) land(8, early, 100'000); // the lump
            land(w, w, 100'000);
        }
        m.on_complete(kT + 10 * kW - 1, kT, 0);
        m.advance(kT + 11 * kW);
        REQUIRE(s.windows.size() == 10);
        return s.windows.back().judged_bps;
    };
    CHECK(run(true) == Approx(100e6).epsilon(0.01));
    CHECK(run(false) == Approx(400e6).epsilon(0.01)); // what dating takes out
}
