// SPDX-License-Identifier: Apache-2.0
// The verbs control messages' payloads (net_plugin/verbs/verbs_wire.h): a CTS group and the
// receiver's holding answer, through their encoders and decoders and Ctl's length checks.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>
#include <string>

#include "verbs/verbs_wire.h"

namespace vn = vigil::net;
namespace vw = vigil::net::verbs_fabric;

TEST_CASE("verbs wire: a CTS group survives encode_cts, Ctl and decode_cts", "[wire]")
{
    vn::CtsGroup g;
    g.index = 77;
    g.first_seq = 0xabcdef0123ULL;
    g.n = static_cast<int>(vw::Ctl::kMaxEntries);
    for (int k = 0; k < g.n; ++k) {
        auto &e = g.entries[static_cast<size_t>(k)];
        e.addr = 0x7f0000001000ULL + static_cast<uint64_t>(k) * 4096;
        e.size = vn::kMaxMessageBytes - static_cast<uint64_t>(k);
        e.tag = k;
        e.rkey = {0x1000u + static_cast<uint32_t>(k), 0x2000u + static_cast<uint32_t>(k)};
    }
    std::array<uint8_t, vw::kCtlBytes> msg{};
    vw::Ctl h;
    const size_t n = vw::encode_cts(g, &h, msg.data() + vw::Ctl::kSize);
    h.encode(msg.data());
    REQUIRE(n == vw::Ctl::kMaxEntries * vw::Ctl::kEntrySize);

    vw::Ctl in;
    REQUIRE(in.decode(msg.data(), vw::Ctl::kSize + n) == nullptr);
    REQUIRE(in.kind == vw::Ctl::kCts);
    const vn::CtsGroup out = vw::decode_cts(in, msg.data() + vw::Ctl::kSize);
    CHECK(out.index == g.index);
    CHECK(out.first_seq == g.first_seq);
    REQUIRE(out.n == g.n);
    for (size_t k = 0; k < static_cast<size_t>(g.n); ++k) {
        CHECK(out.entries[k].addr == g.entries[k].addr);
        CHECK(out.entries[k].size == g.entries[k].size);
        CHECK(out.entries[k].tag == g.entries[k].tag);
        CHECK(out.entries[k].rkey == g.entries[k].rkey);
    }
    // The length must be exactly the entries the header counts.
    CHECK_THAT(std::string(in.decode(msg.data(), vw::Ctl::kSize + n - 1)), Catch::Contains("length"));
}

TEST_CASE("verbs wire: the holding answer carries its floor and bitmap", "[wire]")
{
    vn::Holding hold;
    hold.floor = 1000;
    hold.complete[0] = 0x5;             // floor and floor + 2 held
    hold.complete.back() = 1ULL << 63;  // the last in-flight slot held
    std::array<uint8_t, vw::kCtlBytes> msg{};
    vw::Ctl h;
    const size_t n = vw::encode_holding(hold, 9, &h, msg.data() + vw::Ctl::kSize);
    h.encode(msg.data());
    REQUIRE(n == vw::Ctl::kBitmapBytes);

    vw::Ctl in;
    REQUIRE(in.decode(msg.data(), vw::Ctl::kSize + n) == nullptr);
    CHECK(in.kind == vw::Ctl::kHolding);
    CHECK(in.gen == 9);
    const vn::Holding out = vw::decode_holding(in, msg.data() + vw::Ctl::kSize);
    CHECK(out.floor == 1000);
    CHECK(out.complete == hold.complete);
    CHECK(out.has(999));
    CHECK(out.has(1000));
    CHECK_FALSE(out.has(1001));
    CHECK(out.has(1002));
    CHECK(out.has(1000 + vn::kMaxInflight - 1));
    CHECK_FALSE(out.has(1000 + vn::kMaxInflight));
}

TEST_CASE("verbs wire: a generation notice names at most the second slot", "[wire]")
{
    std::array<uint8_t, vw::kCtlBytes> msg{};
    vw::Ctl h;
    h.kind = vw::Ctl::kGeneration;
    h.gen = 3;
    h.a = 42;
    h.count = 2; // abandoned slot 1
    h.encode(msg.data());
    vw::Ctl in;
    CHECK(in.decode(msg.data(), vw::Ctl::kSize) == nullptr);
    h.count = 3;
    h.encode(msg.data());
    CHECK_THAT(std::string(in.decode(msg.data(), vw::Ctl::kSize)), Catch::Contains("slot"));
}
