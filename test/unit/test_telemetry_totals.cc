// SPDX-License-Identifier: Apache-2.0
// Telemetry (common/telemetry): what a node-wide reader of the registry relies on: device
// totals that only grow while path entries come and go, the launcher's rank in the header, and
// segments of every user listed and reaped.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "telemetry/registry.h"
#include "telemetry/window.h"
#include "telemetry_support.h"

namespace {

// The device totals named `name` in this process's segment, read through a RegistryView as
// `vigil export` reads them; fails the test when there are none.
struct Totals {
    uint64_t bytes[2], ops[2], failovers, failbacks, degraded[2];
};
Totals read_totals(const char *name)
{
    vt::RegistryView v;
    std::string why;
    REQUIRE(v.open(vt::Registry::instance().path(), &why) == 0);
    for (uint32_t d = 0; d < v.devices(); ++d) {
        const vt::DeviceTotals &t = v.header().devices[d];
        if (std::strcmp(t.name, name) != 0) continue;
        return {{t.bytes[0].load(), t.bytes[1].load()},
                {t.ops[0].load(), t.ops[1].load()},
                t.failovers.load(),
                t.failbacks.load(),
                {t.degraded[0].load(), t.degraded[1].load()}};
    }
    FAIL("no device totals named " << name);
    return {};
}

vt::WindowRecord window(uint64_t bytes)
{
    vt::WindowRecord w{};
    w.bytes = bytes;
    w.ops = 1;
    w.window_us = 1000;
    return w;
}

} // namespace

TEST_CASE("registry: a device's totals keep growing while its path entries are replaced",
          "[telemetry]")
{
    vt::Registry &r = registry();
    // Device index 5 ("eth5"): send and receive paths of one connection, then the send path
    // rebuilt (a new entry, its own counters from 0) as a failover and failback do.
    vt::PathEntry *send = r.acquire(0, 0, 5, "eth5", "10.5.0.1:1", "10.5.0.2:2", 0x5e5d);
    vt::PathEntry *recv = r.acquire(1, 1, 5, "eth5", "10.5.0.1:3", "10.5.0.2:4", 0x5e5d);
    REQUIRE(send != nullptr);
    REQUIRE(recv != nullptr);
    vt::ring_push(*send, window(1000));
    vt::ring_push(*send, window(500));
    vt::ring_push(*recv, window(70));
    vt::RegistrySink sink(send, "send primary dev eth5");
    sink.verdict(true, window(0));
    sink.verdict(false, window(0)); // healthy again: not a verdict to count
    vt::count_failover(*send);
    Totals t = read_totals("eth5");
    CHECK(t.bytes[0] == 1500);
    CHECK(t.bytes[1] == 70);
    CHECK(t.ops[0] == 2);
    CHECK(t.degraded[0] == 1);
    CHECK(t.degraded[1] == 0);
    CHECK(t.failovers == 1);
    CHECK(t.failbacks == 0);
    CHECK(send->failovers.load() == 1);
    CHECK(send->degraded_verdicts.load() == 1);

    r.release(send);
    vt::PathEntry *rebuilt = r.acquire(0, 0, 5, "eth5", "10.5.0.1:9", "10.5.0.2:2", 0x5e5d);
    REQUIRE(rebuilt != nullptr);
    CHECK(rebuilt->failovers.load() == 0); // the entry restarts ...
    CHECK(rebuilt->failbacks.load() == 0);
    CHECK(rebuilt->degraded_verdicts.load() == 0);
    vt::count_failback(*rebuilt);
    vt::ring_push(*rebuilt, window(25));
    t = read_totals("eth5"); // ... the device does not
    CHECK(t.bytes[0] == 1525);
    CHECK(t.failovers == 1);
    CHECK(t.failbacks == 1);
    CHECK(rebuilt->failbacks.load() == 1);

    // An entry that is not in this process's segment (a test's own) counts only itself.
    vt::PathEntry loose{};
    loose.dev = 5;
    loose.ring.capacity = vt::kRingCapacity;
    vt::count_failover(loose);
    vt::ring_push(loose, window(1));
    CHECK(loose.failovers.load() == 1);
    CHECK(read_totals("eth5").failovers == 1);
    CHECK(read_totals("eth5").bytes[0] == 1525);
    r.release(rebuilt);
    r.release(recv);
}

TEST_CASE("registry: launcher_rank takes the launcher's rank variables in order, numbers only",
          "[telemetry]")
{
    const char *vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"};
    std::vector<std::pair<std::string, std::string>> saved;
    for (const char *v : vars) {
        if (const char *s = std::getenv(v)) saved.emplace_back(v, s);
        unsetenv(v);
    }
    CHECK(vt::launcher_rank() == -1);
    setenv("PMI_RANK", "12", 1);
    CHECK(vt::launcher_rank() == 12);
    setenv("SLURM_PROCID", "7", 1);
    CHECK(vt::launcher_rank() == 7);
    setenv("RANK", "3", 1);
    CHECK(vt::launcher_rank() == 3);
    for (const char *bad : {"", "-1", "3x", "99999999999", "2147483647"}) {
        setenv("RANK", bad, 1);
        INFO("RANK=\"" << bad << "\"");
        CHECK(vt::launcher_rank() == 7); // skipped: the next variable answers
    }
    setenv("RANK", "2147483646", 1);
    CHECK(vt::launcher_rank() == 2147483646);
    for (const char *v : vars)
        unsetenv(v);
    for (const auto &[k, v] : saved)
        setenv(k.c_str(), v.c_str(), 1);
}

TEST_CASE("registry: a node-wide reader lists and reaps every user's segments, and only segments",
          "[telemetry]")
{
    vt::Registry &r = registry();
    const std::string other_uid = std::to_string(getuid() + 4242);
    const std::string theirs = "/dev/shm/vigil-" + other_uid + "-77-0123456789abcdef";
    const std::string junk = "/dev/shm/vigil-" + other_uid + "-x7-0123456789abcdef";
    for (const std::string &f : {theirs, junk}) {
        std::ofstream(f) << "stale";
        const timespec old[2] = {{time(nullptr) - 60, 0}, {time(nullptr) - 60, 0}};
        REQUIRE(utimensat(AT_FDCWD, f.c_str(), old, 0) == 0);
    }
    auto has = [](const std::vector<std::string> &l, const std::string &f) {
        return std::find(l.begin(), l.end(), f) != l.end();
    };
    CHECK_FALSE(has(vt::list_registries(), theirs));
    CHECK(has(vt::list_registries(), r.path()));
    const std::vector<std::string> all = vt::list_registries(true);
    CHECK(has(all, theirs));
    CHECK(has(all, r.path()));
    CHECK_FALSE(has(all, junk));
    CHECK(vt::segment_settled(theirs));
    CHECK_FALSE(vt::segment_settled("/dev/shm/vigil-no-such-segment"));

    vt::reap_stale();
    CHECK(access(theirs.c_str(), F_OK) == 0); // not ours: a per-user reader leaves it
    CHECK(vt::reap_stale(true) >= 1);
    CHECK(access(theirs.c_str(), F_OK) != 0);
    CHECK(access(junk.c_str(), F_OK) == 0); // not named like a segment: never touched
    CHECK(access(r.path().c_str(), F_OK) == 0);
    unlink(theirs.c_str());
    unlink(junk.c_str());
}
