// SPDX-License-Identifier: Apache-2.0
// Pow2Ring: the doubling ring behind the message, CTS and piece rings.
#include <catch2/catch.hpp>

#include <cerrno>
#include <cstdint>
#include <memory>

#include "pow2_ring.h"
#include "socket_conn.h"

namespace vn = vigil::net;

TEST_CASE("a ring keeps its live entries at their index across each doubling", "[pow2_ring]")
{
    vn::Pow2Ring<uint64_t> r(4);
    // A live window that has wrapped around the ring several times: [lo, hi) = [13, 17).
    uint64_t lo = 13, hi = 17;
    for (uint64_t i = lo; i < hi; ++i) r.at(i) = 1000 + i;
    // Slot 13 & 3 == 1 == 17 & 3: full, the next index would land on the floor's slot.
    REQUIRE(&r.at(hi) == &r.at(lo));
    REQUIRE(r.grow(lo, hi, 64));
    REQUIRE(r.size() == 8);
    for (uint64_t i = lo; i < hi; ++i) CHECK(r.at(i) == 1000 + i);
    // The new slots are free: the window extends without touching a live entry.
    for (; hi < lo + 8; ++hi) {
        CHECK(r.at(hi) == 0);
        r.at(hi) = 1000 + hi;
    }
    ++lo; // the floor moves; the window [14, 21) crosses the 8-slot ring's wrap at 16
    REQUIRE(r.grow(lo, hi, 64));
    REQUIRE(r.size() == 16);
    for (uint64_t i = lo; i < hi; ++i) CHECK(r.at(i) == 1000 + i);
    CHECK(r.at(lo - 1 + 16) == 0); // the entry below the floor did not move
}

TEST_CASE("a ring does not grow past its limit and stays as it was", "[pow2_ring]")
{
    vn::Pow2Ring<uint64_t> r(8);
    for (uint64_t i = 5; i < 13; ++i) r.at(i) = i;
    REQUIRE(r.grow(5, 13, 16));
    CHECK_FALSE(r.grow(5, 13, 16)); // 32 > 16
    CHECK_FALSE(r.grow(5, 13, 31)); // not a power of two: the largest one below it holds
    REQUIRE(r.size() == 16);
    for (uint64_t i = 5; i < 13; ++i) CHECK(r.at(i) == i);
}

TEST_CASE("a ring moves its entries, so it holds move-only ones", "[pow2_ring]")
{
    vn::Pow2Ring<std::unique_ptr<int>> r(2);
    r.at(7) = std::make_unique<int>(7);
    r.at(8) = std::make_unique<int>(8);
    REQUIRE(r.grow(7, 9, 4));
    REQUIRE(r.at(7) != nullptr);
    REQUIRE(r.at(8) != nullptr);
    CHECK(*r.at(7) == 7);
    CHECK(*r.at(8) == 8);
    CHECK(r.at(9) == nullptr);
    CHECK(r.at(10) == nullptr);
}

TEST_CASE("a TCP path's piece FIFO grows to its limit, and a piece past it fails the path, "
          "not the process",
          "[pow2_ring]")
{
    namespace st = vigil::test::sock;
    static uint8_t byte = 0;
    struct Sink final : vn::SendSink {
        void acked(uint64_t) override {}
        void held(uint64_t) override {}
        void landed(uint64_t, uint64_t, uint32_t, uint64_t) override {}
        int cts(const vn::CtsGroup &) override { return 0; }
    } sink;
    // Nothing is written until progress(): every piece posted stays queued.
    auto fill = [](vn::SendPath &p, uint64_t n) {
        for (uint64_t seq = 0; seq < n; ++seq)
            p.post(vn::OutMessage{.seq = seq, .tag = 0, .data = &byte, .size = 1, .offset = 0,
                                  .length = 1, .mr = nullptr, .group = 0, .entry = 0,
                                  .dest = {}});
    };
    constexpr uint64_t kMax = vigil::net::tcp::TcpSendPath::kMaxFifo;
    for (const uint64_t n : {kMax, kMax + 1}) {
        CAPTURE(n);
        std::unique_ptr<vn::SendPath> sp;
        std::unique_ptr<vn::RecvPath> rp;
        st::PathFds fds;
        st::make_path(st::Options{}, vn::kPrimary, &sp, &rp, &fds);
        fill(*sp, n);
        const vn::PathStatus s = sp->progress(sink);
        if (n == kMax) {
            CHECK(s.error == 0); // the FIFO doubled 7 times to hold them all
        } else {
            CHECK(s.error == -ENOMEM);
            CHECK_FALSE(s.fatal); // another path takes the connection over
            CHECK_THAT(s.detail, Catch::Contains("could not queue a piece"));
        }
    }
}
