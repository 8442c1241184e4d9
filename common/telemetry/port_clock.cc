// SPDX-License-Identifier: Apache-2.0
// A port's fair-share clock (port_clock.h).
#include "port_clock.h"

#include <array>

namespace vigil::telemetry {

void PortClock::advance(uint64_t now) noexcept
{
    const int n = n_.load(std::memory_order_relaxed);
    if (now > last_ns_ && n > 0) v_ += static_cast<double>(now - last_ns_) / n;
    if (now > last_ns_) last_ns_ = now; // two threads' clock reads may cross: never back
}

double PortClock::enter(uint64_t now) noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    advance(now);
    n_.fetch_add(1, std::memory_order_relaxed);
    return v_;
}

double PortClock::leave(uint64_t now) noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    advance(now);
    if (n_.load(std::memory_order_relaxed) > 0) n_.fetch_sub(1, std::memory_order_relaxed);
    return v_;
}

double PortClock::read(uint64_t now) noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    advance(now);
    return v_;
}

PortClock *PortClock::of(int dir, int dev) noexcept
{
    static std::array<std::array<PortClock, kDevs>, 2> clocks;
    if (dir < 0 || dir > 1 || dev < 0 || dev >= kDevs) return nullptr;
    return &clocks[static_cast<size_t>(dir)][static_cast<size_t>(dev)];
}

} // namespace vigil::telemetry
