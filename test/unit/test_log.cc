// SPDX-License-Identifier: Apache-2.0
// The logging bridge's Deferral (common/log.h): messages written in its scope reach the logger
// when the outermost one ends, in order, and none is lost when more than it holds are written;
// and a comm's lock holder logs through one, so NCCL's logger never runs under a comm's lock.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "comm_link.h"
#include "log.h"

namespace {

std::vector<std::string> g_seen;         // what the test logger received on the test's thread
std::vector<ncclDebugLogLevel> g_levels; // ... and at which level
vigil::net::SendComm *g_probe = nullptr; // when set: the comm the logger calls into
std::thread::id g_probe_from;            // ... when called on this thread
bool g_probe_served = true;              // every call into g_probe from the logger was served
std::vector<std::future<int>> g_probes;  // waited for outside the logger (a blocked one
                                         // returns once the logging thread let go of the lock)

// Calls isend on g_probe from another thread: served at once when the logging thread does not
// hold g_probe's lock; blocked (a failure here) until the logger returns when it does.
void probe_comm()
{
    if (g_probe == nullptr || std::this_thread::get_id() != g_probe_from) return;
    vigil::net::SendComm *c = g_probe;
    auto served = std::async(std::launch::async, [c] {
        static uint8_t byte = 0;
        vigil::net::Request *r = nullptr;
        return c->isend(&byte, 1, 7, nullptr, &r);
    });
    if (served.wait_for(std::chrono::seconds(2)) != std::future_status::ready) g_probe_served = false;
    g_probes.push_back(std::move(served));
}

void test_logger(ncclDebugLogLevel level, unsigned long, const char *, int, const char *fmt, ...)
{
    char buf[1200];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (std::this_thread::get_id() != g_probe_from) return; // the probe's own lines
    g_seen.emplace_back(buf);
    g_levels.push_back(level);
    probe_comm();
}

// Installs the test logger for a scope; the stderr stub again after it.
struct TestLogger {
    TestLogger()
    {
        g_seen.clear();
        g_levels.clear();
        g_probe_from = std::this_thread::get_id();
        vigil::log::set_logger(&test_logger);
    }
    ~TestLogger() { vigil::log::set_logger(nullptr); }
};

} // namespace

TEST_CASE("a Deferral hands its scope's messages to the logger when the outermost one ends",
          "[log]")
{
    TestLogger t;
    {
        vigil::log::Deferral outer;
        VLOG_WARN("one %d", 1);
        {
            vigil::log::Deferral inner;
            VLOG_INFO(NCCL_NET, "two");
        }
        CHECK(g_seen.empty()); // the inner one ending releases nothing
        VLOG_WARN("three");
        CHECK(g_seen.empty());
    }
    REQUIRE(g_seen.size() == 3);
    CHECK(g_seen[0] == "Vigil one 1");
    CHECK(g_seen[1] == "Vigil two");
    CHECK(g_seen[2] == "Vigil three");
    VLOG_WARN("four"); // no Deferral: at once
    REQUIRE(g_seen.size() == 4);
    CHECK(g_seen[3] == "Vigil four");
}

TEST_CASE("a Deferral that holds more than kHeld messages loses and reorders none", "[log]")
{
    TestLogger t;
    constexpr int kN = vigil::log::Deferral::kHeld * 2 + 3;
    {
        vigil::log::Deferral d;
        for (int i = 0; i < kN; ++i) VLOG_WARN("m%d", i);
        // The first kHeld were held, then written with the rest once the queue was full.
        CHECK(g_seen.size() == static_cast<size_t>(kN));
    }
    REQUIRE(g_seen.size() == static_cast<size_t>(kN));
    for (int i = 0; i < kN; ++i) CHECK(g_seen[static_cast<size_t>(i)] == "Vigil m" + std::to_string(i));
    {
        vigil::log::Deferral d; // a new scope holds again
        VLOG_WARN("again");
        CHECK(g_seen.size() == static_cast<size_t>(kN));
    }
    CHECK(g_seen.back() == "Vigil again");
}

TEST_CASE("NCCL's logger runs after the comm's lock is free: it may call into the comm", "[log][comm]")
{
    using namespace vigil::test::comm;
    Link L;
    TestLogger t;
    g_probe = &L.send;
    g_probe_served = true;
    // An isend beyond the message limit is refused with a WARN written under the comm's lock.
    static uint8_t byte = 0;
    Request *r = nullptr;
    CHECK(L.send.isend(&byte, size_t{vigil::net::kMaxMessageBytes} + 1, 0, nullptr, &r) == -EMSGSIZE);
    g_probe = nullptr;
    g_probes.clear();
    REQUIRE_FALSE(g_seen.empty());
    CHECK(g_seen[0].find("exceeds the") != std::string::npos);
    CHECK(g_probe_served);
}

TEST_CASE("a Burst logs the first events of a window at WARN, the rest at INFO, and says so",
          "[log]")
{
    using vigil::log::Burst;
    TestLogger t;
    Burst b("test events");
    const uint64_t t0 = uint64_t{1} << 40;
    auto warns = [] { return std::count(g_levels.begin(), g_levels.end(), NCCL_LOG_WARN); };
    for (int i = 0; i < Burst::kWarns; ++i) CHECK(b.level(t0 + static_cast<uint64_t>(i)) == NCCL_LOG_WARN);
    CHECK(g_seen.empty()); // no note while every event is a WARN

    // The first one held back: INFO, and one WARN that says so.
    CHECK(b.level(t0 + 100) == NCCL_LOG_INFO);
    REQUIRE(g_seen.size() == 1);
    CHECK(g_levels[0] == NCCL_LOG_WARN);
    CHECK(g_seen[0].find("8 test events within 10 s") != std::string::npos);
    for (int i = 0; i < 100; ++i) CHECK(b.level(t0 + 1'000'000 + static_cast<uint64_t>(i)) == NCCL_LOG_INFO);
    CHECK(g_seen.size() == 1); // said once

    // The window ends kWindowNs after its first event: WARNs again, after a count of the held.
    const uint64_t t1 = t0 + Burst::kWindowNs + 3'000'000'000;
    CHECK(b.level(t1) == NCCL_LOG_WARN);
    REQUIRE(g_seen.size() == 2);
    CHECK(g_levels[1] == NCCL_LOG_WARN);
    CHECK(g_seen[1].find("101 more test events were logged at INFO only, over 1 ms up to 12 s ago") !=
          std::string::npos);

    // A window that held nothing back is not counted; restart_all() opens a new window at once.
    for (int i = 1; i < Burst::kWarns; ++i) CHECK(b.level(t1 + static_cast<uint64_t>(i)) == NCCL_LOG_WARN);
    CHECK(b.level(t1 + Burst::kWindowNs) == NCCL_LOG_WARN);
    CHECK(g_seen.size() == 2);
    for (int i = 1; i < Burst::kWarns; ++i) b.level(t1 + Burst::kWindowNs + static_cast<uint64_t>(i));
    Burst::restart_all();
    CHECK(b.level(t1 + Burst::kWindowNs + 100) == NCCL_LOG_WARN);
    CHECK(g_seen.size() == 2);
    CHECK(warns() == 2);

    // Two threads' clock reads may cross: an event stamped before the window's first is
    // still in that window (neither a new window nor a wrapped age).
    Burst c("crossed events");
    for (int i = 0; i < Burst::kWarns; ++i) CHECK(c.level(t0) == NCCL_LOG_WARN);
    const size_t notes = g_seen.size();
    CHECK(c.level(t0 - 1000) == NCCL_LOG_INFO);
    CHECK(c.level(t0 - 2000) == NCCL_LOG_INFO);
    CHECK(g_seen.size() == notes + 1); // the one note that the rest are held back

    // Through the macro: the level chosen is the level written.
    Burst m("macro events");
    g_seen.clear();
    g_levels.clear();
    for (int i = 0; i < Burst::kWarns + 2; ++i) VLOG_BURST(m, "event %d", i);
    REQUIRE(g_seen.size() == static_cast<size_t>(Burst::kWarns) + 3); // the events and one note
    CHECK(g_seen[Burst::kWarns - 1] == "Vigil event 7");
    CHECK(g_levels[Burst::kWarns - 1] == NCCL_LOG_WARN);
    CHECK(g_seen[Burst::kWarns].find("8 macro events within 10 s") != std::string::npos);
    CHECK(g_seen[Burst::kWarns + 1] == "Vigil event 8");
    CHECK(g_levels[Burst::kWarns + 1] == NCCL_LOG_INFO);
}
