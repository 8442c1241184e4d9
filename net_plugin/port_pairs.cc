// SPDX-License-Identifier: Apache-2.0
// Liveness per (local port, remote port) pair (port_pairs.h).
#include "port_pairs.h"

#include <algorithm>

namespace vigil::net {

void PortPairs::Pair::heard(uint64_t now) noexcept
{
    uint64_t prev = heard_ns.load(std::memory_order_relaxed);
    while (prev < now && !heard_ns.compare_exchange_weak(prev, now, std::memory_order_relaxed)) {
    }
}

bool PortPairs::Pair::claim_probe(uint64_t now, uint64_t interval_ns) noexcept
{
    uint64_t prev = probed_ns.load(std::memory_order_relaxed);
    if (prev != 0 && now < prev + interval_ns) return false;
    return probed_ns.compare_exchange_strong(prev, now, std::memory_order_relaxed);
}

PortPairs &PortPairs::process() noexcept
{
    static PortPairs pairs;
    return pairs;
}

std::shared_ptr<PortPairs::Pair> PortPairs::get(int dev, const std::string &peer_port)
{
    if (peer_port.empty()) return std::make_shared<Pair>();
    std::lock_guard<std::mutex> g(mu_);
    std::weak_ptr<Pair> &slot = pairs_[{dev, peer_port}];
    std::shared_ptr<Pair> p = slot.lock();
    if (!p) {
        p = std::make_shared<Pair>();
        slot = p;
    }
    if (pairs_.size() >= sweep_at_) {
        std::erase_if(pairs_, [](const auto &kv) { return kv.second.expired(); });
        sweep_at_ = std::max<size_t>(64, 2 * pairs_.size());
    }
    return p;
}

size_t PortPairs::size()
{
    std::lock_guard<std::mutex> g(mu_);
    size_t n = 0;
    for (const auto &kv : pairs_) n += kv.second.expired() ? 0 : 1;
    return n;
}

} // namespace vigil::net
