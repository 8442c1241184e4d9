// SPDX-License-Identifier: Apache-2.0
// Backup planning and the failover/telemetry configuration.
#include "path_plan.h"

#include <algorithm>
#include <string_view>

namespace vigil::net {
namespace {

size_t common_prefix(const std::string &a, const std::string &b)
{
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}

} // namespace

bool BackupPlan::parse(const std::string &spec, const std::vector<DeviceProps> &devs, BackupPlan *out,
                       std::string *why)
{
    const size_t n = devs.size();
    out->candidates_.assign(n, {});
    out->next_.assign(n, 0);
    if (spec == "off") return true;
    if (spec == "spread") {
        for (size_t d = 0; d < n; ++d) {
            std::vector<int> c;
            for (size_t o = 0; o < n; ++o)
                if (o != d) c.push_back(static_cast<int>(o));
            const DeviceProps &me = devs[d];
            std::stable_sort(c.begin(), c.end(), [&](int a, int b) {
                const DeviceProps &x = devs[static_cast<size_t>(a)], &y = devs[static_cast<size_t>(b)];
                const bool xn = x.numa_node == me.numa_node, yn = y.numa_node == me.numa_node;
                if (xn != yn) return xn;
                return common_prefix(x.pci_path, me.pci_path) > common_prefix(y.pci_path, me.pci_path);
            });
            out->candidates_[d] = std::move(c);
        }
        return true;
    }
    auto index_of = [&](std::string_view name) {
        for (size_t i = 0; i < n; ++i)
            if (devs[i].name == name) return static_cast<int>(i);
        return -1;
    };
    std::string_view rest = spec;
    while (!rest.empty()) {
        const size_t comma = rest.find(',');
        const std::string_view pair = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        const size_t colon = pair.find(':');
        const int a = colon == std::string_view::npos ? -1 : index_of(pair.substr(0, colon));
        const int b = colon == std::string_view::npos ? -1 : index_of(pair.substr(colon + 1));
        if (a < 0 || b < 0 || a == b) {
            *why = "bad VIGIL_BACKUP entry \"" + std::string(pair) +
                   "\": expected spread, off, or pairs DEV:BACKUPDEV of two different selected devices";
            return false;
        }
        out->candidates_[static_cast<size_t>(a)] = {b};
    }
    return true;
}

ConnectPlan BackupPlan::plan(int dev, const ListenHandle &h, int traffic_class)
{
    ConnectPlan p;
    p.traffic_class = traffic_class;
    p.local_dev[kPrimary] = dev;
    p.remote[kPrimary] = 0;
    std::lock_guard<std::mutex> lock(mu_);
    if (dev < 0 || static_cast<size_t>(dev) >= candidates_.size()) return p;
    const std::vector<int> &cands = candidates_[static_cast<size_t>(dev)];
    if (cands.empty() || h.addrs.size() < 2) return p;
    const int b = cands[next_[static_cast<size_t>(dev)]++ % cands.size()];
    int pick = -1;
    for (size_t i = 1; i < h.addrs.size() && pick < 0; ++i)
        if (h.addr_devs[i] == b) pick = static_cast<int>(i); // rail aligned
    for (size_t i = 1; i < h.addrs.size() && pick < 0; ++i)
        if (h.addr_devs[i] != h.addr_devs[0]) pick = static_cast<int>(i);
    if (pick < 0) return p;
    p.local_dev[kBackup] = b;
    p.remote[kBackup] = pick;
    return p;
}

std::vector<int> BackupPlan::candidates(int dev) const
{
    std::lock_guard<std::mutex> lock(mu_);
    if (dev < 0 || static_cast<size_t>(dev) >= candidates_.size()) return {};
    return candidates_[static_cast<size_t>(dev)];
}

FailoverConfig failover_config(const Params &params)
{
    FailoverConfig c;
    c.fatal_timeout_ns = static_cast<uint64_t>(params.fatal_timeout_ms) * 1'000'000ull;
    c.stall_timeout_ns = static_cast<uint64_t>(params.stall_timeout_ms) * 1'000'000ull;
    c.probe_interval_ns = static_cast<uint64_t>(params.probe_interval_ms) * 1'000'000ull;
    c.failback_hold_ns = static_cast<uint64_t>(params.failback_hold_ms) * 1'000'000ull;
    c.multipath = params.multipath;
    c.piece_bytes = params.multipath_piece_bytes;
    return c;
}

TelemetryConfig telemetry_config(const Params &params, const std::vector<DeviceProps> &devs)
{
    TelemetryConfig c;
    c.window_ns = params.telemetry ? static_cast<uint64_t>(params.window_us) * 1000ull : 0;
    c.detector.fraction = static_cast<double>(params.degrade_pct) / 100.0;
    c.detector.k = static_cast<int>(params.degrade_windows);
    for (const DeviceProps &d : devs) c.link_bytes_per_s.push_back(static_cast<double>(d.speed_mbps) * 1e6 / 8);
    return c;
}

} // namespace vigil::net
