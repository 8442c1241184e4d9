// SPDX-License-Identifier: Apache-2.0
// TCP wire formats: hello, frame header (data and control frames), back channel.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "tcp/wire.h"

using namespace vigil::net::tcp;

namespace {

Hello sample_hello()
{
    Hello h;
    h.nstreams = 4;
    h.stream = 3;
    h.path_kind = 1;
    for (size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = static_cast<uint8_t>(i + 1);
    h.conn_id = 0x0123456789abcdefULL;
    h.path_id = 0xfedcba9876543210ULL;
    return h;
}

// Decodes `bytes` into a fresh Hello and returns the reason ("" when valid).
std::string hello_verdict(const std::array<uint8_t, Hello::kSize> &bytes)
{
    Hello h;
    const char *bad = h.decode(bytes.data());
    return bad == nullptr ? "" : bad;
}

std::array<uint8_t, Hello::kSize> hello_bytes(const Hello &h)
{
    std::array<uint8_t, Hello::kSize> b{};
    h.encode(b.data());
    return b;
}

constexpr uint64_t kMaxMsg = 0x7fffffff;

std::string frame_verdict(const FrameHeader &h, uint64_t max_message = kMaxMsg)
{
    std::array<uint8_t, FrameHeader::kSize> b{};
    h.encode(b.data());
    FrameHeader out;
    const char *bad = out.decode(b.data(), max_message);
    return bad == nullptr ? "" : bad;
}

FrameHeader sample_frame()
{
    FrameHeader f;
    f.gen = 0xA1B2C3D4;
    f.seq = 0x1122334455667788ULL;
    f.size = 1000;
    f.offset = 200;
    f.len = 300;
    f.tag = -5;
    f.entry = 6;
    return f;
}

std::string back_verdict(const BackHeader &h)
{
    std::array<uint8_t, BackHeader::kSize> b{};
    h.encode(b.data());
    BackHeader out;
    const char *bad = out.decode(b.data());
    return bad == nullptr ? "" : bad;
}

} // namespace

TEST_CASE("put_le/get_le are little-endian inverses", "[wire]")
{
    uint8_t b[8] = {};
    put_le(b, 0x0102030405060708ULL, 8);
    CHECK(b[0] == 0x08);
    CHECK(b[7] == 0x01);
    CHECK(get_le(b, 8) == 0x0102030405060708ULL);
    CHECK(get_le(b, 4) == 0x05060708ULL);
}

TEST_CASE("Hello round trip", "[wire]")
{
    const Hello h = sample_hello();
    const auto b = hello_bytes(h);
    CHECK(std::memcmp(b.data(), "VLGC", 4) == 0);
    Hello out;
    REQUIRE(out.decode(b.data()) == nullptr);
    CHECK(out.version == Hello::kVersion);
    CHECK(out.nstreams == 4);
    CHECK(out.stream == 3);
    CHECK(out.path_kind == 1);
    CHECK(out.nonce == h.nonce);
    CHECK(out.conn_id == h.conn_id);
    CHECK(out.path_id == h.path_id);
}

TEST_CASE("Hello accepts the bounds of every field", "[wire]")
{
    Hello h = sample_hello();
    h.nstreams = 1;
    h.stream = 0;
    h.path_kind = 0;
    CHECK(hello_verdict(hello_bytes(h)).empty());
    h.nstreams = static_cast<uint8_t>(kMaxStreams);
    h.stream = static_cast<uint8_t>(kMaxStreams - 1);
    CHECK(hello_verdict(hello_bytes(h)).empty());
}

TEST_CASE("Hello rejects each bad field", "[wire]")
{
    Hello h = sample_hello();
    SECTION("magic")
    {
        auto b = hello_bytes(h);
        b[3] ^= 0xff;
        CHECK_THAT(hello_verdict(b), Catch::Contains("magic"));
    }
    SECTION("version")
    {
        h.version = 1; // the byte-stream protocol before CTS
        CHECK_THAT(hello_verdict(hello_bytes(h)), Catch::Contains("version"));
        h.version = 0;
        CHECK_THAT(hello_verdict(hello_bytes(h)), Catch::Contains("version"));
    }
    SECTION("nstreams 0 and 17")
    {
        h.stream = 0;
        h.nstreams = 0;
        CHECK_THAT(hello_verdict(hello_bytes(h)), Catch::Contains("stream count"));
        h.nstreams = 17;
        CHECK_THAT(hello_verdict(hello_bytes(h)), Catch::Contains("stream count"));
        h.nstreams = 255;
        CHECK_THAT(hello_verdict(hello_bytes(h)), Catch::Contains("stream count"));
    }
    SECTION("stream >= nstreams")
    {
        h.stream = 4;
        CHECK_THAT(hello_verdict(hello_bytes(h)), Catch::Contains("stream index"));
        h.stream = 200;
        CHECK_THAT(hello_verdict(hello_bytes(h)), Catch::Contains("stream index"));
    }
    SECTION("path_kind 2")
    {
        h.path_kind = 2;
        CHECK_THAT(hello_verdict(hello_bytes(h)), Catch::Contains("path kind"));
    }
    SECTION("conn_id 0")
    {
        h.conn_id = 0;
        CHECK_THAT(hello_verdict(hello_bytes(h)), Catch::Contains("connection id"));
    }
    SECTION("path id 0")
    {
        h.path_id = 0;
        CHECK_THAT(hello_verdict(hello_bytes(h)), Catch::Contains("path id"));
    }
}

TEST_CASE("AcceptAnswer layout", "[wire]")
{
    uint8_t b[AcceptAnswer::kSize] = {};
    AcceptAnswer::encode(b, 0xdeadbeef);
    CHECK(std::memcmp(b, "VLGA", 4) == 0);
    CHECK(get_le(b + 4, 4) == 0xdeadbeef);
}

TEST_CASE("FrameHeader round trip", "[wire]")
{
    const FrameHeader f = sample_frame();
    std::array<uint8_t, FrameHeader::kSize> b{};
    f.encode(b.data());
    CHECK(std::memcmp(b.data(), "VLGD", 4) == 0);
    FrameHeader out;
    REQUIRE(out.decode(b.data(), kMaxMsg) == nullptr);
    CHECK(out.gen == f.gen);
    CHECK(out.seq == f.seq);
    CHECK(out.size == f.size);
    CHECK(out.offset == f.offset);
    CHECK(out.len == f.len);
    CHECK(out.tag == -5);
    CHECK(out.entry == 6);
    CHECK(out.kind == FrameHeader::kData);
}

TEST_CASE("FrameHeader accepts boundary values", "[wire]")
{
    FrameHeader f = sample_frame();
    SECTION("zero-byte message")
    {
        f.size = 0;
        f.offset = 0;
        f.len = 0;
        CHECK(frame_verdict(f).empty());
    }
    SECTION("chunk ending exactly at the message end")
    {
        f.offset = 700;
        f.len = 300;
        CHECK(frame_verdict(f).empty());
    }
    SECTION("size == max_message, len == kMaxFrameBytes")
    {
        f.size = kMaxMsg;
        f.offset = kMaxMsg - kMaxFrameBytes;
        f.len = kMaxFrameBytes;
        CHECK(frame_verdict(f).empty());
    }
}

TEST_CASE("FrameHeader rejects each bad field", "[wire]")
{
    FrameHeader f = sample_frame();
    SECTION("magic")
    {
        std::array<uint8_t, FrameHeader::kSize> b{};
        f.encode(b.data());
        b[0] ^= 1;
        FrameHeader out;
        const char *bad = out.decode(b.data(), kMaxMsg);
        REQUIRE(bad != nullptr);
        CHECK_THAT(std::string(bad), Catch::Contains("magic"));
    }
    SECTION("size > max_message")
    {
        f.size = kMaxMsg + 1;
        CHECK_THAT(frame_verdict(f), Catch::Contains("size"));
        f.size = 1001;
        CHECK_THAT(frame_verdict(f, 1000), Catch::Contains("size"));
        CHECK(frame_verdict(f, 1001).empty());
    }
    SECTION("len > kMaxFrameBytes")
    {
        f.size = kMaxMsg;
        f.offset = 0;
        f.len = kMaxFrameBytes + 1;
        CHECK_THAT(frame_verdict(f), Catch::Contains("length"));
        f.len = UINT32_MAX;
        CHECK_THAT(frame_verdict(f), Catch::Contains("length"));
    }
    SECTION("offset > size")
    {
        f.offset = 1001;
        f.len = 0;
        CHECK_THAT(frame_verdict(f), Catch::Contains("outside"));
    }
    SECTION("offset + len > size")
    {
        f.offset = 701;
        f.len = 300;
        CHECK_THAT(frame_verdict(f), Catch::Contains("outside"));
    }
    SECTION("a CTS entry index beyond a group")
    {
        f.entry = FrameHeader::kMaxEntries;
        CHECK_THAT(frame_verdict(f), Catch::Contains("entry"));
    }
    SECTION("offset + len overflowing 32 bits")
    {
        f.size = kMaxMsg;
        f.offset = UINT32_MAX - 1;
        f.len = 4;
        CHECK_THAT(frame_verdict(f), Catch::Contains("outside"));
    }
    SECTION("an unknown kind or non-zero reserved bytes")
    {
        std::array<uint8_t, FrameHeader::kSize> b{};
        f.encode(b.data());
        FrameHeader out;
        b[4] = 9;
        CHECK_THAT(std::string(out.decode(b.data(), kMaxMsg)), Catch::Contains("kind"));
        f.encode(b.data());
        b[7] = 1;
        CHECK_THAT(std::string(out.decode(b.data(), kMaxMsg)), Catch::Contains("reserved"));
        f.encode(b.data());
        b[39] = 1;
        CHECK_THAT(std::string(out.decode(b.data(), kMaxMsg)), Catch::Contains("reserved"));
    }
}

TEST_CASE("control frames carry no payload and name a valid slot", "[wire]")
{
    FrameHeader f;
    f.kind = FrameHeader::kGeneration;
    f.gen = 3;
    f.seq = 77;
    f.entry = FrameHeader::kNoSlot;
    f.path = 0x8877665544332211ULL;
    CHECK(frame_verdict(f).empty());
    std::array<uint8_t, FrameHeader::kSize> b{};
    f.encode(b.data());
    FrameHeader out;
    REQUIRE(out.decode(b.data(), kMaxMsg) == nullptr);
    CHECK(out.path == f.path); // the abandoned path's id rides where a data frame's size is
    CHECK(out.seq == 77);
    f.entry = 1;
    CHECK(frame_verdict(f).empty());
    f.entry = 2;
    CHECK_THAT(frame_verdict(f), Catch::Contains("slot"));
    for (uint8_t k : {FrameHeader::kProbe, FrameHeader::kGoodbye}) {
        FrameHeader c;
        c.kind = k;
        CHECK(frame_verdict(c).empty());
        c.len = 1;
        c.size = 1;
        CHECK_THAT(frame_verdict(c), Catch::Contains("payload"));
    }
}

TEST_CASE("BackHeader round trip, bounds and bad fields", "[wire]")
{
    BackHeader a;
    a.kind = BackHeader::kAck;
    a.arg = 7;
    a.value = 0xfedcba9876543210ULL;
    std::array<uint8_t, BackHeader::kSize> b{};
    a.encode(b.data());
    CHECK(std::memcmp(b.data(), "VLGB", 4) == 0);
    BackHeader out;
    REQUIRE(out.decode(b.data()) == nullptr);
    CHECK(out.kind == BackHeader::kAck);
    CHECK(out.arg == 7);
    CHECK(out.value == a.value);
    CHECK(out.payload() == 0);

    BackHeader cts;
    cts.kind = BackHeader::kCts;
    for (uint8_t n = 1; n <= BackHeader::kMaxEntries; ++n) {
        cts.count = n;
        CHECK(back_verdict(cts).empty());
    }
    cts.count = BackHeader::kMaxEntries;
    cts.encode(b.data());
    REQUIRE(out.decode(b.data()) == nullptr);
    CHECK(out.payload() == 8 + BackHeader::kMaxEntries * BackHeader::kEntrySize);
    CHECK(BackHeader::kSize + out.payload() <= BackHeader::kMaxBytes);
    cts.count = 0;
    CHECK_THAT(back_verdict(cts), Catch::Contains("count"));
    cts.count = BackHeader::kMaxEntries + 1;
    CHECK_THAT(back_verdict(cts), Catch::Contains("count"));
    a.count = 1; // only CTS groups have entries
    CHECK_THAT(back_verdict(a), Catch::Contains("count"));
    BackHeader landed;
    landed.kind = BackHeader::kLanded;
    landed.count = BackHeader::kMaxLanded;
    landed.encode(b.data());
    REQUIRE(out.decode(b.data()) == nullptr);
    CHECK(BackHeader::kSize + out.payload() == BackHeader::kMaxBytes); // the largest message
    landed.count = 0;
    CHECK_THAT(back_verdict(landed), Catch::Contains("count"));
    landed.count = BackHeader::kMaxLanded + 1;
    CHECK_THAT(back_verdict(landed), Catch::Contains("count"));
    BackHeader k;
    k.kind = 5;
    CHECK_THAT(back_verdict(k), Catch::Contains("kind"));
    k.kind = BackHeader::kGoodbye;
    k.encode(b.data());
    b[1] ^= 0x10;
    CHECK_THAT(std::string(out.decode(b.data())), Catch::Contains("magic"));
    k.encode(b.data());
    b[13] = 1;
    CHECK_THAT(std::string(out.decode(b.data())), Catch::Contains("reserved"));
}

TEST_CASE("BackHeader: acks carry the ack delay, no other kind does", "[wire]")
{
    std::array<uint8_t, BackHeader::kSize> b{};
    BackHeader ack;
    ack.kind = BackHeader::kAck;
    ack.value = 42;
    for (uint32_t d : {0u, 1u, 123'456u, 0xffffffffu}) {
        ack.delay_us = d;
        ack.encode(b.data());
        CHECK(get_le(b.data() + 12, 4) == d);
        BackHeader out;
        REQUIRE(out.decode(b.data()) == nullptr);
        CHECK(out.delay_us == d);
        CHECK(out.value == 42);
    }
    // Another kind never writes a delay, and one that carries one is refused.
    BackHeader req;
    req.kind = BackHeader::kFailoverRequest;
    req.delay_us = 7;
    req.encode(b.data());
    CHECK(get_le(b.data() + 12, 4) == 0);
    put_le(b.data() + 12, 7, 4);
    BackHeader out;
    CHECK_THAT(std::string(out.decode(b.data())), Catch::Contains("reserved"));
}

TEST_CASE("CTS group: encode_cts/decode_cts round trip, reserved bytes refused", "[wire]")
{
    vigil::net::CtsGroup g;
    g.index = 0x1122334455667788ULL;
    g.first_seq = 0x0102030405060708ULL;
    g.n = static_cast<int>(BackHeader::kMaxEntries);
    for (int k = 0; k < g.n; ++k) {
        auto &e = g.entries[static_cast<size_t>(k)];
        e.size = (1ULL << 31) - static_cast<uint64_t>(k);
        e.tag = -k - 1; // tags are NCCL ranks, but any 32 bits travel
    }
    std::array<uint8_t, BackHeader::kMaxBytes> msg{};
    BackHeader h;
    encode_cts(g, &h, msg.data() + BackHeader::kSize);
    h.encode(msg.data());
    CHECK(BackHeader::kSize + h.payload() <= BackHeader::kMaxBytes);

    BackHeader in;
    REQUIRE(in.decode(msg.data()) == nullptr);
    vigil::net::CtsGroup out;
    REQUIRE(decode_cts(in, msg.data() + BackHeader::kSize, &out) == nullptr);
    CHECK(out.index == g.index);
    CHECK(out.first_seq == g.first_seq);
    REQUIRE(out.n == g.n);
    for (size_t k = 0; k < static_cast<size_t>(g.n); ++k) {
        CHECK(out.entries[k].size == g.entries[k].size);
        CHECK(out.entries[k].tag == g.entries[k].tag);
    }

    // One entry, then a non-zero reserved word in it.
    g.n = 1;
    encode_cts(g, &h, msg.data() + BackHeader::kSize);
    CHECK(h.payload() == 8 + BackHeader::kEntrySize);
    msg[BackHeader::kSize + 8 + 12] = 1;
    CHECK_THAT(std::string(decode_cts(h, msg.data() + BackHeader::kSize, &out)),
               Catch::Contains("reserved"));
    BackHeader ack;
    CHECK(decode_cts(ack, msg.data(), &out) != nullptr); // not a CTS header
}

TEST_CASE("landed report: encode_landed/decode_landed round trip", "[wire]")
{
    using vigil::net::tcp::Landed;
    std::array<Landed, BackHeader::kMaxLanded> in{};
    for (size_t k = 0; k < in.size(); ++k)
        in[k] = Landed{0x1000000000ull + k * 7, static_cast<uint32_t>(0xfffffff0u - k), static_cast<uint32_t>(k + 1)};
    std::array<uint8_t, BackHeader::kMaxBytes> msg{};
    BackHeader h;
    encode_landed(in.data(), in.size(), 0x18a2b3c4d5e6f708ull, &h, msg.data() + BackHeader::kSize);
    h.encode(msg.data());
    BackHeader got;
    REQUIRE(got.decode(msg.data()) == nullptr);
    REQUIRE(got.kind == BackHeader::kLanded);
    REQUIRE(got.count == in.size());
    CHECK(got.value == 0x18a2b3c4d5e6f708ull); // the receiver's stamp
    CHECK(got.payload() == in.size() * BackHeader::kLandedSize);
    for (size_t k = 0; k < in.size(); ++k) {
        const Landed l = decode_landed(msg.data() + BackHeader::kSize, k);
        CHECK(l.seq == in[k].seq);
        CHECK(l.bytes == in[k].bytes);
        CHECK(l.gen == in[k].gen);
    }
}
