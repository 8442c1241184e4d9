// SPDX-License-Identifier: Apache-2.0
// Telemetry files (common/telemetry/writer.h): rotation at the size bound carries the newest
// events into each new file, and flush_writer() returns with the fatal event on disk. Uses
// this process's real registry and a fresh directory under /tmp.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "telemetry/registry.h"
#include "telemetry/window.h"
#include "telemetry/writer.h"
#include "telemetry_support.h"

namespace fs = std::filesystem;

namespace {

// One line of a telemetry file, as far as these tests read it (the writer's own format: flat
// objects, no spaces).
struct Line {
    std::string type, event;
    bool carried = false;
    uint64_t mono_ns = 0;
};

std::string field(const std::string &line, const std::string &key)
{
    const std::string k = "\"" + key + "\":";
    const size_t at = line.find(k);
    if (at == std::string::npos) return {};
    size_t b = at + k.size(), e = b;
    if (line[b] == '"') e = line.find('"', ++b);
    else e = line.find_first_of(",}", b);
    return line.substr(b, e - b);
}

std::vector<Line> records(const fs::path &file)
{
    std::vector<Line> out;
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
        REQUIRE(line.front() == '{');
        REQUIRE(line.back() == '}'); // whole lines only
        Line l{field(line, "type"), field(line, "event"), field(line, "carried") == "true"};
        if (l.type == "event") l.mono_ns = std::stoull(field(line, "mono_ns"));
        out.push_back(l);
    }
    return out;
}

// Waits until the writer has consumed every window pushed to `e` (it drains every 50 ms).
bool drained(const vt::PathEntry &e)
{
    for (int i = 0; i < 5000; ++i) {
        if (e.ring.tail.load() == e.ring.head.load()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
}

} // namespace

TEST_CASE("telemetry files: a rotated-in file starts with the newest events, and a fatal "
          "error is on disk when flush_writer returns", "[telemetry][writer]")
{
    registry();
    char tmpl[] = "/tmp/vigil-writer-XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    const fs::path dir = tmpl;
    constexpr uint64_t kMax = 64 * 1024;
    std::string why;
    REQUIRE(vt::start_writer(dir.string(), kMax, &why) == 0);

    char host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    const fs::path file = dir / ("vigil-" + std::string(host) + "-" + std::to_string(getpid()) + ".jsonl");
    const fs::path older = file.string() + ".1";

    vt::record_event(vt::EventType::kFailover, "path 0 -> backup: injected");
    // Windows only from here on, enough for several rotations (a line is ~450 bytes): the
    // failover is older than all of them, as in a job that fails over early and dies late.
    vt::PathEntry *e = vt::Registry::instance().acquire(0, 0, 0, "eth9", "10.9.0.1:1", "10.9.0.2:2", 0x77e17e);
    REQUIRE(e != nullptr);
    uint64_t seq = 0;
    for (int batch = 0; batch < 5; ++batch) {
        for (int i = 0; i < 150; ++i, ++seq) {
            vt::WindowRecord w{};
            w.seq = seq;
            w.start_ns = seq * kW;
            w.window_us = 1000;
            w.bytes = 1 << 20;
            w.ops = 8;
            w.busy_ns = kW / 2;
            vt::ring_push(*e, w);
        }
        REQUIRE(drained(*e));
    }
    vt::record_event(vt::EventType::kFatal, "every path lost");
    vt::flush_writer(); // returns with the fatal event written and synced

    const std::vector<Line> newest = records(file);
    vt::stop_writer();
    vt::Registry::instance().release(e);

    REQUIRE(fs::exists(older));
    const std::vector<Line> prev = records(older);
    std::map<std::string, int> originals, carried; // by event name
    std::set<uint64_t> failover_ns; // of the carried copies: one event
    size_t windows = 0;
    for (const auto *recs : {&prev, &newest}) {
        for (const Line &r : *recs) {
            if (r.type == "window") ++windows;
            if (r.type != "event") continue;
            if (r.carried) {
                ++carried[r.event];
                if (r.event == "failover") failover_ns.insert(r.mono_ns);
            } else {
                ++originals[r.event];
            }
        }
    }
    CHECK(windows > 100);
    CHECK(fs::file_size(file) <= kMax + 4096);
    CHECK(fs::file_size(older) <= kMax + 4096);
    // The failover's own line went out with a rotated file; both kept files start with it.
    CHECK(originals["failover"] == 0);
    CHECK(carried["failover"] == 2);
    CHECK(failover_ns.size() == 1);
    REQUIRE(!prev.empty());
    REQUIRE(!newest.empty());
    CHECK(prev.front().carried);
    CHECK(newest.front().carried);
    // The fatal event was read before stop_writer's final drain.
    CHECK(originals["fatal"] == 1);
    fs::remove_all(dir);
}
