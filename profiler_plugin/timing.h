// SPDX-License-Identifier: Apache-2.0
// How long a collective took, from the events NCCL gave for it: the arithmetic behind the
// summary's duration_us, kernel_us and queue_us (definitions: docs/profiler.md, "Timing").
//
// Two clocks meet here and are never mixed in a duration:
//   * the host's CLOCK_MONOTONIC (ns): when NCCL called us (CollApi start = the user's call,
//     Coll start = the launch, KernelCh start/stop events = when NCCL's proxy or profiler
//     thread noticed a channel began or ended);
//   * the GPU's %globaltimer (ns): the KernelCh `pTimer` values the kernel itself wrote when
//     a channel began and ended its work (NCCL src/device/common.h, profiler()).
// Execution time is GPU minus GPU, as NCCL Inspector computes it (plugins/profiler/inspector,
// inspector.cc: the longest channel's stop - start). Only queueing, which starts at a host
// event and ends at a GPU one, needs the offset between the clocks; it is estimated from the
// events themselves and is an upper bound (see GpuOffset).
#pragma once

#include <cstdint>
#include <vector>

namespace vigil::prof {

/// One kernel channel of a collective: its GPU stamps (0 when NCCL gave none) and the host
/// times its start and stop events reached the profiler.
struct ChannelTimes {
    uint8_t channel = 0;
    uint64_t gpu_start = 0, gpu_stop = 0;
    uint64_t host_start = 0, host_stop = 0;
};

/// Where a duration came from, best first.
enum class TimingSource {
    kKernelGpu, ///< GPU stamps of the kernel channels (the reference)
    kKernelCpu, ///< host times of the kernel-channel events (no GPU stamps were given)
    kProxyCpu,  ///< host time from the enqueue to the end of the last network step (no kernel
                ///< channel events: kernel-ch not recorded)
    kNone,      ///< nothing but the collective's own event: no duration
    kInvalid,   ///< kernel stamps that cannot belong to this collective: no duration
};

/// The summary's name of `s` ("kernel_gpu", "kernel_cpu", "proxy_cpu", "none", "invalid").
const char *timing_name(TimingSource s) noexcept;

/// Host CLOCK_MONOTONIC minus the GPU's %globaltimer (ns), estimated as the smallest
/// (host time a channel's start event was seen - that channel's GPU start) over the current
/// and the previous 10 s epoch: the host always sees a start after it happened, so the
/// estimate is the true offset plus the least delivery delay seen (microseconds when NCCL's
/// proxy or profiler thread is busy, more when it sleeps), and follows a slow drift between
/// the clocks. Not thread-safe (the writer thread owns it).
struct GpuOffset {
    int64_t cur = INT64_MAX, prev = INT64_MAX;
    uint64_t epoch_ns = 0;
    void add(int64_t off, uint64_t now);
    bool known() const { return cur != INT64_MAX || prev != INT64_MAX; }
    int64_t value() const { return cur < prev ? cur : prev; }
};

/// What is known of one collective (or p2p task) when it is written.
struct TimingInput {
    uint64_t enqueue_ns = 0;  ///< host: CollApi start when recorded, else the Coll start
    uint64_t proxy_end_ns = 0; ///< host: last proxy-op/-step stop of its network work; 0 none
    std::vector<ChannelTimes> channels; ///< kernel channels seen, in arrival order
};

/// The collective's times. Durations are 0 unless the source gives them; `queue_us` < 0
/// when unknown.
struct TimingResult {
    TimingSource source = TimingSource::kNone;
    double duration_us = 0;    ///< execution time (see TimingSource)
    double kernel_us = 0;      ///< kKernelGpu: first channel start to last channel stop
    double queue_us = -1;      ///< enqueue to the first channel start (upper bound)
    int channels_timed = 0;    ///< channels the duration is taken over
    int channels_invalid = 0;  ///< channels whose stamps failed the checks below
};

/// Slack of the plausibility checks: kTimingSlackNs for the eager launch (NCCL stamps the
/// Coll start after cuLaunchKernel, so a channel may begin a little before the host's enqueue
/// time when no CollApi event is recorded), plus kTimingSlackPerNs of the span checked for
/// the GPU timer's and the host clock's rates (tens of ppm apart; a collective may wait
/// minutes for a late rank).
inline constexpr uint64_t kTimingSlackNs = 1'000'000;
inline constexpr double kTimingSlackPerNs = 1e-4;

/// Times one collective. A channel's GPU stamps are used when both are set, the stop is
/// after the start, the channel did not run longer than the host knew the collective
/// (GPU stop - start <= host_stop - enqueue + slack: an offset-free check), and, with the
/// offset known, it did not start before the enqueue (start + offset >= enqueue - slack).
/// Without GPU stamps, the host times of the channel events give a kKernelCpu duration and
/// an upper bound of the queueing.
/// Stamps failing a check belong to another task (NVIDIA/nccl#2368: NCCL's host-side work
/// counter falls behind the GPU's, and every later channel reads another work's slot): the
/// collective is then kInvalid, never given a wrong duration. Channels that pass feed
/// `offset` (when given) before queue_us is computed. Pure apart from `offset`.
TimingResult time_collective(const TimingInput &in, GpuOffset *offset, uint64_t now_ns);

} // namespace vigil::prof
