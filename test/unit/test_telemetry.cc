// SPDX-License-Identifier: Apache-2.0
// Telemetry (common/telemetry): the log-scale latency histogram against exact percentiles,
// PathMeter's window arithmetic on synthetic timestamps (no clock), the degraded-path
// detector on synthetic window traces, and the shared-memory registry: ring overwrite and
// consumer modes, torn-read refusal, segment validation (RegistryView::open) and reaping of
// segments whose process is gone. The registry tests use this process's real segment
// (/dev/shm/vigil-<uid>-<pid>, unique per test process).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/file.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#include "recv_comm.h"
#include "send_comm.h"
#include "tcp/tcp_path.h"
#include "telemetry/histogram.h"
#include "telemetry/registry.h"
#include "telemetry/window.h"

namespace vt = vigil::telemetry;
using vt::DegradeDetector;
using vt::DetectorConfig;
using vt::kRingCapacity;
using vt::LatencyHistogram;
using vt::PathEntry;
using vt::PathMeter;
using vt::RegistryHeader;
using vt::RegistryView;
using vt::WindowRecord;

namespace {

constexpr uint64_t kW = 1'000'000;   // window length used throughout: 1 ms, in ns
constexpr uint64_t kT = 1'000 * kW;  // a window-aligned synthetic "now"

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

// ---- meter helpers ------------------------------------------------------------------------

class RecordingSink final : public vt::WindowSink
{
public:
    std::vector<WindowRecord> windows;
    std::vector<std::pair<bool, uint64_t>> verdicts; // (degraded, seq of the window)
    std::vector<std::pair<int, uint32_t>> states;    // (PathState, generation)

    void push(const WindowRecord &w) noexcept override { windows.push_back(w); }
    void verdict(bool degraded, const WindowRecord &w) noexcept override { verdicts.emplace_back(degraded, w.seq); }
    void state(vt::PathState s, uint32_t generation) noexcept override { states.emplace_back(static_cast<int>(s), generation); }
};

// ---- detector helpers ---------------------------------------------------------------------

constexpr uint64_t kX = 1'000'000; // bytes per fully busy 1 ms window: 1 GB/s
constexpr uint64_t kQueued = 1 << 20; // bytes queued on average while busy: bandwidth-bound

// A window in which something completed (a verdict is only taken on such windows).
WindowRecord win(uint64_t bytes, uint64_t busy = kW, uint64_t queued = kQueued)
{
    WindowRecord w{};
    w.window_us = static_cast<uint32_t>(kW / 1000);
    w.bytes = bytes;
    w.ops = 1;
    w.busy_ns = busy;
    w.avg_queued_bytes = queued;
    return w;
}

// Feeds `w` up to `max_n` times; returns the 1-based count at which feed() returned `want`
// (0 if never). Every other return must be 0.
int feed_until(DegradeDetector &d, const WindowRecord &w, int want, int max_n)
{
    for (int i = 1; i <= max_n; ++i) {
        const int c = d.feed(w);
        if (c == want) return i;
        REQUIRE(c == 0);
    }
    return 0;
}

// ---- registry helpers ---------------------------------------------------------------------

vt::Registry &registry()
{
    static const int rc = vt::Registry::instance().open(kW, 3);
    REQUIRE(rc == 0);
    REQUIRE(vt::Registry::instance().is_open());
    return vt::Registry::instance();
}

uint64_t next_conn_id()
{
    static uint64_t n = 0;
    return (static_cast<uint64_t>(getpid()) << 24) + 0x7e1e00 + ++n;
}

// An entry acquired from the registry, released at scope exit.
struct Acquired {
    PathEntry *e;
    uint64_t conn_id;
    Acquired() : conn_id(next_conn_id())
    {
        e = registry().acquire(1, 0, 2, "eth9", "10.9.0.1:4000", "10.9.0.2:5000", conn_id);
    }
    ~Acquired() { vt::Registry::instance().release(e); }
    Acquired(const Acquired &) = delete;
    Acquired &operator=(const Acquired &) = delete;
};

// The read-only view of the entry with `conn_id`, or nullptr.
const PathEntry *find_entry(const RegistryView &v, uint64_t conn_id)
{
    for (uint32_t i = 0; i < v.entries(); ++i) {
        const PathEntry &e = v.entry(i);
        if (e.in_use.load() != 0 && e.conn_id == conn_id) return &e;
    }
    return nullptr;
}

// A record whose every field is derived from `i`, so a mix of two records is detectable.
WindowRecord rec_for(uint64_t i)
{
    WindowRecord w{};
    w.seq = i;
    w.start_ns = i * kW;
    w.window_us = static_cast<uint32_t>(i * 3 + 1);
    w.generation = static_cast<uint32_t>(i * 5 + 1);
    w.bytes = i * 7 + 1;
    w.ops = i * 11 + 1;
    w.busy_ns = i ^ 0x5555'5555ull;
    w.lat_p50_ns = i * 13;
    w.lat_p99_ns = i * 17;
    w.lat_max_ns = i * 19;
    w.peak_inflight_bytes = i * 23;
    w.replays = static_cast<uint32_t>(i * 29);
    w.errors = static_cast<uint32_t>(i * 31);
    w.state = static_cast<uint8_t>(i % 4);
    w.degraded = static_cast<uint8_t>(i & 1);
    w.baseline_bps = i * 37;
    return w;
}

bool matches(const WindowRecord &w, uint64_t i)
{
    const WindowRecord r = rec_for(i);
    return w.seq == r.seq && w.start_ns == r.start_ns && w.window_us == r.window_us &&
           w.generation == r.generation && w.bytes == r.bytes && w.ops == r.ops && w.busy_ns == r.busy_ns &&
           w.lat_p50_ns == r.lat_p50_ns && w.lat_p99_ns == r.lat_p99_ns && w.lat_max_ns == r.lat_max_ns &&
           w.peak_inflight_bytes == r.peak_inflight_bytes && w.replays == r.replays && w.errors == r.errors &&
           w.state == r.state && w.degraded == r.degraded && w.baseline_bps == r.baseline_bps;
}

// Ring indices in [from, to) that read() refuses or returns with the wrong content; the
// record published as ring index k is rec_for(k + offset). First 20 only.
std::vector<uint64_t> unreadable(const PathEntry &e, uint64_t from, uint64_t to, uint64_t offset = 0)
{
    std::vector<uint64_t> bad;
    for (uint64_t k = from; k < to; ++k) {
        WindowRecord w;
        if ((!RegistryView::read(e, k, &w) || !matches(w, k + offset)) && bad.size() < 20) bad.push_back(k);
    }
    return bad;
}

// Ring indices in [from, to) that read() accepts. First 20 only.
std::vector<uint64_t> readable(const PathEntry &e, uint64_t from, uint64_t to)
{
    std::vector<uint64_t> ok;
    for (uint64_t k = from; k < to; ++k) {
        WindowRecord w;
        if (RegistryView::read(e, k, &w) && ok.size() < 20) ok.push_back(k);
    }
    return ok;
}

// A pid that does not exist: a reaped child's (or, if that was reused at once, a huge one).
int dead_pid()
{
    const pid_t pid = fork();
    if (pid == 0) _exit(0);
    REQUIRE(pid > 0);
    int st = 0;
    REQUIRE(waitpid(pid, &st, 0) == pid);
    if (!vt::pid_alive(pid)) return pid;
    for (int p = 4194303; p > 4190000; --p)
        if (!vt::pid_alive(p)) return p;
    FAIL("no dead pid found");
    return -1;
}

bool file_exists(const std::string &f)
{
    struct stat st;
    return stat(f.c_str(), &st) == 0;
}

std::vector<char> slurp(const std::string &f)
{
    std::ifstream in(f, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void spit(const std::string &f, const std::vector<char> &data, size_t n)
{
    std::ofstream out(f, std::ios::binary | std::ios::trunc);
    out.write(data.data(), static_cast<std::streamsize>(std::min(n, data.size())));
    REQUIRE(out.good());
}

template <typename T>
void poke(std::vector<char> &buf, size_t off, T v)
{
    std::memcpy(buf.data() + off, &v, sizeof(v));
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

// =========================================================================================
// PathMeter window arithmetic
// =========================================================================================

TEST_CASE("meter: overlapping operations count the union of their busy time", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    m.on_post(kT + 100'000, 1000);                  // A
    m.on_post(kT + 200'000, 2000);                  // B overlaps A
    m.on_complete(kT + 300'000, kT + 100'000, 1000); // A: 200 us
    m.on_complete(kT + 500'000, kT + 200'000, 2000); // B: 300 us
    m.on_post(kT + 800'000, 500);                   // C alone
    m.on_complete(kT + 850'000, kT + 800'000, 500);  // C: 50 us
    m.advance(kT + kW - 1);
    CHECK(s.windows.empty()); // the window is not over yet
    m.advance(kT + kW);
    REQUIRE(s.windows.size() == 1);
    const WindowRecord &w = s.windows[0];
    CHECK(w.seq == 0);
    CHECK(w.start_ns == kT);
    CHECK(w.window_us == 1000);
    CHECK(w.bytes == 3500);
    CHECK(w.ops == 3);
    CHECK(w.busy_ns == 450'000); // union 100..500 + 800..850 (the sum of the ops would be 550 us)
    CHECK(w.peak_inflight_bytes == 3000);
    CHECK(w.lat_max_ns == 300'000);
    CHECK(w.lat_p99_ns == 300'000);                               // clamped to the max
    CHECK(w.lat_p50_ns >= 200'000);                               // 2nd of 50, 200, 300 us
    CHECK(static_cast<double>(w.lat_p50_ns) <= 200'000 * 1.125);
    CHECK(w.replays == 0);
    CHECK(w.errors == 0);
    CHECK(w.state == vt::kActive);
    CHECK(w.generation == 1);
    CHECK(w.degraded == 0);
    CHECK(w.busy_bandwidth() == Approx(3500 * 1e9 / 450'000));
    // Mean bytes in flight while busy: (1000 x 200 us + 2000 x 300 us + 500 x 50 us) / 450 us.
    CHECK(w.avg_queued_bytes == (1000 * 200'000 + 2000 * 300'000 + 500 * 50'000) / 450'000);
    m.advance(kT + 10 * kW);
    CHECK(s.windows.size() == 1); // nothing happened since
}

TEST_CASE("meter: an operation spanning windows splits its busy time exactly", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    SECTION("one operation over four windows")
    {
        m.on_post(kT + 700'000, 10'000);
        m.on_complete(kT + 3 * kW + 200'000, kT + 700'000, 10'000);
        m.advance(kT + 4 * kW);
        REQUIRE(s.windows.size() == 4);
        const uint64_t busy[] = {300'000, kW, kW, 200'000};
        uint64_t total = 0;
        for (size_t i = 0; i < 4; ++i) {
            const WindowRecord &w = s.windows[i];
            INFO("window " << i);
            CHECK(w.seq == i);
            CHECK(w.start_ns == kT + i * kW);
            CHECK(w.busy_ns == busy[i]);
            CHECK(w.peak_inflight_bytes == 10'000);
            CHECK(w.ops == (i == 3 ? 1u : 0u)); // attributed to the window of completion
            CHECK(w.bytes == (i == 3 ? 10'000u : 0u));
            CHECK(w.lat_max_ns == (i == 3 ? 2'500'000u : 0u));
            CHECK(w.avg_queued_bytes == 10'000);
            total += w.busy_ns;
        }
        CHECK(total == 2'500'000);
        m.advance(kT + 20 * kW);
        CHECK(s.windows.size() == 4);
    }
    SECTION("two overlapping operations completing in different windows")
    {
        m.on_post(kT + 400'000, 100);
        m.on_post(kT + 600'000, 300);
        m.on_complete(kT + 900'000, kT + 400'000, 100);
        m.on_complete(kT + 2 * kW + 100'000, kT + 600'000, 300);
        m.advance(kT + 3 * kW);
        REQUIRE(s.windows.size() == 3);
        CHECK(s.windows[0].busy_ns == 600'000);
        CHECK(s.windows[0].bytes == 100);
        CHECK(s.windows[0].ops == 1);
        CHECK(s.windows[0].peak_inflight_bytes == 400);
        CHECK(s.windows[1].busy_ns == kW);
        CHECK(s.windows[1].bytes == 0);
        CHECK(s.windows[1].ops == 0);
        CHECK(s.windows[1].peak_inflight_bytes == 300);
        CHECK(s.windows[2].busy_ns == 100'000);
        CHECK(s.windows[2].bytes == 300);
        CHECK(s.windows[2].ops == 1);
        CHECK(s.windows[2].lat_max_ns == 1'500'000);
    }
}

TEST_CASE("meter: idle gaps emit no windows and do not consume sequence numbers", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    m.on_post(kT + 100, 100);
    m.on_complete(kT + 200'100, kT + 100, 100);
    for (uint64_t i = 1; i < 30; ++i) m.advance(kT + i * kW + 5); // a tick in every idle window
    REQUIRE(s.windows.size() == 1);
    CHECK(s.windows[0].seq == 0);
    CHECK(s.windows[0].busy_ns == 200'000);

    m.on_post(kT + 50 * kW + 10, 64);
    m.on_complete(kT + 50 * kW + 1'010, kT + 50 * kW + 10, 64);
    m.on_error(kT + 100 * kW + 5);       // a window with only an error is emitted
    m.on_replay(kT + 200 * kW + 7, 3);   // a window with only replays is emitted
    m.advance(kT + 300 * kW);
    REQUIRE(s.windows.size() == 4);
    const uint64_t starts[] = {kT, kT + 50 * kW, kT + 100 * kW, kT + 200 * kW};
    for (size_t i = 0; i < 4; ++i) {
        INFO("window " << i);
        CHECK(s.windows[i].seq == i);
        CHECK(s.windows[i].start_ns == starts[i]);
    }
    CHECK(s.windows[1].busy_ns == 1'000);
    CHECK(s.windows[1].bytes == 64);
    CHECK(s.windows[2].errors == 1);
    CHECK(s.windows[2].ops == 0);
    CHECK(s.windows[2].busy_ns == 0);
    CHECK(s.windows[3].replays == 3);
    CHECK(s.windows[3].errors == 0);
    // Windows stay aligned to multiples of the window length whatever the first event.
    for (const WindowRecord &w : s.windows) CHECK(w.start_ns % kW == 0);
}

TEST_CASE("meter: peak in-flight bytes, replays, errors, state and generation", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    m.on_post(kT + 10, 100);
    m.on_post(kT + 20, 200);
    m.on_post(kT + 30, 400);                // 700 in flight
    m.on_complete(kT + 40, kT + 10, 100);   // 600
    m.on_post(kT + 50, 50);                 // 650
    m.on_replay(kT + 60, 5);
    m.on_replay(kT + 70, 2);
    m.on_error(kT + 80);
    m.on_error(kT + 90);
    m.on_error(kT + 95);
    m.advance(kT + kW);
    REQUIRE(s.windows.size() == 1);
    CHECK(s.windows[0].peak_inflight_bytes == 700);
    CHECK(s.windows[0].replays == 7);
    CHECK(s.windows[0].errors == 3);
    CHECK(s.windows[0].state == vt::kActive);
    CHECK(s.windows[0].generation == 1);

    m.on_complete(kT + kW + 10, kT + 20, 200);
    m.on_complete(kT + kW + 20, kT + 30, 400);
    m.on_complete(kT + kW + 30, kT + 50, 50);
    // The state change is published at once; windows that closed before it keep the old one.
    m.set_state(kT + 2 * kW + 5, vt::kStandby, 4);
    REQUIRE(s.states.size() == 1);
    CHECK(s.states[0] == std::make_pair(static_cast<int>(vt::kStandby), 4u));
    REQUIRE(s.windows.size() == 2);
    CHECK(s.windows[1].peak_inflight_bytes == 650); // carried over from the previous window
    CHECK(s.windows[1].busy_ns == 30);
    CHECK(s.windows[1].ops == 3);
    CHECK(s.windows[1].replays == 0);
    CHECK(s.windows[1].errors == 0);
    CHECK(s.windows[1].state == vt::kActive);
    CHECK(s.windows[1].generation == 1);

    m.on_post(kT + 2 * kW + 10, 10);
    m.on_complete(kT + 2 * kW + 20, kT + 2 * kW + 10, 10);
    m.on_error(kT + 2 * kW + 30);
    m.advance(kT + 3 * kW);
    REQUIRE(s.windows.size() == 3);
    CHECK(s.windows[2].peak_inflight_bytes == 10);
    CHECK(s.windows[2].state == vt::kStandby);
    CHECK(s.windows[2].generation == 4);
    CHECK(s.windows[2].errors == 1);

    m.set_state(kT + 3 * kW + 1, vt::kDead, 5); // nothing else happens: no window
    m.advance(kT + 10 * kW);
    CHECK(s.windows.size() == 3);
    REQUIRE(s.states.size() == 2);
    CHECK(s.states[1] == std::make_pair(static_cast<int>(vt::kDead), 5u));
}

TEST_CASE("meter: abandoned operations end the busy time", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    SECTION("all in flight abandoned")
    {
        m.on_post(kT + 100'000, 100);
        m.on_post(kT + 150'000, 200);
        m.on_abandon(kT + 400'000, 2, 300);
        m.advance(kT + 5 * kW);
        REQUIRE(s.windows.size() == 1); // busy time stopped: no busy-only windows follow
        CHECK(s.windows[0].busy_ns == 300'000);
        CHECK(s.windows[0].ops == 0);
        CHECK(s.windows[0].bytes == 0);
        CHECK(s.windows[0].peak_inflight_bytes == 300);
        // The meter is reusable afterwards.
        m.on_post(kT + 6 * kW + 10, 1);
        m.on_complete(kT + 6 * kW + 20, kT + 6 * kW + 10, 1);
        m.advance(kT + 7 * kW);
        REQUIRE(s.windows.size() == 2);
        CHECK(s.windows[1].busy_ns == 10);
        CHECK(s.windows[1].peak_inflight_bytes == 1);
    }
    SECTION("part abandoned, the rest completes later")
    {
        m.on_post(kT + 100'000, 100);
        m.on_post(kT + 100'000, 200);
        m.on_post(kT + 100'000, 400);
        m.on_abandon(kT + 200'000, 1, 400); // still busy
        m.on_complete(kT + 2 * kW + 300'000, kT + 100'000, 100);
        m.on_complete(kT + 2 * kW + 600'000, kT + 100'000, 200);
        m.advance(kT + 10 * kW);
        REQUIRE(s.windows.size() == 3);
        CHECK(s.windows[0].busy_ns == 900'000);
        CHECK(s.windows[0].peak_inflight_bytes == 700);
        CHECK(s.windows[1].busy_ns == kW);
        CHECK(s.windows[1].peak_inflight_bytes == 300);
        CHECK(s.windows[2].busy_ns == 600'000);
        CHECK(s.windows[2].bytes == 300);
        CHECK(s.windows[2].ops == 2);
    }
    SECTION("a completion with nothing in flight counts bytes but no busy time")
    {
        m.on_complete(kT + 500, kT, 4096);
        m.advance(kT + kW);
        REQUIRE(s.windows.size() == 1);
        CHECK(s.windows[0].bytes == 4096);
        CHECK(s.windows[0].ops == 1);
        CHECK(s.windows[0].busy_ns == 0);
        CHECK(s.windows[0].peak_inflight_bytes == 0);
    }
}

TEST_CASE("meter: the detector's verdict reaches the windows and the sink", "[telemetry]")
{
    DetectorConfig cfg;
    cfg.k = 4;
    cfg.warmup = 4;
    RecordingSink s;
    PathMeter m(kW, &s, cfg);
    uint64_t t = kT;
    auto window_of = [&](uint64_t bytes) { // 900 us busy per window: loaded
        m.on_post(t + 50'000, bytes);
        m.on_complete(t + 950'000, t + 50'000, bytes);
        t += kW;
    };
    for (int i = 0; i < 30; ++i) window_of(1'000'000);
    for (int i = 0; i < 30; ++i) window_of(100'000);
    for (int i = 0; i < 30; ++i) window_of(1'000'000);
    m.advance(t);
    REQUIRE(s.windows.size() == 90);
    REQUIRE(s.verdicts.size() == 2);
    const auto [deg, s1] = s.verdicts[0];
    const auto [heal, s2] = s.verdicts[1];
    CHECK(deg);
    CHECK_FALSE(heal);
    CHECK(s1 >= 30);
    CHECK(s1 <= 30 + 4 + 2);
    CHECK(s2 >= s1 + 4); // held for k loaded windows
    CHECK(s2 <= 60 + 4 + 2);
    CHECK(m.degraded() == false);
    for (const WindowRecord &w : s.windows) {
        INFO("window " << w.seq);
        CHECK(w.degraded == (w.seq >= s1 && w.seq < s2 ? 1 : 0));
    }
    const double x = 1e6 * 1e9 / 900'000; // bytes/s over busy time at full rate
    CHECK(static_cast<double>(s.windows[29].baseline_bps) == Approx(x).epsilon(0.01));
    // No baseline is published before the warm-up is over: the first `settle` loaded windows
    // are no evidence, judging starts with a full span of k after them, and learning takes
    // `warmup` judgements (window index settle + k - 2 + warmup is the first published).
    const int first = cfg.settle + cfg.k - 2 + cfg.warmup;
    for (int i = 0; i < 30; ++i) CHECK((s.windows[static_cast<size_t>(i)].baseline_bps == 0) == (i < first));
}

// =========================================================================================
// DegradeDetector
// =========================================================================================

TEST_CASE("detector: steady load, a drop, recovery and the k-window hold", "[telemetry]")
{
    const DetectorConfig cfg; // fraction 0.5, k 8, min_busy 0.5, warmup 16
    const int k = cfg.k;
    DegradeDetector d(cfg);
    const WindowRecord fast = win(kX), slow = win(3 * kX / 10);

    // Nothing is judged before k loaded windows, nothing learned before 2k of them in a row
    // (the first span may ride on a burst), and no verdict is possible during warmup
    // (2k - 1 + warmup loaded windows), however slow the path.
    {
        DegradeDetector w(cfg);
        for (int i = 1; i < 2 * k; ++i) w.feed(fast);
        CHECK(w.baseline() == 0);
        CHECK(w.judged() == Approx(1e9)); // the aggregate is visible, not learned from
        w.feed(fast);
        CHECK(w.baseline() == Approx(1e9));
        CHECK(feed_until(w, win(kX / 10), 1, cfg.warmup - 1) == 0);
    }

    CHECK(feed_until(d, fast, 1, 300) == 0); // steady: never degraded
    CHECK_FALSE(d.degraded());
    CHECK(d.baseline() == Approx(1e9).epsilon(1e-6));
    CHECK(d.judged() == Approx(1e9));

    // The verdict is on the aggregate of the last k loaded windows: with j slow windows
    // among them it is ((k - j) + 0.3 j) / k of the rate, so it cannot be judged slow before
    // that falls below fraction x baseline (baseline <= the old rate), and then must stay
    // slow for k more loaded windows.
    int first_possible = 1;
    while ((static_cast<double>(k - first_possible) + 0.3 * first_possible) / k >= cfg.fraction) ++first_possible;
    const int f1 = feed_until(d, slow, 1, 3 * k);
    INFO("flagged after " << f1 << " slow windows (aggregate crosses after " << first_possible << ")");
    CHECK(f1 >= first_possible + k - 1);
    CHECK(f1 <= first_possible + k + 2);
    REQUIRE(d.degraded());
    const double frozen = d.baseline();
    // The EWMA keeps learning from the falling aggregate until the verdict (the transition
    // windows are not yet "slow"): about 0.915x here with alpha 0.05. Never above the rate.
    CHECK(frozen <= 1e9 * (1 + 1e-9));
    CHECK(frozen >= 0.85e9);
    CHECK(d.judged() < cfg.fraction * frozen);

    // Back to full rate right away: the aggregate is healthy after a few windows, but the
    // verdict holds for k loaded windows.
    const int r1 = feed_until(d, fast, -1, 3 * k);
    CHECK(r1 >= k);
    CHECK(r1 <= k + 2);
    CHECK_FALSE(d.degraded());
    CHECK(d.baseline() == frozen); // no baseline updates while degraded nor on the change

    // Slow again right away: the healthy verdict also holds for k loaded windows, and a
    // window judged slow while the verdict is held does not feed the baseline.
    int f2 = 0, held_slow = 0;
    for (int i = 1; i <= 3 * k && f2 == 0; ++i) {
        const double before = d.baseline();
        const int c = d.feed(slow);
        if (c == 1) {
            f2 = i;
        } else {
            REQUIRE(c == 0);
            if (d.judged() < cfg.fraction * before) {
                ++held_slow;
                CHECK(d.baseline() == before);
            }
        }
    }
    CHECK(f2 >= k);
    CHECK(f2 <= first_possible + k + 2);
    CHECK(held_slow >= 1);
    const double frozen2 = d.baseline();
    CHECK(feed_until(d, slow, -1, 40) == 0); // stays degraded, baseline frozen
    CHECK(d.degraded());
    CHECK(d.baseline() == frozen2);

    // After a long degraded stretch, recovery follows the aggregate (no hold pending).
    const int r2 = feed_until(d, fast, -1, 3 * k);
    CHECK(r2 >= 1);
    CHECK(r2 <= k);
    CHECK(feed_until(d, fast, 1, 200) == 0);
    CHECK(d.baseline() == Approx(1e9).epsilon(1e-3)); // tracks the rate again once healthy
}

TEST_CASE("detector: dips shorter than the aggregate can hide are not flagged", "[telemetry]")
{
    const DetectorConfig cfg;
    DegradeDetector d(cfg);
    REQUIRE(feed_until(d, win(kX), 1, 200) == 0);
    // 1..5 windows at 0.3x: the k = 8 aggregate stays >= 0.5625x > 0.5x.
    for (int len = 1; len <= 5; ++len) {
        INFO("dip of " << len << " windows");
        CHECK(feed_until(d, win(3 * kX / 10), 1, len) == 0);
        CHECK(feed_until(d, win(kX), 1, 2 * cfg.k) == 0);
        CHECK_FALSE(d.degraded());
    }
    // A single window that carries nothing while fully busy is no verdict either.
    CHECK(d.feed(win(0)) == 0);
    CHECK(feed_until(d, win(kX), 1, 2 * cfg.k) == 0);
    CHECK(d.baseline() == Approx(1e9).epsilon(0.1));
}

TEST_CASE("detector: windows that are no evidence never change the evidence or a verdict",
          "[telemetry]")
{
    // settle 0: with it, a window that is not loaded ends a busy period and the next loaded
    // ones settle (tested with the bursts after idle below).
    DetectorConfig cfg;
    cfg.settle = 0;
    // A loaded trace with noise, drops and recoveries.
    std::mt19937_64 rng(99);
    std::vector<WindowRecord> trace;
    // rate in bytes/s over busy time: bytes = rate * busy(ns) / 1e9, +-10 %.
    auto add_rate = [&](int n, double bps) {
        for (int i = 0; i < n; ++i) {
            const double noise = std::uniform_real_distribution<double>(0.9, 1.1)(rng);
            const uint64_t busy = std::uniform_int_distribution<uint64_t>(kW / 2, kW)(rng);
            trace.push_back(win(static_cast<uint64_t>(bps * noise * static_cast<double>(busy) / 1e9), busy));
        }
    };
    add_rate(60, 1e9);
    add_rate(20, 0.2e9);
    add_rate(4, 1e9); // recovers, then drops again while the healthy verdict is held
    add_rate(20, 0.1e9);
    add_rate(30, 1e9);
    add_rate(5, 0.3e9);
    add_rate(30, 1e9);
    add_rate(40, 0.1e9);
    add_rate(40, 2e9);

    // Both detectors learn the rate first; afterwards a window that is no evidence changes
    // neither the aggregate judged nor the verdict nor the baseline when it comes. (It does
    // hold learning back for a span: the load was not continuous.)
    DegradeDetector plain(cfg), mixed(cfg);
    REQUIRE(feed_until(plain, win(kX), 1, 100) == 0);
    REQUIRE(feed_until(mixed, win(kX), 1, 100) == 0);
    int ups = 0, downs = 0, mixed_ups = 0, mixed_downs = 0;
    std::vector<size_t> diverged;
    for (size_t i = 0; i < trace.size(); ++i) {
        // 0..3 windows that are no evidence first, with rates from nothing to absurd: idle
        // (busy below min_busy) or latency-bound (busy, but less than min_queued_bytes queued).
        // An idle window right after a loaded one completes nothing here: with a completion it
        // is the tail of the busy period, which is evidence (tested below).
        const int idles = std::uniform_int_distribution<int>(0, 3)(rng);
        for (int j = 0; j < idles; ++j) {
            const bool latency_bound = std::bernoulli_distribution(0.3)(rng);
            const uint64_t busy = latency_bound ? std::uniform_int_distribution<uint64_t>(kW / 2, kW)(rng)
                                                : std::uniform_int_distribution<uint64_t>(0, kW / 2 - 1)(rng);
            const uint64_t queued = latency_bound
                                        ? std::uniform_int_distribution<uint64_t>(0, cfg.min_queued_bytes - 1)(rng)
                                        : kQueued;
            const uint64_t bytes = std::uniform_int_distribution<uint64_t>(0, 50 * kX)(rng);
            WindowRecord w = win(bytes, busy, queued);
            if (j == 0 && !latency_bound) w.ops = 0;
            const bool deg = mixed.degraded();
            const double base = mixed.baseline(), judged = mixed.judged();
            if (mixed.feed(w) != 0 || mixed.degraded() != deg || mixed.baseline() != base ||
                mixed.judged() != judged)
                diverged.push_back(i);
        }
        const int a = plain.feed(trace[i]), b = mixed.feed(trace[i]);
        ups += a > 0;
        downs += a < 0;
        mixed_ups += b > 0;
        mixed_downs += b < 0;
        if (plain.judged() != mixed.judged()) diverged.push_back(i);
    }
    CHECK(diverged.empty());
    CHECK(ups >= 3); // the trace does exercise both verdicts
    CHECK(downs >= 3);
    CHECK(mixed_ups == ups);
    CHECK(mixed_downs == downs);

    // min_busy is the boundary: exactly half the window busy is loaded, one ns less is idle.
    DetectorConfig one;
    one.k = 1;
    one.warmup = 0;
    one.settle = 0;
    DegradeDetector e(one);
    e.feed(win(123'456, kW / 2 - 1));
    CHECK(e.baseline() == 0);
    e.feed(win(kW / 2, kW / 2));
    CHECK(e.baseline() == Approx(1e9));
    // min_queued_bytes likewise: one byte short is latency-bound, exactly it is loaded.
    DegradeDetector q(one);
    q.feed(win(kX, kW, one.min_queued_bytes - 1));
    CHECK(q.baseline() == 0);
    q.feed(win(kX, kW, one.min_queued_bytes));
    CHECK(q.baseline() == Approx(1e9));
}

// A rate that sinks a little per loaded window once dragged the baseline (a symmetric EWMA)
// down with it and was never flagged; the baseline now falls 20 times slower than it rises.
TEST_CASE("detector: a gradual decline is flagged", "[telemetry]")
{
    const double per_window = GENERATE(0.001, 0.01, 0.03);
    INFO("decline of " << per_window * 100 << " % per loaded window");
    const double x = static_cast<double>(kX);

    SECTION("before the rate is below 40 % of the original (k 8, up to 1 % per window)")
    {
        if (per_window > 0.01) return; // faster: the aggregate's k-window lag is the limit
        DegradeDetector d;
        REQUIRE(feed_until(d, win(kX), 1, 200) == 0);
        double bw = x;
        int flagged = 0;
        while (flagged == 0 && bw > 0.3 * x) {
            bw *= 1 - per_window;
            flagged = d.feed(win(static_cast<uint64_t>(bw)));
        }
        INFO("rate " << bw / x << " of the original, baseline " << d.baseline() / 1e9);
        CHECK(flagged == 1);
        CHECK(bw >= 0.4 * x);
    }
    SECTION("a decline that stops at 40 % is flagged within the hold (k 8 and 32)")
    {
        for (int k : {8, 32}) {
            DetectorConfig cfg;
            cfg.k = k;
            DegradeDetector d(cfg);
            REQUIRE(feed_until(d, win(kX), 1, 200) == 0);
            double bw = x;
            bool flagged = false;
            while (!flagged && bw > 0.4 * x) {
                bw = std::max(0.4 * x, bw * (1 - per_window));
                flagged = d.feed(win(static_cast<uint64_t>(bw))) == 1;
            }
            if (!flagged) flagged = feed_until(d, win(static_cast<uint64_t>(bw)), 1, 2 * k) > 0;
            INFO("k " << k << ", baseline " << d.baseline() / 1e9);
            CHECK(flagged);
        }
    }
}

TEST_CASE("detector: a rate that wanders or steps up is never flagged", "[telemetry]")
{
    const int k = GENERATE(8, 32);
    const double fraction = GENERATE(0.5, 0.7);
    DetectorConfig cfg;
    cfg.k = k;
    cfg.fraction = fraction;
    INFO("k " << k << ", fraction " << fraction);
    const double x = static_cast<double>(kX);

    SECTION("+-20 % uniform noise around a steady rate")
    {
        DegradeDetector d(cfg);
        std::mt19937_64 rng(1234);
        std::uniform_real_distribution<double> noise(0.8, 1.2);
        int flags = 0;
        for (int i = 0; i < 20000; ++i)
            flags += d.feed(win(static_cast<uint64_t>(x * noise(rng)))) != 0;
        CHECK(flags == 0);
        CHECK(d.baseline() >= 0.95e9); // it learned the rate: the case is not vacuous
        CHECK(d.baseline() <= 1.2e9);
        // ... and the same detector does flag a real drop.
        CHECK(feed_until(d, win(kX / 5), 1, 4 * k) > 0);
    }
    SECTION("a step up by half, then noise around the new rate")
    {
        DegradeDetector d(cfg);
        CHECK(feed_until(d, win(kX), 1, 300) == 0);
        std::mt19937_64 rng(99);
        std::uniform_real_distribution<double> noise(0.8, 1.2);
        int flags = 0;
        for (int i = 0; i < 5000; ++i)
            flags += d.feed(win(static_cast<uint64_t>(1.5 * x * noise(rng)))) != 0;
        CHECK(flags == 0);
        CHECK(d.baseline() >= 1.4e9); // the faster rate was learned within the run
    }
}

// ---- wait time: the end points, not the path, held the data -------------------------------

// A starved cycle: the path moves `kX` bytes in one window, then the transfer waits `idle`
// windows and the start of the next for a reader (busy, nothing completes), and the
// completion reports that wait (as the comm does: from the data's arrival to its completion).
namespace {

void starved_cycle(DegradeDetector &d, int idle, bool report, int *flags)
{
    WindowRecord stall = win(0);
    stall.ops = 0;
    *flags += d.feed(stall) != 0; // the transfer itself (its bytes count at completion)
    for (int i = 0; i < idle; ++i) *flags += d.feed(stall) != 0;
    WindowRecord done = win(kX);
    done.wait_us = report ? static_cast<uint32_t>((idle + 1) * kW / 1000) : 0;
    *flags += d.feed(done) != 0;
}

} // namespace

TEST_CASE("detector: wait time reported with a completion is not the path's", "[telemetry]")
{
    DetectorConfig cfg;
    cfg.k = 32;
    for (const int idle : {3, 10, 40}) {
        INFO("the transfer waits " << idle << " windows for its reader");
        DegradeDetector d(cfg), control(cfg);
        REQUIRE(feed_until(d, win(kX), 1, 100) == 0);
        REQUIRE(feed_until(control, win(kX), 1, 100) == 0);
        int flags = 0, control_flags = 0;
        for (int c = 0; c < 30; ++c) {
            starved_cycle(d, idle, true, &flags);
            starved_cycle(control, idle, false, &control_flags);
        }
        CHECK(flags == 0);
        CHECK_FALSE(d.degraded());
        CHECK(control_flags > 0); // the same trace without the reports looks like a slow path
        // The aggregate is the path's own rate again (more where the span cuts a cycle, whose
        // bytes count at its completion), or nothing to judge when the span holds no time of
        // the path's own. The baseline learns what the spans moved with the wait left in (a
        // path left idle may move the next burst faster than it sustains): it may sink a
        // little, which only makes the detector less sensitive, and never rises above the
        // path's rate.
        if (idle + 2 <= cfg.k) CHECK(d.judged() >= 0.99e9);
        CHECK(control.judged() < 0.5e9);
        CHECK(d.baseline() <= 1.01e9);
        CHECK(d.baseline() >= 0.9e9);
    }
}

TEST_CASE("detector: the baseline is what the path sustains, not its bursts after idle",
          "[telemetry]")
{
    // A shaped path (token bucket) left idle moves the start of the next burst at line rate:
    // here each busy period starts with `settle` windows at 3x the rate it sustains.
    DetectorConfig cfg;
    cfg.k = 8;
    DegradeDetector d(cfg);
    WindowRecord idle = win(0, kW / 10);
    for (int burst = 0; burst < 50; ++burst) {
        CHECK(feed_until(d, win(3 * kX), 1, cfg.settle) == 0);
        CHECK(feed_until(d, win(kX), 1, cfg.k + 2) == 0); // the last spans: sustained rate only
        CHECK(d.feed(idle) == 0);
    }
    CHECK(d.armed());
    CHECK(d.baseline() == Approx(1e9).epsilon(0.01)); // not the bursts' 2x average
    // So the sustained rate, continuous for a long time, is never flagged.
    CHECK(feed_until(d, win(3 * kX), 1, cfg.settle) == 0);
    CHECK(feed_until(d, win(kX), 1, 500) == 0);
    // The bursts are what it ignores, not what it is blind to: without `settle` the same
    // trace teaches it the bursts' average.
    cfg.settle = 0;
    DegradeDetector naive(cfg);
    for (int burst = 0; burst < 50; ++burst) {
        feed_until(naive, win(3 * kX), 1, 8);
        feed_until(naive, win(kX), 1, cfg.k + 2);
        naive.feed(idle);
    }
    CHECK(naive.baseline() > 1.3e9);
}

// One busy period of a path: the first window is busy only at its end, windows 1 .. len-1 are
// busy throughout, and in window `len` (the tail) the last message completes early and the
// path goes idle. `done` holds the window of each message's completion (len: in the tail),
// each `per_msg` bytes. Returns the verdict changes; `judged` gets the aggregate after the tail.
int busy_period(DegradeDetector &d, int len, std::initializer_list<int> done, uint64_t per_msg, double *judged)
{
    int changes = 0;
    for (int i = 0; i <= len; ++i) {
        WindowRecord w = win(0, i == 0 || i == len ? 3 * kW / 10 : kW);
        w.ops = 0;
        for (const int at : done) {
            if (at == i) {
                w.bytes += per_msg;
                ++w.ops;
            }
        }
        changes += std::abs(d.feed(w));
    }
    *judged = d.judged();
    return changes;
}

TEST_CASE("detector: the bytes that end a busy period count with the busy time that carried them",
          "[telemetry]")
{
    // NCCL's steps are large (4 MiB takes tens of 1 ms windows at a few Gbit/s) and a busy
    // period often ends with every message in flight completing together, early in a window
    // that is then idle: that window is not loaded, but its bytes are what the windows before
    // it carried. Dropped, a period whose messages all complete in its tail looks like busy
    // time with nothing to show for it. The 4-rank demo on 2 cores flagged healthy paths so.
    DetectorConfig cfg;
    cfg.k = 32; // the plugin's default (VIGIL_DEGRADE_WINDOWS); settle 8
    DegradeDetector d(cfg);
    double judged = 0;
    // A continuous stream first (a completion per window): the baseline is the path's rate.
    REQUIRE(feed_until(d, win(kX), 1, 400) == 0);
    REQUIRE(d.baseline() == Approx(1e9));
    // Then periods of two messages in flight together for 30 windows: in one kind both
    // complete in the tail, in the other one completes midway. The path is as fast as before.
    const uint64_t msg = 15 * kX;
    int changes = 0;
    double lowest = 1e18;
    for (int i = 0; i < 40; ++i) {
        changes += busy_period(d, 30, {30, 30}, msg, &judged);
        lowest = std::min(lowest, judged);
        changes += busy_period(d, 30, {15, 30}, msg, &judged);
        lowest = std::min(lowest, judged);
    }
    CHECK(changes == 0);
    CHECK_FALSE(d.degraded());
    CHECK(lowest >= 0.9e9); // without the tail: about 0.5e9, flagged within two periods
    // Two completions per span are lumps (1.3-1.8e9 here, the settle windows' busy time left
    // out): judged, but not learned, so the baseline stays near what the stream taught it
    // (the first spans still hold the stream's completions).
    CHECK(d.baseline() < 1.05e9);
    // The same periods on a path at a quarter of the rate are flagged.
    int flagged = 0;
    for (int i = 0; i < 10 && flagged == 0; ++i) {
        flagged = busy_period(d, 120, {120, 120}, msg, &judged);
        if (flagged == 0) flagged = busy_period(d, 120, {60, 120}, msg, &judged);
    }
    CHECK(d.degraded());
    CHECK(judged < 0.5 * d.baseline());
}

TEST_CASE("detector: one stall nobody reported drags one span down, not a verdict", "[telemetry]")
{
    // The kernel's own network processing, held up on a saturated host, delays data before any
    // socket timestamps it: no end point reports that wait. One such stall, up to about a span
    // long, leaves the aggregate below the threshold for less than a span.
    DetectorConfig cfg;
    cfg.k = 32;
    cfg.fraction = 0.7;
    DegradeDetector d(cfg);
    REQUIRE(feed_until(d, win(kX), 1, 100) == 0);
    WindowRecord stall = win(0);
    stall.ops = 0;
    for (const int len : {12, 20, 32}) {
        INFO("an unreported stall of " << len << " windows");
        CHECK(feed_until(d, stall, 1, len) == 0);
        CHECK(d.feed(win(kX)) == 0);
        CHECK(d.judged() < cfg.fraction * d.baseline()); // it does look slow for a while ...
        CHECK(feed_until(d, win(kX), 1, 3 * cfg.k) == 0); // ... but not for a span
        CHECK_FALSE(d.degraded());
    }
    // A path that stays slow is flagged once that has lasted a span.
    const int f = feed_until(d, win(kX / 2), 1, 4 * cfg.k);
    CHECK(f > cfg.k);
    CHECK(f <= 2 * cfg.k + 2);
}

TEST_CASE("detector: no verdict while a stall may still be reported", "[telemetry]")
{
    DetectorConfig cfg;
    cfg.k = 8;
    cfg.settle = 0; // the idle window below would start a busy period that settles
    DegradeDetector d(cfg), control(cfg);
    REQUIRE(feed_until(d, win(kX), 1, 100) == 0);
    REQUIRE(feed_until(control, win(kX), 1, 100) == 0);
    // 50 busy windows in which nothing completes: however slow that looks, no verdict yet.
    WindowRecord stall = win(0);
    stall.ops = 0;
    CHECK(feed_until(d, stall, 1, 50) == 0);
    CHECK(feed_until(control, stall, 1, 50) == 0);
    CHECK(d.judged() == 0);
    // The completion comes with the wait that explains the stall: nothing to flag ...
    WindowRecord done = win(kX);
    done.wait_us = 51'000;
    CHECK(d.feed(done) == 0);
    CHECK_FALSE(d.degraded());
    // ... without it, a path that took 51 windows for one window's bytes is slow (and is
    // flagged once that has lasted a span).
    CHECK(control.feed(win(kX)) == 0);
    CHECK(control.judged() < 0.2 * control.baseline());
    CHECK(feed_until(control, win(kX / 10), 1, 2 * cfg.k) > 0);
    // A wait reported by a window that is itself no evidence (mostly idle) still belongs to
    // the loaded windows before it.
    CHECK(feed_until(d, stall, 1, 20) == 0);
    WindowRecord tail = win(kX, kW / 10); // the completion, then idle: not loaded
    tail.wait_us = static_cast<uint32_t>(20'000 + kW / 10 / 1000);
    CHECK(d.feed(tail) == 0);
    CHECK(d.feed(win(kX)) == 0);
    CHECK_FALSE(d.degraded());
    CHECK(d.judged() > 0.9e9);
}

TEST_CASE("detector: the link speed caps the baseline", "[telemetry]")
{
    DetectorConfig capped;
    capped.link_bytes_per_s = 0.4e9; // below the measured 1 GB/s
    DegradeDetector d(capped), control(DetectorConfig{});
    bool over = false;
    for (int i = 0; i < 200; ++i) {
        REQUIRE(d.feed(win(kX)) == 0);
        control.feed(win(kX));
        over = over || d.baseline() > capped.link_bytes_per_s;
    }
    CHECK_FALSE(over);
    CHECK(d.baseline() == capped.link_bytes_per_s);
    CHECK(control.baseline() == Approx(1e9));
    // 0.3 GB/s is below half the measured rate but not below half the link: not degraded.
    CHECK(feed_until(d, win(3 * kX / 10), 1, 50) == 0);
    CHECK(feed_until(control, win(3 * kX / 10), 1, 50) > 0);
    CHECK(d.baseline() <= capped.link_bytes_per_s);
    // 0.1 GB/s is below half the link.
    const int f = feed_until(d, win(kX / 10), 1, 3 * capped.k);
    CHECK(f >= 1);
    CHECK(f <= 2 * capped.k + 2);
    CHECK(d.degraded());
}

// =========================================================================================
// Registry: rings, versioning, stale segments
// =========================================================================================

TEST_CASE("registry: this process's segment and its identity", "[telemetry]")
{
    vt::Registry &r = registry();
    // vigil-<uid>-<pid>-<16 hex>: the random suffix separates pid namespaces.
    const std::string pre = "/dev/shm/vigil-" + std::to_string(getuid()) + "-" + std::to_string(getpid()) + "-";
    REQUIRE(r.path().rfind(pre, 0) == 0);
    CHECK(r.path().size() == pre.size() + 16);
    struct stat st;
    REQUIRE(stat(r.path().c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    CHECK(static_cast<size_t>(st.st_size) == vt::registry_bytes(vt::kMaxRegistryPaths));
    const auto regs = vt::list_registries();
    CHECK(std::find(regs.begin(), regs.end(), r.path()) != regs.end());

    RegistryView v;
    std::string why;
    REQUIRE(v.open(r.path(), &why) == 0);
    const RegistryHeader &h = v.header();
    CHECK(std::memcmp(h.magic, vt::kRegistryMagic, 8) == 0);
    CHECK(h.version == vt::kRegistryVersion);
    CHECK(h.pid == getpid());
    CHECK(h.window_ns == r.window_ns());
    CHECK(h.record_size == sizeof(WindowRecord));

    Acquired a;
    REQUIRE(a.e != nullptr);
    const PathEntry *e = find_entry(v, a.conn_id);
    REQUIRE(e != nullptr);
    CHECK(e->kind == 1);
    CHECK(e->slot == 0);
    CHECK(e->dev == 2);
    CHECK(std::string(e->dev_name) == "eth9");
    CHECK(std::string(e->local) == "10.9.0.1:4000");
    CHECK(std::string(e->peer) == "10.9.0.2:5000");
    CHECK(e->state.load() == vt::kActive);
    CHECK(e->ring.capacity == kRingCapacity);
    CHECK(e->ring.head.load() == 0);
    CHECK(v.entries() >= 1);

    // A released entry is handed out again, reset.
    for (int i = 0; i < 5; ++i) vt::ring_push(*a.e, rec_for(static_cast<uint64_t>(i)));
    PathEntry *old = a.e;
    vt::Registry::instance().release(a.e);
    CHECK(e->in_use.load() == 0);
    CHECK(e->state.load() == vt::kUnused);
    a.e = vt::Registry::instance().acquire(0, 1, 0, "x", "l", "p", a.conn_id);
    CHECK(a.e == old);
    CHECK(e->ring.head.load() == 0);
    CHECK(e->total_ops.load() == 0);
}

TEST_CASE("ring: without a consumer the newest windows overwrite the oldest", "[telemetry]")
{
    vt::Registry &r = registry();
    RegistryView v;
    std::string why;
    REQUIRE(v.open(r.path(), &why) == 0);

    SECTION("before wrapping every published window is readable")
    {
        Acquired a;
        REQUIRE(a.e != nullptr);
        const PathEntry *e = find_entry(v, a.conn_id);
        REQUIRE(e != nullptr);
        for (uint64_t i = 0; i < 10; ++i) vt::ring_push(*a.e, rec_for(i));
        CHECK(e->ring.head.load() == 10);
        CHECK(unreadable(*e, 0, 10).empty());
        CHECK(readable(*e, 10, 20).empty()); // not published yet
    }
    SECTION("after wrapping")
    {
        Acquired a;
        REQUIRE(a.e != nullptr);
        const PathEntry *e = find_entry(v, a.conn_id);
        REQUIRE(e != nullptr);
        const uint64_t n = kRingCapacity + 100;
        uint64_t bytes = 0, ops = 0;
        for (uint64_t i = 0; i < n; ++i) {
            const WindowRecord w = rec_for(i);
            vt::ring_push(*a.e, w);
            bytes += w.bytes;
            ops += w.ops;
        }
        CHECK(e->ring.head.load() == n);
        CHECK(e->ring.dropped.load() == 0);
        CHECK(e->total_bytes.load() == bytes);
        CHECK(e->total_ops.load() == ops);
        CHECK(e->degraded.load() == rec_for(n - 1).degraded);
        CHECK(e->generation.load() == rec_for(n - 1).generation);
        // The newest windows are intact. (Index n - capacity shares its slot with the next
        // push and may be being rewritten, so a peeking reader is allowed to refuse it.)
        CHECK(unreadable(*e, n - kRingCapacity + 1, n).empty());
        // Overwritten and unpublished indices are refused.
        CHECK(readable(*e, 0, n - kRingCapacity).empty());
        CHECK(readable(*e, n, n + 10).empty());
    }
}

TEST_CASE("ring: a torn or stale slot is refused", "[telemetry]")
{
    auto e = std::make_unique<PathEntry>();
    e->ring.capacity = kRingCapacity;
    for (uint64_t i = 0; i < 10; ++i) vt::ring_push(*e, rec_for(i));
    WindowRecord w;
    REQUIRE(RegistryView::read(*e, 3, &w));
    CHECK(matches(w, 3));
    e->records[3].reserved[0] = 3 + kRingCapacity; // the slot now claims another ring index
    CHECK_FALSE(RegistryView::read(*e, 3, &w));
    CHECK(RegistryView::read(*e, 4, &w));

    // Under a concurrent producer every accepted read is one whole record.
    vt::Registry &r = registry();
    RegistryView v;
    std::string why;
    REQUIRE(v.open(r.path(), &why) == 0);
    Acquired a;
    REQUIRE(a.e != nullptr);
    const PathEntry *re = find_entry(v, a.conn_id);
    REQUIRE(re != nullptr);
    std::atomic<bool> done{false};
    PathEntry *we = a.e;
    std::thread producer([&] {
        for (uint64_t i = 0; i < 3'000'000; ++i) vt::ring_push(*we, rec_for(i));
        done.store(true);
    });
    uint64_t accepted = 0, torn = 0, tries = 0;
    std::mt19937_64 rng(5);
    while (!done.load()) {
        const uint64_t head = re->ring.head.load(std::memory_order_acquire);
        if (head < kRingCapacity) continue;
        // Mostly the oldest few, where the producer overwrites.
        const uint64_t off = (tries++ % 4 == 0) ? std::uniform_int_distribution<uint64_t>(0, kRingCapacity - 1)(rng)
                                                : std::uniform_int_distribution<uint64_t>(0, 3)(rng);
        const uint64_t k = head - kRingCapacity + off;
        if (RegistryView::read(*re, k, &w)) {
            ++accepted;
            if (!matches(w, k)) ++torn;
        }
    }
    producer.join();
    INFO(accepted << " reads accepted of " << tries);
    CHECK(torn == 0);
    CHECK(accepted > 0);
}

TEST_CASE("ring: a live consumer makes the producer drop; a dead one is cleared", "[telemetry]")
{
    vt::Registry &r = registry();
    RegistryView v;
    std::string why;
    REQUIRE(v.open(r.path(), &why) == 0);
    Acquired a;
    REQUIRE(a.e != nullptr);
    const PathEntry *e = find_entry(v, a.conn_id);
    REQUIRE(e != nullptr);

    a.e->ring.consumer_pid.store(static_cast<uint32_t>(getpid()));
    a.e->ring.tail.store(0);
    uint64_t next = 0; // content index of the next record pushed
    for (; next < kRingCapacity + 50; ++next) vt::ring_push(*a.e, rec_for(next));
    CHECK(e->ring.head.load() == kRingCapacity); // full: the last 50 were not published
    CHECK(e->ring.dropped.load() == 50);
    CHECK(e->ring.consumer_pid.load() == static_cast<uint32_t>(getpid()));
    CHECK(matches(a.e->records[0], 0)); // the oldest was not overwritten
    CHECK(unreadable(*e, 1, kRingCapacity).empty());

    // The consumer takes 100 windows: room for exactly 100 more.
    a.e->ring.tail.store(100);
    for (int i = 0; i < 100; ++i) vt::ring_push(*a.e, rec_for(next++));
    CHECK(e->ring.head.load() == kRingCapacity + 100);
    CHECK(e->ring.dropped.load() == 50);
    CHECK(unreadable(*e, kRingCapacity, kRingCapacity + 100, 50).empty()); // ring index k holds k + 50
    CHECK(unreadable(*e, 101, kRingCapacity).empty());
    vt::ring_push(*a.e, rec_for(next++));
    CHECK(e->ring.head.load() == kRingCapacity + 100);
    CHECK(e->ring.dropped.load() == 51);

    // The consumer is gone: the producer clears it and overwrites again.
    const int dead = dead_pid();
    a.e->ring.consumer_pid.store(static_cast<uint32_t>(dead));
    const uint64_t off = next - (kRingCapacity + 100); // content index - ring index from here on
    vt::ring_push(*a.e, rec_for(next++));
    CHECK(e->ring.consumer_pid.load() == 0);
    CHECK(e->ring.head.load() == kRingCapacity + 101);
    CHECK(e->ring.dropped.load() == 51);
    for (uint32_t i = 0; i < kRingCapacity; ++i) vt::ring_push(*a.e, rec_for(next++));
    const uint64_t head = 2 * kRingCapacity + 101;
    CHECK(e->ring.head.load() == head);
    CHECK(e->ring.dropped.load() == 51);
    CHECK(unreadable(*e, head - kRingCapacity + 1, head, off).empty());

    // The same with a pid that cannot exist.
    if (!vt::pid_alive(4194303)) {
        a.e->ring.consumer_pid.store(4194303);
        a.e->ring.tail.store(head - kRingCapacity); // full
        vt::ring_push(*a.e, rec_for(next++));
        CHECK(e->ring.consumer_pid.load() == 0);
        CHECK(e->ring.head.load() == head + 1);
        CHECK(e->ring.dropped.load() == 51);
    }
}

// BUG (registry.cc, RegistryView::read): the post-copy check `after < index + cap` refuses
// index == head - cap even when head has not moved, so the oldest window of a full ring is
// never readable. Without a consumer that is defensible (the next push rewrites that slot),
// but with a live consumer that has not taken it, ring_push drops instead of overwriting,
// the slot is intact, and read() still refuses it: a consumer reading from `tail` can never
// read its first window once the ring is full (and the pre-check `head - index > cap`
// shows the oldest was meant to be readable). With no consumer, readers get capacity - 1
// windows. (Regression test: fixed by treating a consumer-held slot as intact.)
TEST_CASE("ring: a full ring held by a live consumer keeps its oldest window readable", "[telemetry]")
{
    vt::Registry &r = registry();
    RegistryView v;
    std::string why;
    REQUIRE(v.open(r.path(), &why) == 0);
    Acquired a;
    REQUIRE(a.e != nullptr);
    const PathEntry *e = find_entry(v, a.conn_id);
    REQUIRE(e != nullptr);
    a.e->ring.consumer_pid.store(static_cast<uint32_t>(getpid()));
    a.e->ring.tail.store(0);
    for (uint64_t i = 0; i < kRingCapacity + 5; ++i) vt::ring_push(*a.e, rec_for(i));
    REQUIRE(e->ring.head.load() == kRingCapacity);
    REQUIRE(matches(a.e->records[0], 0)); // intact in memory, not being overwritten
    CHECK(unreadable(*e, 0, kRingCapacity).empty());
}

TEST_CASE("registry: RegistryView::open refuses segments of another layout", "[telemetry]")
{
    vt::Registry &r = registry();
    const std::vector<char> image = slurp(r.path());
    REQUIRE(image.size() == vt::registry_bytes(vt::kMaxRegistryPaths));
    const std::string copy = "/dev/shm/vigil-test-" + std::to_string(getpid()) + "-copy";

    struct Case {
        const char *what;
        std::function<void(std::vector<char> &)> patch;
        size_t size;
        int rc;
    };
    const size_t full = image.size();
    const std::vector<Case> cases = {
        {"intact", [](std::vector<char> &) {}, full, 0},
        {"bad magic", [](std::vector<char> &b) { b[offsetof(RegistryHeader, magic)] = 'X'; }, full, -EBADMSG},
        {"magic of another version",
         [](std::vector<char> &b) { b[offsetof(RegistryHeader, magic) + 7] = '2'; }, full, -EBADMSG},
        {"newer version",
         [](std::vector<char> &b) { poke(b, offsetof(RegistryHeader, version), vt::kRegistryVersion + 1); }, full,
         -EBADMSG},
        {"version 0", [](std::vector<char> &b) { poke(b, offsetof(RegistryHeader, version), uint32_t{0}); }, full,
         -EBADMSG},
        {"header_size",
         [](std::vector<char> &b) { poke(b, offsetof(RegistryHeader, header_size), uint32_t{2048}); }, full,
         -EBADMSG},
        {"entry_size",
         [](std::vector<char> &b) {
             poke(b, offsetof(RegistryHeader, entry_size), static_cast<uint32_t>(sizeof(PathEntry) + 8));
         },
         full, -EBADMSG},
        {"record_size",
         [](std::vector<char> &b) { poke(b, offsetof(RegistryHeader, record_size), uint32_t{64}); }, full,
         -EBADMSG},
        {"ring_capacity",
         [](std::vector<char> &b) { poke(b, offsetof(RegistryHeader, ring_capacity), kRingCapacity / 2); }, full,
         -EBADMSG},
        {"max_paths 0", [](std::vector<char> &b) { poke(b, offsetof(RegistryHeader, max_paths), uint32_t{0}); },
         full, -EBADMSG},
        {"max_paths too large",
         [](std::vector<char> &b) { poke(b, offsetof(RegistryHeader, max_paths), vt::kMaxRegistryPaths + 1); }, full,
         -EBADMSG},
        {"empty file", [](std::vector<char> &) {}, 0, -EBADMSG},
        {"shorter than a header", [](std::vector<char> &) {}, sizeof(RegistryHeader) - 1, -EBADMSG},
        {"just the header", [](std::vector<char> &) {}, sizeof(RegistryHeader), -EBADMSG},
        {"last entry cut", [](std::vector<char> &) {}, full - 1, -EBADMSG},
        {"fewer paths, sized to match",
         [](std::vector<char> &b) { poke(b, offsetof(RegistryHeader, max_paths), uint32_t{1}); },
         vt::registry_bytes(1), 0},
    };
    for (const Case &c : cases) {
        INFO(c.what);
        std::vector<char> buf = image;
        c.patch(buf);
        spit(copy, buf, c.size);
        {
            RegistryView v;
            std::string why;
            const int rc = v.open(copy, &why);
            INFO("reason: " << why);
            CHECK(rc == c.rc);
            if (c.rc != 0) CHECK_FALSE(why.empty());
            if (rc == 0) {
                CHECK(v.header().pid == getpid());
                CHECK(v.entries() <= v.header().max_paths);
            }
        }
        CHECK(unlink(copy.c_str()) == 0);
    }
    RegistryView v;
    std::string why;
    CHECK(v.open(copy, &why) == -ENOENT);
    CHECK_FALSE(why.empty());
}

TEST_CASE("registry: reap_stale removes segments nobody holds, and only segments", "[telemetry]")
{
    // Liveness is the owner's shared flock (pids do not identify processes across pid
    // namespaces): a segment whose lock is free is stale.
    vt::Registry &r = registry();
    const std::string pre = "/dev/shm/vigil-" + std::to_string(getuid()) + "-";
    const std::string stale = pre + std::to_string(dead_pid()) + "-0123456789abcdef";
    const std::string held = pre + "1-fedcba9876543210";
    const std::string other = pre + "not-a-segment";
    std::vector<char> junk(4096, 'v');
    spit(stale, junk, junk.size());
    spit(held, junk, junk.size());
    spit(other, junk, junk.size());
    const std::string young = pre + std::to_string(dead_pid()) + "-00000000000000aa";
    spit(young, junk, junk.size()); // just created, not locked yet by its owner: kept
    const timespec old[2] = {{time(nullptr) - 60, 0}, {time(nullptr) - 60, 0}};
    for (const std::string *f : {&stale, &held, &other}) REQUIRE(utimensat(AT_FDCWD, f->c_str(), old, 0) == 0);
    const int hold = open(held.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(hold >= 0);
    REQUIRE(flock(hold, LOCK_SH) == 0); // as a live owner does
    auto listed = vt::list_registries();
    CHECK(std::find(listed.begin(), listed.end(), stale) != listed.end());
    CHECK(std::find(listed.begin(), listed.end(), other) == listed.end());

    CHECK(vt::reap_stale() >= 1);
    CHECK_FALSE(file_exists(stale));
    CHECK(file_exists(young));
    CHECK(file_exists(held));
    CHECK(file_exists(other));
    CHECK(file_exists(r.path())); // our own segment: we hold its lock
    listed = vt::list_registries();
    CHECK(std::find(listed.begin(), listed.end(), r.path()) != listed.end());
    close(hold);
    CHECK(vt::reap_stale() >= 1); // released: now stale
    CHECK_FALSE(file_exists(held));
    CHECK(vt::pid_alive(getpid()));
    CHECK_FALSE(vt::pid_alive(0));
    CHECK_FALSE(vt::pid_alive(-1));
    unlink(other.c_str());
    unlink(stale.c_str());
    unlink(held.c_str());
    unlink(young.c_str());
}

TEST_CASE("detector: windows the receiving application held back never count", "[telemetry]")
{
    // The receiver reports (bit 31 of its ack's generation) that data waits for a receive it
    // has not posted: the path is not to blame for that time.
    vt::DetectorConfig cfg;
    cfg.k = 4;
    cfg.warmup = 4;
    vt::DegradeDetector d(cfg);
    auto window = [](uint64_t bytes, bool receiver_bound) {
        vt::WindowRecord w{};
        w.window_us = 1000;
        w.busy_ns = 1'000'000;
        w.bytes = bytes;
        w.ops = 1;
        w.avg_queued_bytes = 1 << 20;
        w.receiver_bound = receiver_bound ? 1 : 0;
        return w;
    };
    for (int i = 0; i < 20; ++i) CHECK(d.feed(window(1'000'000, false)) == 0); // 1 GB/s
    for (int i = 0; i < 50; ++i) CHECK(d.feed(window(10'000, true)) == 0);     // app-bound, slow
    CHECK_FALSE(d.degraded());
    int flagged_at = -1;
    for (int i = 0; i < 20 && flagged_at < 0; ++i)
        if (d.feed(window(10'000, false)) == 1) flagged_at = i; // the path itself slow
    CHECK(flagged_at >= 0);
}

TEST_CASE("meter: a receiver-bound report marks the window and the detector skips it", "[telemetry]")
{
    struct Sink : vt::WindowSink {
        std::vector<vt::WindowRecord> w;
        void push(const vt::WindowRecord &r) noexcept override { w.push_back(r); }
        void verdict(bool, const vt::WindowRecord &) noexcept override {}
    } sink;
    vt::PathMeter m(1'000'000, &sink);
    m.on_post(1'000'000'000, 4096);
    m.set_receiver_bound(1'000'100'000, true);
    m.on_complete(1'000'200'000, 1'000'000'000, 4096);
    m.advance(1'001'000'000); // closes the first window
    m.on_post(1'001'100'000, 4096);
    m.set_receiver_bound(1'001'200'000, false); // bound at this window's start: still marked
    m.on_complete(1'001'300'000, 1'001'100'000, 4096);
    m.advance(1'002'000'000);
    m.on_post(1'002'100'000, 4096); // a window with no receiver-bound time at all
    m.on_complete(1'002'300'000, 1'002'100'000, 4096);
    m.advance(1'003'000'000);
    REQUIRE(sink.w.size() == 3);
    CHECK(sink.w[0].receiver_bound == 1);
    CHECK(sink.w[1].receiver_bound == 1);
    CHECK(sink.w[2].receiver_bound == 0);
}

TEST_CASE("meter: wait time lands in the window of its report", "[telemetry]")
{
    RecordingSink s;
    PathMeter m(kW, &s);
    m.on_post(kT + 100'000, 4096);
    m.on_complete(kT + 200'000, kT + 100'000, 4096);
    m.on_wait(kT + 200'000, 150'000);
    m.on_wait(kT + 300'000, 2'500'000); // more than the window: the detector's to place
    m.advance(kT + kW);
    m.on_wait(kT + kW + 10, 7'000); // a window with nothing but a wait report is emitted
    m.advance(kT + 2 * kW);
    REQUIRE(s.windows.size() == 2);
    CHECK(s.windows[0].wait_us == 2'650);
    CHECK(s.windows[1].wait_us == 7);
    CHECK(s.windows[1].ops == 0);
}

// =========================================================================================
// Wait time over real TCP: kernel receive timestamps, the ack delay, the comm's drain rule
// =========================================================================================

namespace {

namespace vn = vigil::net;
namespace vtcp = vigil::net::tcp;

// A connected pair of non-blocking TCP sockets over loopback: [0] connects, [1] accepted.
std::array<vigil::net::UniqueFd, 2> tcp_pair()
{
    vigil::net::UniqueFd l(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(l.get() >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    REQUIRE(bind(l.get(), reinterpret_cast<sockaddr *>(&a), len) == 0);
    REQUIRE(listen(l.get(), 1) == 0);
    REQUIRE(getsockname(l.get(), reinterpret_cast<sockaddr *>(&a), &len) == 0);
    vigil::net::UniqueFd c(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(connect(c.get(), reinterpret_cast<sockaddr *>(&a), len) == 0);
    vigil::net::UniqueFd s(accept4(l.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    REQUIRE(s.get() >= 0);
    REQUIRE(fcntl(c.get(), F_SETFL, fcntl(c.get(), F_GETFL) | O_NONBLOCK) == 0);
    const int one = 1;
    for (int fd : {c.get(), s.get()}) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return {std::move(c), std::move(s)};
}

// The two halves of one TCP path with `n` streams over loopback.
struct TcpPath {
    std::unique_ptr<vtcp::TcpSendPath> send;
    std::unique_ptr<vtcp::TcpRecvPath> recv;
    explicit TcpPath(int n)
    {
        std::vector<vigil::net::UniqueFd> a, b;
        for (int i = 0; i < n; ++i) {
            auto p = tcp_pair();
            a.push_back(std::move(p[0]));
            b.push_back(std::move(p[1]));
        }
        vn::PathIdentity id;
        id.id = 77;
        id.dev = 0;
        id.dev_name = "lo";
        send = std::make_unique<vtcp::TcpSendPath>(std::move(a), id, 64 * 1024);
        recv = std::make_unique<vtcp::TcpRecvPath>(std::move(b), id);
        rx_timestamps_on();
    }
    // The kernel turns receive timestamps on for the first socket that asks through a
    // deferred work item (segments that arrive before it ran carry none), and off again with
    // the last one: keep a socket that asks open for the whole test process, and wait until
    // its segments come stamped.
    static void rx_timestamps_on()
    {
        static const bool on = [] {
            static std::array<vigil::net::UniqueFd, 2> keep = tcp_pair();
            const int one = 1;
            REQUIRE(setsockopt(keep[1].get(), SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)) == 0);
            for (int i = 0; i < 5000; ++i) {
                const char c = 'x';
                REQUIRE(::send(keep[0].get(), &c, 1, 0) == 1);
                char b[16];
                alignas(cmsghdr) char ctl[64];
                iovec iov{b, sizeof(b)};
                msghdr m{};
                m.msg_iov = &iov;
                m.msg_iovlen = 1;
                m.msg_control = ctl;
                m.msg_controllen = sizeof(ctl);
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
                if (recvmsg(keep[1].get(), &m, MSG_DONTWAIT) > 0 && CMSG_FIRSTHDR(&m) != nullptr)
                    return true;
            }
            return false;
        }();
        REQUIRE(on);
    }
};

// Receives whole messages into one buffer and acks each at once (what RecvComm does).
struct AckingSink final : vn::RecvSink {
    vn::RecvPath *path = nullptr;
    std::vector<uint8_t> buf = std::vector<uint8_t>(1 << 20);
    std::map<uint64_t, uint64_t> got; // seq -> bytes landed
    std::map<uint64_t, uint64_t> size;
    uint64_t floor = 0;
    vn::Placement locate(uint32_t, uint64_t seq, int32_t, uint64_t sz, int) override
    {
        size[seq] = sz;
        return vn::Placement{vn::Placement::kPlace, buf.data(), 0};
    }
    bool still_wanted(uint32_t, uint64_t) override { return true; }
    int landed(uint64_t seq, uint64_t len, uint32_t gen) override
    {
        got[seq] += len;
        while (got.count(floor) != 0 && got[floor] == size[floor]) ++floor;
        path->ack(floor, gen);
        return 0;
    }
    void generation(uint32_t, uint64_t, int, uint64_t) override {}
    int whole(uint32_t, uint64_t, int32_t, uint64_t, int) override { return -EPROTO; } // TCP: none
    int whole_short(uint32_t, uint64_t, int, uint64_t, int) override { return -EPROTO; }
};

struct AckSink final : vn::SendSink {
    uint64_t newest = 0;
    void acked(uint64_t seq) override { newest = std::max(newest, seq); }
    void held(uint64_t) override {}
    int cts(const vn::CtsGroup &) override { return 0; }
};

vn::OutMessage message(uint64_t seq, const uint8_t *data, size_t size)
{
    vn::OutMessage m;
    m.seq = seq;
    m.tag = 1;
    m.data = data;
    m.size = size;
    m.dest.size = size;
    return m;
}

void sleep_ms(int ms)
{
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

constexpr uint64_t kMsNs = 1'000'000;

} // namespace

TEST_CASE("tcp path: acks carry how long the data waited for its reader", "[telemetry][wait]")
{
    TcpPath p(2);
    AckingSink rs;
    rs.path = p.recv.get();
    AckSink ss;
    const std::vector<uint8_t> data(8192, 0x5a); // fits the socket buffers: written at once

    p.send->post(message(0, data.data(), data.size()));
    REQUIRE(p.send->progress(ss).error == 0);
    REQUIRE(p.send->idle());
    sleep_ms(60); // the data waits in the receiver's socket
    REQUIRE(p.recv->progress(rs).error == 0);
    REQUIRE(rs.floor == 1);
    sleep_ms(40); // the ack waits in the sender's socket
    vn::PathStatus st = p.send->progress(ss);
    REQUIRE(st.error == 0);
    CHECK(ss.newest == 1);
    CHECK(st.wait_ack == 1);
    INFO("wait " << st.wait_ns / 1e6 << " ms");
    CHECK(st.wait_ns >= 100 * kMsNs); // both waits, measured by the kernel's timestamps
    CHECK(st.wait_ns < 100 * kMsNs + 2000 * kMsNs);

    // A heartbeat repeats the ack without its delay: its own unread time only.
    p.recv->heartbeat();
    REQUIRE(p.recv->progress(rs).error == 0);
    st = p.send->progress(ss);
    CHECK(st.wait_ack == 1);
    CHECK(st.wait_ns < 60 * kMsNs);

    // A probe that waited does not date the ack of data that did not.
    p.send->probe();
    sleep_ms(60);
    p.send->post(message(1, data.data(), data.size()));
    REQUIRE(p.send->progress(ss).error == 0);
    REQUIRE(p.recv->progress(rs).error == 0);
    REQUIRE(rs.floor == 2);
    st = p.send->progress(ss);
    CHECK(st.wait_ack == 2);
    CHECK(st.wait_ns < 60 * kMsNs);
}

namespace {

// Sum of wait_us over every window the registry holds for the send path of `comm`.
uint64_t charged_wait_us(const vn::SendComm *comm)
{
    RegistryView v;
    std::string why;
    REQUIRE(v.open(vt::Registry::instance().path(), &why) == 0);
    const PathEntry *e = find_entry(v, reinterpret_cast<uintptr_t>(comm));
    REQUIRE(e != nullptr);
    uint64_t sum = 0;
    const uint64_t head = e->ring.head.load();
    for (uint64_t k = head > kRingCapacity ? head - kRingCapacity : 0; k < head; ++k) {
        WindowRecord w;
        if (RegistryView::read(*e, k, &w)) sum += w.wait_us;
    }
    return sum;
}

// A sendComm and recvComm over one TCP loopback path, telemetry on (1 ms windows).
struct TcpConn {
    std::unique_ptr<vn::SendComm> send;
    std::unique_ptr<vn::RecvComm> recv;
    TcpConn()
    {
        registry();
        TcpPath p(1);
        vn::SendPaths sp;
        vn::RecvPaths rp;
        sp.paths[vn::kPrimary] = std::move(p.send);
        rp.paths[vn::kPrimary] = std::move(p.recv);
        rp.devs = {{0, -1}};
        vn::TelemetryConfig tc;
        tc.window_ns = kW;
        send = std::make_unique<vn::SendComm>(std::move(sp), rp.devs, vn::FailoverConfig{}, tc);
        const std::array<int, vn::kMaxPaths> devs{{0, -1}};
        recv = std::make_unique<vn::RecvComm>(std::move(rp), devs, vn::FailoverConfig{}, tc);
    }
    vn::Request *post_recv(std::vector<uint8_t> &buf)
    {
        void *d = buf.data();
        const size_t sz = buf.size();
        const int tag = 1;
        vn::MemRegion *mr = nullptr;
        vn::Request *r = nullptr;
        REQUIRE(recv->irecv(1, &d, &sz, &tag, &mr, &r) == 0);
        REQUIRE(r != nullptr);
        return r;
    }
    vn::Request *post_send(const std::vector<uint8_t> &buf)
    {
        vn::Request *r = nullptr;
        for (int i = 0; i < 1000 && r == nullptr; ++i) {
            REQUIRE(send->isend(buf.data(), buf.size(), 1, nullptr, &r) == 0);
            if (r == nullptr) sleep_ms(1);
        }
        REQUIRE(r != nullptr);
        return r;
    }
    static void wait_done(vn::Comm &c, vn::Request *r)
    {
        int done = 0;
        for (int i = 0; i < 5000 && done == 0; ++i) {
            REQUIRE(c.test(r, &done, nullptr) == 0);
            if (done == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        REQUIRE(done == 1);
    }
    // Lets the send path's windows close: progress a little later (isend of an unmatched tag).
    void close_windows()
    {
        sleep_ms(3);
        vn::Request *r = nullptr;
        std::vector<uint8_t> none(1);
        REQUIRE(send->isend(none.data(), none.size(), 9, nullptr, &r) == 0);
        REQUIRE(r == nullptr);
    }
};

} // namespace

TEST_CASE("send comm: the end points' wait reported with an ack counts, whatever else is in flight",
          "[telemetry][wait]")
{
    std::vector<uint8_t> data(8192, 0x33), in1(8192), in2(8192);
    SECTION("the ack of the last message in flight: charged")
    {
        TcpConn c;
        vn::Request *rr = c.post_recv(in1);
        vn::Request *sr = c.post_send(data);
        sleep_ms(100); // nothing reads the data
        TcpConn::wait_done(*c.recv, rr);
        TcpConn::wait_done(*c.send, sr);
        c.close_windows();
        const uint64_t w = charged_wait_us(c.send.get());
        INFO("charged " << w << " us");
        CHECK(w >= 100'000);
        CHECK(w < 100'000 + 2'000'000);
    }
    SECTION("an ack read while another message is in flight: charged too (a reader that does not "
            "run stalls the path however much is queued)")
    {
        TcpConn c;
        vn::Request *rr1 = c.post_recv(in1);
        vn::Request *rr2 = c.post_recv(in2);
        vn::Request *sr1 = c.post_send(data);
        sleep_ms(100);
        TcpConn::wait_done(*c.recv, rr1); // acks message 0 with a 100 ms delay ...
        vn::Request *sr2 = c.post_send(data); // ... read when message 1 is already posted
        TcpConn::wait_done(*c.send, sr1);
        TcpConn::wait_done(*c.recv, rr2);
        TcpConn::wait_done(*c.send, sr2);
        c.close_windows();
        const uint64_t w = charged_wait_us(c.send.get());
        INFO("charged " << w << " us");
        CHECK(w >= 100'000);
        CHECK(w < 100'000 + 2'000'000);
    }
    SECTION("acks read at once: nothing charged")
    {
        TcpConn c;
        for (int i = 0; i < 4; ++i) {
            vn::Request *rr = c.post_recv(in1);
            vn::Request *sr = c.post_send(data);
            TcpConn::wait_done(*c.recv, rr);
            TcpConn::wait_done(*c.send, sr);
        }
        c.close_windows();
        const uint64_t w = charged_wait_us(c.send.get());
        INFO("charged " << w << " us");
        CHECK(w < 50'000);
    }
}
