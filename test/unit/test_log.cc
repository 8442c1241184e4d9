// SPDX-License-Identifier: Apache-2.0
// The logging bridge's Deferral (common/log.h): messages written in its scope reach the logger
// when the outermost one ends, in order, and none is lost when more than it holds are written;
// and a comm's lock holder logs through one, so NCCL's logger never runs under a comm's lock.
#include <catch2/catch.hpp>

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

void test_logger(ncclDebugLogLevel, unsigned long, const char *, int, const char *fmt, ...)
{
    char buf[1200];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (std::this_thread::get_id() != g_probe_from) return; // the probe's own lines
    g_seen.emplace_back(buf);
    probe_comm();
}

// Installs the test logger for a scope; the stderr stub again after it.
struct TestLogger {
    TestLogger()
    {
        g_seen.clear();
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
