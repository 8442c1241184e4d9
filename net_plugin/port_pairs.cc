// SPDX-License-Identifier: Apache-2.0
// Liveness per (local port, remote port) pair (port_pairs.h).
#include "port_pairs.h"

#include <algorithm>

#include "clock.h"

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

void PortPairs::Pair::sleep(Sleeper *who, uint64_t interval_ns, uint64_t stall_ns,
                            bool on_silence, uint64_t heard)
{
    std::lock_guard<std::mutex> g(mu_);
    auto [it, fresh] = sleeping_.try_emplace(who, Sleeping{interval_ns, stall_ns, heard, on_silence});
    if (!fresh) {
        it->second.on_silence = it->second.on_silence || on_silence;
        it->second.heard_ns = std::max(it->second.heard_ns, heard);
    }
    min_interval_ns_ = std::min(min_interval_ns_, interval_ns);
    min_stall_ns_ = std::min(min_stall_ns_, stall_ns);
}

void PortPairs::Pair::unsleep(Sleeper *who)
{
    std::lock_guard<std::mutex> g(mu_);
    sleeping_.erase(who);
}

size_t PortPairs::Pair::sleepers()
{
    std::lock_guard<std::mutex> g(mu_);
    return sleeping_.size();
}

uint64_t PortPairs::Pair::sweep(uint64_t now)
{
    std::lock_guard<std::mutex> g(mu_);
    if (sleeping_.empty()) return ~0ull;
    const uint64_t heard = last_heard();
    const uint64_t probed = probed_ns.load(std::memory_order_relaxed);
    // Probed and heard lately: nobody to wake, whatever their number.
    if (since(now, probed) <= 2 * min_interval_ns_ && since(now, heard) <= min_stall_ns_)
        return min_interval_ns_;
    bool prober_woken = false;
    min_interval_ns_ = min_stall_ns_ = ~0ull;
    for (auto it = sleeping_.begin(); it != sleeping_.end();) {
        const Sleeping &s = it->second;
        const bool silent = s.on_silence && since(now, std::max(heard, s.heard_ns)) > s.stall_ns;
        // Nobody claimed the pair's probe for two intervals: one sleeper takes it over.
        const bool unprobed = !prober_woken && since(now, probed) > 2 * s.interval_ns;
        if (!silent && !unprobed) {
            min_interval_ns_ = std::min(min_interval_ns_, s.interval_ns);
            min_stall_ns_ = std::min(min_stall_ns_, s.stall_ns);
            ++it;
            continue;
        }
        prober_woken = prober_woken || unprobed;
        it->first->wake_from_pair();
        it = sleeping_.erase(it);
    }
    return min_interval_ns_;
}

uint64_t PortPairs::sweep(uint64_t now)
{
    std::vector<std::shared_ptr<Pair>> live;
    {
        std::lock_guard<std::mutex> g(mu_);
        live.reserve(pairs_.size());
        for (const auto &kv : pairs_)
            if (std::shared_ptr<Pair> p = kv.second.lock()) live.push_back(std::move(p));
    }
    uint64_t interval = ~0ull;
    for (const std::shared_ptr<Pair> &p : live) interval = std::min(interval, p->sweep(now));
    constexpr uint64_t kMinNs = 10'000'000, kMaxNs = 100'000'000;
    return now + std::clamp(interval, kMinNs, kMaxNs);
}

void PortPairs::Sweeper::on_tick() noexcept
{
    next_ = pairs_.sweep(now_ns());
}

void PortPairs::start_sweeper()
{
    if (sweeping_.load(std::memory_order_acquire)) return;
    ProgressEngine &engine = ProgressEngine::instance();
    engine.bind(&sweeper_, -1);
    engine.add_ticker(&sweeper_);
    sweeping_.store(true, std::memory_order_release);
}

void PortPairs::stop_sweeper()
{
    if (!sweeping_.load(std::memory_order_acquire)) return;
    sweeping_.store(false, std::memory_order_release);
    ProgressEngine &engine = ProgressEngine::instance();
    engine.remove_ticker(&sweeper_);
    engine.quiesce();
    engine.unbind(&sweeper_);
}

PortPairs &PortPairs::process() noexcept
{
    // Never destroyed, like the engine: ncclNet v8..v10 have no finalize, so the engine's
    // threads may still sweep (and comms still hold pairs) while statics are destroyed at exit.
    static PortPairs *pairs = new PortPairs;
    return *pairs;
}

std::shared_ptr<PortPairs::Pair> PortPairs::get(int dev, const std::string &peer_port)
{
    if (peer_port.empty()) return std::make_shared<Pair>();
    std::lock_guard<std::mutex> g(mu_);
    std::weak_ptr<Pair> &slot = pairs_[{dev, peer_port}];
    std::shared_ptr<Pair> p = slot.lock();
    if (!p) {
        p = std::make_shared<Pair>();
        p->shared = true;
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
