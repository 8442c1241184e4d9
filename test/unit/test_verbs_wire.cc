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

TEST_CASE("verbs wire: a striped message's last piece names its offset in its record", "[wire]")
{
    std::array<uint8_t, vw::kRecordBytes> b{};
    vw::Record r;
    r.seq = 0x1'4000'0007ull;
    r.gen = 5;
    r.size = 600000;
    r.tag = -3;
    r.entry = 7;
    r.offset = 524288;
    r.encode(b.data());
    const uint32_t imm = static_cast<uint32_t>(r.seq) & vw::Record::kImmSeqMask;
    REQUIRE(vw::Record::is_record(imm));
    vw::Record in;
    REQUIRE(in.decode(b.data(), imm, vn::kMaxMessageBytes) == nullptr);
    CHECK(in.seq == r.seq);
    CHECK(in.gen == 5);
    CHECK(in.size == 600000);
    CHECK(in.tag == -3);
    CHECK(in.entry == 7);
    CHECK(in.offset == 524288);
    SECTION("the check covers the offset")
    {
        b[24] ^= 1;
        CHECK_THAT(std::string(in.decode(b.data(), imm, vn::kMaxMessageBytes)),
                   Catch::Contains("check"));
    }
    SECTION("an offset at or past the size is refused")
    {
        r.offset = r.size;
        r.encode(b.data());
        CHECK_THAT(std::string(in.decode(b.data(), imm, vn::kMaxMessageBytes)),
                   Catch::Contains("offset"));
    }
    SECTION("the immediate must name the record's seq")
    {
        CHECK(in.decode(b.data(), imm ^ 1, vn::kMaxMessageBytes) != nullptr);
    }
}

namespace {
// Which of the five kinds an immediate is, by the receiver's tests: 's'hort, 'p'iece,
// 'c'ontrol, credi't', 'r'ecord; '?' unless exactly one says yes.
char kind_of(uint32_t imm)
{
    const bool is[] = {vw::ShortImm::is_short(imm), vw::PieceImm::is_piece(imm), vw::CtlImm::is_control(imm),
                       vw::CtlImm::is_credit(imm), vw::Record::is_record(imm)};
    char k = '?';
    int n = 0;
    for (int i = 0; i < 5; ++i)
        if (is[i]) k = "spctr"[i], ++n;
    return n == 1 ? k : '?';
}
} // namespace

TEST_CASE("verbs wire: the five immediates are told apart, and a piece's fields survive", "[wire]")
{
    const uint32_t piece = vw::PieceImm::encode(0x12345, 8195, 6);
    for (const uint64_t n : {uint64_t{0}, uint64_t{0x12345}, ~uint64_t{0}}) {
        CHECK(kind_of(vw::PieceImm::encode(n, static_cast<uint32_t>(n), 7)) == 'p');
        CHECK(kind_of(vw::ShortImm::encode(n, 7)) == 's');
        CHECK(kind_of(vw::CtlImm::control(n)) == 'c');
        CHECK(kind_of(vw::CtlImm::credit(n)) == 't');
        CHECK(kind_of(static_cast<uint32_t>(n) & vw::Record::kImmSeqMask) == 'r');
    }
    const vw::PieceImm p = vw::PieceImm::decode(piece);
    CHECK(p.entry == 6);
    CHECK(p.seq_low == (0x12345u & ((1u << vw::PieceImm::kSeqBits) - 1)));
    CHECK(p.gen_low == 8195u % (1u << vw::PieceImm::kGenBits));
    // The generation unwraps at or below the path's latest notice.
    CHECK(p.generation(8195) == 8195);
    CHECK(p.generation(8200) == 8195);
    CHECK(p.generation(8195 + 8191) == 8195);
    CHECK(p.generation(8195 + 8192) == 8195 + 8192);
    // Below every generation there is: 0, which no receiver counts.
    CHECK(vw::PieceImm::decode(vw::PieceImm::encode(1, 9, 0)).generation(1) == 0);
    CHECK(vw::PieceImm::decode(vw::PieceImm::encode(1, 1, 0)).generation(1) == 1);
}

TEST_CASE("verbs wire: control counts unwrap at or below what was written", "[wire]")
{
    constexpr uint64_t kWrap = uint64_t{1} << vw::CtlImm::kCountBits;
    CHECK(vw::CtlImm::count(vw::CtlImm::control(kWrap + 5)) == 5);
    CHECK(vw::CtlImm::count(vw::CtlImm::credit(3 * kWrap - 1)) == kWrap - 1);
    // A credit is at most what was written, and across the 28-bit wrap too.
    CHECK(vw::CtlImm::unwrap(10, 10) == 10);
    CHECK(vw::CtlImm::unwrap(100 - vw::kCtlSlots, 100) == 100 - vw::kCtlSlots);
    CHECK(vw::CtlImm::unwrap(vw::CtlImm::count(vw::CtlImm::credit(kWrap - 3)), kWrap + 4) == kWrap - 3);
    CHECK(vw::CtlImm::unwrap(1, 5 * kWrap + 20) == 5 * kWrap + 1);
    // One past what was written reads as 2^28 - 1 behind it: the path refuses such a credit.
    CHECK(10 - vw::CtlImm::unwrap(11, 10) == kWrap - 1);
}

TEST_CASE("verbs wire: a path end carries its control ring, and one without is refused", "[wire]")
{
    vw::PathEnd e;
    e.nqps = 2;
    e.mtu = 3;
    e.psn = 0xabcdef;
    e.qpn[0] = 0x11;
    e.qpn[1] = 0x12;
    e.ring_addr = 0x7f0000001000;
    e.ctl_addr = 0x7f0000002000;
    e.rkey = 0x1234;
    std::array<uint8_t, vw::PathEnd::kSize> b{};
    e.encode(b.data());
    vw::PathEnd in;
    REQUIRE(in.decode(b.data()) == nullptr);
    CHECK(in.ring_addr == e.ring_addr);
    CHECK(in.ctl_addr == e.ctl_addr);
    CHECK(in.rkey == e.rkey);
    CHECK(in.qpn == e.qpn);
    e.ctl_addr = 0;
    e.encode(b.data());
    CHECK_THAT(std::string(in.decode(b.data())), Catch::Contains("control ring"));
    e.ctl_addr = 0x7f0000002000;
    e.rkey = 0;
    e.encode(b.data());
    CHECK_THAT(std::string(in.decode(b.data())), Catch::Contains("control ring"));
    e.rkey = 0x1234;
    e.encode(b.data());
    b[108] = 1;
    CHECK_THAT(std::string(in.decode(b.data())), Catch::Contains("reserved"));
}
