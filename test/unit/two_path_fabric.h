// SPDX-License-Identifier: Apache-2.0
// The in-process fake fabric of the failover and failback tests (test_failover.cc,
// test_failback.cc). It models one connection of the transport core (comm.h): a primary and a
// backup path, each a Lane (fake send half, link, fake receive half) whose link can break,
// go silent, lose acks, hold, chunk or split frames, or get "stuck" (the send half keeps what
// it is given and is not idle()); optionally a fake PathRebuilder (refused while "the port is
// down", then a fresh Lane) and a fake PathAcceptor that hands each rebuilt path's receiving
// end to the RecvComm. Traffic posts messages and receives through NCCL's calls and checks
// exact delivery and the canaries of spent receive buffers. nfds() is 0 everywhere, so nothing
// touches the progress engine; the core reads CLOCK_MONOTONIC, so tests run in real time.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "clock.h"
#include "comm.h"

namespace vigil::test::two_path {

namespace vn = vigil::net;

inline constexpr uint64_t kMs = 1'000'000ull; // ns
using SeqGen = std::pair<uint64_t, uint32_t>;
using SeqGens = std::vector<SeqGen>;

// ---- The fake fabric --------------------------------------------------------------------

// One frame on the wire, as a TCP FrameHeader would describe it, plus its bytes.
struct Frame {
    uint32_t gen = 0;
    uint64_t seq = 0;
    int32_t tag = 0;
    uint64_t size = 0; // whole message
    uint64_t offset = 0;
    uint64_t len = 0;
    std::vector<uint8_t> bytes;
    bool probe = false;
    // Receive side, split delivery: header located, payload not landed yet.
    bool located = false;
    uint8_t *dest = nullptr;
};

// Receiver -> sender: an ack (also what a heartbeat re-sends) or a failover request.
struct Back {
    enum Kind { kAck, kFailoverRequest } kind = kAck;
    uint64_t seq = 0;
    uint32_t gen = 0;
};

struct Located {
    uint32_t gen;
    uint64_t seq;
    uint64_t offset;
    vn::Placement::Kind kind;
};

struct Write {
    uint32_t gen;
    uint64_t seq;
    uint64_t offset;
    uint64_t len;
};

// One path of a connection: the fake send half, the link, the fake receive half. Owned by
// the test (Net keeps its lanes in a deque: stable addresses, and a rebuilt path gets a fresh
// lane); the knobs are plain fields.
struct Lane {
    // -- sender half
    uint32_t gen = 1;               // generation stamped on written frames (begin() sets it)
    uint64_t expect_seq = 0;        // post() must be dense from here
    int non_dense_posts = 0;
    SeqGens begins;                 // (first_seq, gen)
    std::vector<uint64_t> begin_ns; // when each begin() came
    SeqGens posted;                 // (seq, gen)
    uint64_t chunk = 0;             // > 0: frames of at most this many bytes
    int probes = 0;
    int send_error = 0; // injected: the send half's progress() reports it
    bool send_peer_closed = false;
    int send_sabotaged = 0;
    bool stuck = false;       // written frames wait in `outbox`: the path is not idle()
    std::deque<Frame> outbox; // posted, not yet written
    // -- the link
    bool broken = false;    // both halves report -ECONNRESET from progress()
    bool drop_data = false; // frames written are lost (dead link, no error anywhere)
    bool drop_back = false; // acks, heartbeats and failover requests are lost
    bool hold = false;      // written frames wait on the wire until released
    std::deque<Frame> wire;
    std::deque<Back> back;
    // -- receiver half
    int recv_error = 0; // injected
    bool recv_peer_closed = false;
    int recv_sabotaged = 0;
    size_t frames_per_progress = SIZE_MAX;
    bool split_payload = false; // a placed frame's payload lands on the next progress()
    uint64_t last_ack = 0;
    uint32_t last_ack_gen = 0;
    std::vector<Located> locates;
    std::vector<Write> writes;
    uint64_t bytes_written = 0;
    SeqGens acks; // (ack_seq, gen) the receiver sent
    std::vector<uint32_t> failover_requests;
    int heartbeats = 0;

    // A dead link that reports nothing: everything queued is lost, nothing gets through.
    void silence()
    {
        drop_data = drop_back = true;
        wire.clear();
        back.clear();
        outbox.clear();
    }
    // A broken link: both ends see an error from progress().
    void break_link()
    {
        broken = true;
        wire.clear();
        back.clear();
        outbox.clear();
    }
    void reply(Back b)
    {
        if (!broken && !drop_back) back.push_back(b);
    }
    // Frames located with `kind` (of generation `g`; 0: any).
    size_t count(vn::Placement::Kind kind, uint32_t g = 0) const
    {
        return static_cast<size_t>(std::count_if(locates.begin(), locates.end(), [&](const Located &l) {
            return l.kind == kind && (g == 0 || l.gen == g);
        }));
    }
};

class FakeSendPath final : public vn::SendPath
{
public:
    FakeSendPath(Lane &l, int dev) : l_(l), dev_(dev) {}
    void begin(uint64_t first_seq, uint32_t gen) override
    {
        l_.begins.emplace_back(first_seq, gen);
        l_.begin_ns.push_back(vigil::now_ns());
        l_.expect_seq = first_seq;
        l_.gen = gen;
    }
    void post(const vn::OutMessage &m) override
    {
        if (m.seq != l_.expect_seq) ++l_.non_dense_posts;
        l_.expect_seq = m.seq + 1;
        l_.posted.emplace_back(m.seq, l_.gen);
        if (l_.broken || l_.drop_data) return;
        const uint64_t chunk = l_.chunk == 0 ? std::max<uint64_t>(m.size, 1) : l_.chunk;
        uint64_t off = 0;
        do {
            Frame f;
            f.gen = l_.gen;
            f.seq = m.seq;
            f.tag = m.tag;
            f.size = m.size;
            f.offset = off;
            f.len = std::min(chunk, m.size - off);
            if (f.len > 0) f.bytes.assign(m.data + off, m.data + off + f.len);
            queue().push_back(std::move(f));
            off += chunk;
        } while (off < m.size);
    }
    // Frames reach the wire as they are posted, unless the lane is stuck.
    bool idle() const override { return l_.outbox.empty(); }
    void probe() override
    {
        ++l_.probes;
        if (l_.broken || l_.drop_data) return;
        Frame f;
        f.gen = l_.gen;
        f.probe = true;
        queue().push_back(std::move(f));
    }
    void sabotage() override
    {
        ++l_.send_sabotaged;
        l_.break_link();
    }
    int local_dev() const override { return dev_; }
    vn::PathStatus progress(uint64_t *acked_seq) override
    {
        vn::PathStatus st;
        if (l_.broken) return vn::PathStatus{.error = -ECONNRESET, .detail = "fake link broken"};
        if (l_.send_error != 0) return vn::PathStatus{.error = l_.send_error, .detail = "injected"};
        if (!l_.stuck)
            while (!l_.outbox.empty()) {
                l_.wire.push_back(std::move(l_.outbox.front()));
                l_.outbox.pop_front();
            }
        while (!l_.back.empty()) {
            const Back b = l_.back.front();
            l_.back.pop_front();
            st.heard = true;
            if (b.kind == Back::kAck) {
                *acked_seq = std::max(*acked_seq, b.seq);
            } else {
                st.failover_requested = true;
                st.failed_slot = b.gen; // the fake carries the request's value in its gen field
            }
        }
        st.peer_closed = l_.send_peer_closed;
        return st;
    }
    int fd(size_t) const override { return -1; }
    size_t nfds() const override { return 0; }
    std::string describe() const override { return "fake send path dev " + std::to_string(dev_); }

private:
    // Where a written frame goes: the wire, or the outbox while the lane is stuck (and until
    // the outbox has drained, so frames stay in order).
    std::deque<Frame> &queue() { return (l_.stuck || !l_.outbox.empty()) ? l_.outbox : l_.wire; }

    Lane &l_;
    int dev_;
};

class FakeRecvPath final : public vn::RecvPath
{
public:
    FakeRecvPath(Lane &l, int dev) : l_(l), dev_(dev) {}
    vn::PathStatus progress(vn::RecvSink &sink) override
    {
        using vn::Placement;
        if (l_.broken) return vn::PathStatus{.error = -ECONNRESET, .detail = "fake link broken"};
        if (l_.recv_error != 0) return vn::PathStatus{.error = l_.recv_error, .detail = "injected"};
        vn::PathStatus st;
        size_t budget = l_.frames_per_progress;
        while (!l_.hold && !l_.wire.empty() && budget > 0) {
            Frame &f = l_.wire.front();
            if (f.probe) {
                l_.wire.pop_front();
                st.heard = true;
                continue;
            }
            if (!f.located) {
                const Placement p = sink.locate(f.gen, f.seq, f.tag, f.size);
                l_.locates.push_back({f.gen, f.seq, f.offset, p.kind});
                if (p.kind == Placement::kNotPosted) break;
                if (p.kind == Placement::kError)
                    return vn::PathStatus{.error = p.error, .detail = "frame refused"};
                st.heard = true;
                if (p.kind == Placement::kDiscard) {
                    l_.wire.pop_front();
                    --budget;
                    continue;
                }
                f.located = true;
                f.dest = p.dest;
                if (l_.split_payload) break; // the payload comes with the next call
            }
            // The path contract: ask before writing payload bytes (a newer generation or a
            // completed message turns the rest of the frame into a discard).
            const bool wanted = sink.still_wanted(f.gen, f.seq);
            if (f.len > 0 && wanted) {
                std::memcpy(f.dest + f.offset, f.bytes.data(), f.len);
                l_.bytes_written += f.len;
                l_.writes.push_back({f.gen, f.seq, f.offset, f.len});
            }
            const uint64_t seq = f.seq, len = f.len;
            const uint32_t gen = f.gen;
            l_.wire.pop_front();
            st.heard = true;
            if (int rc = sink.landed(seq, len, gen); rc != 0)
                return vn::PathStatus{.error = rc, .detail = "landed refused"};
            --budget;
        }
        st.peer_closed = l_.recv_peer_closed && l_.wire.empty();
        return st;
    }
    void ack(uint64_t ack_seq, uint32_t gen) override
    {
        l_.acks.emplace_back(ack_seq, gen);
        l_.last_ack = ack_seq;
        l_.last_ack_gen = gen;
        l_.reply({Back::kAck, ack_seq, gen});
    }
    void request_failover(uint32_t gen) override
    {
        l_.failover_requests.push_back(gen);
        l_.reply({Back::kFailoverRequest, 0, gen});
    }
    void heartbeat() override
    {
        ++l_.heartbeats;
        l_.reply({Back::kAck, l_.last_ack, l_.last_ack_gen});
    }
    void sabotage() override
    {
        ++l_.recv_sabotaged;
        l_.break_link();
    }
    int local_dev() const override { return dev_; }
    int fd(size_t) const override { return -1; }
    size_t nfds() const override { return 0; }
    std::string describe() const override { return "fake recv path dev " + std::to_string(dev_); }

private:
    Lane &l_;
    int dev_;
};

// ---- Rebuilt paths: the fake rebuilder and acceptor ----------------------------------------

// What the fake rebuilder and acceptor share with the test: the rebuild knobs and a log of
// every rebuild attempt, and the receiving ends of rebuilt paths on their way to the RecvComm.
struct Rebuilds {
    // -- rebuilder knobs, per slot
    std::array<bool, vn::kMaxPaths> rebuildable{{true, true}}; // can_rebuild()
    std::array<bool, vn::kMaxPaths> refuse{{true, true}};      // "the port is down"
    std::array<int, vn::kMaxPaths> connecting{{0, 0}}; // calls answering "in progress" first
    // -- rebuilder log, per slot
    std::array<std::vector<uint64_t>, vn::kMaxPaths> attempts; // now_ns() of each progress()
    std::array<std::vector<uint64_t>, vn::kMaxPaths> refused;  // ... of each refused one
    std::array<std::vector<size_t>, vn::kMaxPaths> rebuilt;    // lane of each path handed out
    std::array<std::vector<uint64_t>, vn::kMaxPaths> rebuilt_ns;
    // -- acceptor: receive halves of rebuilt paths, in the order the sender rebuilt them
    std::deque<std::pair<std::unique_ptr<vn::RecvPath>, int>> handover;
    std::vector<int> accepted; // slots handed to the RecvComm
    int polls = 0;
};

// Each successful attempt adds a fresh lane (device 10 + slot) to `lanes`.
class FakeRebuilder final : public vn::PathRebuilder
{
public:
    FakeRebuilder(std::deque<Lane> &lanes, Rebuilds &r) : lanes_(lanes), r_(r) {}
    bool can_rebuild(int slot) const override { return r_.rebuildable.at(static_cast<size_t>(slot)); }
    int progress(int slot, std::unique_ptr<vn::SendPath> *out) override
    {
        const size_t s = static_cast<size_t>(slot);
        const uint64_t now = vigil::now_ns();
        r_.attempts.at(s).push_back(now);
        if (r_.refuse[s]) {
            r_.refused[s].push_back(now);
            return -ECONNREFUSED;
        }
        if (r_.connecting[s] > 0) {
            --r_.connecting[s];
            return 0; // in progress
        }
        Lane &l = lanes_.emplace_back();
        const int dev = 10 + slot;
        *out = std::make_unique<FakeSendPath>(l, dev);
        r_.handover.emplace_back(std::make_unique<FakeRecvPath>(l, dev), slot);
        r_.rebuilt[s].push_back(lanes_.size() - 1);
        r_.rebuilt_ns[s].push_back(now);
        return 0;
    }

private:
    std::deque<Lane> &lanes_;
    Rebuilds &r_;
};

class FakeAcceptor final : public vn::PathAcceptor
{
public:
    explicit FakeAcceptor(Rebuilds &r) : r_(r) {}
    int poll(std::unique_ptr<vn::RecvPath> *out, int *slot) override
    {
        ++r_.polls;
        if (r_.handover.empty()) return 0;
        *out = std::move(r_.handover.front().first);
        *slot = r_.handover.front().second;
        r_.handover.pop_front();
        r_.accepted.push_back(*slot);
        return 0;
    }

private:
    Rebuilds &r_;
};

// ---- A connection ----------------------------------------------------------------------------

// Both comms of one connection over two lanes (or one, without a backup); device of lane i is
// 10 + i. With `rebuild`, the comms get the fake rebuilder and acceptor (otherwise dead paths
// stay dead).
struct Net {
    std::deque<Lane> lane; // [0] primary, [1] backup, then one per rebuilt path
    Rebuilds fab;          // the rebuild knobs and log
    // (lanes and knobs before the comms: destroyed after them)
    std::unique_ptr<vn::SendComm> send;
    std::unique_ptr<vn::RecvComm> recv;

    explicit Net(const vn::FailoverConfig &cfg, bool with_backup = true, bool rebuild = false)
    {
        lane.resize(vn::kMaxPaths);
        std::array<std::unique_ptr<vn::SendPath>, vn::kMaxPaths> sp;
        std::array<std::unique_ptr<vn::RecvPath>, vn::kMaxPaths> rp;
        for (size_t i = 0; i < (with_backup ? vn::kMaxPaths : 1); ++i) {
            sp[i] = std::make_unique<FakeSendPath>(lane[i], 10 + static_cast<int>(i));
            rp[i] = std::make_unique<FakeRecvPath>(lane[i], 10 + static_cast<int>(i));
        }
        std::unique_ptr<vn::PathRebuilder> rebuilder;
        std::unique_ptr<vn::PathAcceptor> acceptor;
        if (rebuild) {
            rebuilder = std::make_unique<FakeRebuilder>(lane, fab);
            acceptor = std::make_unique<FakeAcceptor>(fab);
        }
        send = std::make_unique<vn::SendComm>(std::move(sp), cfg, std::move(rebuilder));
        recv = std::make_unique<vn::RecvComm>(std::move(rp), cfg, std::move(acceptor));
    }
    Lane &primary() { return lane[vn::kPrimary]; }
    Lane &backup() { return lane[vn::kBackup]; }
    // The k-th path rebuilt for `slot`.
    Lane &rebuilt(int slot, size_t k = 0) { return lane.at(fab.rebuilt.at(static_cast<size_t>(slot)).at(k)); }

    // Each (gen, seq) was posted on one lane only, every post was dense, and each
    // generation lives on one lane only.
    void check_posting() const
    {
        std::set<SeqGen> seen;
        std::vector<std::set<uint32_t>> gens(lane.size());
        for (size_t i = 0; i < lane.size(); ++i) {
            CHECK(lane[i].non_dense_posts == 0);
            for (auto [seq, gen] : lane[i].posted) {
                INFO("lane " << i << " seq " << seq << " gen " << gen);
                CHECK(seen.insert({seq, gen}).second);
                gens[i].insert(gen);
            }
        }
        for (size_t i = 0; i < lane.size(); ++i)
            for (size_t j = i + 1; j < lane.size(); ++j)
                for (uint32_t g : gens[i]) {
                    INFO("generation " << g << " on lanes " << i << " and " << j);
                    CHECK(gens[j].count(g) == 0);
                }
    }
    // Every message 0..n-1 was placed (located with kPlace) exactly once over all lanes,
    // and the payload bytes written add up to exactly `bytes` (for lanes that carry whole
    // messages in one frame: no `chunk`).
    void check_exactly_once(uint64_t n, uint64_t bytes) const
    {
        std::map<uint64_t, int> placed;
        uint64_t written = 0;
        for (const Lane &l : lane) {
            written += l.bytes_written;
            for (const Located &x : l.locates)
                if (x.kind == vn::Placement::kPlace) ++placed[x.seq];
        }
        CHECK(written == bytes);
        CHECK(placed.size() == n);
        for (uint64_t s = 0; s < n; ++s) {
            INFO("seq " << s);
            CHECK(placed[s] == 1);
        }
    }
};

// ---- Traffic: messages, receives and their checks -----------------------------------------

inline constexpr uint8_t kFresh = 0xA5; // receive buffers before delivery
inline constexpr uint8_t kSpent = 0x5A; // ... after test() reported them done (canary)
inline constexpr size_t kTail = 32;     // bytes past each buffer's capacity that nobody may write

inline uint8_t pattern(uint64_t msg, uint64_t k)
{
    uint64_t x = (msg + 1) * 0x9E3779B97F4A7C15ULL ^ (k + 7) * 0xC2B2AE3D27D4EB4FULL;
    x ^= x >> 31;
    return static_cast<uint8_t>(x);
}

inline bool all_equal(const uint8_t *p, size_t n, uint8_t v)
{
    return std::all_of(p, p + n, [v](uint8_t x) { return x == v; });
}

inline void nap() { std::this_thread::sleep_for(std::chrono::microseconds(200)); }

struct Traffic {
    struct Msg {
        std::vector<uint8_t> src;
        int32_t tag = 0;
        vn::Request *req = nullptr;
        bool done = false;
        int recv = -1; // the irecv expected to hold it, and its buffer
        size_t buf = 0;
    };
    struct Recv {
        std::vector<std::vector<uint8_t>> bufs; // capacity + kTail each
        std::vector<size_t> caps;
        std::vector<int> tags;
        std::vector<int> expect; // message index per buffer
        vn::Request *req = nullptr;
        bool done = false;
    };

    Net &n;
    std::vector<Msg> msgs;
    std::vector<Recv> recvs;

    // `run_limit_ms`: how long run() waits by default.
    explicit Traffic(Net &net, uint64_t run_limit_ms = 2000) : n(net), run_limit_ms_(run_limit_ms)
    {
        msgs.reserve(256);
        recvs.reserve(256);
    }

    // isend of a new message; must return 0 and a request.
    int send(size_t size, int32_t tag)
    {
        const int id = static_cast<int>(msgs.size());
        Msg m;
        m.tag = tag;
        m.src.resize(size);
        for (size_t k = 0; k < size; ++k) m.src[k] = pattern(static_cast<uint64_t>(id), k);
        msgs.push_back(std::move(m));
        Msg &mm = msgs.back();
        REQUIRE(n.send->isend(mm.src.data(), mm.src.size(), tag, &mm.req) == 0);
        REQUIRE(mm.req != nullptr);
        return id;
    }

    // irecv of one group; expect[i] is the message (index of send()) buffer i must receive.
    int recv(std::vector<size_t> caps, std::vector<int> tags, std::vector<int> expect)
    {
        REQUIRE(caps.size() == tags.size());
        REQUIRE(caps.size() == expect.size());
        const int id = static_cast<int>(recvs.size());
        Recv r;
        r.caps = caps;
        r.tags = tags;
        r.expect = expect;
        for (size_t c : caps) r.bufs.emplace_back(c + kTail, kFresh);
        recvs.push_back(std::move(r));
        Recv &rr = recvs.back();
        std::vector<void *> ptrs;
        for (auto &b : rr.bufs) ptrs.push_back(b.data());
        REQUIRE(n.recv->irecv(static_cast<int>(caps.size()), ptrs.data(), rr.caps.data(),
                              rr.tags.data(), &rr.req) == 0);
        REQUIRE(rr.req != nullptr);
        for (size_t i = 0; i < expect.size(); ++i) pending_bind_.push_back({expect[i], id, i});
        bind_late();
        return id;
    }

    // test() of every pending request, once. All must return 0 (a path is alive). Each
    // test() of a pending request also progresses its comm.
    void poll()
    {
        poll_recvs();
        poll_sends();
    }
    void poll_recvs()
    {
        bind_late();
        for (size_t i = 0; i < recvs.size(); ++i) {
            Recv &r = recvs[i];
            if (r.done) continue;
            int d = -1;
            int sizes[vn::kMaxRecvs];
            std::fill(std::begin(sizes), std::end(sizes), -1);
            INFO("irecv " << i);
            REQUIRE(n.recv->test(r.req, &d, sizes) == 0);
            REQUIRE((d == 0 || d == 1));
            if (d == 1) on_recv_done(i, sizes);
        }
    }
    void poll_sends()
    {
        bind_late();
        for (size_t i = 0; i < msgs.size(); ++i) {
            Msg &m = msgs[i];
            if (m.done) continue;
            int d = -1, size = -1;
            INFO("isend " << i);
            REQUIRE(n.send->test(m.req, &d, &size) == 0);
            REQUIRE((d == 0 || d == 1));
            if (d == 1) {
                CHECK(size == static_cast<int>(m.src.size()));
                on_send_done(i);
            }
        }
    }

    bool finished() const
    {
        return std::all_of(msgs.begin(), msgs.end(), [](const Msg &m) { return m.done; }) &&
               std::all_of(recvs.begin(), recvs.end(), [](const Recv &r) { return r.done; });
    }

    // Polls until everything completed (within `limit_ms` of real time; by default the
    // constructor's run_limit_ms).
    void run() { run(run_limit_ms_); }
    void run(uint64_t limit_ms)
    {
        const uint64_t deadline = vigil::now_ns() + limit_ms * kMs;
        while (!finished()) {
            REQUIRE(vigil::now_ns() < deadline);
            poll();
            if (!finished()) nap();
        }
        check_spent();
    }

    // No buffer was written after test() reported it done.
    void check_spent() const
    {
        for (size_t i = 0; i < recvs.size(); ++i) {
            if (!recvs[i].done) continue;
            for (size_t b = 0; b < recvs[i].bufs.size(); ++b) {
                INFO("irecv " << i << " buffer " << b << " written after it was reported done");
                CHECK(all_equal(recvs[i].bufs[b].data(), recvs[i].bufs[b].size(), kSpent));
            }
        }
    }

    bool recv_done(int id) const { return recvs[static_cast<size_t>(id)].done; }
    bool send_done(int id) const { return msgs[static_cast<size_t>(id)].done; }
    // Bytes of every message sent so far.
    uint64_t bytes() const
    {
        uint64_t b = 0;
        for (const Msg &m : msgs) b += m.src.size();
        return b;
    }
    int next_id() const { return static_cast<int>(msgs.size()); }

private:
    struct Bind {
        int msg, recv;
        size_t buf;
    };
    std::vector<Bind> pending_bind_;
    uint64_t run_limit_ms_;

    // Binds receive buffers to the messages they expect, once those messages were sent.
    void bind_late()
    {
        for (auto it = pending_bind_.begin(); it != pending_bind_.end();) {
            if (static_cast<size_t>(it->msg) < msgs.size()) {
                msgs[static_cast<size_t>(it->msg)].recv = it->recv;
                msgs[static_cast<size_t>(it->msg)].buf = it->buf;
                it = pending_bind_.erase(it);
            } else {
                ++it;
            }
        }
    }

    void on_recv_done(size_t i, const int *sizes)
    {
        Recv &r = recvs[i];
        for (size_t b = 0; b < r.bufs.size(); ++b) {
            const Msg &m = msgs.at(static_cast<size_t>(r.expect[b]));
            const size_t size = m.src.size();
            INFO("irecv " << i << " buffer " << b << " <- message " << r.expect[b]);
            REQUIRE(sizes[b] == static_cast<int>(size));
            REQUIRE(std::equal(m.src.begin(), m.src.end(), r.bufs[b].begin()));
            REQUIRE(all_equal(r.bufs[b].data() + size, r.bufs[b].size() - size, kFresh));
        }
        for (size_t b = r.bufs.size(); b < vn::kMaxRecvs; ++b) REQUIRE(sizes[b] == -1);
        for (auto &b : r.bufs) std::fill(b.begin(), b.end(), kSpent); // NCCL reuses them
        r.done = true;
    }

    void on_send_done(size_t i)
    {
        Msg &m = msgs[i];
        INFO("isend " << i << " completed");
        // Completion means the receiver holds the whole message (invariant 3).
        REQUIRE(m.recv >= 0);
        const Recv &r = recvs[static_cast<size_t>(m.recv)];
        if (!r.done) // (when done, on_recv_done checked the bytes before the canary)
            REQUIRE(std::equal(m.src.begin(), m.src.end(), r.bufs[m.buf].begin()));
        m.done = true;
    }
};

} // namespace vigil::test::two_path
