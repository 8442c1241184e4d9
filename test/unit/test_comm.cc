// SPDX-License-Identifier: Apache-2.0
// The transport-agnostic core's requests over one path (no backup; failover is
// test_failover.cc's): CTS matching at the sender, placement and completion at the receiver,
// the ack window, request and window limits, zero-byte messages, memory region references, and
// a random stress. Driven through the fake fabric (comm_link.h), whose frames the tests also
// forge; frames that break the protocol and path failures are test_comm_protocol.cc's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "comm_link.h"
#include "fake_fabric.h"
#include "socket_conn.h"
#include "traffic.h"

using namespace vigil::test::comm; // vn, Link and the helpers
using vn::Placement;
using vigil::test::fake::Frame;

// ---- CTS matching at the sender -------------------------------------------------------------

TEST_CASE("isend answers NULL until the receiver's CTS names a buffer with its tag", "[comm][cts]")
{
    Link L;
    uint8_t x = 1;
    null_isend(L.send, &x, 1, 4);
    CHECK(L.w.posted.empty());
    std::vector<uint8_t> a(8), b(8);
    Request *r = must_irecv(L.recv, {a.data()}, {8}, {5}); // a different tag
    REQUIRE(L.w.advertised.size() == 1);
    CHECK(L.w.advertised[0].index == 0);
    CHECK(L.w.advertised[0].first_seq == 0);
    CHECK(L.w.advertised[0].n == 1);
    CHECK(L.w.advertised[0].entries[0].tag == 5);
    CHECK(L.w.advertised[0].entries[0].size == 8);
    CHECK(L.w.advertised[0].entries[0].addr == reinterpret_cast<uintptr_t>(a.data()));
    null_isend(L.send, &x, 1, 4); // tag 4 is not in the oldest group
    Request *s5 = must_isend(L.send, &x, 1, 5);
    Request *r2 = must_irecv(L.recv, {b.data()}, {8}, {4});
    Request *s4 = must_isend(L.send, &x, 1, 4);
    CHECK(done(L.recv, r));
    CHECK(done(L.recv, r2));
    CHECK(done(L.send, s5));
    CHECK(done(L.send, s4));
    REQUIRE(L.w.messages.size() == 2);
    CHECK(L.w.messages[0].group == 0);
    CHECK(L.w.messages[1].group == 1);
    CHECK(L.n.send->stats().null_for_cts == 2);
}

TEST_CASE("a send binds to the first unbound buffer with its tag in the oldest group", "[comm][cts]")
{
    Link L;
    std::vector<std::vector<uint8_t>> dst(6, std::vector<uint8_t>(64, 0));
    must_irecv(L.recv, {dst[0].data(), dst[1].data(), dst[2].data()}, {64, 64, 64}, {7, 7, 8});
    must_irecv(L.recv, {dst[3].data(), dst[4].data(), dst[5].data()}, {64, 64, 64}, {8, 7, 7});
    const auto src = bytes(10, 1);
    const int tags[6] = {8, 7, 7, 7, 8, 7};
    for (int t : tags) must_isend(L.send, src.data(), src.size(), t);
    REQUIRE(L.w.messages.size() == 6);
    const std::pair<uint64_t, int> want[6] = {{0, 2}, {0, 0}, {0, 1}, {1, 1}, {1, 0}, {1, 2}};
    for (size_t i = 0; i < 6; ++i) {
        INFO("message " << i);
        CHECK(L.w.messages[i].seq == i);
        CHECK(L.w.messages[i].group == want[i].first);
        CHECK(L.w.messages[i].entry == want[i].second);
        CHECK(L.w.messages[i].dest.addr ==
              reinterpret_cast<uintptr_t>(dst[want[i].first * 3 + static_cast<size_t>(want[i].second)].data()));
    }
}

TEST_CASE("the sender drops CTS groups it already has and refuses contradicting ones", "[comm][cts]")
{
    Link L;
    L.w.hold_acks = true;
    uint8_t buf[2][8];
    must_irecv(L.recv, {buf[0], buf[1]}, {8, 8}, {1, 1});
    REQUIRE(L.w.advertised.size() == 1);
    vigil::test::fake::Back dup;
    dup.kind = vigil::test::fake::Back::kCts;
    dup.cts = L.w.advertised[0];
    L.w.back.push_back(dup); // a repeat, as the other path would deliver it
    uint8_t x = 9;
    Request *s = must_isend(L.send, &x, 1, 1); // group 0 keeps one unbound buffer
    CHECK(L.n.send->stats().cts_duplicates == 1);
    CHECK(L.n.send->stats().cts_groups == 1);
    SECTION("a group that skips ahead is fatal")
    {
        dup.cts.index = 5;
        L.w.back.push_back(dup);
        CHECK(eventual_error(L.send, s) == -EPROTO);
    }
    SECTION("a repeat that disagrees with the first copy is fatal")
    {
        dup.cts.n = 3;
        L.w.back.push_back(dup);
        CHECK(eventual_error(L.send, s) == -EPROTO);
    }
    SECTION("a group at the wrong sequence number is fatal")
    {
        dup.cts.index = 1;
        dup.cts.first_seq = 7;
        L.w.back.push_back(dup);
        CHECK(eventual_error(L.send, s) == -EPROTO);
    }
    SECTION("a group with a bad buffer count is fatal")
    {
        dup.cts.index = 1;
        dup.cts.first_seq = 2;
        dup.cts.n = vn::kMaxRecvs + 1;
        L.w.back.push_back(dup);
        CHECK(eventual_error(L.send, s) == -EPROTO);
    }
}

// ---- Send completion and request recycling ------------------------------------------------

TEST_CASE("a send completes only after the receiver acked it", "[comm]")
{
    Link L;
    L.w.hold_acks = true;
    const auto src = bytes(100, 1);
    std::vector<uint8_t> dst(128, 0);
    Request *r = must_irecv(L.recv, {dst.data()}, {dst.size()}, {7});
    Request *s = must_isend(L.send, src.data(), src.size(), 7);
    REQUIRE(L.w.messages.size() == 1);
    CHECK(L.w.messages[0].seq == 0);
    CHECK(L.w.messages[0].tag == 7);
    CHECK(L.w.messages[0].size == 100);
    CHECK(L.w.messages[0].data == src.data());

    int rsize = -1;
    CHECK(done(L.recv, r, &rsize));
    CHECK(rsize == 100);
    CHECK(starts_with(dst, src));
    CHECK(all_equal(dst.data() + 100, 28, 0));
    REQUIRE(L.w.acks.size() == 1);
    CHECK(L.w.acks[0].first == 1);
    CHECK(r->state.load() == Request::kFree);

    // The receiver holds it, but the ack has not reached the sender yet.
    CHECK_FALSE(done(L.send, s));
    CHECK_FALSE(done(L.send, s));
    L.w.release_acks();
    int ssize = -1;
    CHECK(done(L.send, s, &ssize));
    CHECK(ssize == 100);
    CHECK(s->state.load() == Request::kFree);
}

TEST_CASE("requests are recycled after test() reported them done", "[comm]")
{
    Link L;
    std::vector<Request *> sreqs;
    Request *first_recv = nullptr;
    for (uint32_t i = 0; i < 600; ++i) {
        uint32_t out = i * 2654435761u, in = 0;
        Request *r = must_irecv(L.recv, {&in}, {sizeof(in)}, {1});
        Request *s = must_isend(L.send, &out, sizeof(out), 1);
        if (first_recv == nullptr) first_recv = r;
        CHECK(r == first_recv); // the one recv request is free again every time
        int rs = -1, ss = -1;
        REQUIRE(done(L.recv, r, &rs));
        REQUIRE(done(L.send, s, &ss));
        REQUIRE(rs == 4);
        REQUIRE(ss == 4);
        REQUIRE(in == out);
        sreqs.push_back(s);
        // One message in flight at a time: the ring keeps its first size, its slots in turn.
        const uint32_t ring = L.send.stats().ring_slots;
        REQUIRE(ring == 16);
        if (i >= ring) REQUIRE(sreqs[i] == sreqs[i - ring]);
    }
    CHECK(L.send.stats().cts_slots == 8);
    CHECK(L.w.acks.size() == 600);
    CHECK(L.w.ack_regressions == 0);
}

TEST_CASE("test() accepts NULL sizes", "[comm]")
{
    Link L;
    uint8_t x = 42, y = 0;
    Request *r = must_irecv(L.recv, {&y}, {1}, {0});
    Request *s = must_isend(L.send, &x, 1, 0);
    CHECK(done(L.recv, r));
    CHECK(done(L.send, s));
    CHECK(y == 42);
}

TEST_CASE("a message slot is reused only once its send was acked and tested", "[comm]")
{
    Link L;
    L.w.hold_acks = true;
    uint8_t byte = 0;
    std::vector<std::array<uint8_t, 8>> bufs(vn::kMaxInflight + 8);
    std::vector<Request *> recvs;
    for (int k = 0; k < vn::kMaxRequests; ++k) {
        std::vector<void *> d;
        for (int i = 0; i < vn::kMaxRecvs; ++i) d.push_back(bufs[static_cast<size_t>(k * 8 + i)].data());
        recvs.push_back(must_irecv(L.recv, d, std::vector<size_t>(8, 8), std::vector<int>(8, 0)));
    }
    std::vector<Request *> reqs;
    for (int i = 0; i < vn::kMaxInflight; ++i) reqs.push_back(must_isend(L.send, &byte, 1, 0));
    CHECK(L.w.posted.size() == static_cast<size_t>(vn::kMaxInflight));
    null_isend(L.send, &byte, 1, 0); // no CTS entry left (and the window is full)

    // Every receive completed; the first group is tested and posted again.
    for (Request *r : recvs) REQUIRE(done(L.recv, r));
    std::vector<void *> d;
    for (int i = 0; i < vn::kMaxRecvs; ++i) d.push_back(bufs[static_cast<size_t>(vn::kMaxInflight + i)].data());
    must_irecv(L.recv, d, std::vector<size_t>(8, 8), std::vector<int>(8, 0));

    // The acks reach the sender; only seq 0 is tested.
    L.w.release_acks();
    CHECK(done(L.send, reqs[0]));
    Request *r256 = must_isend(L.send, &byte, 1, 0);
    CHECK(r256 == reqs[0]);
    CHECK(r256->seq == static_cast<uint64_t>(vn::kMaxInflight));
    // Seq 1 is acked but not tested yet: its slot is still NCCL's.
    null_isend(L.send, &byte, 1, 0);
    CHECK(done(L.send, reqs[1]));
    CHECK(must_isend(L.send, &byte, 1, 0) == reqs[1]);
    for (size_t i = 0; i < L.w.posted.size(); ++i) REQUIRE(L.w.posted[i].first == i);
}

TEST_CASE("the message ring grows with the sends in flight; NCCL's requests stay where they are",
          "[comm]")
{
    Link L;
    // 20 messages one at a time first, so the ring has wrapped when it grows: each slot then
    // moves to a new place.
    constexpr uint64_t kWarm = 20;
    for (uint64_t i = 0; i < kWarm; ++i) {
        uint8_t x = 1, y = 0;
        Request *r = must_irecv(L.recv, {&y}, {1}, {3});
        Request *s = must_isend(L.send, &x, 1, 3);
        REQUIRE(done(L.recv, r));
        REQUIRE(done(L.send, s));
    }
    CHECK(L.send.stats().ring_slots == 16);
    L.w.hold_acks = true;
    constexpr int kSends = 40; // the ring doubles from 16 to 32 to 64 on the way
    std::vector<std::vector<uint8_t>> out(kSends), in(kSends);
    std::vector<Request *> recvs, sends;
    for (int i = 0; i < kSends; ++i) {
        out[static_cast<size_t>(i)].assign(static_cast<size_t>(i + 1), static_cast<uint8_t>(i * 7 + 1));
        in[static_cast<size_t>(i)].assign(64, 0);
    }
    // 10 receives of 4 buffers each: the CTS ring doubles from 8 to 16 groups.
    for (int k = 0; k < kSends / 4; ++k) {
        std::vector<void *> d;
        for (int i = 0; i < 4; ++i) d.push_back(in[static_cast<size_t>(k * 4 + i)].data());
        recvs.push_back(must_irecv(L.recv, d, std::vector<size_t>(4, 64), std::vector<int>(4, 3)));
    }
    for (int i = 0; i < kSends; ++i) {
        sends.push_back(must_isend(L.send, out[static_cast<size_t>(i)].data(), out[static_cast<size_t>(i)].size(), 3));
        REQUIRE(sends.back()->seq == kWarm + static_cast<uint64_t>(i));
    }
    CHECK(L.send.stats().ring_slots == 64);
    CHECK(L.send.stats().cts_slots == 16);
    std::vector<Request *> distinct = sends;
    std::sort(distinct.begin(), distinct.end());
    CHECK(std::unique(distinct.begin(), distinct.end()) == distinct.end());
    for (Request *s : sends) CHECK(s->state.load() == Request::kPending);

    for (int k = 0; k < kSends / 4; ++k) {
        std::array<int, vn::kMaxRecvs> sizes{};
        REQUIRE(done(L.recv, recvs[static_cast<size_t>(k)], sizes.data()));
        for (int i = 0; i < 4; ++i) CHECK(sizes[static_cast<size_t>(i)] == k * 4 + i + 1);
    }
    L.w.release_acks();
    for (int i = 0; i < kSends; ++i) { // each request still says its own message's size
        int size = -1;
        REQUIRE(done(L.send, sends[static_cast<size_t>(i)], &size));
        CHECK(size == i + 1);
    }
    for (int i = 0; i < kSends; ++i)
        CHECK(std::equal(out[static_cast<size_t>(i)].begin(), out[static_cast<size_t>(i)].end(),
                         in[static_cast<size_t>(i)].begin()));
    // The grown ring serves the next messages from the slots that follow.
    int size = -1;
    uint8_t b = 9, got = 0;
    Request *r = must_irecv(L.recv, {&got}, {1}, {3});
    Request *s = must_isend(L.send, &b, 1, 3);
    CHECK(s->seq == kWarm + kSends);
    REQUIRE(done(L.recv, r));
    REQUIRE(done(L.send, s, &size));
    CHECK(got == 9);
    CHECK(L.send.stats().ring_slots == 64);
}

TEST_CASE("a TCP path's FIFO grows while its sockets are full; every message lands intact",
          "[comm][tcp]")
{
    // 96 messages posted at once over 2 streams of 4 KiB socket buffers: the path's FIFO
    // (16 pieces at first) holds them all while the receiver reads nothing. A FIFO that did
    // not grow, or lost its queued pieces growing, would send the wrong bytes.
    namespace sock = vigil::test::sock;
    sock::Options o;
    o.sndbuf = 4096;
    o.chunk = 4096;
    o.backup = GENERATE(false, true);
    vn::FailoverConfig cfg;
    cfg.multipath = o.backup; // with a backup: pieces over both paths
    cfg.piece_bytes = 8192;
    INFO((o.backup ? "multipath over 2 paths" : "one path"));
    sock::Conn c(cfg, o);
    constexpr int kGroups = 12, kMsgs = kGroups * vn::kMaxRecvs, kBytes = 16 * 1024;
    std::vector<std::vector<uint8_t>> out(kMsgs), in(kMsgs);
    std::vector<Request *> recvs, sends;
    for (int i = 0; i < kMsgs; ++i) {
        out[static_cast<size_t>(i)].resize(kBytes);
        for (int k = 0; k < kBytes; ++k) out[static_cast<size_t>(i)][static_cast<size_t>(k)] = static_cast<uint8_t>(i * 31 + k);
        in[static_cast<size_t>(i)].assign(kBytes, 0);
    }
    for (int g = 0; g < kGroups; ++g) {
        std::array<void *, vn::kMaxRecvs> d{};
        std::array<size_t, vn::kMaxRecvs> sz{};
        std::array<int, vn::kMaxRecvs> tags{};
        for (int i = 0; i < vn::kMaxRecvs; ++i) {
            d[static_cast<size_t>(i)] = in[static_cast<size_t>(g * vn::kMaxRecvs + i)].data();
            sz[static_cast<size_t>(i)] = kBytes;
        }
        Request *r = nullptr;
        REQUIRE(c.recv->irecv(vn::kMaxRecvs, d.data(), sz.data(), tags.data(), nullptr, &r) == 0);
        REQUIRE(r != nullptr);
        recvs.push_back(r);
    }
    for (int i = 0; i < kMsgs; ++i) {
        Request *s = nullptr;
        for (int tries = 0; s == nullptr && tries < 1000; ++tries) {
            REQUIRE(c.send->isend(out[static_cast<size_t>(i)].data(), kBytes, 0, nullptr, &s) == 0);
            int done = 0; // the receiver's first pass writes its CTS groups
            if (s == nullptr) REQUIRE(c.recv->test(recvs.back(), &done, nullptr) == 0);
        }
        INFO("send " << i);
        REQUIRE(s != nullptr);
        sends.push_back(s);
    }
    size_t left = recvs.size() + sends.size();
    for (int spins = 0; left > 0 && spins < 200000; ++spins) {
        for (auto *v : {&recvs, &sends})
            for (Request *&r : *v) {
                if (r == nullptr) continue;
                int done = 0;
                const int rc = r->is_send ? c.send->test(r, &done, nullptr) : c.recv->test(r, &done, nullptr);
                if (rc != 0) FAIL("test() returned " << rc);
                if (done) {
                    r = nullptr;
                    --left;
                }
            }
    }
    REQUIRE(left == 0);
    for (int i = 0; i < kMsgs; ++i) REQUIRE(in[static_cast<size_t>(i)] == out[static_cast<size_t>(i)]);
}

TEST_CASE("irecv beyond kMaxRequests outstanding is refused", "[comm]")
{
    Link L;
    std::vector<uint64_t> bufs(vn::kMaxRequests + 1);
    std::vector<Request *> reqs;
    for (int i = 0; i < vn::kMaxRequests; ++i)
        reqs.push_back(must_irecv(L.recv, {&bufs[static_cast<size_t>(i)]}, {8}, {0}));
    Request *extra = reinterpret_cast<Request *>(&bufs[0]);
    void *data = &bufs.back();
    size_t size = 8;
    int tag = 0;
    CHECK(L.recv.irecv(1, &data, &size, &tag, nullptr, &extra) == 0);
    CHECK(extra == nullptr);

    uint64_t v = 0x1122334455667788ULL;
    must_isend(L.send, &v, 8, 0);
    CHECK(done(L.recv, reqs[0]));
    CHECK(bufs[0] == v);
    CHECK(must_irecv(L.recv, {data}, {8}, {0}) == reqs[0]);
}

TEST_CASE("irecv is refused while the sequence window is full, even with free requests", "[comm]")
{
    Link L;
    // Messages 0..7 (the first irecv's) travel on a stream that is held back.
    route(L.w, 2, [](const OutMessage &m) { return m.seq < 8 ? size_t{1} : size_t{0}; });
    L.w.paused[1] = true;

    std::vector<std::array<uint8_t, 8>> bufs(vn::kMaxInflight);
    std::vector<Request *> reqs;
    for (int k = 0; k < vn::kMaxRequests; ++k) {
        std::vector<void *> d;
        for (int i = 0; i < vn::kMaxRecvs; ++i)
            d.push_back(bufs[static_cast<size_t>(k * 8 + i)].data());
        reqs.push_back(must_irecv(L.recv, d, std::vector<size_t>(8, 8), std::vector<int>(8, 3)));
    }
    std::vector<uint8_t> src(vn::kMaxInflight);
    std::iota(src.begin(), src.end(), uint8_t{0});
    for (int i = 0; i < vn::kMaxInflight; ++i)
        must_isend(L.send, &src[static_cast<size_t>(i)], 1, 3);

    for (int k = 1; k < vn::kMaxRequests; ++k) {
        std::vector<int> sizes(8, -1);
        REQUIRE(done(L.recv, reqs[static_cast<size_t>(k)], sizes.data()));
        CHECK(sizes == std::vector<int>(8, 1));
    }
    CHECK_FALSE(done(L.recv, reqs[0]));
    CHECK(L.w.acks.empty()); // seq 0 incomplete: no ack at all

    uint8_t spare[1];
    void *data = spare;
    size_t size = 1;
    int tag = 3;
    Request *extra = reqs[0];
    CHECK(L.recv.irecv(1, &data, &size, &tag, nullptr, &extra) == 0);
    CHECK(extra == nullptr);

    L.w.paused[1] = false;
    CHECK(done(L.recv, reqs[0]));
    REQUIRE_FALSE(L.w.acks.empty());
    CHECK(L.w.acks.back().first == static_cast<uint64_t>(vn::kMaxInflight));
    CHECK(L.w.ack_regressions == 0);
    for (int i = 0; i < vn::kMaxInflight; ++i)
        CHECK(bufs[static_cast<size_t>(i)][0] == src[static_cast<size_t>(i)]);
    CHECK(must_irecv(L.recv, {data}, {1}, {3}) != nullptr);
}

TEST_CASE("a receiving connection's requests and message ring grow with what is pending, and "
          "a message half placed before the growth completes in place", "[comm]")
{
    Link L;
    // Message 0's first half travels on stream 0, its second half on stream 1, held back;
    // every other message whole on stream 0.
    L.w.set_streams(2);
    L.w.paused[1] = true;
    L.w.split = [](const OutMessage &m, Lane &lane) {
        if (m.seq != 0) {
            FakeSendPath::write_to(lane, 0, chunk_of(m, 0, m.size, lane.gen));
            return;
        }
        FakeSendPath::write_to(lane, 0, chunk_of(m, 0, m.size / 2, lane.gen));
        FakeSendPath::write_to(lane, 1, chunk_of(m, m.size / 2, m.size - m.size / 2, lane.gen));
    };
    auto slots = [&] { return std::pair{L.recv.slots().requests, L.recv.slots().messages}; };
    CHECK(slots() == std::pair{0u, 16u}); // nothing allocated for requests before the first

    constexpr size_t kBytes = 64;
    std::vector<std::vector<uint8_t>> dst(vn::kMaxInflight, std::vector<uint8_t>(kBytes, 0xEE));
    std::vector<std::vector<uint8_t>> src;
    for (int i = 0; i < vn::kMaxInflight; ++i) src.push_back(bytes(kBytes, static_cast<uint8_t>(i)));
    auto post = [&](int k) {
        std::vector<void *> d;
        for (int i = 0; i < vn::kMaxRecvs; ++i) d.push_back(dst[static_cast<size_t>(k * vn::kMaxRecvs + i)].data());
        return must_irecv(L.recv, d, std::vector<size_t>(vn::kMaxRecvs, kBytes), std::vector<int>(vn::kMaxRecvs, 6));
    };
    std::vector<Request *> recvs{post(0)};
    CHECK(slots() == std::pair{8u, 16u});
    for (int i = 0; i < vn::kMaxRecvs; ++i) must_isend(L.send, src[static_cast<size_t>(i)].data(), kBytes, 6);
    // Messages 1..7 complete, message 0 holds half its bytes: the floor stays at 0.
    CHECK_FALSE(done(L.recv, recvs[0]));
    CHECK(all_equal(dst[0].data() + kBytes / 2, kBytes / 2, 0xEE));

    // NCCL's fullest window: every request and every message slot, the ring doubling four
    // times and the pool twice while message 0 is half placed.
    for (int k = 1; k < vn::kMaxRequests; ++k) recvs.push_back(post(k));
    CHECK(slots() == std::pair{static_cast<uint32_t>(vn::kMaxRequests), static_cast<uint32_t>(vn::kMaxInflight)});
    for (int i = vn::kMaxRecvs; i < vn::kMaxInflight; ++i)
        must_isend(L.send, src[static_cast<size_t>(i)].data(), kBytes, 6);
    for (size_t k = 1; k < recvs.size(); ++k) REQUIRE(done(L.recv, recvs[k]));
    CHECK_FALSE(done(L.recv, recvs[0]));
    CHECK(L.w.acks.empty()); // message 0 incomplete: no ack

    L.w.paused[1] = false;
    REQUIRE(done(L.recv, recvs[0]));
    for (int i = 0; i < vn::kMaxInflight; ++i) {
        INFO("message " << i);
        CHECK(dst[static_cast<size_t>(i)] == src[static_cast<size_t>(i)]);
    }
    REQUIRE_FALSE(L.w.acks.empty());
    CHECK(L.w.acks.back().first == static_cast<uint64_t>(vn::kMaxInflight));
    // The next window reuses what is there: the pool and the ring keep their size.
    Request *again = post(0);
    CHECK(std::find(recvs.begin(), recvs.end(), again) != recvs.end());
    CHECK(slots() == std::pair{static_cast<uint32_t>(vn::kMaxRequests), static_cast<uint32_t>(vn::kMaxInflight)});
}

// ---- Placement at the receiver ----------------------------------------------------------------

TEST_CASE("multi-recv: messages land in the buffers the sender bound them to, whatever the "
          "arrival order", "[comm]")
{
    Link L;
    // Message i travels alone on stream 3-i, and streams are read 0..3: later messages first.
    route(L.w, 4, [](const OutMessage &m) { return 3 - static_cast<size_t>(m.seq); });
    std::vector<std::vector<uint8_t>> dst(4, std::vector<uint8_t>(512, 0xEE));
    Request *r = must_irecv(L.recv, {dst[0].data(), dst[1].data(), dst[2].data(), dst[3].data()},
                            {512, 512, 512, 512}, {10, 11, 12, 13});
    const int send_tags[4] = {12, 10, 13, 11};
    std::vector<std::vector<uint8_t>> src;
    for (int i = 0; i < 4; ++i)
        src.push_back(bytes(100 * static_cast<size_t>(i + 1), static_cast<uint8_t>(i * 50)));
    std::vector<Request *> sends;
    for (int i = 0; i < 4; ++i) sends.push_back(must_isend(L.send, src[i].data(), src[i].size(), send_tags[i]));
    int sizes[4] = {-1, -1, -1, -1};
    REQUIRE(done(L.recv, r, sizes));
    // buffer tag 10 <- message 1, 11 <- 3, 12 <- 0, 13 <- 2
    CHECK(sizes[0] == 200);
    CHECK(sizes[1] == 400);
    CHECK(sizes[2] == 100);
    CHECK(sizes[3] == 300);
    CHECK(starts_with(dst[0], src[1]));
    CHECK(starts_with(dst[1], src[3]));
    CHECK(starts_with(dst[2], src[0]));
    CHECK(starts_with(dst[3], src[2]));
    CHECK(all_equal(dst[2].data() + 100, 412, 0xEE));
    REQUIRE(L.w.locates.size() == 4);
    CHECK(L.w.locates[0].seq == 3); // the last message was placed first
    for (Request *s : sends) CHECK(done(L.send, s));
}

TEST_CASE("a message's chunks may arrive in any order; it completes with the last one", "[comm]")
{
    Link L;
    L.w.set_streams(4);
    L.w.frames_per_progress = 1;
    // Chunk c of the 1000-byte message goes to stream where[c]; streams are read 0..3, so the
    // chunks arrive in the order 3, 1, 0, 2.
    L.w.split = [](const OutMessage &m, Lane &l) {
        const size_t where[4] = {2, 1, 3, 0};
        for (size_t c = 0; c < 4; ++c) FakeSendPath::write_to(l, where[c], chunk_of(m, 250 * c, 250, l.gen));
    };
    const auto src = bytes(1000, 9);
    std::vector<uint8_t> dst(1000, 0);
    Request *r = must_irecv(L.recv, {dst.data()}, {1000}, {1});
    Request *s = must_isend(L.send, src.data(), src.size(), 1);
    CHECK_FALSE(done(L.recv, r)); // chunk 3
    CHECK(L.w.bytes_written == 250);
    CHECK_FALSE(done(L.recv, r)); // chunk 1
    CHECK_FALSE(done(L.recv, r)); // chunk 0
    CHECK(L.w.acks.empty());
    CHECK_FALSE(done(L.send, s));
    int size = -1;
    CHECK(done(L.recv, r, &size)); // chunk 2
    CHECK(size == 1000);
    CHECK(dst == src);
    REQUIRE(L.w.acks.size() == 1);
    CHECK(L.w.acks[0].first == 1);
    CHECK(done(L.send, s));
}

TEST_CASE("zero-byte messages complete", "[comm]")
{
    Link L;
    SECTION("alone, with NULL buffers")
    {
        Request *r = must_irecv(L.recv, {nullptr}, {0}, {3});
        Request *s = must_isend(L.send, nullptr, 0, 3);
        int rs = -1, ss = -1;
        CHECK(done(L.recv, r, &rs));
        CHECK(rs == 0);
        CHECK(done(L.send, s, &ss));
        CHECK(ss == 0);
    }
    SECTION("inside a multi-recv")
    {
        std::vector<std::vector<uint8_t>> dst(3, std::vector<uint8_t>(16, 0xEE));
        const auto five = bytes(5, 5);
        uint8_t none = 0;
        Request *r = must_irecv(L.recv, {dst[0].data(), dst[1].data(), dst[2].data()}, {16, 16, 16},
                                {1, 1, 1});
        must_isend(L.send, &none, 0, 1);
        must_isend(L.send, five.data(), 5, 1);
        must_isend(L.send, &none, 0, 1);
        int sizes[3] = {-1, -1, -1};
        REQUIRE(done(L.recv, r, sizes));
        CHECK(sizes[0] == 0);
        CHECK(sizes[1] == 5);
        CHECK(sizes[2] == 0);
        CHECK(all_equal(dst[0].data(), 16, 0xEE));
        CHECK(starts_with(dst[1], five));
        CHECK(all_equal(dst[2].data(), 16, 0xEE));
    }
}

TEST_CASE("memory regions stay referenced while requests use them", "[comm]")
{
    Link L;
    auto *mr = new vn::MemRegion;
    uint8_t in[16] = {}, out[16] = {1, 2, 3};
    mr->base = in;
    mr->size = sizeof(in);
    void *data = in;
    size_t size = 16;
    int tag = 0;
    Request *r = nullptr;
    vn::MemRegion *mrs[1] = {mr};
    REQUIRE(L.recv.irecv(1, &data, &size, &tag, mrs, &r) == 0);
    REQUIRE(r != nullptr);
    CHECK(mr->refs.load() == 2);
    vn::MemRegion::unref(mr); // deregMr with the receive in flight
    CHECK(static_cast<vn::RecvRequest *>(r)->mr[0] == mr); // still alive through the request's reference
    must_isend(L.send, out, 16, 0);
    CHECK(done(L.recv, r));
    CHECK(in[2] == 3);
}

// ---- Random stress ----------------------------------------------------------------------

TEST_CASE("stress: 2000 random messages in random groups, chunks, streams and arrival order",
          "[comm][stress]")
{
    constexpr size_t kStreams = 4;
    std::mt19937_64 rng(0x5717E55);
    auto below = [&](uint64_t n) { return rng() % n; };
    Link L;
    L.w.set_streams(kStreams);
    L.w.rng = &rng;
    // 1..4 chunks at random cut points, shuffled, each on a random stream. Streams stay FIFO
    // and messages are posted in sequence order, as on TCP.
    L.w.split = [&](const OutMessage &m, Lane &l) {
        std::vector<uint64_t> cuts = {0, m.size};
        const uint64_t extra = m.size < 2 ? 0 : below(4);
        for (uint64_t i = 0; i < extra; ++i) cuts.push_back(1 + below(m.size - 1));
        std::sort(cuts.begin(), cuts.end());
        cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
        std::vector<Frame> frames;
        if (m.size == 0) frames.push_back(chunk_of(m, 0, 0, l.gen));
        for (size_t i = 0; i + 1 < cuts.size(); ++i)
            frames.push_back(chunk_of(m, cuts[i], cuts[i + 1] - cuts[i], l.gen));
        std::shuffle(frames.begin(), frames.end(), rng);
        for (Frame &f : frames) FakeSendPath::write_to(l, below(kStreams), std::move(f));
    };
    vigil::test::Traffic t(L.send, L.recv, 60'000);
    // Groups of 1..8 buffers with tags from {-1, 0, 7}; the sends fill them in order.
    int next_msg = 0;
    for (int g = 0; g < 500; ++g) {
        const int n = 1 + static_cast<int>(below(vn::kMaxRecvs));
        std::vector<size_t> caps;
        std::vector<int> tags, expect;
        const int32_t tag_set[3] = {-1, 0, 7};
        for (int i = 0; i < n; ++i) {
            tags.push_back(tag_set[below(3)]);
            caps.push_back(below(20) == 0 ? 0 : below(64 * 1024 + 1));
        }
        // Send in index order: each binds to its own buffer (the first unbound of its tag).
        for (int i = 0; i < n; ++i) {
            expect.push_back(next_msg++);
            t.send(caps[static_cast<size_t>(i)] == 0 ? 0 : below(caps[static_cast<size_t>(i)] + 1),
                   tags[static_cast<size_t>(i)]);
        }
        t.recv(caps, tags, expect);
        if (g % 16 == 15) t.run();
    }
    t.run();
    CHECK(L.w.ack_regressions == 0);
    CHECK_FALSE(L.w.in_flight());
    CHECK(L.w.count(Placement::kError) == 0);
    CHECK(L.w.count(Placement::kDiscard) == 0);
}
