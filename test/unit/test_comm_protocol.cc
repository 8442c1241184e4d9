// SPDX-License-Identifier: Apache-2.0
// The transport-agnostic core against frames a correct peer never sends (oversized, striped
// pieces beyond their buffer, contradicting the advertised receives, replays of completed
// messages), path failures on either side, and the holding answer to a generation notice.
// One path over the fake fabric (comm_link.h); test_comm.cc has the requests themselves.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "abi_guard.h"
#include "comm_link.h"
#include "fake_fabric.h"

using namespace vigil::test::comm; // vn, Link and the helpers
using vn::Placement;
using vigil::test::fake::data_frame;
using vigil::test::fake::Frame;

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

namespace {

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

} // namespace

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
        // isend's pass reads it and acts on nothing; the engine's tick (or test()) fails the
        // connection, and every call after says so.
        CHECK(L.send.isend(out[0], 8, 0, nullptr, &x) == 0);
        CHECK(x == nullptr);
        L.send.on_tick();
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

