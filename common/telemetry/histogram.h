// SPDX-License-Identifier: Apache-2.0
// Fixed log-scale latency histogram: 8 sub-buckets per power of two from 64 ns to ~275 s,
// so any percentile is reported within 12.5 % of the exact value. add() is a few
// instructions (count leading zeros, shift, increment): no allocation, no lock.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>

namespace vigil::telemetry {

/// Not thread-safe: one writer (the path's owner). Plain value type.
class LatencyHistogram
{
public:
    static constexpr int kSubBits = 3;                 // 8 sub-buckets per octave
    static constexpr int kMinShift = 6;                // values < 64 ns share bucket 0
    static constexpr int kOctaves = 32;                // up to 2^38 ns
    static constexpr int kBuckets = 1 + (kOctaves << kSubBits); // bucket 0: below 64 ns

    /// Bucket index of a latency in ns (saturates at both ends).
    static constexpr int bucket_of(uint64_t ns)
    {
        if (ns < (uint64_t{1} << kMinShift)) return 0;
        const int msb = 63 - std::countl_zero(ns);
        const int octave = msb - kMinShift;
        if (octave >= kOctaves) return kBuckets - 1;
        const int sub = static_cast<int>((ns >> (msb - kSubBits)) & ((1 << kSubBits) - 1));
        return 1 + ((octave << kSubBits) | sub);
    }
    /// Largest value that falls into bucket `b` (what percentiles report).
    static constexpr uint64_t upper_of(int b)
    {
        if (b == 0) return (uint64_t{1} << kMinShift) - 1;
        --b;
        const int octave = b >> kSubBits, sub = b & ((1 << kSubBits) - 1);
        const int msb = octave + kMinShift;
        const uint64_t base = uint64_t{1} << msb, step = base >> kSubBits;
        return base + step * static_cast<uint64_t>(sub + 1) - 1;
    }

    void add(uint64_t ns)
    {
        const int b = bucket_of(ns);
        ++counts_[static_cast<size_t>(b)];
        lo_ = std::min(lo_, b);
        hi_ = std::max(hi_, b);
        max_ = std::max(max_, ns);
        ++n_;
    }
    uint64_t count() const { return n_; }
    uint64_t max() const { return max_; }
    /// Upper bound of the bucket holding the q-quantile (q in [0,1]); 0 when empty.
    uint64_t percentile(double q) const
    {
        if (n_ == 0) return 0;
        const uint64_t rank = std::max<uint64_t>(1, static_cast<uint64_t>(q * static_cast<double>(n_) + 0.999999));
        uint64_t seen = 0;
        for (int b = lo_; b <= hi_; ++b) {
            seen += counts_[static_cast<size_t>(b)];
            if (seen >= rank) return std::min(upper_of(b), max_);
        }
        return max_;
    }
    /// Clears only the buckets used since the last reset (cheap at 1 ms windows).
    void reset()
    {
        if (n_ != 0) std::fill(counts_.begin() + lo_, counts_.begin() + hi_ + 1, 0u);
        lo_ = kBuckets;
        hi_ = -1;
        n_ = max_ = 0;
    }

private:
    std::array<uint32_t, kBuckets> counts_{};
    int lo_ = kBuckets, hi_ = -1;
    uint64_t n_ = 0, max_ = 0;
};

} // namespace vigil::telemetry
