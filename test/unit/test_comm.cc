// SPDX-License-Identifier: Apache-2.0
// The transport-agnostic core's requests over one path (no backup; failover is
// test_failover.cc's): CTS matching at the sender, placement and completion at the receiver,
// the ack window, request and window limits, protocol violations, orderly closes. Driven
// through the fake fabric (test/support/fake_fabric.h), whose frames the tests also forge.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "abi_guard.h"
#include "fake_fabric.h"
#include "traffic.h"

namespace vn = vigil::net;
using vn::OutMessage;
using vn::Placement;
using vn::Request;
using vigil::test::fake::chunk_of;
using vigil::test::fake::data_frame;
using vigil::test::fake::FakeSendPath;
using vigil::test::fake::Frame;
using vigil::test::fake::Lane;
using vigil::test::fake::Net;

namespace {

// Timeouts for the single-path tests: a lost path fails the connection soon (the exact
// bound is test_failover.cc's business); no test here runs long enough to look stalled.
vn::FailoverConfig single_path_config()
{
    vn::FailoverConfig c;
    c.fatal_timeout_ns = 20'000'000ull;     // 20 ms
    c.stall_timeout_ns = 60'000'000'000ull; // 60 s
    return c;
}

// One connection over one lane.
struct Link {
    Net n{single_path_config(), false, false};
    Lane &w = n.primary();
    vn::SendComm &send = *n.send;
    vn::RecvComm &recv = *n.recv;
};

// isend that must be posted: retried while NULL (the CTS may still be on its way).
Request *must_isend(vn::SendComm &c, const void *data, size_t size, int tag)
{
    Request *r = nullptr;
    for (int i = 0; i < 1000 && r == nullptr; ++i) REQUIRE(c.isend(data, size, tag, nullptr, &r) == 0);
    REQUIRE(r != nullptr);
    return r;
}

// isend that must be answered NULL (rc 0).
void null_isend(vn::SendComm &c, const void *data, size_t size, int tag)
{
    Request *r = reinterpret_cast<Request *>(&c); // must be overwritten
    REQUIRE(c.isend(data, size, tag, nullptr, &r) == 0);
    REQUIRE(r == nullptr);
}

Request *must_irecv(vn::RecvComm &c, std::vector<void *> bufs, std::vector<size_t> sizes,
                    std::vector<int> tags)
{
    Request *r = nullptr;
    REQUIRE(c.irecv(static_cast<int>(bufs.size()), bufs.data(), sizes.data(), tags.data(), nullptr, &r) == 0);
    REQUIRE(r != nullptr);
    return r;
}

// test() that must succeed; returns whether `r` completed.
bool done(vn::Comm &c, Request *r, int *sizes = nullptr)
{
    int d = -1;
    REQUIRE(c.test(r, &d, sizes) == 0);
    REQUIRE((d == 0 || d == 1));
    return d == 1;
}

// test() that must fail; returns the error.
int test_error(vn::Comm &c, Request *r)
{
    int d = -1;
    const int rc = c.test(r, &d, nullptr);
    CHECK(d == 0);
    return rc;
}

// test() of a request whose connection lost its only path: it reports "not done" until the
// fatal timeout (single_path_config) and then fails; returns the error (0: never failed).
int eventual_error(vn::Comm &c, Request *r)
{
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < deadline) {
        int d = -1;
        const int rc = c.test(r, &d, nullptr);
        REQUIRE(d == 0);
        if (rc != 0) return rc;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return 0;
}

std::vector<uint8_t> bytes(size_t n, uint8_t seed)
{
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
    return v;
}

bool starts_with(const std::vector<uint8_t> &buf, const std::vector<uint8_t> &want)
{
    return buf.size() >= want.size() && std::equal(want.begin(), want.end(), buf.begin());
}

bool all_equal(const uint8_t *p, size_t n, uint8_t v)
{
    return std::all_of(p, p + n, [v](uint8_t x) { return x == v; });
}

// Frames of message m go to stream `pick(m)` whole.
void route(Lane &l, size_t nstreams, std::function<size_t(const OutMessage &)> pick)
{
    l.set_streams(nstreams);
    l.split = [pick](const OutMessage &m, Lane &lane) {
        FakeSendPath::write_to(lane, pick(m), chunk_of(m, 0, m.size, lane.gen));
    };
}

} // namespace

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
        if (i >= static_cast<uint32_t>(vn::kMaxInflight))
            REQUIRE(sreqs[i] == sreqs[i - static_cast<uint32_t>(vn::kMaxInflight)]);
    }
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

// ---- Frames that break the protocol (forged: a correct sender never writes them) -------------

TEST_CASE("a frame larger than its buffer is -EMSGSIZE, sticky, and writes nothing", "[comm][protocol]")
{
    Link L;
    std::vector<uint8_t> a(100, 0xEE), b(100, 0xEE);
    Request *r1 = must_irecv(L.recv, {a.data()}, {100}, {1});
    Request *r2 = must_irecv(L.recv, {b.data()}, {100}, {1});
    L.w.push(0, data_frame(0, 1, 200, 0, 200, 0x33));

    CHECK(test_error(L.recv, r1) == -EMSGSIZE);
    REQUIRE_FALSE(L.w.locates.empty());
    CHECK(L.w.locates[0].kind == Placement::kError);
    CHECK(L.w.locates[0].error == -EMSGSIZE);
    CHECK(test_error(L.recv, r2) == -EMSGSIZE);
    CHECK(L.w.bytes_written == 0);
    CHECK(all_equal(a.data(), a.size(), 0xEE));
    CHECK(all_equal(b.data(), b.size(), 0xEE));
    // Sticky, for new receives too.
    void *data = a.data();
    size_t size = 100;
    int tag = 1;
    Request *extra = r1;
    CHECK(L.recv.irecv(1, &data, &size, &tag, nullptr, &extra) == -EMSGSIZE);
    CHECK(extra == nullptr);
    CHECK(vigil::to_nccl_result(-EMSGSIZE) == ncclInvalidUsage);
}

// A piece of a message striped over RDMA paths, forged as the fake's RDMA lanes carry it: its
// bytes land at `buf` + offset at once (an RDMA write), the receive half reports it when it
// polls the frame (RecvSink::piece; piece_last for the last).
void rdma_piece(Lane &w, uint64_t seq, uint64_t size, uint64_t offset, uint64_t len, uint8_t fill,
                uint8_t *buf, uint32_t gen = 1)
{
    vigil::test::fake::Frame f = data_frame(seq, 1, size, offset, len, fill, 0, gen);
    f.piece = true;
    f.dest = buf;
    std::memcpy(buf + offset, f.bytes.data(), len);
    w.push(0, std::move(f));
}

TEST_CASE("pieces of a striped RDMA message count once, in their generation, and its last "
          "piece's size completes it",
          "[comm][protocol][multipath]")
{
    Link L;
    L.w.rdma = true;
    std::vector<uint8_t> a(3000, 0);
    Request *r = must_irecv(L.recv, {a.data()}, {3000}, {1});
    SECTION("in order")
    {
        rdma_piece(L.w, 0, 2500, 0, 1000, 0x11, a.data());
        rdma_piece(L.w, 0, 2500, 1000, 1000, 0x22, a.data());
        REQUIRE_FALSE(done(L.recv, r)); // no size yet
        rdma_piece(L.w, 0, 2500, 2000, 500, 0x33, a.data());
    }
    SECTION("the last piece first")
    {
        rdma_piece(L.w, 0, 2500, 2000, 500, 0x33, a.data());
        REQUIRE_FALSE(done(L.recv, r));
        rdma_piece(L.w, 0, 2500, 1000, 1000, 0x22, a.data());
        REQUIRE_FALSE(done(L.recv, r));
        rdma_piece(L.w, 0, 2500, 0, 1000, 0x11, a.data());
    }
    SECTION("a newer generation restarts the count, and the older one's pieces no longer count")
    {
        rdma_piece(L.w, 0, 2500, 0, 1000, 0x11, a.data(), 1);
        rdma_piece(L.w, 0, 2500, 0, 1000, 0x11, a.data(), 2);
        // Counted, these would make 3500 bytes of a 2500-byte message (-EPROTO).
        rdma_piece(L.w, 0, 2500, 1000, 1000, 0x22, a.data(), 1);
        rdma_piece(L.w, 0, 2500, 2000, 500, 0x33, a.data(), 1);
        rdma_piece(L.w, 0, 2500, 1000, 1000, 0x22, a.data(), 2);
        REQUIRE_FALSE(done(L.recv, r));
        rdma_piece(L.w, 0, 2500, 2000, 500, 0x33, a.data(), 2);
    }
    SECTION("an older generation's pieces still count for a message that has none newer")
    {
        // The sender saw them land and completed its send before it switched: they never
        // come again.
        std::vector<uint8_t> b(100, 0);
        Request *r2 = must_irecv(L.recv, {b.data()}, {100}, {1});
        rdma_piece(L.w, 0, 2500, 0, 1000, 0x11, a.data(), 1);
        rdma_piece(L.w, 1, 100, 0, 100, 0x44, b.data(), 2); // a newer generation, adopted
        REQUIRE(done(L.recv, r2));
        rdma_piece(L.w, 0, 2500, 1000, 1000, 0x22, a.data(), 1);
        rdma_piece(L.w, 0, 2500, 2000, 500, 0x33, a.data(), 1);
    }
    int sizes = -1;
    REQUIRE(done(L.recv, r, &sizes));
    CHECK(sizes == 2500);
    CHECK(all_equal(a.data(), 1000, 0x11));
    CHECK(all_equal(a.data() + 1000, 1000, 0x22));
    CHECK(all_equal(a.data() + 2000, 500, 0x33));
}

TEST_CASE("pieces of a striped RDMA message beyond its buffer, or beyond the size its last "
          "piece says, fail the connection",
          "[comm][protocol][multipath]")
{
    Link L;
    L.w.rdma = true;
    std::vector<uint8_t> a(4000, 0); // room for the forged bytes: the fake writes them
    Request *r = must_irecv(L.recv, {a.data()}, {1000}, {1});
    int want = 0;
    SECTION("more bytes than the buffer holds, before the size is known")
    {
        rdma_piece(L.w, 0, 1600, 0, 800, 0x11, a.data());
        rdma_piece(L.w, 0, 1600, 800, 800, 0x11, a.data());
        want = -EMSGSIZE;
    }
    SECTION("a last piece whose size is below what landed")
    {
        rdma_piece(L.w, 0, 1000, 0, 600, 0x11, a.data());
        rdma_piece(L.w, 0, 1000, 600, 300, 0x11, a.data());
        rdma_piece(L.w, 0, 800, 700, 100, 0x11, a.data());
        want = -EPROTO;
    }
    SECTION("a last piece larger than the buffer")
    {
        rdma_piece(L.w, 0, 1500, 1000, 500, 0x11, a.data());
        want = -EMSGSIZE;
    }
    CHECK(test_error(L.recv, r) == want);
}

TEST_CASE("frames that contradict the advertised receives are -EPROTO and write nothing",
          "[comm][protocol]")
{
    Link L;
    std::vector<uint8_t> a(64, 0), b(64, 0);
    Request *r = must_irecv(L.recv, {a.data(), b.data()}, {64, 64}, {1, 2});
    SECTION("a tag that is not its buffer's") { L.w.push(0, data_frame(0, 3, 8, 0, 8, 0x55, 0)); }
    SECTION("a buffer index beyond the group") { L.w.push(0, data_frame(0, 1, 8, 0, 8, 0x55, 2)); }
    SECTION("two messages for one buffer")
    {
        L.w.push(0, data_frame(0, 1, 8, 0, 4, 0x55, 0));
        L.w.push(0, data_frame(1, 1, 8, 0, 4, 0x66, 0));
    }
    SECTION("a message no receive was posted for")
    {
        L.w.push(0, data_frame(2, 1, 8, 0, 8, 0x55, 0));
    }
    SECTION("beyond the window") { L.w.push(0, data_frame(vn::kMaxInflight, 1, 8, 0, 8, 0x55, 0)); }
    SECTION("a later frame disagrees on the message size")
    {
        L.w.push(0, data_frame(0, 1, 40, 0, 20, 0, 0));
        L.w.push(0, data_frame(0, 1, 41, 20, 20, 0, 0));
    }
    SECTION("a later frame disagrees on the buffer")
    {
        L.w.push(0, data_frame(0, 1, 40, 0, 20, 0, 0));
        L.w.push(0, data_frame(0, 2, 40, 20, 20, 0, 1));
    }
    SECTION("frames carrying more bytes than the message")
    {
        L.w.push(0, data_frame(0, 1, 10, 0, 8, 0, 0));
        L.w.push(0, data_frame(0, 1, 10, 0, 8, 0, 0));
    }
    CHECK(test_error(L.recv, r) == -EPROTO);
    CHECK(L.w.acks.empty());
    CHECK(all_equal(b.data(), b.size(), 0));
}

TEST_CASE("replayed frames of completed messages are discarded, never written", "[comm]")
{
    Link L;
    SECTION("seq below the completed floor")
    {
        std::vector<uint8_t> d0(64, 0), d1(64, 0);
        const auto m0 = bytes(32, 0x11), m1 = bytes(48, 0x22);
        Request *r0 = must_irecv(L.recv, {d0.data()}, {64}, {4});
        must_isend(L.send, m0.data(), m0.size(), 4);
        REQUIRE(done(L.recv, r0));
        Request *r1 = must_irecv(L.recv, {d1.data()}, {64}, {4});
        const uint64_t written = L.w.bytes_written;
        L.w.push(0, data_frame(0, 4, 32, 0, 32, 0x99));
        CHECK_FALSE(done(L.recv, r1));
        CHECK(L.w.locates.back().seq == 0);
        CHECK(L.w.locates.back().kind == Placement::kDiscard);
        CHECK(L.w.bytes_written == written);
        CHECK(starts_with(d0, m0));
        CHECK(all_equal(d1.data(), d1.size(), 0));
        must_isend(L.send, m1.data(), m1.size(), 4);
        int size = -1;
        CHECK(done(L.recv, r1, &size));
        CHECK(size == 48);
        CHECK(starts_with(d1, m1));
    }
    SECTION("completed message above an incomplete one")
    {
        std::vector<uint8_t> d0(64, 0), d1(64, 0);
        Request *r = must_irecv(L.recv, {d0.data(), d1.data()}, {64, 64}, {1, 2});
        L.w.push(0, data_frame(0, 1, 40, 0, 20, 0x10, 0));  // first half of seq 0
        L.w.push(0, data_frame(1, 2, 10, 0, 10, 0x20, 1));  // all of seq 1
        L.w.push(0, data_frame(1, 2, 10, 0, 10, 0x99, 1));  // replay of seq 1
        L.w.push(0, data_frame(0, 1, 40, 20, 20, 0x30, 0)); // second half of seq 0
        int sizes[2] = {-1, -1};
        REQUIRE(done(L.recv, r, sizes));
        REQUIRE(L.w.locates.size() == 4);
        CHECK(L.w.locates[2].seq == 1);
        CHECK(L.w.locates[2].kind == Placement::kDiscard);
        CHECK(L.w.bytes_written == 50);
        CHECK(sizes[0] == 40);
        CHECK(sizes[1] == 10);
        CHECK(all_equal(d0.data(), 20, 0x10));
        CHECK(all_equal(d0.data() + 20, 20, 0x30));
        CHECK(all_equal(d1.data(), 10, 0x20));
        REQUIRE(L.w.acks.size() == 1);
        CHECK(L.w.acks[0].first == 2);
    }
}

// ---- Failures and orderly closes ------------------------------------------------------------

TEST_CASE("send-side failures", "[comm]")
{
    Link L;
    uint8_t byte = 1, in[8];
    Request *rin = must_irecv(L.recv, {in}, {8}, {0});
    SECTION("a path error is sticky for pending and new sends")
    {
        Request *s = must_isend(L.send, &byte, 1, 0);
        L.w.hold_acks = true;
        L.w.send_error = -ECONNRESET;
        // No backup: once the fatal timeout has passed the connection fails (-ECONNRESET,
        // whatever the path's own errno).
        CHECK(eventual_error(L.send, s) == -ECONNRESET);
        L.w.send_error = 0;
        CHECK(test_error(L.send, s) == -ECONNRESET);
        Request *extra = s;
        CHECK(L.send.isend(&byte, 1, 0, nullptr, &extra) == -ECONNRESET);
        CHECK(extra == nullptr);
    }
    SECTION("a fatal path error (protection, access) fails the connection at once")
    {
        L.w.hold_acks = true;
        Request *s = must_isend(L.send, &byte, 1, 0);
        L.w.send_error = -EACCES;
        L.w.send_error_fatal = true;
        CHECK(test_error(L.send, s) == -EACCES);
    }
    SECTION("an ack beyond the last sent seq is -EPROTO")
    {
        L.w.hold_acks = true;
        Request *s = must_isend(L.send, &byte, 1, 0);
        L.w.back.push_back({vigil::test::fake::Back::kAck, 2, 1, 0, {}});
        CHECK(test_error(L.send, s) == -EPROTO);
    }
    SECTION("the receiver's goodbye with sends unacknowledged fails them at once")
    {
        L.w.hold_acks = true;
        Request *s = must_isend(L.send, &byte, 1, 0);
        L.n.recv->close(); // closeRecv: says goodbye on every path
        CHECK(L.w.recv_goodbye_sent);
        CHECK(test_error(L.send, s) == -ECONNRESET);
        CHECK(L.n.send->stats().failovers == 0); // not taken for a failure
    }
    SECTION("the receiver's goodbye with nothing outstanding fails only the next isend")
    {
        Request *s = must_isend(L.send, &byte, 1, 0);
        REQUIRE(done(L.recv, rin)); // the receiver holds it and acks
        REQUIRE(done(L.send, s));
        L.n.recv->close();
        L.send.on_ready(); // the engine's progress call sees the goodbye
        Request *extra = reinterpret_cast<Request *>(&byte);
        CHECK(L.send.isend(&byte, 1, 0, nullptr, &extra) == -ECONNRESET);
        CHECK(extra == nullptr);
        CHECK(L.n.send->stats().failovers == 0);
    }
    SECTION("a message over kMaxMessageBytes is -EMSGSIZE and nothing else")
    {
        Request *extra = reinterpret_cast<Request *>(&byte);
        CHECK(L.send.isend(&byte, vn::kMaxMessageBytes + 1, 0, nullptr, &extra) == -EMSGSIZE);
        CHECK(extra == nullptr);
        CHECK(L.w.posted.empty());
        Request *s = must_isend(L.send, &byte, 1, 0); // not sticky
        CHECK(s->seq == 0);
    }
}

TEST_CASE("receive-side failures", "[comm]")
{
    Link L;
    uint8_t buf[8];
    SECTION("the sender's goodbye with receives outstanding fails them")
    {
        Request *r = must_irecv(L.recv, {buf}, {8}, {0});
        L.n.send->close();
        CHECK(L.w.send_goodbyes == 1);
        CHECK(test_error(L.recv, r) == -ECONNRESET);
    }
    SECTION("the sender's goodbye with nothing outstanding fails only the next irecv")
    {
        L.n.send->close();
        L.recv.on_ready(); // the engine's progress call
        void *data = buf;
        size_t size = 8;
        int tag = 0;
        Request *r = reinterpret_cast<Request *>(buf);
        CHECK(L.recv.irecv(1, &data, &size, &tag, nullptr, &r) == -ECONNRESET);
        CHECK(r == nullptr);
    }
    SECTION("a path error fails pending receives after the fatal timeout")
    {
        Request *r = must_irecv(L.recv, {buf}, {8}, {0});
        L.w.recv_error = -ETIMEDOUT;
        CHECK(eventual_error(L.recv, r) == -ECONNRESET);
        CHECK(test_error(L.recv, r) == -ECONNRESET); // sticky
    }
    SECTION("every path ended without a goodbye: the sender's process is gone, fail at once")
    {
        Request *r = must_irecv(L.recv, {buf}, {8}, {0});
        L.w.peer_eof = true;
        L.w.break_link();
        CHECK(test_error(L.recv, r) == -ECONNRESET);
    }
    SECTION("irecv with n outside 1..kMaxRecvs is -EINVAL, not sticky")
    {
        void *data[vn::kMaxRecvs + 1] = {};
        size_t sizes[vn::kMaxRecvs + 1] = {};
        int tags[vn::kMaxRecvs + 1] = {};
        for (int n : {0, -1, vn::kMaxRecvs + 1}) {
            Request *r = reinterpret_cast<Request *>(buf);
            CHECK(L.recv.irecv(n, data, sizes, tags, nullptr, &r) == -EINVAL);
            CHECK(r == nullptr);
        }
        CHECK(must_irecv(L.recv, {buf}, {8}, {0}) != nullptr);
    }
}

TEST_CASE("messages the receiver reports holding complete at once, ahead of the ack", "[comm]")
{
    Link L;
    L.w.hold_acks = true;
    uint8_t in[3][8], out[3][8] = {{1}, {2}, {3}};
    Request *r[3], *s[3];
    for (int i = 0; i < 3; ++i) r[i] = must_irecv(L.recv, {in[i]}, {8}, {0});
    for (int i = 0; i < 3; ++i) s[i] = must_isend(L.send, out[i], 8, 0);
    for (int i = 0; i < 3; ++i) REQUIRE(done(L.recv, r[i]));
    using vigil::test::fake::Back;
    L.w.back.push_back({Back::kHeld, 2, 0, 0, {}});
    CHECK(done(L.send, s[2]));
    CHECK_FALSE(done(L.send, s[0]));
    CHECK_FALSE(done(L.send, s[1]));
    L.w.back.push_back({Back::kHeld, 2, 0, 0, {}}); // a repeat changes nothing
    L.w.back.push_back({Back::kAck, 1, 1, 0, {}});
    CHECK(done(L.send, s[0]));
    CHECK_FALSE(done(L.send, s[1]));
    L.w.back.push_back({Back::kHeld, 1, 0, 0, {}}); // the ack now moves over 1 and 2
    CHECK(done(L.send, s[1]));
    // The ring moved on: three more messages reuse the slots.
    for (int i = 0; i < 3; ++i) r[i] = must_irecv(L.recv, {in[i]}, {8}, {0});
    for (int i = 0; i < 3; ++i) CHECK(must_isend(L.send, out[i], 8, 0)->seq == 3u + static_cast<unsigned>(i));
    SECTION("holding a message never sent is a protocol error")
    {
        L.w.back.push_back({Back::kHeld, 9, 0, 0, {}});
        Request *x = nullptr;
        CHECK(L.send.isend(out[0], 8, 0, nullptr, &x) == -EPROTO);
        CHECK(x == nullptr);
    }
}

TEST_CASE("the receiver answers a generation notice with what it holds", "[comm]")
{
    // RDMA mode: the sender writes nothing of the new generation before the answer.
    vigil::test::fake::Net n(single_path_config(), true, false);
    for (auto &l : n.lane) l.rdma = true;
    uint8_t in[4][8], out[4][8] = {{1}, {2}, {3}, {4}};
    Request *r[4];
    for (int i = 0; i < 4; ++i) {
        void *d = in[i];
        size_t sz = 8;
        int tag = 0;
        REQUIRE(n.recv->irecv(1, &d, &sz, &tag, nullptr, &r[i]) == 0);
    }
    // Messages 0 and 2 land; the writes of 1 and 3 are lost with the port.
    for (int i = 0; i < 4; ++i) {
        n.primary().lose_records = i % 2;
        must_isend(*n.send, out[i], 8, 0);
    }
    REQUIRE(done(*n.recv, r[0]));
    REQUIRE(done(*n.recv, r[2]));
    n.send->fail_path(vn::kPrimary, "test", false);
    n.recv->on_ready();
    REQUIRE(n.backup().holdings.size() == 1);
    const vn::Holding &h = n.backup().holdings[0];
    CHECK(h.floor == 1);
    CHECK(h.has(0));
    CHECK_FALSE(h.has(1));
    CHECK(h.has(2));
    CHECK_FALSE(h.has(3));
    CHECK_FALSE(h.has(1 + vn::kMaxInflight));
    // The answer came after the notice's path returned, and the replay completes the rest.
    CHECK(n.primary().fences == 1);
    REQUIRE(done(*n.recv, r[1]));
    REQUIRE(done(*n.recv, r[3]));
    CHECK(in[3][0] == 4);
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
    CHECK(r->mr[0] == mr);    // still alive through the request's reference
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
