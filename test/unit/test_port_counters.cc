// SPDX-License-Identifier: Apache-2.0
// Ports' hardware counters in the telemetry registry: one entry per port name, published by a
// single writer under a seqlock and read back whole by the tools' readers.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "telemetry/registry.h"

namespace vt = vigil::telemetry;

TEST_CASE("registry ports: one entry per name, values round-trip, -1 stays -1", "[telemetry][ports]")
{
    vt::Registry &r = vt::Registry::instance();
    REQUIRE(r.open(1'000'000, -1) == 0);
    vt::PortCounterEntry *a = r.port("test_a0:1");
    REQUIRE(a != nullptr);
    CHECK(r.port("test_a0:1") == a);
    vt::PortCounterEntry *b = r.port("test_b0:1");
    REQUIRE(b != nullptr);
    CHECK(b != a);
    vt::PortCounters c;
    c.sampled_ns = 42;
    c.retransmits = 7;
    c.seq_errors = 3;
    c.tx_packets = 1000;
    vt::write_port(*a, c);
    vt::PortCounters got;
    REQUIRE(vt::read_port(*a, &got));
    CHECK(got.sampled_ns == 42);
    CHECK(got.retransmits == 7);
    CHECK(got.seq_errors == 3);
    CHECK(got.out_of_sequence == -1); // the device has none
    CHECK(got.tx_packets == 1000);
    // A reader of the segment file sees both ports by name.
    vt::RegistryView v;
    std::string why;
    INFO(why);
    REQUIRE(v.open(r.path(), &why) == 0);
    REQUIRE(v.ports() >= 2);
    bool seen_a = false, seen_b = false;
    for (uint32_t i = 0; i < v.ports(); ++i) {
        const std::string name = v.header().ports[i].name;
        seen_a = seen_a || name == "test_a0:1";
        seen_b = seen_b || name == "test_b0:1";
        if (name == "test_a0:1") {
            vt::PortCounters x;
            REQUIRE(vt::read_port(v.header().ports[i], &x));
            CHECK(x.retransmits == 7);
        }
    }
    CHECK(seen_a);
    CHECK(seen_b);
}

TEST_CASE("registry ports: a reader racing the writer never sees a mixed sample", "[telemetry][ports]")
{
    vt::Registry &r = vt::Registry::instance();
    REQUIRE(r.open(1'000'000, -1) == 0);
    vt::PortCounterEntry *e = r.port("test_race:1");
    REQUIRE(e != nullptr);
    std::atomic<bool> stop{false};
    std::thread writer([&] {
        for (int64_t k = 1; !stop.load(std::memory_order_relaxed); ++k) {
            vt::PortCounters c;
            c.sampled_ns = static_cast<uint64_t>(k);
            c.retransmits = k;
            c.seq_errors = 2 * k;
            c.rx_packets = 3 * k;
            vt::write_port(*e, c);
        }
    });
    // Until the writer has published once (its thread may start late).
    for (vt::PortCounters c; !vt::read_port(*e, &c) || c.sampled_ns == 0;) std::this_thread::yield();
    int consistent = 0;
    for (int i = 0; i < 200'000; ++i) {
        vt::PortCounters c;
        if (!vt::read_port(*e, &c) || c.sampled_ns == 0) continue; // none written yet
        if (c.seq_errors != 2 * c.retransmits || c.rx_packets != 3 * c.retransmits ||
            c.sampled_ns != static_cast<uint64_t>(c.retransmits)) {
            FAIL_CHECK("mixed sample: retransmits " << c.retransmits << " seq_errors " << c.seq_errors
                                                    << " rx_packets " << c.rx_packets);
            break;
        }
        ++consistent;
    }
    stop = true;
    writer.join();
    CHECK(consistent > 0);
}

TEST_CASE("registry ports: at most kMaxRegistryPorts entries", "[telemetry][ports]")
{
    vt::Registry &r = vt::Registry::instance();
    REQUIRE(r.open(1'000'000, -1) == 0);
    int got = 0;
    for (uint32_t i = 0; i < vt::kMaxRegistryPorts + 4; ++i)
        got += r.port("test_many" + std::to_string(i)) != nullptr ? 1 : 0;
    // Other cases of this process may hold some entries already.
    CHECK(got <= static_cast<int>(vt::kMaxRegistryPorts));
    CHECK(r.port("test_many" + std::to_string(vt::kMaxRegistryPorts + 3)) == nullptr);
}
