// SPDX-License-Identifier: Apache-2.0
// The transport-agnostic core (comm.h): requests, sequencing, the ack window and multi-recv
// matching, driven through an in-process fake fabric with one path (no backup; failover is
// covered by test_failover.cc). Also the errno -> ncclResult_t table and the exception
// firewall (abi_guard.h).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <new>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "abi_guard.h"
#include "comm.h"

namespace vn = vigil::net;
using vn::OutMessage;
using vn::PathStatus;
using vn::Placement;
using vn::Request;

namespace {

// ---- The fake fabric --------------------------------------------------------------------

// One frame "on the wire": a chunk of message `seq` at `offset`, of generation `gen` (the one
// the send path was begun with; a path that was never begun writes generation 1).
struct Frame {
    uint32_t gen = 1;
    uint64_t seq = 0;
    int32_t tag = 0;
    uint64_t size = 0; // whole message
    uint64_t offset = 0;
    std::vector<uint8_t> bytes;
};

struct LocateEvent {
    uint64_t seq;
    Placement::Kind kind;
    int error;
};

// Everything between the fake send path and the fake receive path. Owned by the test; the
// test controls chunking (split), which streams deliver (paused, frames_per_progress, rng),
// when acks reach the sender (forward_acks, ack_to_sender) and which status each path reports.
struct Wire {
    // Sender side.
    uint32_t gen = 1; // generation of the frames the send path writes (begin() changes it)
    std::vector<OutMessage> posted;
    std::function<void(const OutMessage &, Wire &)> split; // default: one frame on stream 0
    uint64_t ack_to_sender = 0;
    bool forward_acks = true;
    bool sender_hears = false; // an ack or heartbeat reached the sender since its last progress
    PathStatus send_status;
    int probes = 0;

    // In flight: per-stream FIFOs, like TCP streams.
    std::vector<std::deque<Frame>> streams{1};
    std::vector<bool> paused{false};

    // Receiver side.
    PathStatus recv_status;
    size_t frames_per_progress = SIZE_MAX;
    std::mt19937_64 *rng = nullptr; // when set: random stream order, 0..4 frames per progress
    std::vector<uint64_t> acks;     // every ack() the receiving core sent
    std::vector<uint32_t> ack_gens; // ... and the generation each one carried
    int heartbeats = 0;
    int ack_regressions = 0;        // acks that did not increase
    std::vector<LocateEvent> locates;
    uint64_t bytes_written = 0;

    void set_streams(size_t n)
    {
        streams.resize(n);
        paused.resize(n, false);
    }
    void push(size_t stream, Frame f) { streams.at(stream).push_back(std::move(f)); }

    size_t count(uint64_t seq, Placement::Kind kind) const
    {
        return static_cast<size_t>(
            std::count_if(locates.begin(), locates.end(),
                          [&](const LocateEvent &e) { return e.seq == seq && e.kind == kind; }));
    }
    size_t count(Placement::Kind kind) const
    {
        return static_cast<size_t>(std::count_if(
            locates.begin(), locates.end(), [&](const LocateEvent &e) { return e.kind == kind; }));
    }
    bool in_flight() const
    {
        return std::any_of(streams.begin(), streams.end(),
                           [](const auto &s) { return !s.empty(); });
    }
};

Frame chunk_of(const OutMessage &m, uint64_t offset, uint64_t len, uint32_t gen = 1)
{
    Frame f{gen, m.seq, m.tag, m.size, offset, {}};
    if (len > 0) f.bytes.assign(m.data + offset, m.data + offset + len);
    return f;
}

Frame make_frame(uint64_t seq, int32_t tag, uint64_t size, uint64_t offset, uint64_t len,
                 uint8_t fill)
{
    return Frame{1, seq, tag, size, offset, std::vector<uint8_t>(len, fill)};
}

class FakeSendPath final : public vn::SendPath
{
public:
    explicit FakeSendPath(Wire &w) : w_(w) {}
    void begin(uint64_t, uint32_t gen) override { w_.gen = gen; }
    void post(const OutMessage &m) override
    {
        w_.posted.push_back(m);
        if (w_.split)
            w_.split(m, w_);
        else
            w_.push(0, chunk_of(m, 0, m.size, w_.gen));
    }
    bool idle() const override { return true; }
    void probe() override { ++w_.probes; }
    void sabotage() override { w_.send_status.error = -ECONNRESET; }
    int local_dev() const override { return 0; }
    PathStatus progress(uint64_t *acked_seq) override
    {
        *acked_seq = std::max(*acked_seq, w_.ack_to_sender);
        PathStatus st = w_.send_status;
        st.heard = st.heard || w_.sender_hears;
        w_.sender_hears = false;
        return st;
    }
    int fd(size_t) const override { return -1; }
    size_t nfds() const override { return 0; }
    std::string describe() const override { return "fake send path"; }

private:
    Wire &w_;
};

class FakeRecvPath final : public vn::RecvPath
{
public:
    explicit FakeRecvPath(Wire &w) : w_(w) {}

    // Delivers frames through the sink like a stream-based path: the head frame of a stream
    // that the core answers kNotPosted blocks that stream until a later call.
    PathStatus progress(vn::RecvSink &sink) override
    {
        if (w_.recv_status.error != 0 || w_.recv_status.peer_closed) return w_.recv_status;
        size_t budget = w_.rng != nullptr ? (*w_.rng)() % 5 : w_.frames_per_progress;
        std::vector<size_t> order(w_.streams.size());
        std::iota(order.begin(), order.end(), size_t{0});
        for (bool moved = true; moved && budget > 0;) {
            moved = false;
            if (w_.rng != nullptr) std::shuffle(order.begin(), order.end(), *w_.rng);
            for (size_t i : order) {
                if (budget == 0) break;
                if (w_.paused[i] || w_.streams[i].empty()) continue;
                Frame &f = w_.streams[i].front();
                const Placement p = sink.locate(f.gen, f.seq, f.tag, f.size);
                w_.locates.push_back({f.seq, p.kind, p.error});
                if (p.kind == Placement::kNotPosted) continue;
                if (p.kind == Placement::kError)
                    return PathStatus{.error = p.error, .detail = "frame refused"};
                if (p.kind == Placement::kPlace) {
                    // The path contract: ask before writing payload bytes.
                    if (!f.bytes.empty() && sink.still_wanted(f.gen, f.seq)) {
                        std::memcpy(p.dest + f.offset, f.bytes.data(), f.bytes.size());
                        w_.bytes_written += f.bytes.size();
                    }
                    const int rc = sink.landed(f.seq, f.bytes.size(), f.gen);
                    if (rc != 0) {
                        w_.streams[i].pop_front();
                        return PathStatus{.error = rc, .detail = "landed refused"};
                    }
                }
                w_.streams[i].pop_front();
                moved = true;
                --budget;
            }
        }
        return w_.recv_status;
    }
    void ack(uint64_t ack_seq, uint32_t gen) override
    {
        if (!w_.acks.empty() && ack_seq <= w_.acks.back()) ++w_.ack_regressions;
        w_.acks.push_back(ack_seq);
        w_.ack_gens.push_back(gen);
        if (w_.forward_acks) {
            w_.ack_to_sender = ack_seq;
            w_.sender_hears = true;
        }
    }
    void request_failover(uint32_t) override {} // never called with a single path
    void heartbeat() override
    {
        ++w_.heartbeats;
        if (w_.forward_acks) w_.sender_hears = true;
    }
    void sabotage() override { w_.recv_status.error = -ECONNRESET; }
    int local_dev() const override { return 0; }
    int fd(size_t) const override { return -1; }
    size_t nfds() const override { return 0; }
    std::string describe() const override { return "fake recv path"; }

private:
    Wire &w_;
};

// Timeouts for the single-path tests: a lost path fails the connection soon (the exact
// bound is test_failover.cc's business); no test here runs long enough to look stalled.
vn::FailoverConfig single_path_config()
{
    vn::FailoverConfig c;
    c.fatal_timeout_ns = 20'000'000ull;    // 20 ms
    c.stall_timeout_ns = 60'000'000'000ull; // 60 s
    return c;
}

template <class Path, class Base>
std::array<std::unique_ptr<Base>, vn::kMaxPaths> primary_only(std::unique_ptr<Path> p)
{
    std::array<std::unique_ptr<Base>, vn::kMaxPaths> a;
    a[vn::kPrimary] = std::move(p); // the backup slot stays null
    return a;
}

// A connection: both comms over one wire, no backup path. nfds() is 0, so nothing touches
// the engine.
struct Link {
    Wire w;
    vn::SendComm send{primary_only<FakeSendPath, vn::SendPath>(std::make_unique<FakeSendPath>(w)),
                      single_path_config()};
    vn::RecvComm recv{primary_only<FakeRecvPath, vn::RecvPath>(std::make_unique<FakeRecvPath>(w)),
                      single_path_config()};
};

// ---- Helpers ----------------------------------------------------------------------------

Request *must_isend(vn::SendComm &c, const void *data, size_t size, int tag)
{
    Request *r = nullptr;
    REQUIRE(c.isend(data, size, tag, &r) == 0);
    REQUIRE(r != nullptr);
    return r;
}

Request *must_irecv(vn::RecvComm &c, std::vector<void *> bufs, std::vector<size_t> sizes,
                    std::vector<int> tags)
{
    Request *r = nullptr;
    REQUIRE(c.irecv(static_cast<int>(bufs.size()), bufs.data(), sizes.data(), tags.data(), &r) ==
            0);
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

} // namespace

// ---- Send completion and request recycling ------------------------------------------------

TEST_CASE("a send completes only after the receiver acked it", "[comm]")
{
    Link L;
    L.w.forward_acks = false;
    const auto src = bytes(100, 1);
    Request *s = must_isend(L.send, src.data(), src.size(), 7);
    CHECK_FALSE(done(L.send, s));
    REQUIRE(L.w.posted.size() == 1);
    CHECK(L.w.posted[0].seq == 0);
    CHECK(L.w.posted[0].tag == 7);
    CHECK(L.w.posted[0].size == 100);
    CHECK(L.w.posted[0].data == src.data());

    std::vector<uint8_t> dst(128, 0);
    Request *r = must_irecv(L.recv, {dst.data()}, {dst.size()}, {7});
    int rsize = -1;
    CHECK(done(L.recv, r, &rsize));
    CHECK(rsize == 100);
    CHECK(starts_with(dst, src));
    CHECK(all_equal(dst.data() + 100, 28, 0));
    CHECK(L.w.acks == std::vector<uint64_t>{1});
    CHECK(r->state.load() == Request::kFree);

    // The receiver holds it, but the ack has not reached the sender yet.
    CHECK_FALSE(done(L.send, s));
    CHECK_FALSE(done(L.send, s));
    L.w.ack_to_sender = 1;
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
        Request *s = must_isend(L.send, &out, sizeof(out), 1);
        Request *r = must_irecv(L.recv, {&in}, {sizeof(in)}, {1});
        if (first_recv == nullptr) first_recv = r;
        CHECK(r == first_recv); // the one recv request is free again every time
        int rs = -1, ss = -1;
        REQUIRE(done(L.recv, r, &rs));
        REQUIRE(done(L.send, s, &ss)); // the test NULL-sizes path is covered elsewhere
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
    Request *s = must_isend(L.send, &x, 1, 0);
    Request *r = must_irecv(L.recv, {&y}, {1}, {0});
    CHECK(done(L.recv, r));
    CHECK(done(L.send, s));
    CHECK(y == 42);
}

TEST_CASE("sends beyond kMaxInflight outstanding are refused until acked and tested", "[comm]")
{
    Link L;
    L.w.forward_acks = false;
    uint8_t byte = 0;
    std::vector<Request *> reqs;
    for (int i = 0; i < vn::kMaxInflight; ++i) reqs.push_back(must_isend(L.send, &byte, 1, 0));
    CHECK(L.w.posted.size() == static_cast<size_t>(vn::kMaxInflight));

    Request *extra = reinterpret_cast<Request *>(&byte); // must be overwritten with NULL
    CHECK(L.send.isend(&byte, 1, 0, &extra) == 0);
    CHECK(extra == nullptr);
    CHECK(L.w.posted.size() == static_cast<size_t>(vn::kMaxInflight));

    // The first 10 are acked; seq 256 reuses seq 0's slot once seq 0 has been tested.
    L.w.ack_to_sender = 10;
    CHECK(done(L.send, reqs[0]));
    Request *r256 = must_isend(L.send, &byte, 1, 0);
    CHECK(r256 == reqs[0]);
    // Seq 1 is acked but not tested yet: its slot is still NCCL's.
    CHECK(L.send.isend(&byte, 1, 0, &extra) == 0);
    CHECK(extra == nullptr);
    for (int i = 1; i < 10; ++i) CHECK(done(L.send, reqs[static_cast<size_t>(i)]));
    for (int i = 1; i < 10; ++i) must_isend(L.send, &byte, 1, 0);
    CHECK(L.w.posted.size() == static_cast<size_t>(vn::kMaxInflight) + 10);
    // Window full again: 266 sent, 10 acked.
    CHECK(L.send.isend(&byte, 1, 0, &extra) == 0);
    CHECK(extra == nullptr);
    CHECK_FALSE(done(L.send, reqs[10]));
    for (size_t i = 0; i < L.w.posted.size(); ++i) REQUIRE(L.w.posted[i].seq == i);
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
    CHECK(L.recv.irecv(1, &data, &size, &tag, &extra) == 0);
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
    L.w.set_streams(2);
    L.w.paused[1] = true;
    L.w.split = [](const OutMessage &m, Wire &w) {
        w.push(m.seq < 8 ? 1 : 0, chunk_of(m, 0, m.size));
    };

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
    CHECK(L.recv.irecv(1, &data, &size, &tag, &extra) == 0);
    CHECK(extra == nullptr);

    L.w.paused[1] = false;
    CHECK(done(L.recv, reqs[0]));
    REQUIRE_FALSE(L.w.acks.empty());
    CHECK(L.w.acks.back() == static_cast<uint64_t>(vn::kMaxInflight));
    CHECK(L.w.ack_regressions == 0);
    for (int i = 0; i < vn::kMaxInflight; ++i)
        CHECK(bufs[static_cast<size_t>(i)][0] == src[static_cast<size_t>(i)]);
    CHECK(must_irecv(L.recv, {data}, {1}, {3}) != nullptr);
}

// ---- Multi-recv matching ------------------------------------------------------------------

TEST_CASE("multi-recv with distinct tags: each message lands in its tag's buffer", "[comm]")
{
    Link L;
    // Message i travels alone on stream 3-i, and streams are read 0..3: the later messages
    // are seen first.
    L.w.set_streams(4);
    L.w.split = [](const OutMessage &m, Wire &w) { w.push(3 - m.seq, chunk_of(m, 0, m.size)); };
    const int send_tags[4] = {12, 10, 13, 11};
    std::vector<std::vector<uint8_t>> src;
    for (int i = 0; i < 4; ++i)
        src.push_back(bytes(100 * static_cast<size_t>(i + 1), static_cast<uint8_t>(i * 50)));
    std::vector<Request *> sends;
    for (int i = 0; i < 4; ++i)
        sends.push_back(must_isend(L.send, src[i].data(), src[i].size(), send_tags[i]));

    std::vector<std::vector<uint8_t>> dst(4, std::vector<uint8_t>(512, 0xEE));
    Request *r = must_irecv(L.recv, {dst[0].data(), dst[1].data(), dst[2].data(), dst[3].data()},
                            {512, 512, 512, 512}, {10, 11, 12, 13});
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
    // The later messages were offered first and told to wait.
    REQUIRE(L.w.locates.size() >= 4);
    CHECK(L.w.locates[0].seq == 3);
    CHECK(L.w.locates[0].kind == Placement::kNotPosted);
    CHECK(L.w.count(3, Placement::kNotPosted) >= 1);
    CHECK(L.w.count(1, Placement::kNotPosted) >= 1);
    for (Request *s : sends) CHECK(done(L.send, s));
}

TEST_CASE("multi-recv with equal tags binds buffers in sequence order", "[comm]")
{
    Link L;
    L.w.set_streams(3);
    L.w.paused[0] = true; // message 0 is late
    L.w.split = [](const OutMessage &m, Wire &w) { w.push(m.seq, chunk_of(m, 0, m.size)); };
    std::vector<std::vector<uint8_t>> src = {bytes(10, 1), bytes(20, 2), bytes(30, 3)};
    for (auto &s : src) must_isend(L.send, s.data(), s.size(), 5);

    std::vector<std::vector<uint8_t>> dst(3, std::vector<uint8_t>(64, 0));
    Request *r =
        must_irecv(L.recv, {dst[0].data(), dst[1].data(), dst[2].data()}, {64, 64, 64}, {5, 5, 5});
    CHECK_FALSE(done(L.recv, r));
    CHECK(L.w.count(1, Placement::kNotPosted) >= 1);
    CHECK(L.w.count(2, Placement::kNotPosted) >= 1);
    CHECK(L.w.count(Placement::kPlace) == 0);
    CHECK(L.w.bytes_written == 0);

    L.w.paused[0] = false;
    int sizes[3] = {-1, -1, -1};
    REQUIRE(done(L.recv, r, sizes));
    CHECK(sizes[0] == 10);
    CHECK(sizes[1] == 20);
    CHECK(sizes[2] == 30);
    for (size_t i = 0; i < 3; ++i) CHECK(starts_with(dst[i], src[i]));
}

TEST_CASE("multi-recv with some equal tags: first free buffer of the tag, in sequence order",
          "[comm]")
{
    Link L;
    L.w.set_streams(3);
    L.w.split = [](const OutMessage &m, Wire &w) { w.push(2 - m.seq, chunk_of(m, 0, m.size)); };
    std::vector<std::vector<uint8_t>> src = {bytes(11, 1), bytes(22, 2), bytes(33, 3)};
    const int tags[3] = {8, 7, 7};
    for (size_t i = 0; i < 3; ++i) must_isend(L.send, src[i].data(), src[i].size(), tags[i]);
    std::vector<std::vector<uint8_t>> dst(3, std::vector<uint8_t>(40, 0));
    Request *r =
        must_irecv(L.recv, {dst[0].data(), dst[1].data(), dst[2].data()}, {40, 40, 40}, {7, 7, 8});
    int sizes[3] = {-1, -1, -1};
    REQUIRE(done(L.recv, r, sizes));
    CHECK(sizes[0] == 22);
    CHECK(sizes[1] == 33);
    CHECK(sizes[2] == 11);
    CHECK(starts_with(dst[0], src[1]));
    CHECK(starts_with(dst[1], src[2]));
    CHECK(starts_with(dst[2], src[0]));
}

TEST_CASE("a message's chunks may arrive in any order; it completes with the last one", "[comm]")
{
    Link L;
    L.w.set_streams(4);
    L.w.frames_per_progress = 1;
    // Chunk c of the 1000-byte message goes to stream where[c]; streams are read 0..3, so the
    // chunks arrive in the order 3, 1, 0, 2.
    L.w.split = [](const OutMessage &m, Wire &w) {
        const size_t where[4] = {2, 1, 3, 0};
        for (size_t c = 0; c < 4; ++c) w.push(where[c], chunk_of(m, 250 * c, 250));
    };
    const auto src = bytes(1000, 9);
    Request *s = must_isend(L.send, src.data(), src.size(), 1);
    std::vector<uint8_t> dst(1000, 0);
    Request *r = must_irecv(L.recv, {dst.data()}, {1000}, {1}); // lands chunk 3
    CHECK(L.w.bytes_written == 250);
    CHECK_FALSE(done(L.recv, r)); // chunk 1
    CHECK_FALSE(done(L.recv, r)); // chunk 0
    CHECK(L.w.acks.empty());
    CHECK_FALSE(done(L.send, s));
    int size = -1;
    CHECK(done(L.recv, r, &size)); // chunk 2
    CHECK(size == 1000);
    CHECK(dst == src);
    CHECK(L.w.acks == std::vector<uint64_t>{1});
    CHECK(done(L.send, s));
}

// ---- Errors and protocol violations -------------------------------------------------------

TEST_CASE("a message larger than the posted buffer is -EMSGSIZE, sticky for the comm", "[comm]")
{
    Link L;
    std::vector<uint8_t> a(100, 0xEE), b(100, 0xEE);
    Request *r1 = must_irecv(L.recv, {a.data()}, {100}, {1});
    Request *r2 = must_irecv(L.recv, {b.data()}, {100}, {1});
    const auto src = bytes(200, 3);
    Request *s = must_isend(L.send, src.data(), src.size(), 1);

    CHECK(test_error(L.recv, r1) == -EMSGSIZE);
    REQUIRE_FALSE(L.w.locates.empty());
    CHECK(L.w.locates[0].seq == 0);
    CHECK(L.w.locates[0].kind == Placement::kError);
    CHECK(L.w.locates[0].error == -EMSGSIZE);
    CHECK(test_error(L.recv, r2) == -EMSGSIZE);
    CHECK(L.w.bytes_written == 0);
    CHECK(all_equal(a.data(), a.size(), 0xEE));
    CHECK(all_equal(b.data(), b.size(), 0xEE));

    // Sticky: even with the offending frame gone, and for new receives.
    L.w.streams[0].clear();
    CHECK(test_error(L.recv, r1) == -EMSGSIZE);
    void *data = a.data();
    size_t size = 100;
    int tag = 1;
    Request *extra = r1;
    CHECK(L.recv.irecv(1, &data, &size, &tag, &extra) == -EMSGSIZE);
    CHECK(extra == nullptr);
    CHECK(vigil::to_nccl_result(-EMSGSIZE) == ncclInvalidUsage);
    CHECK_FALSE(done(L.send, s)); // never acked
}

TEST_CASE("a frame whose tag matches no posted buffer is -EPROTO", "[comm]")
{
    Link L;
    std::vector<uint8_t> a(16, 0), b(16, 0);
    Request *r = must_irecv(L.recv, {a.data(), b.data()}, {16, 16}, {1, 2});
    L.w.push(0, make_frame(0, 3, 8, 0, 8, 0x55));
    CHECK(test_error(L.recv, r) == -EPROTO);
    REQUIRE(L.w.locates.size() == 1);
    CHECK(L.w.locates[0].kind == Placement::kError);
    CHECK(L.w.locates[0].error == -EPROTO);
    CHECK(L.w.bytes_written == 0);
}

TEST_CASE("replayed frames of completed messages are discarded, never written", "[comm]")
{
    Link L;
    SECTION("seq below the completed floor")
    {
        std::vector<uint8_t> d0(64, 0), d1(64, 0);
        const auto m0 = bytes(32, 0x11), m1 = bytes(48, 0x22);
        must_isend(L.send, m0.data(), m0.size(), 4);
        Request *r0 = must_irecv(L.recv, {d0.data()}, {64}, {4});
        REQUIRE(done(L.recv, r0));
        REQUIRE(L.w.acks == std::vector<uint64_t>{1});

        Request *r1 = must_irecv(L.recv, {d1.data()}, {64}, {4});
        const uint64_t written = L.w.bytes_written;
        L.w.push(0, make_frame(0, 4, 32, 0, 32, 0x99));
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
        L.w.push(0, make_frame(0, 1, 40, 0, 20, 0x10));  // first half of seq 0
        L.w.push(0, make_frame(1, 2, 10, 0, 10, 0x20));  // all of seq 1
        L.w.push(0, make_frame(1, 2, 10, 0, 10, 0x99));  // replay of seq 1
        L.w.push(0, make_frame(0, 1, 40, 20, 20, 0x30)); // second half of seq 0
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
        CHECK(L.w.acks == std::vector<uint64_t>{2});
    }
}

TEST_CASE("other protocol violations are -EPROTO", "[comm]")
{
    Link L;
    std::vector<uint8_t> d(64, 0);
    Request *r = must_irecv(L.recv, {d.data()}, {64}, {1});
    SECTION("a seq inside the window but not posted waits; beyond the window is an error")
    {
        L.w.set_streams(2);
        L.w.push(0, make_frame(vn::kMaxInflight - 1, 1, 8, 0, 8, 0));
        CHECK_FALSE(done(L.recv, r));
        CHECK(L.w.locates.back().kind == Placement::kNotPosted);
        L.w.push(1, make_frame(vn::kMaxInflight, 1, 8, 0, 8, 0));
        CHECK(test_error(L.recv, r) == -EPROTO);
        CHECK(L.w.locates.back().seq == static_cast<uint64_t>(vn::kMaxInflight));
        CHECK(L.w.locates.back().kind == Placement::kError);
    }
    SECTION("a later frame disagrees on the message size")
    {
        L.w.push(0, make_frame(0, 1, 40, 0, 20, 0));
        L.w.push(0, make_frame(0, 1, 41, 20, 20, 0));
        CHECK(test_error(L.recv, r) == -EPROTO);
    }
    SECTION("a later frame disagrees on the tag")
    {
        L.w.push(0, make_frame(0, 1, 40, 0, 20, 0));
        L.w.push(0, make_frame(0, 2, 40, 20, 20, 0));
        CHECK(test_error(L.recv, r) == -EPROTO);
    }
    SECTION("frames carrying more bytes than the message")
    {
        L.w.push(0, make_frame(0, 1, 10, 0, 8, 0));
        L.w.push(0, make_frame(0, 1, 10, 0, 8, 0));
        CHECK(test_error(L.recv, r) == -EPROTO);
        CHECK(L.w.acks.empty());
    }
}

TEST_CASE("zero-byte messages complete", "[comm]")
{
    Link L;
    SECTION("alone, with NULL buffers")
    {
        Request *s = must_isend(L.send, nullptr, 0, 3);
        Request *r = must_irecv(L.recv, {nullptr}, {0}, {3});
        int rs = -1, ss = -1;
        CHECK(done(L.recv, r, &rs));
        CHECK(rs == 0);
        CHECK(done(L.send, s, &ss));
        CHECK(ss == 0);
        CHECK(L.w.acks == std::vector<uint64_t>{1});
    }
    SECTION("inside a multi-recv")
    {
        std::vector<std::vector<uint8_t>> dst(3, std::vector<uint8_t>(16, 0xEE));
        const auto five = bytes(5, 5);
        uint8_t none = 0;
        must_isend(L.send, &none, 0, 1);
        must_isend(L.send, five.data(), 5, 1);
        must_isend(L.send, &none, 0, 1);
        Request *r = must_irecv(L.recv, {dst[0].data(), dst[1].data(), dst[2].data()}, {16, 16, 16},
                                {1, 1, 1});
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

TEST_CASE("send-side failures", "[comm]")
{
    Link L;
    uint8_t byte = 1;
    SECTION("a path error is sticky for pending and new sends")
    {
        Request *s = must_isend(L.send, &byte, 1, 0);
        L.w.send_status = PathStatus{.error = -ECONNRESET, .detail = "reset by fake"};
        // No backup: once the fatal timeout has passed the connection fails (-ECONNRESET,
        // whatever the path's own errno).
        CHECK(eventual_error(L.send, s) == -ECONNRESET);
        L.w.send_status = PathStatus{};
        CHECK(test_error(L.send, s) == -ECONNRESET);
        Request *extra = s;
        CHECK(L.send.isend(&byte, 1, 0, &extra) == -ECONNRESET);
        CHECK(extra == nullptr);
        CHECK(L.w.posted.size() == 1);
    }
    SECTION("an ack beyond the last sent seq is -EPROTO")
    {
        Request *s = must_isend(L.send, &byte, 1, 0);
        L.w.ack_to_sender = 2;
        CHECK(test_error(L.send, s) == -EPROTO);
    }
    SECTION("the peer closing with sends unacknowledged is -ECONNRESET")
    {
        L.w.forward_acks = false;
        Request *s = must_isend(L.send, &byte, 1, 0);
        L.w.send_status.peer_closed = true;
        CHECK(eventual_error(L.send, s) == -ECONNRESET);
    }
    SECTION("the peer closing with nothing outstanding fails only the next isend")
    {
        Request *s = must_isend(L.send, &byte, 1, 0);
        L.w.ack_to_sender = 1;
        REQUIRE(done(L.send, s));
        L.w.send_status.peer_closed = true;
        L.send.on_ready(); // the engine's progress call sees the orderly close
        Request *extra = reinterpret_cast<Request *>(&byte);
        CHECK(L.send.isend(&byte, 1, 0, &extra) == -ECONNRESET);
        CHECK(extra == nullptr);
        CHECK(L.w.posted.size() == 1);
    }
    SECTION("a message over kMaxMessageBytes is -EMSGSIZE and nothing else")
    {
        Request *extra = reinterpret_cast<Request *>(&byte);
        CHECK(L.send.isend(&byte, vn::kMaxMessageBytes + 1, 0, &extra) == -EMSGSIZE);
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
    SECTION("peer closed with receives outstanding fails them")
    {
        Request *r = must_irecv(L.recv, {buf}, {8}, {0});
        L.w.recv_status.peer_closed = true;
        CHECK(test_error(L.recv, r) == -ECONNRESET);
    }
    SECTION("peer closed with nothing outstanding fails the next irecv")
    {
        L.w.recv_status.peer_closed = true;
        L.recv.on_ready(); // the engine's progress call
        void *data = buf;
        size_t size = 8;
        int tag = 0;
        Request *r = reinterpret_cast<Request *>(buf);
        CHECK(L.recv.irecv(1, &data, &size, &tag, &r) == -ECONNRESET);
        CHECK(r == nullptr);
    }
    SECTION("a path error fails pending receives")
    {
        Request *r = must_irecv(L.recv, {buf}, {8}, {0});
        L.w.recv_status.error = -ETIMEDOUT;
        // The only path is gone: -ECONNRESET (ncclRemoteError) after the fatal timeout.
        CHECK(eventual_error(L.recv, r) == -ECONNRESET);
        CHECK(test_error(L.recv, r) == -ECONNRESET); // sticky
    }
    SECTION("irecv with n outside 1..kMaxRecvs is -EINVAL, not sticky")
    {
        void *data[vn::kMaxRecvs + 1] = {};
        size_t sizes[vn::kMaxRecvs + 1] = {};
        int tags[vn::kMaxRecvs + 1] = {};
        for (int n : {0, -1, vn::kMaxRecvs + 1}) {
            Request *r = reinterpret_cast<Request *>(buf);
            CHECK(L.recv.irecv(n, data, sizes, tags, &r) == -EINVAL);
            CHECK(r == nullptr);
        }
        CHECK(must_irecv(L.recv, {buf}, {8}, {0}) != nullptr);
    }
}

// ---- Random stress ----------------------------------------------------------------------

namespace {

uint8_t pattern(uint64_t seq, uint64_t k)
{
    uint64_t x = seq * 0x9E3779B97F4A7C15ULL ^ (k + 1) * 0xC2B2AE3D27D4EB4FULL;
    x ^= x >> 29;
    return static_cast<uint8_t>(x);
}

bool holds_pattern(const uint8_t *p, uint64_t seq, uint64_t size)
{
    for (uint64_t k = 0; k < size; ++k)
        if (p[k] != pattern(seq, k)) return false;
    return true;
}

} // namespace

TEST_CASE("stress: 2000 random messages, random chunks, streams, interleaving and multi-recvs",
          "[comm][stress]")
{
    constexpr int kMessages = 2000;
    constexpr size_t kStreams = 4;
    constexpr size_t kCanary = 16;
    std::mt19937_64 rng(0x5717E55);
    auto below = [&](uint64_t n) { return rng() % n; };

    // Plan: message sizes and tags, receive groups (one irecv each) and, for each message,
    // the buffer it must bind to: the first unbound buffer with its tag, in sequence order.
    struct Msg {
        uint64_t size;
        int32_t tag;
        size_t group;
        size_t buf;
    };
    struct Group {
        int first;
        int n;
        std::vector<int> tags;
        std::vector<size_t> caps;
        std::vector<int> msg_of_buf;
    };
    std::vector<Msg> msgs(kMessages);
    std::vector<Group> groups;
    const int32_t tag_set[3] = {-1, 0, 7};
    for (int seq = 0; seq < kMessages;) {
        Group g;
        g.first = seq;
        g.n = std::min(1 + static_cast<int>(below(vn::kMaxRecvs)), kMessages - seq);
        for (int k = 0; k < g.n; ++k) {
            Msg &m = msgs[static_cast<size_t>(seq + k)];
            m.size = below(20) == 0 ? 0 : below(64 * 1024 + 1);
            m.tag = tag_set[below(3)];
            m.group = groups.size();
            g.tags.push_back(m.tag);
        }
        std::shuffle(g.tags.begin(), g.tags.end(), rng);
        g.caps.assign(static_cast<size_t>(g.n), 0);
        g.msg_of_buf.assign(static_cast<size_t>(g.n), -1);
        for (int k = 0; k < g.n; ++k) {
            Msg &m = msgs[static_cast<size_t>(seq + k)];
            for (size_t j = 0; j < g.tags.size(); ++j) {
                if (g.msg_of_buf[j] < 0 && g.tags[j] == m.tag) {
                    g.msg_of_buf[j] = seq + k;
                    g.caps[j] = m.size + below(64);
                    m.buf = j;
                    break;
                }
            }
        }
        groups.push_back(g);
        seq += g.n;
    }

    Link L;
    L.w.set_streams(kStreams);
    L.w.rng = &rng;
    // 1..4 chunks at random cut points, shuffled, each on a random stream. Streams stay FIFO
    // and messages are posted in sequence order, as on TCP.
    L.w.split = [&](const OutMessage &m, Wire &w) {
        std::vector<uint64_t> cuts = {0, m.size};
        const uint64_t extra = m.size < 2 ? 0 : below(4);
        for (uint64_t i = 0; i < extra; ++i) cuts.push_back(1 + below(m.size - 1));
        std::sort(cuts.begin(), cuts.end());
        cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
        std::vector<Frame> frames;
        if (m.size == 0) frames.push_back(chunk_of(m, 0, 0));
        for (size_t i = 0; i + 1 < cuts.size(); ++i)
            frames.push_back(chunk_of(m, cuts[i], cuts[i + 1] - cuts[i]));
        std::shuffle(frames.begin(), frames.end(), rng);
        for (Frame &f : frames) w.push(below(kStreams), std::move(f));
    };

    struct PostedGroup {
        Request *req = nullptr;
        bool posted = false;
        bool verified = false;
        int sends_left = 0;
        std::vector<std::vector<uint8_t>> bufs;
    };
    std::vector<PostedGroup> pg(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) pg[g].sends_left = groups[g].n;
    std::vector<std::vector<uint8_t>> send_data(kMessages);
    std::vector<std::pair<Request *, int>> pending_sends;
    std::vector<size_t> pending_recvs;
    int next_send = 0, sends_done = 0;
    size_t next_group = 0, groups_done = 0;
    uint64_t last_ack_seen = 0;

    auto release_group = [&](size_t g) {
        if (pg[g].verified && pg[g].sends_left == 0) pg[g].bufs = {};
    };

    for (long step = 0; sends_done < kMessages || groups_done < groups.size(); ++step) {
        REQUIRE(step < 5'000'000); // no progress: a deadlock
        switch (below(4)) {
        case 0: { // isend the next message
            if (next_send == kMessages) break;
            const Msg &m = msgs[static_cast<size_t>(next_send)];
            std::vector<uint8_t> &d = send_data[static_cast<size_t>(next_send)];
            if (d.size() != m.size) {
                d.resize(m.size);
                for (uint64_t k = 0; k < m.size; ++k)
                    d[k] = pattern(static_cast<uint64_t>(next_send), k);
            }
            Request *r = nullptr;
            REQUIRE(L.send.isend(d.data(), d.size(), m.tag, &r) == 0);
            if (r == nullptr) break; // window full: retry later
            REQUIRE(r->seq == static_cast<uint64_t>(next_send));
            pending_sends.emplace_back(r, next_send++);
            break;
        }
        case 1: { // irecv the next group
            if (next_group == groups.size()) break;
            const Group &g = groups[next_group];
            PostedGroup &p = pg[next_group];
            std::vector<void *> ptrs;
            if (p.bufs.empty()) {
                for (int j = 0; j < g.n; ++j)
                    p.bufs.emplace_back(g.caps[static_cast<size_t>(j)] + kCanary, uint8_t{0xA5});
            }
            for (auto &b : p.bufs) ptrs.push_back(b.data());
            Request *r = nullptr;
            REQUIRE(L.recv.irecv(g.n, ptrs.data(), g.caps.data(), g.tags.data(), &r) == 0);
            if (r == nullptr) break; // no request or window: retry later
            p.req = r;
            p.posted = true;
            pending_recvs.push_back(next_group++);
            break;
        }
        case 2: { // test a random pending send
            if (pending_sends.empty()) break;
            const size_t i = below(pending_sends.size());
            auto [r, seq] = pending_sends[i];
            int size = -1;
            if (!done(L.send, r, &size)) break;
            const Msg &m = msgs[static_cast<size_t>(seq)];
            REQUIRE(size == static_cast<int>(m.size));
            // Completion means the receiver holds the whole message (design invariant 3).
            REQUIRE(L.w.ack_to_sender > static_cast<uint64_t>(seq));
            PostedGroup &p = pg[m.group];
            REQUIRE(p.posted);
            REQUIRE(holds_pattern(p.bufs[m.buf].data(), static_cast<uint64_t>(seq), m.size));
            send_data[static_cast<size_t>(seq)] = {};
            pending_sends[i] = pending_sends.back();
            pending_sends.pop_back();
            ++sends_done;
            --p.sends_left;
            release_group(m.group);
            break;
        }
        default: { // test a random pending receive
            if (pending_recvs.empty()) break;
            const size_t i = below(pending_recvs.size());
            const size_t gi = pending_recvs[i];
            const Group &g = groups[gi];
            PostedGroup &p = pg[gi];
            int sizes[vn::kMaxRecvs];
            std::fill(std::begin(sizes), std::end(sizes), -1);
            if (!done(L.recv, p.req, sizes)) break;
            for (int j = 0; j < g.n; ++j) {
                const size_t bj = static_cast<size_t>(j);
                const int seq = g.msg_of_buf[bj];
                const Msg &m = msgs[static_cast<size_t>(seq)];
                INFO("message " << seq << " buffer " << j << " of group " << gi);
                REQUIRE(sizes[j] == static_cast<int>(m.size));
                REQUIRE(holds_pattern(p.bufs[bj].data(), static_cast<uint64_t>(seq), m.size));
                REQUIRE(all_equal(p.bufs[bj].data() + m.size, g.caps[bj] - m.size + kCanary, 0xA5));
            }
            for (int j = g.n; j < vn::kMaxRecvs; ++j) REQUIRE(sizes[j] == -1); // only n written
            p.verified = true;
            pending_recvs[i] = pending_recvs.back();
            pending_recvs.pop_back();
            ++groups_done;
            release_group(gi);
            break;
        }
        }
        // Acks as the sender sees them never go back.
        if (L.w.ack_to_sender < last_ack_seen) FAIL("ack went back from " << last_ack_seen);
        last_ack_seen = L.w.ack_to_sender;
    }

    CHECK(L.w.ack_regressions == 0);
    REQUIRE_FALSE(L.w.acks.empty());
    CHECK(L.w.acks.back() == static_cast<uint64_t>(kMessages));
    CHECK_FALSE(L.w.in_flight());
    uint64_t total = 0;
    for (const Msg &m : msgs) total += m.size;
    CHECK(L.w.bytes_written == total); // every byte written exactly once
    CHECK(L.w.count(Placement::kError) == 0);
    CHECK(L.w.count(Placement::kDiscard) == 0);
    CHECK(L.w.count(Placement::kNotPosted) > 0); // out-of-order arrival did happen
}

// ---- errno -> ncclResult_t and the exception firewall -------------------------------------

TEST_CASE("to_nccl_result maps the errno table", "[abi]")
{
    STATIC_REQUIRE(vigil::to_nccl_result(0) == ncclSuccess);
    CHECK(vigil::to_nccl_result(-EINVAL) == ncclInternalError);
    CHECK(vigil::to_nccl_result(-EMSGSIZE) == ncclInvalidUsage);
    CHECK(vigil::to_nccl_result(-ENOMEM) == ncclSystemError);
    for (int e : {ECONNRESET, ECONNREFUSED, ECONNABORTED, EHOSTUNREACH, ENETUNREACH, ENETDOWN,
                  EPIPE, ETIMEDOUT, EPROTO, EBADMSG, EACCES}) {
        INFO("errno " << e);
        CHECK(vigil::to_nccl_result(-e) == ncclRemoteError);
    }
    for (int rc : {-EIO, -ENOENT, -EAGAIN, -9999, 1, EINVAL}) {
        INFO("rc " << rc);
        CHECK(vigil::to_nccl_result(rc) == ncclSystemError);
    }
}

TEST_CASE("abi_guard converts exceptions and never lets them escape", "[abi]")
{
    STATIC_REQUIRE(noexcept(vigil::abi_guard("t", [] { return ncclSuccess; })));
    CHECK(vigil::abi_guard("t", [] { return ncclInProgress; }) == ncclInProgress);
    CHECK(vigil::abi_guard("t", [] { return ncclRemoteError; }) == ncclRemoteError);
    CHECK(vigil::abi_guard("t", []() -> ncclResult_t { throw std::bad_alloc(); }) ==
          ncclSystemError);
    CHECK(vigil::abi_guard("t", []() -> ncclResult_t { throw std::runtime_error("boom"); }) ==
          ncclInternalError);
    CHECK(vigil::abi_guard("t", []() -> ncclResult_t {
              std::vector<int> v;
              return static_cast<ncclResult_t>(v.at(3));
          }) == ncclInternalError);
    CHECK(vigil::abi_guard("t", []() -> ncclResult_t { throw 42; }) == ncclInternalError);
    CHECK(vigil::abi_guard("t", [] { return vigil::to_nccl_result(-ECONNRESET); }) ==
          ncclRemoteError);
}
