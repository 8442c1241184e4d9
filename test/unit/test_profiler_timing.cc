// SPDX-License-Identifier: Apache-2.0
// The collective-timing arithmetic (profiler_plugin/timing.h) on the event sequences a real
// GPU gives, modelled on what stock NCCL 2.28.9 delivered on an H100: collectives issued
// back to back (a small kernel done before NCCL stamps the Coll start; large ones queued
// behind each other), KernelCh events delivered milliseconds late by an idle proxy thread,
// kernel stamps that belong to another task, and the host-only fallbacks.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "timing.h"

namespace vp = vigil::prof;
using vp::ChannelTimes;
using vp::TimingInput;
using vp::TimingSource;

namespace {

// The GPU's %globaltimer runs on its own origin: host monotonic + this.
constexpr uint64_t kGpu = 1'767'766'829'000'000'000ull;
constexpr uint64_t kUs = 1000;

/// A channel that ran on the GPU from host time `t0` to `t1` (ns), its events seen `lag`
/// later by the host.
ChannelTimes ran(uint8_t ch, uint64_t t0, uint64_t t1, uint64_t lag)
{
    return ChannelTimes{ch, t0 + kGpu, t1 + kGpu, t0 + lag, t1 + lag};
}

} // namespace

TEST_CASE("timing: a small collective done before NCCL stamped its Coll start", "[profiler][timing]")
{
    // Back to back: the user's call at 1000 us, the kernel ran 7.9 us at 1003 us, NCCL
    // stamped the Coll start after cuLaunchKernel returned, at 1015 us.
    TimingInput in;
    in.enqueue_ns = 1000 * kUs;
    in.channels = {ran(0, 1003 * kUs, 1003 * kUs + 7900, 4 * kUs), ran(1, 1003 * kUs + 100, 1010 * kUs, 4 * kUs)};
    vp::GpuOffset off;
    const vp::TimingResult t = vp::time_collective(in, &off, 2000 * kUs);
    CHECK(t.source == TimingSource::kKernelGpu);
    CHECK(t.duration_us == Approx(7.9));
    CHECK(t.kernel_us == Approx(7.9));
    CHECK(t.channels_timed == 2);
    CHECK(t.channels_invalid == 0);
    // Queueing: 3 us, overestimated by the 4 us the host took to see the start.
    CHECK(t.queue_us == Approx(7.0));
}

TEST_CASE("timing: large collectives queued behind each other get their own GPU time", "[profiler][timing]")
{
    // Four 64 MiB all-reduces issued 100 us apart; each kernel runs 37.7 ms after the one
    // before. The duration is each one's 37.7 ms, not enqueue to completion (up to 151 ms).
    vp::GpuOffset off;
    const uint64_t run = 37'700 * kUs;
    for (int i = 0; i < 4; ++i) {
        TimingInput in;
        in.enqueue_ns = static_cast<uint64_t>(i) * 100 * kUs + 10 * kUs;
        const uint64_t t0 = 20 * kUs + static_cast<uint64_t>(i) * run;
        in.channels = {ran(0, t0, t0 + run, 5 * kUs), ran(1, t0 + 2 * kUs, t0 + run - kUs, 5 * kUs)};
        const vp::TimingResult t = vp::time_collective(in, &off, t0 + run);
        INFO("collective " << i);
        CHECK(t.source == TimingSource::kKernelGpu);
        CHECK(t.duration_us == Approx(37'700.0));
        CHECK(t.kernel_us == Approx(37'700.0));
        CHECK(t.queue_us == Approx((static_cast<double>(t0) - static_cast<double>(in.enqueue_ns)) / 1e3 + 5.0));
    }
}

TEST_CASE("timing: events delivered 2 ms late do not inflate the duration", "[profiler][timing]")
{
    // A loop that synchronises after every call: NCCL's proxy thread sleeps between them
    // and sees every kernel-channel event about 2.1 ms late. A 1 KiB broadcast runs 7.9 us.
    vp::GpuOffset off;
    for (int i = 0; i < 20; ++i) {
        const uint64_t base = static_cast<uint64_t>(i) * 10'000 * kUs;
        TimingInput in;
        in.enqueue_ns = base;
        in.channels = {ran(0, base + 6 * kUs, base + 6 * kUs + 7900, 2100 * kUs)};
        const vp::TimingResult t = vp::time_collective(in, &off, base + 3000 * kUs);
        CHECK(t.source == TimingSource::kKernelGpu);
        CHECK(t.duration_us == Approx(7.9));
        // Queueing is an upper bound: 6 us true, plus the least delay seen.
        CHECK(t.queue_us == Approx(2106.0));
    }
}

TEST_CASE("timing: kernel stamps of another task are detected, never printed", "[profiler][timing]")
{
    vp::GpuOffset off;
    TimingInput good;
    good.enqueue_ns = 1000 * kUs;
    good.channels = {ran(0, 1010 * kUs, 1050 * kUs, 3 * kUs)};
    REQUIRE(vp::time_collective(good, &off, 2000 * kUs).source == TimingSource::kKernelGpu);

    SECTION("a channel that ends before it begins")
    {
        TimingInput in;
        in.enqueue_ns = 5000 * kUs;
        ChannelTimes c = ran(0, 5010 * kUs, 5020 * kUs, 3 * kUs);
        std::swap(c.gpu_start, c.gpu_stop);
        in.channels = {ran(1, 5010 * kUs, 5020 * kUs, 3 * kUs), c};
        const vp::TimingResult t = vp::time_collective(in, &off, 6000 * kUs);
        CHECK(t.source == TimingSource::kInvalid);
        CHECK(t.duration_us == 0);
        CHECK(t.channels_invalid == 1);
        CHECK(t.queue_us < 0);
    }
    SECTION("a channel longer than the collective existed on the host")
    {
        // Stamps 2.9 s apart for a collective the host knew for 40 ms (NVIDIA/nccl#2368).
        TimingInput in;
        in.enqueue_ns = 9000 * kUs;
        ChannelTimes c = ran(0, 9010 * kUs, 9030 * kUs, 3 * kUs);
        c.gpu_start -= 2'900'000 * kUs;
        in.channels = {c};
        const vp::TimingResult t = vp::time_collective(in, &off, 10'000 * kUs);
        CHECK(t.source == TimingSource::kInvalid);
        CHECK(t.channels_invalid == 1);
    }
    SECTION("a channel that started before the user called")
    {
        // An earlier work's stamps, 2.5 ms before the call: caught once the clocks compare.
        TimingInput in;
        in.enqueue_ns = 20'000 * kUs;
        in.channels = {ran(0, 17'500 * kUs, 17'510 * kUs, 2510 * kUs)};
        // host_stop (20 020 us) - enqueue = 20 us covers the 10 us channel: only the
        // clock comparison can tell.
        const vp::TimingResult t = vp::time_collective(in, &off, 21'000 * kUs);
        CHECK(t.source == TimingSource::kInvalid);
    }
    SECTION("within the slack of an eager launch it is not an anomaly")
    {
        // No CollApi: the enqueue is the Coll start, stamped 300 us after the kernel began.
        TimingInput in;
        in.enqueue_ns = 30'300 * kUs;
        in.channels = {ran(0, 30'000 * kUs, 30'400 * kUs, 3 * kUs)};
        const vp::TimingResult t = vp::time_collective(in, &off, 31'000 * kUs);
        CHECK(t.source == TimingSource::kKernelGpu);
        CHECK(t.duration_us == Approx(400.0));
        CHECK(t.queue_us == 0);
    }
}

TEST_CASE("timing: a collective that waited minutes for a late rank is not an anomaly", "[profiler][timing]")
{
    // Enqueued at 0, its channels ran 5 minutes (waiting for a peer), the GPU timer 50 ppm
    // faster than the host clock: the GPU span exceeds the host's by 15 ms.
    vp::GpuOffset off;
    TimingInput in;
    in.enqueue_ns = 1000 * kUs;
    const uint64_t host_run = 300'000'000 * kUs;
    ChannelTimes c = ran(0, 1010 * kUs, 1010 * kUs + host_run, 5 * kUs);
    c.gpu_stop = c.gpu_start + host_run + host_run / 20'000;
    in.channels = {c};
    const vp::TimingResult t = vp::time_collective(in, &off, 1010 * kUs + host_run);
    CHECK(t.source == TimingSource::kKernelGpu);
    CHECK(t.duration_us == Approx(300'015'000.0));
}

TEST_CASE("timing: host fallbacks are named as such", "[profiler][timing]")
{
    vp::GpuOffset off;
    SECTION("channels without GPU stamps: the host times of their events")
    {
        TimingInput in;
        in.enqueue_ns = 100 * kUs;
        in.channels = {ChannelTimes{0, 0, 0, 120 * kUs, 180 * kUs}, ChannelTimes{1, 0, 0, 121 * kUs, 150 * kUs}};
        const vp::TimingResult t = vp::time_collective(in, &off, 200 * kUs);
        CHECK(t.source == TimingSource::kKernelCpu);
        CHECK(t.duration_us == Approx(60.0));
        CHECK(t.channels_timed == 2);
        CHECK(t.queue_us == Approx(20.0)); // the first channel's start event, 20 us after the call
        CHECK_FALSE(off.known());
    }
    SECTION("no kernel channels: enqueue to the last network step")
    {
        TimingInput in;
        in.enqueue_ns = 100 * kUs;
        in.proxy_end_ns = 350 * kUs;
        const vp::TimingResult t = vp::time_collective(in, &off, 400 * kUs);
        CHECK(t.source == TimingSource::kProxyCpu);
        CHECK(t.duration_us == Approx(250.0));
    }
    SECTION("nothing but the collective: no duration")
    {
        TimingInput in;
        in.enqueue_ns = 100 * kUs;
        const vp::TimingResult t = vp::time_collective(in, &off, 400 * kUs);
        CHECK(t.source == TimingSource::kNone);
        CHECK(t.duration_us == 0);
        CHECK(std::string(vp::timing_name(t.source)) == "none");
    }
}

TEST_CASE("timing: the GPU offset is the least delivery delay, and follows the clocks", "[profiler][timing]")
{
    vp::GpuOffset off;
    CHECK_FALSE(off.known());
    const int64_t base = -static_cast<int64_t>(kGpu);
    off.add(base + 5000, 1);
    off.add(base + 900, 2);
    off.add(base + 3000, 3);
    REQUIRE(off.known());
    CHECK(off.value() == base + 900);
    // Two 10 s epochs later the old minimum is forgotten: a drift of the clocks is followed.
    off.add(base + 2000, 11'000'000'000ull);
    CHECK(off.value() == base + 900);
    off.add(base + 2500, 22'000'000'000ull);
    CHECK(off.value() == base + 2000);
}
