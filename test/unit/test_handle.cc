// SPDX-License-Identifier: Apache-2.0
// ListenHandle encoding and hostile-input decoding; Endpoint helpers.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <array>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <random>
#include <string>
#include <sys/un.h>
#include <vector>

#include "handle.h"

using vigil::net::Endpoint;
using vigil::net::ListenHandle;

namespace {

using Buf = std::array<uint8_t, ListenHandle::kSize>;
constexpr size_t kSumOffset = 104;

Endpoint v4(const char *text, uint16_t port)
{
    Endpoint e;
    e.family = AF_INET;
    e.port = port;
    REQUIRE(inet_pton(AF_INET, text, e.addr.data()) == 1);
    return e;
}

Endpoint v6(const char *text, uint16_t port)
{
    Endpoint e;
    e.family = AF_INET6;
    e.port = port;
    REQUIRE(inet_pton(AF_INET6, text, e.addr.data()) == 1);
    return e;
}

ListenHandle sample_handle(size_t naddrs)
{
    const Endpoint pool[] = {v4("10.0.0.1", 4242), v6("2001:db8::17", 65535),
                             v4("192.168.7.200", 1), v6("fd00::1:2:3", 31337)};
    ListenHandle h;
    h.dev = 0xBEEF;
    for (size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = static_cast<uint8_t>(0xA0 + i);
    for (size_t i = 0; i < naddrs; ++i) h.addrs.push_back(pool[i % 4]);
    return h;
}

Buf encoded(const ListenHandle &h)
{
    Buf b{};
    REQUIRE(h.encode(b.data()) == 0);
    return b;
}

// Recomputes the checksum so that a deliberately corrupted field reaches its own check.
void reseal(Buf &b)
{
    const uint32_t sum = vigil::net::fnv1a32(b.data(), kSumOffset);
    for (int i = 0; i < 4; ++i)
        b[kSumOffset + static_cast<size_t>(i)] = static_cast<uint8_t>(sum >> (8 * i));
}

// Decodes `b`, which must be rejected; returns the reason.
std::string rejection(const Buf &b)
{
    ListenHandle out;
    std::string why;
    const int rc = ListenHandle::decode(b.data(), &out, &why);
    CHECK(rc == -EBADMSG);
    CHECK_FALSE(why.empty());
    return why;
}

uint8_t *entry(Buf &b, size_t i)
{
    return b.data() + 24 + 20 * i;
}

} // namespace

TEST_CASE("ListenHandle round trips 1..4 IPv4/IPv6 addresses, dev and nonce", "[handle]")
{
    for (size_t n = 1; n <= ListenHandle::kMaxAddrs; ++n) {
        DYNAMIC_SECTION("addresses: " << n)
        {
            const ListenHandle h = sample_handle(n);
            const Buf b = encoded(h);
            ListenHandle out;
            std::string why;
            REQUIRE(ListenHandle::decode(b.data(), &out, &why) == 0);
            CHECK(out.version == ListenHandle::kVersion);
            CHECK(out.dev == 0xBEEF);
            CHECK(out.nonce == h.nonce);
            REQUIRE(out.addrs.size() == n);
            for (size_t i = 0; i < n; ++i) CHECK(out.addrs[i] == h.addrs[i]);
        }
    }
}

TEST_CASE("ListenHandle layout: magic, version, count, dev little-endian, scratch zeroed",
          "[handle]")
{
    ListenHandle h = sample_handle(2);
    Buf b;
    b.fill(0xEE);
    REQUIRE(h.encode(b.data()) == 0);
    CHECK(std::memcmp(b.data(), "VGLH", 4) == 0);
    CHECK(b[4] == 1);
    CHECK(b[5] == 2);
    CHECK(b[6] == 0xEF);
    CHECK(b[7] == 0xBE);
    CHECK(entry(b, 0)[0] == 4);
    CHECK(entry(b, 1)[0] == 6);
    CHECK(entry(b, 0)[2] == (4242 >> 8));
    CHECK(entry(b, 0)[3] == (4242 & 0xff));
    for (size_t i = ListenHandle::kScratchOffset; i < ListenHandle::kSize; ++i) CHECK(b[i] == 0);
}

TEST_CASE("ListenHandle does not carry the IPv6 scope id", "[handle]")
{
    ListenHandle h = sample_handle(2);
    h.addrs[1].scope_id = 7;
    const Buf b = encoded(h);
    ListenHandle out;
    REQUIRE(ListenHandle::decode(b.data(), &out, nullptr) == 0);
    CHECK(out.addrs[1].scope_id == 0);
}

TEST_CASE("ListenHandle::encode rejects empty, oversized and bad-family address lists", "[handle]")
{
    Buf b{};
    ListenHandle h = sample_handle(1);
    h.addrs.clear();
    CHECK(h.encode(b.data()) == -EINVAL);
    h = sample_handle(4);
    h.addrs.push_back(v4("10.0.0.5", 5));
    CHECK(h.encode(b.data()) == -EINVAL);
    h = sample_handle(1);
    h.addrs[0].family = AF_UNIX;
    CHECK(h.encode(b.data()) == -EINVAL);
}

TEST_CASE("ListenHandle::decode rejects each bad field with -EBADMSG and a reason", "[handle]")
{
    Buf b = encoded(sample_handle(2));

    SECTION("bad magic")
    {
        b[0] ^= 0x01;
        reseal(b);
        CHECK_THAT(rejection(b), Catch::Contains("magic"));
    }
    SECTION("wrong version")
    {
        for (uint8_t v : {0, 2, 255}) {
            b[4] = v;
            reseal(b);
            CHECK_THAT(rejection(b), Catch::Contains("version"));
        }
    }
    SECTION("address count 0 and 5")
    {
        for (uint8_t n : {0, 5, 255}) {
            b[5] = n;
            reseal(b);
            CHECK_THAT(rejection(b), Catch::Contains("count"));
        }
    }
    SECTION("bad family code")
    {
        for (uint8_t f : {0, 2, 5, 10, 255}) {
            entry(b, 1)[0] = f;
            reseal(b);
            CHECK_THAT(rejection(b), Catch::Contains("family"));
        }
    }
    SECTION("zero port")
    {
        entry(b, 0)[2] = 0;
        entry(b, 0)[3] = 0;
        reseal(b);
        CHECK_THAT(rejection(b), Catch::Contains("port"));
    }
    SECTION("byte 1 of an entry is the listener's device index")
    {
        entry(b, 0)[1] = 7;
        reseal(b);
        ListenHandle out;
        std::string why;
        REQUIRE(ListenHandle::decode(b.data(), &out, &why) == 0);
        REQUIRE(out.addr_devs.size() == out.addrs.size());
        CHECK(out.addr_devs[0] == 7);
    }
    SECTION("non-zero bytes after an IPv4 address")
    {
        for (size_t k = 8; k < 20; ++k) {
            Buf c = b;
            entry(c, 0)[k] = 0x80;
            reseal(c);
            CHECK_THAT(rejection(c), Catch::Contains("padding"));
        }
    }
    SECTION("non-zero unused entries")
    {
        for (size_t i = 2; i < ListenHandle::kMaxAddrs; ++i) {
            for (size_t k = 0; k < 20; ++k) {
                Buf c = b;
                entry(c, i)[k] = 1;
                reseal(c);
                CHECK_THAT(rejection(c), Catch::Contains("unused"));
            }
        }
    }
    SECTION("bad checksum")
    {
        b[kSumOffset] ^= 0x40;
        CHECK_THAT(rejection(b), Catch::Contains("checksum"));
    }
}

TEST_CASE("ListenHandle::decode rejects every single-bit flip in [0,104)", "[handle]")
{
    for (size_t n : {1, 4}) {
        const Buf good = encoded(sample_handle(n));
        int accepted = 0;
        for (size_t i = 0; i < kSumOffset; ++i) {
            for (int bit = 0; bit < 8; ++bit) {
                Buf b = good;
                b[i] ^= static_cast<uint8_t>(1u << bit);
                ListenHandle out;
                std::string why;
                if (ListenHandle::decode(b.data(), &out, &why) != -EBADMSG || why.empty()) {
                    ++accepted;
                    UNSCOPED_INFO("byte " << i << " bit " << bit << " not rejected");
                }
            }
        }
        CHECK(accepted == 0);
    }
}

TEST_CASE("ListenHandle::decode ignores the scratch area [108,128)", "[handle]")
{
    const ListenHandle h = sample_handle(3);
    Buf b = encoded(h);
    std::mt19937_64 rng(7);
    for (size_t i = ListenHandle::kScratchOffset; i < ListenHandle::kSize; ++i)
        b[i] = static_cast<uint8_t>(rng() | 1);
    ListenHandle out;
    std::string why;
    REQUIRE(ListenHandle::decode(b.data(), &out, &why) == 0);
    CHECK(out.dev == h.dev);
    CHECK(out.nonce == h.nonce);
    CHECK(out.addrs == h.addrs);
}

TEST_CASE("ListenHandle::decode rejects 100000 random buffers without crashing", "[handle][fuzz]")
{
    std::mt19937_64 rng(0x5eed1234);
    int accepted = 0;
    int accepted_with_magic = 0;
    for (int iter = 0; iter < 100000; ++iter) {
        Buf b;
        for (size_t i = 0; i < b.size(); i += 8) {
            const uint64_t r = rng();
            std::memcpy(b.data() + i, &r, 8);
        }
        ListenHandle out;
        std::string why;
        if (ListenHandle::decode(b.data(), &out, &why) == 0) ++accepted;
        // Same buffer with a plausible prefix, so the later checks see random input too.
        std::memcpy(b.data(), "VGLH", 4);
        b[4] = 1;
        b[5] = static_cast<uint8_t>(1 + b[5] % 4);
        if (ListenHandle::decode(b.data(), &out, &why) == 0)
            ++accepted_with_magic;
        else if (why.empty())
            FAIL("rejected without a reason");
    }
    CHECK(accepted == 0);
    CHECK(accepted_with_magic == 0);
}

TEST_CASE("ListenHandle::decode of checksum-valid mutations is accepted only in canonical, "
          "in-bounds form",
          "[handle][fuzz]")
{
    std::mt19937_64 rng(0xC0FFEE);
    int accepted = 0;
    int rejected = 0;
    for (int iter = 0; iter < 20000; ++iter) {
        ListenHandle h = sample_handle(1 + rng() % 4);
        for (auto &x : h.nonce) x = static_cast<uint8_t>(rng());
        Buf b = encoded(h);
        const int nmut = 1 + static_cast<int>(rng() % 4);
        for (int m = 0; m < nmut; ++m) {
            // Mostly small values: they get past the family/count checks more often.
            const size_t pos = rng() % kSumOffset;
            b[pos] = rng() % 2 ? static_cast<uint8_t>(rng() % 8) : static_cast<uint8_t>(rng());
        }
        reseal(b);
        ListenHandle out;
        std::string why;
        const int rc = ListenHandle::decode(b.data(), &out, &why);
        if (rc != 0) {
            REQUIRE(rc == -EBADMSG);
            REQUIRE_FALSE(why.empty());
            ++rejected;
            continue;
        }
        ++accepted;
        REQUIRE(out.addrs.size() >= 1);
        REQUIRE(out.addrs.size() <= ListenHandle::kMaxAddrs);
        REQUIRE(out.addrs.size() == b[5]);
        for (const Endpoint &e : out.addrs) {
            REQUIRE((e.family == AF_INET || e.family == AF_INET6));
            REQUIRE(e.port != 0);
        }
        // An accepted handle is canonical: encoding it again gives the same bytes.
        Buf again{};
        REQUIRE(out.encode(again.data()) == 0);
        REQUIRE(std::memcmp(again.data(), b.data(), ListenHandle::kScratchOffset) == 0);
    }
    // Both outcomes must have happened, or the loop tested nothing.
    CHECK(accepted > 100);
    CHECK(rejected > 100);
}

TEST_CASE("fnv1a32 matches the published FNV-1a test vectors", "[handle]")
{
    // The checksum is part of the wire format between processes: pin the algorithm.
    auto h = [](const char *s) {
        return vigil::net::fnv1a32(reinterpret_cast<const uint8_t *>(s), std::strlen(s));
    };
    CHECK(h("") == 0x811c9dc5u);
    CHECK(h("a") == 0xe40c292cu);
    CHECK(h("foobar") == 0xbf9cf968u);
}

TEST_CASE("nonce_equal compares all 16 bytes", "[handle]")
{
    std::array<uint8_t, 16> a{};
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<uint8_t>(i * 17);
    std::array<uint8_t, 16> b = a;
    CHECK(vigil::net::nonce_equal(a, b));
    for (size_t i = 0; i < a.size(); ++i) {
        b = a;
        b[i] ^= 0x80;
        CHECK_FALSE(vigil::net::nonce_equal(a, b));
    }
}

TEST_CASE("random_bytes fills the buffer", "[handle]")
{
    std::array<uint8_t, 64> a{}, b{};
    REQUIRE(vigil::net::random_bytes(a.data(), a.size()) == 0);
    REQUIRE(vigil::net::random_bytes(b.data(), b.size()) == 0);
    CHECK(a != b); // 2^-512 chance of a false failure
}

TEST_CASE("Endpoint::to_string formats IPv4 and IPv6", "[handle]")
{
    CHECK(v4("10.0.0.1", 4242).to_string() == "10.0.0.1:4242");
    CHECK(v4("255.255.255.255", 65535).to_string() == "255.255.255.255:65535");
    CHECK(v6("fe80::1", 4242).to_string() == "[fe80::1]:4242");
    CHECK(v6("::1", 1).to_string() == "[::1]:1");
    CHECK(v6("2001:db8::17", 80).to_string() == "[2001:db8::17]:80");
}

TEST_CASE("Endpoint sockaddr round trip", "[handle]")
{
    SECTION("IPv4")
    {
        const Endpoint e = v4("172.16.5.4", 12345);
        sockaddr_storage ss;
        REQUIRE(e.to_sockaddr(&ss) == sizeof(sockaddr_in));
        const auto *in = reinterpret_cast<const sockaddr_in *>(&ss);
        CHECK(in->sin_family == AF_INET);
        CHECK(ntohs(in->sin_port) == 12345);
        CHECK(in->sin_addr.s_addr == inet_addr("172.16.5.4"));
        Endpoint back;
        REQUIRE(Endpoint::from_sockaddr(reinterpret_cast<const sockaddr *>(&ss), &back));
        CHECK(back == e);
    }
    SECTION("IPv6 with scope")
    {
        Endpoint e = v6("fe80::abcd", 999);
        e.scope_id = 3;
        sockaddr_storage ss;
        REQUIRE(e.to_sockaddr(&ss) == sizeof(sockaddr_in6));
        const auto *in6 = reinterpret_cast<const sockaddr_in6 *>(&ss);
        CHECK(in6->sin6_family == AF_INET6);
        CHECK(ntohs(in6->sin6_port) == 999);
        CHECK(in6->sin6_scope_id == 3);
        Endpoint back;
        REQUIRE(Endpoint::from_sockaddr(reinterpret_cast<const sockaddr *>(&ss), &back));
        CHECK(back == e);
    }
    SECTION("other families are refused")
    {
        sockaddr_un un{};
        un.sun_family = AF_UNIX;
        Endpoint back = v4("1.2.3.4", 5);
        CHECK_FALSE(Endpoint::from_sockaddr(reinterpret_cast<const sockaddr *>(&un), &back));
        CHECK_FALSE(Endpoint::from_sockaddr(nullptr, &back));
        CHECK(back == v4("1.2.3.4", 5)); // untouched
    }
}
