// SPDX-License-Identifier: Apache-2.0
// Telemetry (common/telemetry): the shared-memory registry: ring overwrite and consumer modes,
// torn-read refusal, segment validation (RegistryView::open) and reaping of segments whose
// process is gone. The tests use this process's real segment (/dev/shm/vigil-<uid>-<pid>,
// unique per test process).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "telemetry/health.h"
#include "telemetry/registry.h"
#include "telemetry/window.h"
#include "telemetry_support.h"

using vt::kRingCapacity;
using vt::PathEntry;
using vt::RegistryHeader;
using vt::RegistryView;
using vt::WindowRecord;

namespace {

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

TEST_CASE("health: two active send paths of one connection mean multipath, and the fraction "
          "left is the mean of the devices'",
          "[telemetry][multipath]")
{
    vt::Registry &r = registry();
    const uint64_t conn = next_conn_id();
    PathEntry *a = r.acquire(0, 0, 0, "eth0", "10.9.0.1:4000", "10.9.0.2:5000", conn);
    PathEntry *b = r.acquire(0, 1, 1, "eth1", "10.9.1.1:4000", "10.9.1.2:5000", conn);
    REQUIRE(a != nullptr);
    REQUIRE(b != nullptr);
    RegistryView v;
    std::string why;
    REQUIRE(v.open(r.path(), &why) == 0);
    a->state.store(vt::kActive);
    b->state.store(vt::kStandby); // a hot standby
    CHECK_FALSE(vt::read_health(v).multipath);
    b->state.store(vt::kActive); // the backup shares
    CHECK(vt::read_health(v).multipath);
    r.release(a);
    r.release(b);

    // A degraded path's fraction is the detector's evidence when it flagged the path, not the
    // newest window: a few pieces carried at the burst rate after the verdict must not read as
    // a whole port. From a writer that does not keep the evidence, the median of its flagged
    // windows still in the ring.
    {
        PathEntry *c = r.acquire(0, 0, 0, "eth0", "10.9.0.1:4001", "10.9.0.2:5001", next_conn_id());
        REQUIRE(c != nullptr);
        c->state.store(vt::kActive);
        auto flagged = [](uint64_t judged, uint8_t degraded) {
            WindowRecord w{};
            w.window_us = 1000;
            w.bytes = 1;
            w.degraded = degraded;
            w.baseline_bps = 100'000'000;
            w.judged_bps = judged;
            return w;
        };
        vt::ring_push(*c, flagged(90'000'000, 0)); // before the verdict: not the episode's
        for (uint64_t j : {20'000'000, 30'000'000, 25'000'000, 26'000'000, 24'000'000})
            vt::ring_push(*c, flagged(j, 1));
        vt::ring_push(*c, flagged(150'000'000, 1)); // a burst, newest
        c->degraded.store(1);
        RegistryView cv;
        REQUIRE(cv.open(r.path(), &why) == 0);
        const vt::ProcessHealth h = vt::read_health(cv);
        const auto dev = std::find_if(h.devices.begin(), h.devices.end(), [](const auto &d) { return d.dev == 0; });
        REQUIRE(dev != h.devices.end());
        CHECK(dev->degraded);
        CHECK(dev->fraction() == Approx(0.26)); // median of 20, 30, 25, 26, 24, 150

        // Flagged through the sink, as the meter does: the verdict's window is the evidence
        // however the windows after it read.
        vt::RegistrySink sink(c, "test path");
        WindowRecord v = flagged(15'000'000, 1);
        sink.verdict(true, v);
        sink.push(v);
        for (int i = 0; i < 20; ++i) sink.push(flagged(120'000'000, 1));
        const vt::ProcessHealth h2 = vt::read_health(cv);
        const auto dev2 = std::find_if(h2.devices.begin(), h2.devices.end(), [](const auto &d) { return d.dev == 0; });
        REQUIRE(dev2 != h2.devices.end());
        CHECK(dev2->fraction() == Approx(0.15));
        CHECK(c->degraded_verdicts.load() == 1);
        r.release(c);
    }

    vt::ProcessHealth ph;
    vt::DeviceHealth slow, whole;
    slow.degraded = true;
    slow.judged_bps = 25;
    slow.baseline_bps = 100;
    ph.devices = {slow, whole};
    CHECK(ph.effective_fraction() == Approx(0.25)); // the slow NIC paces a ring
    ph.multipath = true;
    CHECK(ph.effective_fraction() == Approx(0.625)); // each NIC carries what it can
    ph.devices[0].failed = true;
    CHECK(ph.effective_fraction() == Approx(0.5));
}
