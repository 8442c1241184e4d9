// SPDX-License-Identifier: Apache-2.0
// A port's fair-share clock (port_clock.h).
#include "port_clock.h"

#include <array>

namespace vigil::telemetry {
namespace {

class Guard
{
public:
    explicit Guard(std::atomic_flag &f) noexcept : f_(f)
    {
        while (f_.test_and_set(std::memory_order_acquire)) {
        }
    }
    ~Guard() { f_.clear(std::memory_order_release); }
    Guard(const Guard &) = delete;
    Guard &operator=(const Guard &) = delete;

private:
    std::atomic_flag &f_;
};

} // namespace

void PortClock::advance(uint64_t now) noexcept
{
    const int n = n_.load(std::memory_order_relaxed);
    if (now > last_ns_ && n > 0) v_ += static_cast<double>(now - last_ns_) / n;
    if (now > last_ns_) last_ns_ = now; // two threads' clock reads may cross: never back
}

double PortClock::enter(uint64_t now) noexcept
{
    Guard g(lock_);
    advance(now);
    n_.fetch_add(1, std::memory_order_relaxed);
    return v_;
}

double PortClock::leave(uint64_t now) noexcept
{
    Guard g(lock_);
    advance(now);
    if (n_.load(std::memory_order_relaxed) > 0) n_.fetch_sub(1, std::memory_order_relaxed);
    return v_;
}

double PortClock::read(uint64_t now) noexcept
{
    Guard g(lock_);
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
