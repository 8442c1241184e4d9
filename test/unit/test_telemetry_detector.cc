// SPDX-License-Identifier: Apache-2.0
// Telemetry (common/telemetry): the degraded-path detector on synthetic window traces.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "telemetry/window.h"
#include "telemetry_support.h"

using vt::DegradeDetector;
using vt::DetectorConfig;
using vt::WindowRecord;

namespace {

// ---- detector helpers ---------------------------------------------------------------------

constexpr uint64_t kX = 1'000'000; // bytes per fully busy 1 ms window: 1 GB/s
constexpr uint64_t kQueued = 1 << 20; // bytes queued on average while busy: bandwidth-bound

// A window in which something completed (a verdict is only taken on such windows).
WindowRecord win(uint64_t bytes, uint64_t busy = kW, uint64_t queued = kQueued)
{
    WindowRecord w{};
    w.window_us = static_cast<uint32_t>(kW / 1000);
    w.bytes = bytes;
    w.ops = 1;
    w.busy_ns = busy;
    w.avg_queued_bytes = queued;
    return w;
}

// Feeds `w` up to `max_n` times; returns the 1-based count at which feed() returned `want`
// (0 if never). Every other return must be 0.
int feed_until(DegradeDetector &d, const WindowRecord &w, int want, int max_n)
{
    for (int i = 1; i <= max_n; ++i) {
        const int c = d.feed(w);
        if (c == want) return i;
        REQUIRE(c == 0);
    }
    return 0;
}

} // namespace

// =========================================================================================
// DegradeDetector
// =========================================================================================

TEST_CASE("detector: steady load, a drop, recovery and the k-window hold", "[telemetry]")
{
    const DetectorConfig cfg; // fraction 0.5, k 8, min_busy 0.5, warmup 16
    const int k = cfg.k;
    DegradeDetector d(cfg);
    const WindowRecord fast = win(kX), slow = win(3 * kX / 10);

    // Nothing is judged before k loaded windows, nothing learned before 2k of them in a row
    // (the first span may ride on a burst), and no verdict is possible during warmup
    // (2k - 1 + warmup loaded windows), however slow the path.
    {
        DegradeDetector w(cfg);
        for (int i = 1; i < 2 * k; ++i) w.feed(fast);
        CHECK(w.baseline() == 0);
        CHECK(w.judged() == Approx(1e9)); // the aggregate is visible, not learned from
        w.feed(fast);
        CHECK(w.baseline() == Approx(1e9));
        CHECK(feed_until(w, win(kX / 10), 1, cfg.warmup - 1) == 0);
    }

    CHECK(feed_until(d, fast, 1, 300) == 0); // steady: never degraded
    CHECK_FALSE(d.degraded());
    CHECK(d.baseline() == Approx(1e9).epsilon(1e-6));
    CHECK(d.judged() == Approx(1e9));

    // The verdict is on the aggregate of the last k loaded windows: with j slow windows
    // among them it is ((k - j) + 0.3 j) / k of the rate, so it cannot be judged slow before
    // that falls below fraction x baseline (baseline <= the old rate), and then must stay
    // slow for k more loaded windows.
    int first_possible = 1;
    while ((static_cast<double>(k - first_possible) + 0.3 * first_possible) / k >= cfg.fraction) ++first_possible;
    const int f1 = feed_until(d, slow, 1, 3 * k);
    INFO("flagged after " << f1 << " slow windows (aggregate crosses after " << first_possible << ")");
    CHECK(f1 >= first_possible + k - 1);
    CHECK(f1 <= first_possible + k + 2);
    REQUIRE(d.degraded());
    const double frozen = d.baseline();
    // The EWMA keeps learning from the falling aggregate until the verdict (the transition
    // windows are not yet "slow"): about 0.915x here with alpha 0.05. Never above the rate.
    CHECK(frozen <= 1e9 * (1 + 1e-9));
    CHECK(frozen >= 0.85e9);
    CHECK(d.judged() < cfg.fraction * frozen);

    // Back to full rate right away: recovery needs the aggregate clearly healthy (at least
    // midway between the threshold and the baseline) on every judgement for k loaded
    // windows. With j fast windows among the last k it is ((k - j) 0.3 + j) / k of the rate.
    const double well = (1 + cfg.fraction) / 2 * frozen / 1e9;
    int well_from = 1;
    while ((0.3 * static_cast<double>(k - well_from) + well_from) / k < well) ++well_from;
    const int r1 = feed_until(d, fast, -1, 4 * k);
    INFO("healthy again after " << r1 << " fast windows (clearly healthy from " << well_from << ")");
    CHECK(r1 >= well_from + k - 1);
    CHECK(r1 <= well_from + k + 2);
    CHECK_FALSE(d.degraded());
    CHECK(d.baseline() == frozen); // no baseline updates while degraded nor on the change

    // Slow again right away: the healthy verdict also holds for k loaded windows, and a
    // window judged slow while the verdict is held does not feed the baseline.
    int f2 = 0, held_slow = 0;
    for (int i = 1; i <= 3 * k && f2 == 0; ++i) {
        const double before = d.baseline();
        const int c = d.feed(slow);
        if (c == 1) {
            f2 = i;
        } else {
            REQUIRE(c == 0);
            if (d.judged() < cfg.fraction * before) {
                ++held_slow;
                CHECK(d.baseline() == before);
            }
        }
    }
    CHECK(f2 >= k);
    CHECK(f2 <= first_possible + k + 2);
    CHECK(held_slow >= 1);
    const double frozen2 = d.baseline();
    CHECK(feed_until(d, slow, -1, 40) == 0); // stays degraded, baseline frozen
    CHECK(d.degraded());
    CHECK(d.baseline() == frozen2);

    // After a long degraded stretch (no hold pending) recovery takes the same: a span of
    // clearly healthy judgements.
    const int r2 = feed_until(d, fast, -1, 4 * k);
    CHECK(r2 >= well_from + k - 1);
    CHECK(r2 <= well_from + k + 2);
    CHECK(feed_until(d, fast, 1, 200) == 0);
    CHECK(d.baseline() == Approx(1e9).epsilon(1e-3)); // tracks the rate again once healthy
}

TEST_CASE("detector: a degraded path's bursts above the threshold do not end its verdict", "[telemetry]")
{
    // Under multipath a degraded path carries only what the striper leaves it, now and then a
    // few pieces at its burst rate: single judgements above the threshold. Recovery takes a
    // clearly healthy span, so the verdict (and the tuner's view) does not flap.
    const DetectorConfig cfg;
    const int k = cfg.k;
    DegradeDetector d(cfg);
    REQUIRE(feed_until(d, win(kX), 1, 200) == 0);
    REQUIRE(feed_until(d, win(kX / 10), 1, 4 * k) > 0);
    REQUIRE(d.degraded());
    // Period 12: ten windows at 0.1x, two at 2x. The aggregate of a span holding both bursts
    // is (6 x 0.1 + 2 x 2) / 8 = 0.575x: above the threshold, below midway (0.75x).
    int above = 0;
    for (int period = 0; period < 20; ++period)
        for (int i = 0; i < 12; ++i) {
            REQUIRE(d.feed(win(i < 10 ? kX / 10 : 2 * kX)) == 0);
            above += d.judged() >= cfg.fraction * d.baseline();
        }
    CHECK(above >= 20); // the bursts did lift the aggregate over the threshold
    CHECK(d.degraded());
    // Nor does a span whose end points' wait covers nine tenths of its busy time: taken out,
    // the path reads as fast as its baseline; the baseline was learned with the wait in.
    WindowRecord waited = win(kX / 10);
    waited.wait_us = 900;
    for (int i = 0; i < 10 * k; ++i) REQUIRE(d.feed(waited) == 0);
    CHECK(d.judged() >= cfg.fraction * d.baseline());
    CHECK(d.degraded());
    // A real recovery still ends it.
    CHECK(feed_until(d, win(kX), -1, 3 * k) > 0);
    CHECK_FALSE(d.degraded());
}

TEST_CASE("detector: dips shorter than the aggregate can hide are not flagged", "[telemetry]")
{
    const DetectorConfig cfg;
    DegradeDetector d(cfg);
    REQUIRE(feed_until(d, win(kX), 1, 200) == 0);
    // 1..5 windows at 0.3x: the k = 8 aggregate stays >= 0.5625x > 0.5x.
    for (int len = 1; len <= 5; ++len) {
        INFO("dip of " << len << " windows");
        CHECK(feed_until(d, win(3 * kX / 10), 1, len) == 0);
        CHECK(feed_until(d, win(kX), 1, 2 * cfg.k) == 0);
        CHECK_FALSE(d.degraded());
    }
    // A single window that carries nothing while fully busy is no verdict either.
    CHECK(d.feed(win(0)) == 0);
    CHECK(feed_until(d, win(kX), 1, 2 * cfg.k) == 0);
    CHECK(d.baseline() == Approx(1e9).epsilon(0.1));
}

TEST_CASE("detector: windows that are no evidence never change the evidence or a verdict",
          "[telemetry]")
{
    // settle 0: with it, a window that is not loaded ends a busy period and the next loaded
    // ones settle (tested with the bursts after idle below).
    DetectorConfig cfg;
    cfg.settle = 0;
    // A loaded trace with noise, drops and recoveries.
    std::mt19937_64 rng(99);
    std::vector<WindowRecord> trace;
    // rate in bytes/s over busy time: bytes = rate * busy(ns) / 1e9, +-10 %.
    auto add_rate = [&](int n, double bps) {
        for (int i = 0; i < n; ++i) {
            const double noise = std::uniform_real_distribution<double>(0.9, 1.1)(rng);
            const uint64_t busy = std::uniform_int_distribution<uint64_t>(kW / 2, kW)(rng);
            trace.push_back(win(static_cast<uint64_t>(bps * noise * static_cast<double>(busy) / 1e9), busy));
        }
    };
    add_rate(60, 1e9);
    add_rate(20, 0.2e9);
    add_rate(16, 1e9); // recovers (a clearly healthy span), then drops again while the healthy verdict is held
    add_rate(20, 0.1e9);
    add_rate(30, 1e9);
    add_rate(5, 0.3e9);
    add_rate(30, 1e9);
    add_rate(40, 0.1e9);
    add_rate(40, 2e9);

    // Both detectors learn the rate first; afterwards a window that is no evidence changes
    // neither the aggregate judged nor the verdict nor the baseline when it comes. (It does
    // hold learning back for a span: the load was not continuous.)
    DegradeDetector plain(cfg), mixed(cfg);
    REQUIRE(feed_until(plain, win(kX), 1, 100) == 0);
    REQUIRE(feed_until(mixed, win(kX), 1, 100) == 0);
    int ups = 0, downs = 0, mixed_ups = 0, mixed_downs = 0;
    std::vector<size_t> diverged;
    for (size_t i = 0; i < trace.size(); ++i) {
        // 0..3 windows that are no evidence first, with rates from nothing to absurd: idle
        // (busy below min_busy) or latency-bound (busy, but less than min_queued_bytes queued).
        // An idle window right after a loaded one completes nothing here: with a completion it
        // is the tail of the busy period, which is evidence (tested below).
        const int idles = std::uniform_int_distribution<int>(0, 3)(rng);
        for (int j = 0; j < idles; ++j) {
            const bool latency_bound = std::bernoulli_distribution(0.3)(rng);
            const uint64_t busy = latency_bound ? std::uniform_int_distribution<uint64_t>(kW / 2, kW)(rng)
                                                : std::uniform_int_distribution<uint64_t>(0, kW / 2 - 1)(rng);
            const uint64_t queued = latency_bound
                                        ? std::uniform_int_distribution<uint64_t>(0, cfg.min_queued_bytes - 1)(rng)
                                        : kQueued;
            const uint64_t bytes = std::uniform_int_distribution<uint64_t>(0, 50 * kX)(rng);
            WindowRecord w = win(bytes, busy, queued);
            if (j == 0 && !latency_bound) w.ops = 0;
            const bool deg = mixed.degraded();
            const double base = mixed.baseline(), judged = mixed.judged();
            if (mixed.feed(w) != 0 || mixed.degraded() != deg || mixed.baseline() != base ||
                mixed.judged() != judged)
                diverged.push_back(i);
        }
        const int a = plain.feed(trace[i]), b = mixed.feed(trace[i]);
        ups += a > 0;
        downs += a < 0;
        mixed_ups += b > 0;
        mixed_downs += b < 0;
        if (plain.judged() != mixed.judged()) diverged.push_back(i);
    }
    CHECK(diverged.empty());
    CHECK(ups >= 3); // the trace does exercise both verdicts
    CHECK(downs >= 3);
    CHECK(mixed_ups == ups);
    CHECK(mixed_downs == downs);

    // min_busy is the boundary: exactly half the window busy is loaded, one ns less is idle.
    DetectorConfig one;
    one.k = 1;
    one.warmup = 0;
    one.settle = 0;
    DegradeDetector e(one);
    e.feed(win(123'456, kW / 2 - 1));
    CHECK(e.baseline() == 0);
    e.feed(win(kW / 2, kW / 2));
    CHECK(e.baseline() == Approx(1e9));
    // min_queued_bytes likewise: one byte short is latency-bound, exactly it is loaded.
    DegradeDetector q(one);
    q.feed(win(kX, kW, one.min_queued_bytes - 1));
    CHECK(q.baseline() == 0);
    q.feed(win(kX, kW, one.min_queued_bytes));
    CHECK(q.baseline() == Approx(1e9));
}

// A rate that sinks a little per loaded window once dragged the baseline (a symmetric EWMA)
// down with it and was never flagged; the baseline now falls 20 times slower than it rises.
TEST_CASE("detector: a gradual decline is flagged", "[telemetry]")
{
    const double per_window = GENERATE(0.001, 0.01, 0.03);
    INFO("decline of " << per_window * 100 << " % per loaded window");
    const double x = static_cast<double>(kX);

    SECTION("before the rate is below 40 % of the original (k 8, up to 1 % per window)")
    {
        if (per_window > 0.01) return; // faster: the aggregate's k-window lag is the limit
        DegradeDetector d;
        REQUIRE(feed_until(d, win(kX), 1, 200) == 0);
        double bw = x;
        int flagged = 0;
        while (flagged == 0 && bw > 0.3 * x) {
            bw *= 1 - per_window;
            flagged = d.feed(win(static_cast<uint64_t>(bw)));
        }
        INFO("rate " << bw / x << " of the original, baseline " << d.baseline() / 1e9);
        CHECK(flagged == 1);
        CHECK(bw >= 0.4 * x);
    }
    SECTION("a decline that stops at 40 % is flagged within the hold (k 8 and 32)")
    {
        for (int k : {8, 32}) {
            DetectorConfig cfg;
            cfg.k = k;
            DegradeDetector d(cfg);
            REQUIRE(feed_until(d, win(kX), 1, 200) == 0);
            double bw = x;
            bool flagged = false;
            while (!flagged && bw > 0.4 * x) {
                bw = std::max(0.4 * x, bw * (1 - per_window));
                flagged = d.feed(win(static_cast<uint64_t>(bw))) == 1;
            }
            if (!flagged) flagged = feed_until(d, win(static_cast<uint64_t>(bw)), 1, 2 * k) > 0;
            INFO("k " << k << ", baseline " << d.baseline() / 1e9);
            CHECK(flagged);
        }
    }
}

TEST_CASE("detector: a rate that wanders or steps up is never flagged", "[telemetry]")
{
    const int k = GENERATE(8, 32);
    const double fraction = GENERATE(0.5, 0.7);
    DetectorConfig cfg;
    cfg.k = k;
    cfg.fraction = fraction;
    INFO("k " << k << ", fraction " << fraction);
    const double x = static_cast<double>(kX);

    SECTION("+-20 % uniform noise around a steady rate")
    {
        DegradeDetector d(cfg);
        std::mt19937_64 rng(1234);
        std::uniform_real_distribution<double> noise(0.8, 1.2);
        int flags = 0;
        for (int i = 0; i < 20000; ++i)
            flags += d.feed(win(static_cast<uint64_t>(x * noise(rng)))) != 0;
        CHECK(flags == 0);
        CHECK(d.baseline() >= 0.95e9); // it learned the rate: the case is not vacuous
        CHECK(d.baseline() <= 1.2e9);
        // ... and the same detector does flag a real drop.
        CHECK(feed_until(d, win(kX / 5), 1, 4 * k) > 0);
    }
    SECTION("a step up by half, then noise around the new rate")
    {
        DegradeDetector d(cfg);
        CHECK(feed_until(d, win(kX), 1, 300) == 0);
        std::mt19937_64 rng(99);
        std::uniform_real_distribution<double> noise(0.8, 1.2);
        int flags = 0;
        for (int i = 0; i < 5000; ++i)
            flags += d.feed(win(static_cast<uint64_t>(1.5 * x * noise(rng)))) != 0;
        CHECK(flags == 0);
        CHECK(d.baseline() >= 1.4e9); // the faster rate was learned within the run
    }
}

// ---- wait time: the end points, not the path, held the data -------------------------------

// A starved cycle: the path moves `kX` bytes in one window, then the transfer waits `idle`
// windows and the start of the next for a reader (busy, nothing completes), and the
// completion reports that wait (as the comm does: from the data's arrival to its completion).
namespace {

void starved_cycle(DegradeDetector &d, int idle, bool report, int *flags)
{
    WindowRecord stall = win(0);
    stall.ops = 0;
    *flags += d.feed(stall) != 0; // the transfer itself (its bytes count at completion)
    for (int i = 0; i < idle; ++i) *flags += d.feed(stall) != 0;
    WindowRecord done = win(kX);
    done.wait_us = report ? static_cast<uint32_t>((idle + 1) * kW / 1000) : 0;
    *flags += d.feed(done) != 0;
}

} // namespace

TEST_CASE("detector: wait time reported with a completion is not the path's", "[telemetry]")
{
    DetectorConfig cfg;
    cfg.k = 32;
    for (const int idle : {3, 10, 40}) {
        INFO("the transfer waits " << idle << " windows for its reader");
        DegradeDetector d(cfg), control(cfg);
        REQUIRE(feed_until(d, win(kX), 1, 100) == 0);
        REQUIRE(feed_until(control, win(kX), 1, 100) == 0);
        int flags = 0, control_flags = 0;
        for (int c = 0; c < 30; ++c) {
            starved_cycle(d, idle, true, &flags);
            starved_cycle(control, idle, false, &control_flags);
        }
        CHECK(flags == 0);
        CHECK_FALSE(d.degraded());
        CHECK(control_flags > 0); // the same trace without the reports looks like a slow path
        // The aggregate is the path's own rate again (more where the span cuts a cycle, whose
        // bytes count at its completion), or nothing to judge when the span holds no time of
        // the path's own. The baseline learns what the spans moved with the wait left in (a
        // path left idle may move the next burst faster than it sustains): it may sink a
        // little, which only makes the detector less sensitive, and never rises above the
        // path's rate.
        if (idle + 2 <= cfg.k) CHECK(d.judged() >= 0.99e9);
        CHECK(control.judged() < 0.5e9);
        CHECK(d.baseline() <= 1.01e9);
        CHECK(d.baseline() >= 0.9e9);
    }
}

TEST_CASE("detector: the baseline is what the path sustains, not its bursts after idle",
          "[telemetry]")
{
    // A shaped path (token bucket) left idle moves the start of the next burst at line rate:
    // here each busy period starts with `settle` windows at 3x the rate it sustains.
    DetectorConfig cfg;
    cfg.k = 8;
    DegradeDetector d(cfg);
    WindowRecord idle = win(0, kW / 10);
    for (int burst = 0; burst < 50; ++burst) {
        CHECK(feed_until(d, win(3 * kX), 1, cfg.settle) == 0);
        CHECK(feed_until(d, win(kX), 1, cfg.k + 2) == 0); // the last spans: sustained rate only
        CHECK(d.feed(idle) == 0);
    }
    CHECK(d.armed());
    CHECK(d.baseline() == Approx(1e9).epsilon(0.01)); // not the bursts' 2x average
    // So the sustained rate, continuous for a long time, is never flagged.
    CHECK(feed_until(d, win(3 * kX), 1, cfg.settle) == 0);
    CHECK(feed_until(d, win(kX), 1, 500) == 0);
    // The bursts are what it ignores, not what it is blind to: without `settle` the same
    // trace teaches it the bursts' average.
    cfg.settle = 0;
    DegradeDetector naive(cfg);
    for (int burst = 0; burst < 50; ++burst) {
        feed_until(naive, win(3 * kX), 1, 8);
        feed_until(naive, win(kX), 1, cfg.k + 2);
        naive.feed(idle);
    }
    CHECK(naive.baseline() > 1.3e9);
}

// One busy period of a path: the first window is busy only at its end, windows 1 .. len-1 are
// busy throughout, and in window `len` (the tail) the last message completes early and the
// path goes idle. `done` holds the window of each message's completion (len: in the tail),
// each `per_msg` bytes. Returns the verdict changes; `judged` gets the aggregate after the tail.
int busy_period(DegradeDetector &d, int len, std::initializer_list<int> done, uint64_t per_msg, double *judged)
{
    int changes = 0;
    for (int i = 0; i <= len; ++i) {
        WindowRecord w = win(0, i == 0 || i == len ? 3 * kW / 10 : kW);
        w.ops = 0;
        for (const int at : done) {
            if (at == i) {
                w.bytes += per_msg;
                ++w.ops;
            }
        }
        changes += std::abs(d.feed(w));
    }
    *judged = d.judged();
    return changes;
}

TEST_CASE("detector: the bytes that end a busy period count with the busy time that carried them",
          "[telemetry]")
{
    // NCCL's steps are large (4 MiB takes tens of 1 ms windows at a few Gbit/s) and a busy
    // period often ends with every message in flight completing together, early in a window
    // that is then idle: that window is not loaded, but its bytes are what the windows before
    // it carried. Dropped, a period whose messages all complete in its tail looks like busy
    // time with nothing to show for it. The 4-rank demo on 2 cores flagged healthy paths so.
    DetectorConfig cfg;
    cfg.k = 32; // the plugin's default (VIGIL_DEGRADE_WINDOWS); settle 8
    DegradeDetector d(cfg);
    double judged = 0;
    // A continuous stream first (a completion per window): the baseline is the path's rate.
    REQUIRE(feed_until(d, win(kX), 1, 400) == 0);
    REQUIRE(d.baseline() == Approx(1e9));
    // Then periods of two messages in flight together for 30 windows: in one kind both
    // complete in the tail, in the other one completes midway. The path is as fast as before.
    const uint64_t msg = 15 * kX;
    int changes = 0;
    double lowest = 1e18;
    for (int i = 0; i < 40; ++i) {
        changes += busy_period(d, 30, {30, 30}, msg, &judged);
        lowest = std::min(lowest, judged);
        changes += busy_period(d, 30, {15, 30}, msg, &judged);
        lowest = std::min(lowest, judged);
    }
    CHECK(changes == 0);
    CHECK_FALSE(d.degraded());
    CHECK(lowest >= 0.9e9); // without the tail: about 0.5e9, flagged within two periods
    // Two completions per span are lumps (1.3-1.8e9 here, the settle windows' busy time left
    // out): judged, but not learned, so the baseline stays near what the stream taught it
    // (the first spans still hold the stream's completions).
    CHECK(d.baseline() < 1.05e9);
    // The same periods on a path at a quarter of the rate are flagged.
    int flagged = 0;
    for (int i = 0; i < 10 && flagged == 0; ++i) {
        flagged = busy_period(d, 120, {120, 120}, msg, &judged);
        if (flagged == 0) flagged = busy_period(d, 120, {60, 120}, msg, &judged);
    }
    CHECK(d.degraded());
    CHECK(judged < 0.5 * d.baseline());
}

TEST_CASE("detector: one stall nobody reported drags one span down, not a verdict", "[telemetry]")
{
    // The kernel's own network processing, held up on a saturated host, delays data before any
    // socket timestamps it: no end point reports that wait. One such stall, up to about a span
    // long, leaves the aggregate below the threshold for less than a span.
    DetectorConfig cfg;
    cfg.k = 32;
    cfg.fraction = 0.7;
    DegradeDetector d(cfg);
    REQUIRE(feed_until(d, win(kX), 1, 100) == 0);
    WindowRecord stall = win(0);
    stall.ops = 0;
    for (const int len : {12, 20, 32}) {
        INFO("an unreported stall of " << len << " windows");
        CHECK(feed_until(d, stall, 1, len) == 0);
        CHECK(d.feed(win(kX)) == 0);
        CHECK(d.judged() < cfg.fraction * d.baseline()); // it does look slow for a while ...
        CHECK(feed_until(d, win(kX), 1, 3 * cfg.k) == 0); // ... but not for a span
        CHECK_FALSE(d.degraded());
    }
    // A path that stays slow is flagged once that has lasted a span.
    const int f = feed_until(d, win(kX / 2), 1, 4 * cfg.k);
    CHECK(f > cfg.k);
    CHECK(f <= 2 * cfg.k + 2);
}

TEST_CASE("detector: no verdict while a stall may still be reported", "[telemetry]")
{
    DetectorConfig cfg;
    cfg.k = 8;
    cfg.settle = 0; // the idle window below would start a busy period that settles
    DegradeDetector d(cfg), control(cfg);
    REQUIRE(feed_until(d, win(kX), 1, 100) == 0);
    REQUIRE(feed_until(control, win(kX), 1, 100) == 0);
    // 50 busy windows in which nothing completes: however slow that looks, no verdict yet.
    WindowRecord stall = win(0);
    stall.ops = 0;
    CHECK(feed_until(d, stall, 1, 50) == 0);
    CHECK(feed_until(control, stall, 1, 50) == 0);
    CHECK(d.judged() == 0);
    // The completion comes with the wait that explains the stall: nothing to flag ...
    WindowRecord done = win(kX);
    done.wait_us = 51'000;
    CHECK(d.feed(done) == 0);
    CHECK_FALSE(d.degraded());
    // ... without it, a path that took 51 windows for one window's bytes is slow (and is
    // flagged once that has lasted a span).
    CHECK(control.feed(win(kX)) == 0);
    CHECK(control.judged() < 0.2 * control.baseline());
    CHECK(feed_until(control, win(kX / 10), 1, 2 * cfg.k) > 0);
    // A wait reported by a window that is itself no evidence (mostly idle) still belongs to
    // the loaded windows before it.
    CHECK(feed_until(d, stall, 1, 20) == 0);
    WindowRecord tail = win(kX, kW / 10); // the completion, then idle: not loaded
    tail.wait_us = static_cast<uint32_t>(20'000 + kW / 10 / 1000);
    CHECK(d.feed(tail) == 0);
    CHECK(d.feed(win(kX)) == 0);
    CHECK_FALSE(d.degraded());
    CHECK(d.judged() > 0.9e9);
}

TEST_CASE("detector: the link speed caps the baseline", "[telemetry]")
{
    DetectorConfig capped;
    capped.link_bytes_per_s = 0.4e9; // below the measured 1 GB/s
    DegradeDetector d(capped), control(DetectorConfig{});
    bool over = false;
    for (int i = 0; i < 200; ++i) {
        REQUIRE(d.feed(win(kX)) == 0);
        control.feed(win(kX));
        over = over || d.baseline() > capped.link_bytes_per_s;
    }
    CHECK_FALSE(over);
    CHECK(d.baseline() == capped.link_bytes_per_s);
    CHECK(control.baseline() == Approx(1e9));
    // 0.3 GB/s is below half the measured rate but not below half the link: not degraded.
    CHECK(feed_until(d, win(3 * kX / 10), 1, 50) == 0);
    CHECK(feed_until(control, win(3 * kX / 10), 1, 50) > 0);
    CHECK(d.baseline() <= capped.link_bytes_per_s);
    // 0.1 GB/s is below half the link.
    const int f = feed_until(d, win(kX / 10), 1, 3 * capped.k);
    CHECK(f >= 1);
    CHECK(f <= 2 * capped.k + 2);
    CHECK(d.degraded());
}

TEST_CASE("detector: windows the receiving application held back never count", "[telemetry]")
{
    // The receiver reports (bit 31 of its ack's generation) that data waits for a receive it
    // has not posted: the path is not to blame for that time.
    vt::DetectorConfig cfg;
    cfg.k = 4;
    cfg.warmup = 4;
    vt::DegradeDetector d(cfg);
    auto window = [](uint64_t bytes, bool receiver_bound) {
        vt::WindowRecord w{};
        w.window_us = 1000;
        w.busy_ns = 1'000'000;
        w.bytes = bytes;
        w.ops = 1;
        w.avg_queued_bytes = 1 << 20;
        w.receiver_bound = receiver_bound ? 1 : 0;
        return w;
    };
    for (int i = 0; i < 20; ++i) CHECK(d.feed(window(1'000'000, false)) == 0); // 1 GB/s
    for (int i = 0; i < 50; ++i) CHECK(d.feed(window(10'000, true)) == 0);     // app-bound, slow
    CHECK_FALSE(d.degraded());
    int flagged_at = -1;
    for (int i = 0; i < 20 && flagged_at < 0; ++i)
        if (d.feed(window(10'000, false)) == 1) flagged_at = i; // the path itself slow
    CHECK(flagged_at >= 0);
}
