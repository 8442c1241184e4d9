// SPDX-License-Identifier: Apache-2.0
// The Striper (striper.h) alone: rates, room, and which path takes the next piece, over a
// model of two paths that deliver what they are given at fixed rates on a synthetic clock.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>

#include "striper.h"

namespace vn = vigil::net;
using vn::kBackup;
using vn::kPrimary;
using vn::Striper;

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kPiece = 256 * kKiB;
constexpr uint64_t kUs = 1000; // ns

// Two paths that deliver what they were posted, in order, each at its own rate (bytes/s),
// and report every piece landed when its last byte arrived; time in steps of `step` ns.
struct Model {
    explicit Model(double fast, double slow, vn::PortAccount *ports = nullptr)
        : rate{fast, slow}, s(kPiece, ports != nullptr ? ports : &own)
    {
        s.set_carrying(kPrimary, 0, true, now);
        s.set_carrying(kBackup, 1, true, now);
    }
    vn::PortCounters own;
    std::array<double, 2> rate;
    Striper s;
    uint64_t now = 1'000'000'000;
    std::array<std::deque<uint64_t>, 2> fifo; // bytes left of each posted piece
    std::array<double, 2> credit{};            // bytes a path may still deliver this step
    std::array<uint64_t, 2> carried{};

    // Posts the next pieces of `msg` bytes (of `remaining` bound) while the Striper says so;
    // returns the bytes of `msg` not yet posted.
    uint64_t post(uint64_t msg, uint64_t *remaining)
    {
        while (msg > 0) {
            const Striper::Pick p = s.next(msg, *remaining, room(), kPrimary, now);
            if (p.slot < 0) break;
            REQUIRE(p.len > 0);
            REQUIRE(p.len <= std::min(msg, kPiece));
            s.on_post(p.slot, p.len, now);
            fifo[static_cast<size_t>(p.slot)].push_back(p.len);
            carried[static_cast<size_t>(p.slot)] += p.len;
            msg -= p.len;
            *remaining -= p.len;
        }
        return msg;
    }
    // Advances the clock by `step` ns, delivering and reporting landings.
    void tick(uint64_t step)
    {
        now += step;
        for (int i = 0; i < 2; ++i) {
            auto &q = fifo[static_cast<size_t>(i)];
            double &c = credit[static_cast<size_t>(i)];
            c = q.empty() ? 0 : c + rate[static_cast<size_t>(i)] * static_cast<double>(step) / 1e9;
            while (!q.empty() && c >= static_cast<double>(q.front())) {
                c -= static_cast<double>(q.front());
                s.on_landed(i, q.front(), now);
                q.pop_front();
            }
        }
    }
    bool idle() const { return fifo[0].empty() && fifo[1].empty(); }
    // Which paths take a piece: what they hold undelivered is below their room limit.
    std::array<bool, vn::kMaxPaths> room() const
    {
        std::array<bool, vn::kMaxPaths> r{};
        for (int i = 0; i < 2; ++i) {
            uint64_t held = 0;
            for (uint64_t b : fifo[static_cast<size_t>(i)]) held += b;
            r[static_cast<size_t>(i)] = held < s.room_limit(i);
        }
        return r;
    }
    // Sends messages of `bytes` (one bound at a time, as a ring step), returns the time it
    // took, ns.
    uint64_t send(uint64_t bytes)
    {
        const uint64_t t0 = now;
        uint64_t remaining = bytes, left = bytes;
        while (left > 0 || !idle()) {
            left = post(left, &remaining);
            tick(10 * kUs);
        }
        return now - t0;
    }
};

} // namespace

TEST_CASE("striper: two equal paths share a stream, each within its room", "[striper]")
{
    Model m(100e6, 100e6);
    uint64_t remaining = 64 * kPiece;
    const uint64_t left = m.post(64 * kPiece, &remaining);
    // Room: two pieces each (two carrying paths on each device), then the rest waits.
    CHECK(m.s.outstanding(kPrimary) == 2 * kPiece);
    CHECK(m.s.outstanding(kBackup) == 2 * kPiece);
    CHECK(left == 60 * kPiece);
    CHECK_FALSE(m.room()[kPrimary]);
    m.send(64 * kPiece);
    const double share = static_cast<double>(m.carried[kBackup]) / static_cast<double>(m.carried[0] + m.carried[1]);
    CHECK(share > 0.4);
    CHECK(share < 0.6);
}

TEST_CASE("striper: a small message keeps to the preferred path", "[striper]")
{
    Model m(100e6, 100e6);
    for (int k = 0; k < 20; ++k) {
        uint64_t remaining = 8;
        CHECK(m.post(8, &remaining) == 0); // posted at once, before anything landed
    }
    CHECK(m.carried[kPrimary] == 160);
    CHECK(m.carried[kBackup] == 0);
}

TEST_CASE("striper: rates follow landings over busy time only", "[striper]")
{
    Model m(200e6, 50e6);
    m.send(32 * kPiece); // learns both rates
    CHECK(m.s.rate(kPrimary, m.now) == Approx(200e6).epsilon(0.15));
    CHECK(m.s.rate(kBackup, m.now) == Approx(50e6).epsilon(0.15));
    // Idle time changes nothing.
    m.now += 5'000'000'000;
    CHECK(m.s.rate(kBackup, m.now) == Approx(50e6).epsilon(0.15));
    // A path that stops delivering with bytes outstanding looks slower at once.
    m.s.on_post(kBackup, kPiece, m.now);
    const double before = m.s.rate(kBackup, m.now);
    m.now += 100'000'000;
    CHECK(m.s.rate(kBackup, m.now) < before / 2);
}

TEST_CASE("striper: a ring step's tail never waits on the slow path", "[striper]")
{
    const uint64_t msg = 16 * kPiece; // 4 MiB
    for (const double cut : {0.75, 0.5, 0.25, 0.1, 0.02}) {
        CAPTURE(cut);
        Model m(100e6, 100e6 * cut);
        for (int k = 0; k < 4; ++k) m.send(msg); // rates learned
        const uint64_t t = m.send(msg);
        // The fluid bound: both paths finishing together; and the fast path alone (what a
        // dead slow port would cost).
        const double fluid = static_cast<double>(msg) / (100e6 * (1 + cut)) * 1e9;
        const double alone = static_cast<double>(msg) / 100e6 * 1e9;
        const double piece = static_cast<double>(kPiece) / 100e6 * 1e9; // one on the fast path
        CHECK(static_cast<double>(t) <= std::max(fluid * 1.1, fluid + piece));
        CHECK(static_cast<double>(t) <= alone * 1.02);
    }
}

TEST_CASE("striper: a path far slower than its share is worth takes nothing, then is "
          "measured again",
          "[striper]")
{
    Model m(100e6, 100e6);
    m.send(16 * kPiece);
    m.rate[kBackup] = 100e6 / 100; // the port is cut to 1 %
    for (int k = 0; k < 3; ++k) m.send(16 * kPiece);
    const uint64_t before = m.carried[kBackup];
    m.send(4 * kPiece);
    CHECK(m.carried[kBackup] == before); // its share is below a minimum piece
    // After kReprobeNs without a piece it takes its (small) share again ...
    m.now += Striper::kReprobeNs;
    m.rate[kBackup] = 100e6; // ... and finds the port healed
    for (int k = 0; k < 6; ++k) m.send(16 * kPiece);
    CHECK(m.carried[kBackup] > before + 8 * kPiece);
    CHECK(m.s.rate(kBackup, m.now) > 50e6);
}

TEST_CASE("striper: the port's room is shared by the paths carrying on it", "[striper]")
{
    vn::PortCounters ports;
    Model m(100e6, 100e6, &ports);
    CHECK(ports.carriers(0) == 1);
    // Three more connections carry on device 0: four pieces over four paths, one each.
    for (int k = 0; k < 3; ++k) ports.add(0, +1);
    uint64_t remaining = 64 * kPiece;
    m.post(64 * kPiece, &remaining);
    CHECK(m.s.outstanding(kPrimary) == kPiece);
    CHECK(m.s.outstanding(kBackup) == 2 * kPiece);
    m.s.set_carrying(kPrimary, 0, false, m.now);
    CHECK(ports.carriers(0) == 3);
    CHECK(m.s.outstanding(kPrimary) == 0); // abandoned with it
}

TEST_CASE("striper: a healthy preferred path holds more where the other ports carry other "
          "connections' own traffic",
          "[striper]")
{
    vn::PortCounters ports;
    ports.lead(1, +1); // another connection's preferred path is on device 1
    Model m(100e6, 100e6, &ports);
    CHECK(m.s.room_limit(kPrimary) == 2 * kPiece); // nothing measured yet
    m.send(16 * kPiece);
    // Both measured, the primary as fast as the backup, and the backup's port another
    // connection's: the primary holds four times its room, so it does not spill there.
    CHECK(ports.leaders(0) == 1);
    CHECK(m.s.room_limit(kPrimary) == 8 * kPiece);
    CHECK(m.s.room_limit(kBackup) == 2 * kPiece);
    // A primary that slows is held to its room again, and the backup takes its share.
    m.rate[kPrimary] = 25e6;
    for (int k = 0; k < 4; ++k) m.send(16 * kPiece);
    CHECK(m.s.room_limit(kPrimary) == 2 * kPiece);
    // With the backup's port free of other connections, the room stays as it was.
    ports.lead(1, -1);
    Model alone(100e6, 100e6, &ports);
    alone.send(16 * kPiece);
    CHECK(alone.s.room_limit(kPrimary) == 2 * kPiece);
}

TEST_CASE("striper: the room is not wide while another connection spills onto the port, nor "
          "against a faster leader on the other port",
          "[striper]")
{
    vn::PortCounters ports;
    ports.lead(1, +1); // another connection's preferred path is on device 1
    Model m(100e6, 100e6, &ports);
    m.send(16 * kPiece);
    REQUIRE(m.s.room_limit(kPrimary) == 8 * kPiece);
    CHECK(ports.lead_rate(0) > 50e6); // the primary's rate, published for the port
    // Another connection's other path holds a whole piece on device 0: room as it was.
    ports.spill(0, +1);
    m.send(16 * kPiece);
    CHECK(m.s.room_limit(kPrimary) == 2 * kPiece);
    ports.spill(0, -1);
    m.send(16 * kPiece);
    CHECK(m.s.room_limit(kPrimary) == 8 * kPiece);
    // The leader on device 1 moves four times what the primary does: the backup, fed only
    // what overflows, says little of that port, and the room is not wide.
    ports.lead_rate(1, 400e6);
    m.send(16 * kPiece);
    CHECK(m.s.room_limit(kPrimary) == 2 * kPiece);
}

TEST_CASE("striper: a connection spills onto a port while a path other than its preferred one "
          "holds a whole piece there",
          "[striper]")
{
    vn::PortCounters ports;
    {
        Model m(25e6, 100e6, &ports); // the preferred path is the slow one
        uint64_t remaining = 64 * kPiece;
        const uint64_t left = m.post(64 * kPiece, &remaining);
        REQUIRE(left > 0);
        REQUIRE(m.s.outstanding(kBackup) >= kPiece);
        CHECK(ports.spillers(1) == 1);
        CHECK(ports.spillers(0) == 0); // the preferred path's own port is not spilled onto
        CHECK(ports.leaders(0) == 1);
        while (!m.idle()) m.tick(10 * kUs);
        CHECK(ports.spillers(1) == 0); // landed
        m.post(left, &remaining);
        REQUIRE(m.s.outstanding(kBackup) >= kPiece);
        CHECK(ports.spillers(1) == 1);
        m.s.set_carrying(kBackup, 1, false, m.now); // abandoned: no longer spilling
        CHECK(ports.spillers(1) == 0);
        m.post(left, &remaining);
        m.s.set_carrying(kBackup, 1, true, m.now);
        m.s.on_post(kBackup, kPiece, m.now);
        CHECK(ports.spillers(1) == 1);
    }
    // The Striper is gone: it leaves the account as it found it.
    CHECK(ports.spillers(1) == 0);
    CHECK(ports.leaders(0) == 0);
    CHECK(ports.carriers(0) == 0);
    CHECK(ports.carriers(1) == 0);
}

TEST_CASE("striper: a path never measured is measured once it has waited, so a preferred path "
          "that slows does not keep every message",
          "[striper]")
{
    // Messages of two pieces, each within the preferred path's room: it takes all of them
    // and the other path is never measured.
    Model m(100e6, 100e6);
    for (int k = 0; k < 10; ++k) m.send(2 * kPiece);
    REQUIRE(m.carried[kBackup] == 0);
    REQUIRE(m.s.rate(kBackup, m.now) == 0);
    // The preferred path's port is cut to a tenth. Assumed as fast as the only path measured,
    // the other path would never be given a piece; once it has waited kReprobeNs it takes a
    // minimum piece, is measured, and carries what it delivers first from then on.
    m.rate[kPrimary] = 10e6;
    uint64_t t = 0;
    while (m.now < 1'000'000'000 + 2 * Striper::kReprobeNs) t = m.send(2 * kPiece);
    CHECK(m.s.rate(kBackup, m.now) > 50e6);
    const double alone = static_cast<double>(2 * kPiece) / 100e6 * 1e9; // the fast path alone
    CHECK(static_cast<double>(t) <= alone * 1.3);
}

TEST_CASE("striper: a path never measured is assumed as fast as its port's leader", "[striper]")
{
    vn::PortCounters ports;
    ports.lead(1, +1); // another connection leads on device 1, at 100 MB/s
    ports.lead_rate(1, 100e6);
    Model m(100e6, 100e6, &ports);
    for (int k = 0; k < 10; ++k) m.send(2 * kPiece);
    REQUIRE(m.carried[kBackup] == 0);
    // The preferred path's port is cut to a tenth: the other path, taken to be as fast as
    // what was measured on its port, takes the pieces at once, before any reprobe is due.
    m.rate[kPrimary] = 10e6;
    uint64_t t = 0;
    for (int k = 0; k < 4; ++k) t = m.send(2 * kPiece);
    REQUIRE(m.now < 1'000'000'000 + Striper::kReprobeNs);
    CHECK(m.carried[kBackup] > 0);
    const double alone = static_cast<double>(2 * kPiece) / 100e6 * 1e9;
    CHECK(static_cast<double>(t) <= alone * 1.3);
}
