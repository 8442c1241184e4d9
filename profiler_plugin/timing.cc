// SPDX-License-Identifier: Apache-2.0
// The collective-timing arithmetic (see timing.h).
#include "timing.h"

#include <algorithm>

namespace vigil::prof {

const char *timing_name(TimingSource s) noexcept
{
    switch (s) {
    case TimingSource::kKernelGpu: return "kernel_gpu";
    case TimingSource::kKernelCpu: return "kernel_cpu";
    case TimingSource::kProxyCpu: return "proxy_cpu";
    case TimingSource::kNone: return "none";
    case TimingSource::kInvalid: return "invalid";
    }
    return "none";
}

void GpuOffset::add(int64_t off, uint64_t now)
{
    if (now - epoch_ns > 10'000'000'000ull) {
        prev = cur;
        cur = INT64_MAX;
        epoch_ns = now;
    }
    cur = std::min(cur, off);
}

namespace {

constexpr double kUs = 1e3;

bool has_gpu(const ChannelTimes &c)
{
    return c.gpu_start != 0 || c.gpu_stop != 0;
}

// The offset-free half of the checks: GPU stamps in order, and no longer than the host knew
// the collective existed.
bool plausible(const ChannelTimes &c, uint64_t enqueue_ns)
{
    if (c.gpu_start == 0 || c.gpu_stop <= c.gpu_start) return false;
    const uint64_t gpu = c.gpu_stop - c.gpu_start;
    const uint64_t host = c.host_stop > enqueue_ns ? c.host_stop - enqueue_ns : 0;
    return gpu <= host + kTimingSlackNs + static_cast<uint64_t>(kTimingSlackPerNs * static_cast<double>(host));
}

TimingResult host_fallback(const TimingInput &in)
{
    TimingResult r;
    uint64_t first = UINT64_MAX;
    for (const ChannelTimes &c : in.channels) {
        if (c.host_stop <= c.host_start) continue;
        r.duration_us = std::max(r.duration_us, static_cast<double>(c.host_stop - c.host_start) / kUs);
        first = std::min(first, c.host_start);
        ++r.channels_timed;
    }
    if (r.channels_timed > 0) {
        r.source = TimingSource::kKernelCpu;
        // The first channel start seen: an upper bound, like the GPU-timed one.
        r.queue_us = first > in.enqueue_ns ? static_cast<double>(first - in.enqueue_ns) / kUs : 0;
    } else if (in.proxy_end_ns > in.enqueue_ns) {
        r.source = TimingSource::kProxyCpu;
        r.duration_us = static_cast<double>(in.proxy_end_ns - in.enqueue_ns) / kUs;
    }
    return r;
}

} // namespace

TimingResult time_collective(const TimingInput &in, GpuOffset *offset, uint64_t now_ns)
{
    const bool any_gpu = std::any_of(in.channels.begin(), in.channels.end(), has_gpu);
    if (!any_gpu) return host_fallback(in);

    TimingResult r;
    uint64_t first = UINT64_MAX, last = 0;
    for (const ChannelTimes &c : in.channels) {
        if (!has_gpu(c)) continue; // this channel's stamps were not given: not timed
        if (!plausible(c, in.enqueue_ns)) {
            ++r.channels_invalid;
            continue;
        }
        first = std::min(first, c.gpu_start);
        last = std::max(last, c.gpu_stop);
        r.duration_us = std::max(r.duration_us, static_cast<double>(c.gpu_stop - c.gpu_start) / kUs);
        ++r.channels_timed;
    }
    if (r.channels_invalid == 0 && offset != nullptr) {
        for (const ChannelTimes &c : in.channels)
            if (has_gpu(c) && c.host_start != 0)
                offset->add(static_cast<int64_t>(c.host_start) - static_cast<int64_t>(c.gpu_start), now_ns);
    }
    // A start before the enqueue, once the clocks can be compared: stamps of an earlier work.
    if (r.channels_invalid == 0 && offset != nullptr && offset->known()) {
        const int64_t start_host = static_cast<int64_t>(first) + offset->value();
        if (start_host + static_cast<int64_t>(kTimingSlackNs) < static_cast<int64_t>(in.enqueue_ns))
            r.channels_invalid = r.channels_timed;
        else
            r.queue_us = std::max<int64_t>(0, start_host - static_cast<int64_t>(in.enqueue_ns)) / kUs;
    }
    if (r.channels_invalid > 0) {
        TimingResult bad;
        bad.source = TimingSource::kInvalid;
        bad.channels_invalid = r.channels_invalid;
        return bad;
    }
    r.source = TimingSource::kKernelGpu;
    r.kernel_us = static_cast<double>(last - first) / kUs;
    return r;
}

} // namespace vigil::prof
