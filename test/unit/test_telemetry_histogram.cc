// SPDX-License-Identifier: Apache-2.0
// Telemetry (common/telemetry): the log-scale latency histogram against exact percentiles.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <utility>
#include <vector>

#include "telemetry/histogram.h"

namespace vt = vigil::telemetry;
using vt::LatencyHistogram;

namespace {

// ---- histogram helpers --------------------------------------------------------------------

// Values to check bucket_of/upper_of on: everything below 2^14, then every sub-bucket
// boundary (and its neighbours) of every octave up to the documented 2^38 ns, plus random
// values in each octave (fixed seed).
std::vector<uint64_t> sweep_values()
{
    std::vector<uint64_t> v;
    for (uint64_t x = 0; x < (uint64_t{1} << 14); ++x) v.push_back(x);
    std::mt19937_64 rng(12345);
    for (int msb = 6; msb < 38; ++msb) {
        const uint64_t base = uint64_t{1} << msb, step = base >> 3;
        for (uint64_t sub = 0; sub <= 8; ++sub) {
            const uint64_t edge = base + step * sub;
            v.push_back(edge - 1);
            v.push_back(edge);
            v.push_back(edge + 1);
        }
        std::uniform_int_distribution<uint64_t> in(base, 2 * base - 1);
        for (int i = 0; i < 1000; ++i) v.push_back(in(rng));
    }
    std::erase_if(v, [](uint64_t x) { return x >= (uint64_t{1} << 38); });
    return v;
}

// Values that do not lie in their own bucket: v <= upper_of(b) and, for b > 0,
// v > upper_of(b - 1), where b = bucket_of(v). First 20 only.
std::vector<uint64_t> misplaced(const std::vector<uint64_t> &values)
{
    std::vector<uint64_t> bad;
    for (uint64_t v : values) {
        const int b = LatencyHistogram::bucket_of(v);
        const bool ok = b >= 0 && b < LatencyHistogram::kBuckets && v <= LatencyHistogram::upper_of(b) &&
                        (b == 0 || v > LatencyHistogram::upper_of(b - 1));
        if (!ok && bad.size() < 20) bad.push_back(v);
    }
    return bad;
}

// Nearest-rank exact percentile (per-mille q) of sorted data.
uint64_t exact_percentile(const std::vector<uint64_t> &sorted, uint64_t per_mille)
{
    const uint64_t n = sorted.size();
    const uint64_t rank = std::max<uint64_t>(1, (n * per_mille + 999) / 1000);
    return sorted[rank - 1];
}

} // namespace

// =========================================================================================
// LatencyHistogram
// =========================================================================================

// Values 64..71 ns once fell into bucket 0 whose upper bound is 63 (percentiles of 70 ns
// samples reported 63); the sweep covers them and the checks below pin the boundary.
TEST_CASE("histogram: every value lies within its bucket", "[telemetry]")
{
    CHECK(misplaced(sweep_values()).empty());

    // upper_of is strictly increasing and bucket b + 1 starts right after bucket b ends.
    std::vector<int> gaps;
    for (int b = 0; b + 1 < LatencyHistogram::kBuckets; ++b) {
        const uint64_t u = LatencyHistogram::upper_of(b);
        if (LatencyHistogram::bucket_of(u) != b || LatencyHistogram::bucket_of(u + 1) != b + 1) gaps.push_back(b);
        if (LatencyHistogram::upper_of(b + 1) <= u) gaps.push_back(-b);
    }
    CHECK(gaps.empty());
    // Every bucket above 64 ns is at most 1/8 of its lower bound wide (the documented 12.5 %).
    for (int b = 1; b < LatencyHistogram::kBuckets; ++b) {
        const uint64_t lo = LatencyHistogram::upper_of(b - 1) + 1, hi = LatencyHistogram::upper_of(b);
        if (lo < 64 || hi - lo + 1 > lo / 8) gaps.push_back(b);
    }
    CHECK(gaps.empty());
    // Saturation at both ends.
    CHECK(LatencyHistogram::bucket_of(0) == 0);
    CHECK(LatencyHistogram::bucket_of(63) == 0);
    CHECK(LatencyHistogram::bucket_of(64) == 1);
    CHECK(LatencyHistogram::bucket_of(uint64_t{1} << 40) == LatencyHistogram::kBuckets - 1);
    CHECK(LatencyHistogram::bucket_of(UINT64_MAX) == LatencyHistogram::kBuckets - 1);
    CHECK(LatencyHistogram::upper_of(LatencyHistogram::kBuckets - 1) == (uint64_t{1} << 38) - 1);

    LatencyHistogram h;
    for (int i = 0; i < 1000; ++i) h.add(70);
    CHECK(h.percentile(0.5) == 70);
    CHECK(h.percentile(0.99) == 70);
    h.add(65);
    CHECK(h.percentile(0.0) >= 65);
    CHECK(h.percentile(0.0) <= 71);
}

TEST_CASE("histogram: percentiles within bucket resolution of the exact ones", "[telemetry]")
{
    using Gen = std::function<uint64_t(std::mt19937_64 &)>;
    const std::vector<std::pair<const char *, Gen>> dists = {
        {"uniform 0..2 ms",
         [](std::mt19937_64 &r) { return std::uniform_int_distribution<uint64_t>(0, 2'000'000)(r); }},
        {"log-uniform 100 ns..1 s",
         [](std::mt19937_64 &r) {
             const double l = std::uniform_real_distribution<double>(std::log(100.0), std::log(1e9))(r);
             return static_cast<uint64_t>(std::llround(std::exp(l)));
         }},
        {"bimodal 50/50 (2 us, 800 us)",
         [](std::mt19937_64 &r) {
             return std::bernoulli_distribution(0.5)(r)
                        ? std::uniform_int_distribution<uint64_t>(1'500, 2'500)(r)
                        : std::uniform_int_distribution<uint64_t>(400'000, 1'200'000)(r);
         }},
        {"bimodal 97/3 (2 us, 800 us)",
         [](std::mt19937_64 &r) {
             return std::bernoulli_distribution(0.97)(r)
                        ? std::uniform_int_distribution<uint64_t>(1'500, 2'500)(r)
                        : std::uniform_int_distribution<uint64_t>(400'000, 1'200'000)(r);
         }},
    };
    const uint64_t per_mille[] = {500, 900, 990, 999};
    for (const auto &[name, gen] : dists) {
        for (size_t n : {size_t{1}, size_t{2}, size_t{7}, size_t{1000}, size_t{10007}}) {
            std::mt19937_64 rng(0xC0DE + n);
            std::vector<uint64_t> data(n);
            LatencyHistogram h;
            for (uint64_t &x : data) {
                x = gen(rng);
                h.add(x);
            }
            std::sort(data.begin(), data.end());
            INFO(name << ", n = " << n);
            CHECK(h.count() == n);
            CHECK(h.max() == data.back());
            CHECK(h.percentile(1.0) == data.back());
            for (uint64_t pm : per_mille) {
                const uint64_t exact = exact_percentile(data, pm);
                const uint64_t got = h.percentile(static_cast<double>(pm) / 1000.0);
                INFO("p" << pm / 10.0 << ": exact " << exact << ", reported " << got);
                CHECK(got >= exact);
                CHECK(static_cast<double>(got) <= static_cast<double>(exact) * 1.125 + 64);
            }
        }
    }
}

TEST_CASE("histogram: reset() clears everything", "[telemetry]")
{
    LatencyHistogram h;
    CHECK(h.percentile(0.5) == 0);
    h.reset(); // empty: no-op
    CHECK(h.count() == 0);

    std::mt19937_64 rng(7);
    for (int i = 0; i < 5000; ++i) h.add(std::uniform_int_distribution<uint64_t>(100, 50'000'000)(rng));
    REQUIRE(h.count() == 5000);
    h.reset();
    CHECK(h.count() == 0);
    CHECK(h.max() == 0);
    CHECK(h.percentile(0.5) == 0);
    CHECK(h.percentile(1.0) == 0);

    // After a reset the histogram behaves exactly like a fresh one, for data inside, below
    // and above the previous range.
    for (const auto &[lo, hi] : {std::pair<uint64_t, uint64_t>{20'000, 30'000}, {1'000, 1'500}, {1'000'000'000, 2'000'000'000}}) {
        LatencyHistogram fresh;
        for (int i = 0; i < 300; ++i) {
            const uint64_t x = std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
            h.add(x);
            fresh.add(x);
        }
        INFO("range " << lo << ".." << hi);
        CHECK(h.count() == fresh.count());
        CHECK(h.max() == fresh.max());
        for (int q = 0; q <= 100; ++q) CHECK(h.percentile(q / 100.0) == fresh.percentile(q / 100.0));
        h.reset();
    }
}
