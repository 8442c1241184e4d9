// SPDX-License-Identifier: Apache-2.0
// The registry readers' shared part: opening every segment, summing a path's recent windows.
#include "registry_read.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <utility>

#include "clock.h"

namespace vigil::tool {

using namespace telemetry;

std::vector<Process> open_all(bool all_users, OpenStats *stats, bool warn)
{
    const int removed = reap_stale(all_users);
    if (stats != nullptr) stats->removed += removed;
    std::vector<Process> out;
    for (const std::string &f : list_registries(all_users)) {
        auto v = std::make_unique<RegistryView>();
        std::string why;
        if (v->open(f, &why) != 0) {
            // A segment its owner is still creating, or one gone since the listing, is no fault.
            if (!segment_settled(f)) continue;
            if (warn) std::fprintf(stderr, "vigil: skipping %s: %s\n", f.c_str(), why.c_str());
            if (stats != nullptr) stats->refused.emplace_back(f, why);
            continue;
        }
        out.push_back({f, std::move(v)});
    }
    return out;
}

const char *state_name(int s)
{
    switch (s) {
    case kActive: return "active";
    case kStandby: return "standby";
    case kDead: return "dead";
    default: return "unused";
    }
}

Recent recent(const PathEntry &e, uint64_t span_ns)
{
    // The plugin stamps windows with CLOCK_MONOTONIC, which every process on the host shares.
    const uint64_t now = now_ns();
    const uint64_t from = now > span_ns ? now - span_ns : 0;
    Recent r;
    const uint64_t head = e.ring.head.load(std::memory_order_acquire);
    uint64_t first = 0;
    for (uint64_t k = head; k-- > 0 && head - k <= kRingCapacity;) {
        WindowRecord w;
        if (!RegistryView::read(e, k, &w)) break;
        if (k + 1 == head) r.baseline = w.baseline_bps;
        // A path closes windows only while it moves: one that stopped has no recent windows
        // and reads 0, not the rate it had when it stopped.
        if (w.start_ns + w.window_us * 1000ull <= from) break;
        first = w.start_ns;
        r.bytes += w.bytes;
        r.busy_ns += w.busy_ns;
        r.p50 = std::max(r.p50, w.lat_p50_ns);
        r.p99 = std::max(r.p99, w.lat_p99_ns);
        r.inflight = std::max(r.inflight, w.peak_inflight_bytes);
        ++r.windows;
    }
    if (r.busy_ns) r.bw = static_cast<double>(r.bytes) * 1e9 / static_cast<double>(r.busy_ns);
    // Over the time the windows read cover (the ring may hold less than the span).
    if (r.windows && now > first)
        r.rate = static_cast<double>(r.bytes) * 1e9 / static_cast<double>(now - first);
    return r;
}

std::vector<double> shares(const RegistryView &v, uint64_t span_ns)
{
    std::vector<double> out(v.entries(), -1);
    std::map<std::pair<uint64_t, uint8_t>, uint64_t> total; // (conn, kind) -> bytes
    std::vector<uint64_t> bytes(v.entries(), 0);
    for (uint32_t i = 0; i < v.entries(); ++i) {
        const PathEntry &e = v.entry(i);
        if (e.in_use.load(std::memory_order_acquire) == 0) continue;
        bytes[i] = recent(e, span_ns).bytes;
        total[{e.conn_id, e.kind}] += bytes[i];
    }
    for (uint32_t i = 0; i < v.entries(); ++i) {
        const PathEntry &e = v.entry(i);
        if (e.in_use.load(std::memory_order_acquire) == 0) continue;
        const uint64_t t = total[{e.conn_id, e.kind}];
        if (t > 0) out[i] = static_cast<double>(bytes[i]) / static_cast<double>(t);
    }
    return out;
}

} // namespace vigil::tool
