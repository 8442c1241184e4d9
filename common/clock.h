// SPDX-License-Identifier: Apache-2.0
// The one monotonic clock every timestamp in Vigil comes from.
#pragma once

#include <cstdint>
#include <ctime>

namespace vigil {

/// Nanoseconds of CLOCK_MONOTONIC (vDSO, no system call on x86-64/aarch64 Linux).
/// Thread-safe; comparable across processes of one host.
inline uint64_t now_ns() noexcept
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

/// a - b, or 0 when b is later (timestamps taken on different lines, or by different
/// threads, may cross).
inline uint64_t since(uint64_t a, uint64_t b) noexcept
{
    return a > b ? a - b : 0;
}

} // namespace vigil
