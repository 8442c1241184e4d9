// SPDX-License-Identifier: Apache-2.0
// The in-process fake fabric of the core's unit tests. It models the paths of one connection
// (fabric.h): each path is a Lane — a fake send half, a link of N FIFO streams one way and a
// back channel the other, and a fake receive half — whose link can break, go silent, lose
// the back channel, hold or pause streams, chunk or split frames, or get "stuck" (the send
// half keeps what it is given and is not idle()). A fake PathRebuilder (refused while "the
// port is down", then a fresh Lane) and a fake PathAcceptor hand each rebuilt path's
// receiving end to the RecvComm. Every call is logged for the tests to check. nfds() is 0
// everywhere, so nothing touches the progress engine; the core reads CLOCK_MONOTONIC, so
// tests run in real time.
//
// A lane in RDMA mode (`rdma`) behaves like the verbs fabric instead of a byte stream: post()
// writes the payload straight into the advertised receive buffer (an RDMA write lands at
// once), one record per message follows on the stream and the receive half reports it whole
// (RecvSink::whole); the send half hears each record acknowledged (SendSink::held) on its next
// progress(), before the receiving core has polled it, as an RC ACK precedes the CQ poll.
// drain() reports the records waiting on the streams (even while `hold` keeps progress()
// from reading them); fence() drains, then nothing lands any more. With `short_records` too,
// every record names its sequence number only modulo 2^11 and no tag (RecvSink::whole_short),
// as the verbs fabric's short messages do. With `stripes` too, post() takes pieces as the
// verbs fabric does under multipath: a piece is one frame whose bytes land in the buffer once
// it left the outbox (as an RDMA write lands), and the receive half reports it when it polls
// the frame (RecvSink::piece, piece_last for a message's last, whole for a whole message);
// the send half hears it landed (SendSink::landed, held for a whole message) on its next
// progress().
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "clock.h"
#include "recv_comm.h"
#include "send_comm.h"

namespace vigil::test::fake {

namespace vn = vigil::net;

inline constexpr uint64_t kMs = 1'000'000ull; // ns
using SeqGen = std::pair<uint64_t, uint32_t>;
using SeqGens = std::vector<SeqGen>;

// ---- The link ----------------------------------------------------------------------------

// One frame on a stream: a chunk of a message, or a control frame.
struct Frame {
    enum Kind { kData, kProbe, kGeneration, kGoodbye } kind = kData;
    uint32_t gen = 1;
    uint64_t seq = 0; // kGeneration: the generation's first seq
    int32_t tag = 0;
    int entry = 0;    // kGeneration: the abandoned slot (-1: none)
    uint64_t path = 0; // kGeneration: the abandoned path's id
    uint64_t size = 0; // whole message
    uint64_t offset = 0;
    std::vector<uint8_t> bytes;
    bool piece = false; // RDMA striping: a piece and its bytes, written at `dest` when sent
    // A piece that is the whole message (told as whole(), acknowledged as held()).
    bool whole_piece() const { return offset == 0 && bytes.size() == size; }
    // Receive side, split delivery: located, payload not landed yet.
    bool located = false;
    uint8_t *dest = nullptr;
};

// Receiver -> sender. kHeld: seq held; kLanded: `len` bytes of seq (generation gen) counted
// by the receiver from this lane's frames, as the TCP fabric's receiver reports them.
struct Back {
    enum Kind { kAck, kFailoverRequest, kCts, kGoodbye, kHeld, kLanded } kind = kAck;
    uint64_t seq = 0;
    uint32_t gen = 0;
    uint32_t slot = 0;
    vn::CtsGroup cts;
    uint64_t len = 0;
    uint64_t late = 0; // kLanded: SendSink::landed's late_ns
};

struct Located {
    uint32_t gen;
    uint64_t seq;
    uint64_t offset;
    int entry;
    vn::Placement::Kind kind;
    int error;
};

struct Write {
    uint32_t gen;
    uint64_t seq;
    uint64_t offset;
    uint64_t len;
};

struct Begin {
    uint64_t first_seq;
    uint32_t gen;
    int abandoned;
    uint64_t abandoned_id;
    uint64_t at_ns;
};

// Path ids of the fake: one per lane, never 0.
inline uint64_t next_lane_id()
{
    static uint64_t n = 0;
    return ++n;
}

// One path of a connection. Owned by the test (Net keeps its lanes in a deque: stable
// addresses, and a rebuilt path gets a fresh lane); the knobs are plain fields.
struct Lane {
    uint64_t id = next_lane_id(); // both halves' PathIdentity::id
    // -- sender half
    uint32_t gen = 1;          // generation stamped on written frames (begin() sets it)
    uint64_t expect_seq = 0;   // post() must be dense from here
    int non_dense_posts = 0;
    std::vector<Begin> begins;
    SeqGens posted;            // (seq, gen)
    std::vector<vn::OutMessage> messages; // every post() as given
    bool stripes = false;      // SendPath::stripes(): takes pieces (written as given, not dense)
    uint64_t chunk = 0;        // > 0: frames of at most this many bytes
    // Custom cut: frames of message m and the stream each goes to (default: `chunk`, all on
    // stream 0).
    std::function<void(const vn::OutMessage &m, Lane &l)> split;
    int probes = 0;
    int send_goodbyes = 0;
    int send_error = 0;         // injected: the send half's progress() reports it
    bool send_error_fatal = false;
    int send_sabotaged = 0;
    bool stuck = false;         // written frames wait in `outbox`: the path is not idle()
    std::deque<std::pair<size_t, Frame>> outbox; // (stream, frame) posted, not yet written
    std::vector<vn::CtsGroup> cts_delivered; // groups the send half handed to the core
    int cts_refused = 0;                      // ... that the core refused
    // -- the link
    bool broken = false;    // both halves report -ECONNRESET from progress()
    bool peer_eof = false;  // ... as an end without a goodbye (the peer's process died)
    bool drop_data = false; // frames written are lost (dead link, no error anywhere)
    bool drop_back = false; // everything of the back channel is lost
    uint64_t landed_late_ns = 0; // landed reports say their news is this late (ReturnDelay)
    bool hold_acks = false; // acks, landed reports and heartbeats wait in `held_acks` (CTS and
                            // the rest pass)
    std::deque<Back> held_acks;
    bool hold = false;      // written frames wait on the streams until released
    std::vector<std::deque<Frame>> streams{1};
    std::vector<bool> paused{false}; // a paused stream delivers nothing
    std::deque<Back> back;
    // -- receiver half
    // -- RDMA mode (see the top of this file)
    bool rdma = false;
    bool short_records = false;   // records as short immediates (RecvSink::whole_short)
    std::deque<uint64_t> rc_acks; // records acknowledged, not yet reported to the sender
    struct RcPiece {
        uint64_t seq = 0, len = 0;
        uint32_t gen = 0;
        bool whole = false;
    };
    std::deque<RcPiece> rc_pieces; // striping: pieces on the wire, not yet reported landed
    int pieces_told = 0;           // RecvSink::piece / piece_last calls
    bool fenced = false;          // the receive half was fenced: writes no longer land
    int lose_records = 0;         // the next N messages vanish on the wire (nothing lands)
    int drains = 0;
    int wholes = 0;               // records reported whole (any outcome)
    // -- receiver half
    int recv_error = 0;     // injected
    bool recv_error_fatal = false;
    int recv_sabotaged = 0;
    int fences = 0;
    size_t frames_per_progress = SIZE_MAX;
    std::mt19937_64 *rng = nullptr; // when set: random stream order, 0..4 frames per progress
    bool split_payload = false; // a placed frame's payload lands on the next progress()
    bool goodbye_seen = false;  // the sender's goodbye arrived
    bool recv_goodbye_sent = false;
    uint64_t last_ack = 0;
    uint32_t last_ack_gen = 0;
    std::vector<Located> locates;
    std::vector<Write> writes;
    uint64_t bytes_written = 0;
    SeqGens acks; // (ack_seq, gen) the receiver sent
    int ack_regressions = 0;
    std::vector<uint32_t> failover_requests;
    std::vector<vn::CtsGroup> advertised; // every advertise() call
    std::vector<Begin> notices;           // generation notices the receive half delivered
    std::vector<vn::Holding> holdings;    // ... and what the receiver answered to each
    int heartbeats = 0;
    // Calls into this receive half while a receive half's progress(), drain() or fence() was
    // on this thread's stack: the core must apply what a sink queues afterwards (fabric.h,
    // RecvSink). ~FakeRecvPath checks there were none.
    int reentries = 0;

    // (first_seq, gen) of every begin(), for compact checks.
    SeqGens begun() const
    {
        SeqGens v;
        for (const Begin &b : begins) v.emplace_back(b.first_seq, b.gen);
        return v;
    }
    void set_streams(size_t n)
    {
        streams.resize(n);
        paused.resize(n, false);
    }
    // A dead link that reports nothing: everything queued is lost, nothing gets through.
    void silence()
    {
        drop_data = drop_back = true;
        for (auto &s : streams) s.clear();
        back.clear();
        outbox.clear();
    }
    // A broken link: both ends see an error from progress().
    void break_link()
    {
        broken = true;
        for (auto &s : streams) s.clear();
        back.clear();
        outbox.clear();
    }
    void reply(Back b)
    {
        if (broken || drop_back) return;
        if (hold_acks && (b.kind == Back::kAck || b.kind == Back::kLanded)) held_acks.push_back(std::move(b));
        else back.push_back(std::move(b));
    }
    // The receiver's heartbeat on this lane: an ack of what it has.
    void heartbeat()
    {
        ++heartbeats;
        reply({Back::kAck, last_ack, last_ack_gen, 0, {}});
    }
    // Lets the held acks through.
    void release_acks()
    {
        hold_acks = false;
        while (!held_acks.empty()) {
            back.push_back(std::move(held_acks.front()));
            held_acks.pop_front();
        }
    }
    // Puts a frame on the wire as the sender would (for protocol tests).
    void push(size_t stream, Frame f) { streams.at(stream).push_back(std::move(f)); }
    // Frames other than probes on the link (a probe goes out whenever the path was quiet for
    // the probe interval, which a loaded machine makes happen at any time).
    bool in_flight() const
    {
        auto data = [](const auto &fs) {
            return std::any_of(fs.begin(), fs.end(), [](const auto &f) { return f.kind != Frame::kProbe; });
        };
        return std::any_of(streams.begin(), streams.end(), data) ||
               std::any_of(outbox.begin(), outbox.end(), [](const auto &e) { return e.second.kind != Frame::kProbe; });
    }
    // Frames located with `kind` (of generation `g`; 0: any; of message `seq`; ~0: any).
    size_t count(vn::Placement::Kind kind, uint32_t g = 0, uint64_t seq = ~0ull) const
    {
        return static_cast<size_t>(std::count_if(locates.begin(), locates.end(), [&](const Located &l) {
            return l.kind == kind && (g == 0 || l.gen == g) && (seq == ~0ull || l.seq == seq);
        }));
    }
};

// A data frame as a sender of generation `gen` would write it, filled with `fill`.
inline Frame data_frame(uint64_t seq, int32_t tag, uint64_t size, uint64_t offset, uint64_t len,
                        uint8_t fill, int entry = 0, uint32_t gen = 1)
{
    Frame f;
    f.gen = gen;
    f.seq = seq;
    f.tag = tag;
    f.entry = entry;
    f.size = size;
    f.offset = offset;
    f.bytes.assign(len, fill);
    return f;
}

// The chunk [offset, offset + len) of message `m`, in generation `gen`.
inline Frame chunk_of(const vn::OutMessage &m, uint64_t offset, uint64_t len, uint32_t gen)
{
    Frame f;
    f.gen = gen;
    f.seq = m.seq;
    f.tag = m.tag;
    f.entry = m.entry;
    f.size = m.size;
    f.offset = offset;
    if (len > 0) f.bytes.assign(m.data + offset, m.data + offset + len);
    return f;
}

// ---- The halves --------------------------------------------------------------------------

// The identity both halves of a lane's path report (device `dev`, "fake<dev>").
inline vn::PathIdentity fake_identity(const Lane &l, int slot, int dev, const char *local, const char *peer)
{
    vn::PathIdentity id;
    id.id = l.id;
    id.slot = slot;
    id.dev = dev;
    id.dev_name = "fake" + std::to_string(dev);
    id.local = std::string(local) + std::to_string(dev);
    id.peer = std::string(peer) + std::to_string(dev);
    return id;
}

class FakeSendPath final : public vn::SendPath
{
public:
    FakeSendPath(Lane &l, int slot, int dev) : l_(l), id_(fake_identity(l, slot, dev, "send", "recv")) {}
    const vn::PathIdentity &identity() const override { return id_; }
    void begin(uint64_t first_seq, uint32_t gen, int abandoned, uint64_t abandoned_id) override
    {
        l_.begins.push_back({first_seq, gen, abandoned, abandoned_id, vigil::now_ns()});
        l_.expect_seq = first_seq;
        l_.gen = gen;
        Frame f;
        f.kind = Frame::kGeneration;
        f.gen = gen;
        f.seq = first_seq;
        f.entry = abandoned;
        f.path = abandoned_id;
        write(0, std::move(f));
    }
    bool stripes() const override { return l_.stripes; }
    // What waits in the outbox is not yet on the wire (a stuck lane's queue grows).
    bool can_post(uint64_t limit) const override
    {
        uint64_t n = 0;
        for (const auto &e : l_.outbox) n += e.second.bytes.size();
        return n < limit;
    }
    void post(const vn::OutMessage &m) override
    {
        if (l_.stripes && l_.rdma) { // a piece, one frame: lands when it leaves the outbox
            l_.posted.emplace_back(m.seq, l_.gen);
            l_.messages.push_back(m);
            if (l_.fenced) return;
            Frame f = chunk_of(m, m.offset, m.length, l_.gen);
            f.piece = true;
            f.dest = reinterpret_cast<uint8_t *>(m.dest.addr);
            write(0, std::move(f));
            return;
        }
        if (l_.stripes) { // a piece: [offset, offset + length), in frames of `chunk`
            l_.posted.emplace_back(m.seq, l_.gen);
            l_.messages.push_back(m);
            const uint64_t chunk = l_.chunk == 0 ? std::max<uint64_t>(m.length, 1) : l_.chunk;
            uint64_t off = 0;
            do {
                write(0, chunk_of(m, m.offset + off, std::min(chunk, m.length - off), l_.gen));
                off += chunk;
            } while (off < m.length);
            return;
        }
        // Dense, except that a replay over RDMA skips messages already seen held.
        if (m.seq != l_.expect_seq && !(l_.rdma && m.seq > l_.expect_seq)) ++l_.non_dense_posts;
        l_.expect_seq = m.seq + 1;
        l_.posted.emplace_back(m.seq, l_.gen);
        l_.messages.push_back(m);
        if (l_.rdma) {
            if (l_.broken || l_.drop_data || l_.fenced) return; // the write never lands
            if (l_.lose_records > 0) {
                --l_.lose_records;
                return;
            }
            if (m.size > 0) std::memcpy(reinterpret_cast<uint8_t *>(m.dest.addr), m.data, m.size);
            write(0, chunk_of(m, 0, 0, l_.gen)); // the record: no bytes, the whole size
            l_.rc_acks.push_back(m.seq);
            return;
        }
        if (l_.split) {
            l_.split(m, l_); // the test's cut: FakeSendPath::write_to() per frame
            return;
        }
        const uint64_t chunk = l_.chunk == 0 ? std::max<uint64_t>(m.size, 1) : l_.chunk;
        uint64_t off = 0;
        do {
            write(0, chunk_of(m, off, std::min(chunk, m.size - off), l_.gen));
            off += chunk;
        } while (off < m.size);
    }
    bool idle() const override { return l_.outbox.empty(); }
    void probe() override
    {
        ++l_.probes;
        Frame f;
        f.kind = Frame::kProbe;
        f.gen = l_.gen;
        write(0, std::move(f));
    }
    void goodbye() override
    {
        ++l_.send_goodbyes;
        Frame f;
        f.kind = Frame::kGoodbye;
        write(0, std::move(f));
    }
    void sabotage() override
    {
        ++l_.send_sabotaged;
        l_.break_link();
    }
    vn::PathStatus progress(vn::SendSink &sink) override
    {
        vn::PathStatus st;
        if (l_.broken)
            return vn::PathStatus{.error = -ECONNRESET, .peer_eof = l_.peer_eof, .detail = "fake link broken"};
        if (l_.send_error != 0)
            return vn::PathStatus{.error = l_.send_error, .fatal = l_.send_error_fatal, .detail = "injected"};
        if (!l_.stuck)
            while (!l_.outbox.empty()) {
                sent(l_, l_.outbox.front().second);
                l_.streams.at(l_.outbox.front().first).push_back(std::move(l_.outbox.front().second));
                l_.outbox.pop_front();
            }
        while (!l_.back.empty()) {
            Back b = std::move(l_.back.front());
            l_.back.pop_front();
            st.heard = true;
            switch (b.kind) {
            case Back::kAck:
                sink.acked(b.seq);
                break;
            case Back::kFailoverRequest:
                st.failover_requested = true;
                st.failed_slot = b.slot;
                break;
            case Back::kCts:
                l_.cts_delivered.push_back(b.cts);
                if (sink.cts(b.cts) != 0) {
                    ++l_.cts_refused;
                    return vn::PathStatus{.error = -EPROTO, .fatal = true, .detail = "CTS refused"};
                }
                break;
            case Back::kGoodbye:
                st.peer_closed = true;
                return st;
            case Back::kHeld:
                sink.held(b.seq);
                break;
            case Back::kLanded:
                sink.landed(b.seq, b.len, b.gen, b.late);
                break;
            }
        }
        while (!l_.rc_acks.empty() && !l_.hold_acks) {
            st.heard = true;
            sink.held(l_.rc_acks.front());
            l_.rc_acks.pop_front();
        }
        while (!l_.rc_pieces.empty() && !l_.hold_acks) {
            st.heard = true;
            const Lane::RcPiece p = l_.rc_pieces.front();
            l_.rc_pieces.pop_front();
            if (p.whole)
                sink.held(p.seq);
            else
                sink.landed(p.seq, p.len, p.gen, 0);
        }
        return st;
    }
    int fd(size_t) const override { return -1; }
    size_t nfds() const override { return 0; }

    // Where a written frame goes: the stream, or the outbox while the lane is stuck (and
    // until the outbox has drained, so frames stay in order).
    static void write_to(Lane &l, size_t stream, Frame f)
    {
        if (l.broken || l.drop_data) return;
        if (l.stuck || !l.outbox.empty()) {
            l.outbox.emplace_back(stream, std::move(f));
        } else {
            sent(l, f);
            l.streams.at(stream).push_back(std::move(f));
        }
    }
    // A striped RDMA piece left the sender: its write lands now (unless the receive half was
    // fenced) and the sender hears the RC ACK on its next progress().
    static void sent(Lane &l, const Frame &f)
    {
        if (!f.piece || l.fenced) return;
        if (!f.bytes.empty()) {
            std::memcpy(f.dest + f.offset, f.bytes.data(), f.bytes.size());
            l.bytes_written += f.bytes.size();
            l.writes.push_back({f.gen, f.seq, f.offset, f.bytes.size()});
        }
        l.rc_pieces.push_back({f.seq, f.bytes.size(), f.gen, f.whole_piece()});
    }

private:
    void write(size_t stream, Frame f) { write_to(l_, stream, std::move(f)); }

    Lane &l_;
    vn::PathIdentity id_;
};

// Receive-half calls of this thread in progress (progress(), drain(), fence()), across lanes.
inline thread_local int t_recv_calls_on_stack = 0;

// Counts a call into `l`'s receive half made while another receive call is on the stack;
// `nests`: this call is one of those (progress(), drain(), fence()).
class OnStack
{
public:
    OnStack(Lane &l, bool nests) : nests_(nests)
    {
        if (t_recv_calls_on_stack > 0) ++l.reentries;
        if (nests_) ++t_recv_calls_on_stack;
    }
    ~OnStack()
    {
        if (nests_) --t_recv_calls_on_stack;
    }
    OnStack(const OnStack &) = delete;
    OnStack &operator=(const OnStack &) = delete;

private:
    bool nests_;
};

class FakeRecvPath final : public vn::RecvPath
{
public:
    FakeRecvPath(Lane &l, int slot, int dev) : l_(l), id_(fake_identity(l, slot, dev, "recv", "send")) {}
    ~FakeRecvPath() override
    {
        INFO("receive half " << id_.describe());
        CHECK(l_.reentries == 0);
    }
    const vn::PathIdentity &identity() const override { return id_; }

    // Delivers frames through the sink like a stream-based path: streams in order (or random
    // with `rng`), each head frame until a stream is empty, paused or the budget is spent.
    vn::PathStatus progress(vn::RecvSink &sink) override
    {
        const OnStack on_stack(l_, true);
        using vn::Placement;
        if (l_.broken)
            return vn::PathStatus{.error = -ECONNRESET, .peer_eof = l_.peer_eof, .detail = "fake link broken"};
        if (l_.recv_error != 0)
            return vn::PathStatus{.error = l_.recv_error, .fatal = l_.recv_error_fatal, .detail = "injected"};
        vn::PathStatus st;
        size_t budget = l_.rng != nullptr ? (*l_.rng)() % 5 : l_.frames_per_progress;
        std::vector<size_t> order(l_.streams.size());
        std::iota(order.begin(), order.end(), size_t{0});
        for (bool moved = true; moved && budget > 0 && !l_.hold;) {
            moved = false;
            if (l_.rng != nullptr) std::shuffle(order.begin(), order.end(), *l_.rng);
            for (size_t i : order) {
                if (budget == 0 || l_.paused[i] || l_.streams[i].empty()) continue;
                Frame &f = l_.streams[i].front();
                st.heard = true;
                if (f.kind != Frame::kData) {
                    if (f.kind == Frame::kGeneration) {
                        l_.notices.push_back({f.seq, f.gen, f.entry, f.path, vigil::now_ns()});
                        sink.generation(f.gen, f.seq, f.entry, f.path);
                        if (l_.rdma) {
                            // A verbs sender writes nothing of the new generation before the
                            // answer, which the core gives once this call returned.
                            l_.streams[i].pop_front();
                            return st;
                        }
                    } else if (f.kind == Frame::kGoodbye) {
                        l_.goodbye_seen = true;
                    }
                    l_.streams[i].pop_front();
                    moved = true;
                    continue;
                }
                if (l_.rdma) {
                    const int rc = whole(sink, f);
                    l_.streams[i].pop_front();
                    moved = true;
                    --budget;
                    if (rc != 0) return vn::PathStatus{.error = rc, .fatal = true, .detail = "record refused"};
                    continue;
                }
                if (!f.located) {
                    const Placement p = sink.locate(f.gen, f.seq, f.tag, f.size, f.entry);
                    l_.locates.push_back({f.gen, f.seq, f.offset, f.entry, p.kind, p.error});
                    if (p.kind == Placement::kError)
                        return vn::PathStatus{.error = p.error, .fatal = true, .detail = "frame refused"};
                    if (p.kind == Placement::kDiscard) {
                        l_.streams[i].pop_front();
                        --budget;
                        moved = true;
                        continue;
                    }
                    f.located = true;
                    f.dest = p.dest;
                    if (l_.split_payload) {
                        --budget;
                        continue; // the payload comes with the next call
                    }
                }
                // The path contract: ask before writing payload bytes (a newer generation or a
                // completed message turns the rest of the frame into a discard).
                if (!f.bytes.empty() && sink.still_wanted(f.gen, f.seq)) {
                    std::memcpy(f.dest + f.offset, f.bytes.data(), f.bytes.size());
                    l_.bytes_written += f.bytes.size();
                    l_.writes.push_back({f.gen, f.seq, f.offset, f.bytes.size()});
                }
                const uint64_t seq = f.seq, len = f.bytes.size();
                const uint32_t gen = f.gen;
                l_.streams[i].pop_front();
                moved = true;
                --budget;
                const int rc = sink.landed(seq, len, gen);
                if (rc < 0) return vn::PathStatus{.error = rc, .fatal = true, .detail = "landed refused"};
                if (rc > 0 && len > 0) {
                    Back b;
                    b.kind = Back::kLanded;
                    b.seq = seq;
                    b.gen = gen;
                    b.len = len;
                    b.late = l_.landed_late_ns;
                    l_.reply(std::move(b));
                }
            }
        }
        const bool drained = std::all_of(l_.streams.begin(), l_.streams.end(), [](const auto &s) { return s.empty(); });
        st.peer_closed = l_.goodbye_seen && drained;
        return st;
    }
    void advertise(const vn::CtsGroup &g) override
    {
        const OnStack on_stack(l_, false);
        l_.advertised.push_back(g);
        Back b;
        b.kind = Back::kCts;
        b.cts = g;
        l_.reply(std::move(b));
    }
    void ack(uint64_t ack_seq, uint32_t gen) override
    {
        const OnStack on_stack(l_, false);
        if (!l_.acks.empty() && ack_seq <= l_.acks.back().first) ++l_.ack_regressions;
        l_.acks.emplace_back(ack_seq, gen);
        l_.last_ack = ack_seq;
        l_.last_ack_gen = gen;
        l_.reply({Back::kAck, ack_seq, gen, 0, {}});
    }
    void answer(uint32_t /*gen*/, const vn::Holding &h) override
    {
        const OnStack on_stack(l_, false);
        l_.holdings.push_back(h);
    }
    void request_failover(uint32_t slot) override
    {
        const OnStack on_stack(l_, false);
        l_.failover_requests.push_back(slot);
        l_.reply({Back::kFailoverRequest, 0, 0, slot, {}});
    }
    void heartbeat() override
    {
        const OnStack on_stack(l_, false);
        l_.heartbeat();
    }
    void goodbye() override
    {
        const OnStack on_stack(l_, false);
        l_.recv_goodbye_sent = true;
        l_.reply({Back::kGoodbye, 0, 0, 0, {}});
    }
    // RDMA mode: every record waiting on the streams (control frames stay, in order).
    void drain(vn::RecvSink &sink) override
    {
        const OnStack on_stack(l_, true);
        ++l_.drains;
        drain_records(sink);
    }
    void drain_records(vn::RecvSink &sink)
    {
        if (!l_.rdma) return;
        for (auto &stream : l_.streams)
            for (auto it = stream.begin(); it != stream.end();) {
                if (it->kind != Frame::kData) {
                    ++it;
                    continue;
                }
                (void)whole(sink, *it);
                it = stream.erase(it);
            }
    }
    void fence(vn::RecvSink &sink) override
    {
        const OnStack on_stack(l_, true);
        ++l_.fences;
        ++l_.drains;
        drain_records(sink);
        if (l_.rdma) {
            l_.fenced = true;
            for (auto &stream : l_.streams) stream.clear();
        }
    }
    void sabotage() override
    {
        ++l_.recv_sabotaged;
        l_.break_link();
    }
    int fd(size_t) const override { return -1; }
    size_t nfds() const override { return 0; }

private:
    // RDMA mode: the record of `f` polled; the lane's record kind decides how it is told.
    int whole(vn::RecvSink &sink, const Frame &f)
    {
        constexpr int kBits = 11; // few, so that tests cross the wrap
        if (f.piece && !f.whole_piece()) {
            ++l_.pieces_told;
            if (f.offset + f.bytes.size() == f.size)
                return sink.piece_last(f.gen, f.seq, f.tag, f.size, f.entry, f.bytes.size());
            return sink.piece(f.gen, f.seq & ((uint64_t{1} << kBits) - 1), kBits, f.bytes.size(),
                              f.entry);
        }
        ++l_.wholes;
        if (l_.short_records)
            return sink.whole_short(f.gen, f.seq & ((uint64_t{1} << kBits) - 1), kBits, f.size, f.entry);
        return sink.whole(f.gen, f.seq, f.tag, f.size, f.entry);
    }
    Lane &l_;
    vn::PathIdentity id_;
};

// ---- Rebuilt paths: the fake rebuilder and acceptor ----------------------------------------

// What the fake rebuilder and acceptor share with the test: the rebuild knobs and a log of
// every rebuild attempt, and the receiving ends of rebuilt paths on their way to the RecvComm.
struct Rebuilds {
    // -- rebuilder knobs, per slot
    std::array<bool, vn::kMaxPaths> rebuildable{{true, true}}; // can_rebuild()
    std::array<bool, vn::kMaxPaths> refuse{{true, true}};      // "the port is down"
    std::array<int, vn::kMaxPaths> connecting{{0, 0}}; // calls answering "in progress" first
    bool rdma = false; // rebuilt lanes are in RDMA mode
    bool short_records = false; // ... with short records
    // -- rebuilder log, per slot
    std::array<std::vector<uint64_t>, vn::kMaxPaths> attempts; // now_ns() of each progress()
    std::array<std::vector<uint64_t>, vn::kMaxPaths> refused;  // ... of each refused one
    std::array<std::vector<size_t>, vn::kMaxPaths> rebuilt;    // lane of each path handed out
    std::array<std::vector<uint64_t>, vn::kMaxPaths> rebuilt_ns;
    // -- acceptor: receive halves of rebuilt paths, in the order the sender rebuilt them
    std::deque<std::unique_ptr<vn::RecvPath>> handover;
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
        l.rdma = r_.rdma;
        l.short_records = r_.short_records;
        const int dev = 10 + slot;
        *out = std::make_unique<FakeSendPath>(l, slot, dev);
        r_.handover.push_back(std::make_unique<FakeRecvPath>(l, slot, dev));
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
    int poll(std::unique_ptr<vn::RecvPath> *out) override
    {
        ++r_.polls;
        if (r_.handover.empty()) return 0;
        *out = std::move(r_.handover.front());
        r_.handover.pop_front();
        r_.accepted.push_back((*out)->identity().slot);
        return 0;
    }

private:
    Rebuilds &r_;
};

// ---- A connection ----------------------------------------------------------------------------

// Both comms of one connection over two lanes (or one, without a backup); the device of
// slot i is 10 + i. With `rebuild`, the comms get the fake rebuilder and acceptor (otherwise
// dead paths stay dead).
struct Net {
    std::deque<Lane> lane; // [0] primary, [1] backup, then one per rebuilt path
    Rebuilds fab;          // the rebuild knobs and log
    // (lanes and knobs before the comms: destroyed after them)
    std::unique_ptr<vn::SendComm> send;
    std::unique_ptr<vn::RecvComm> recv;

    explicit Net(const vn::FailoverConfig &cfg, bool with_backup = true, bool rebuild = false,
                 const vn::TelemetryConfig &tcfg = {})
    {
        lane.resize(vn::kMaxPaths);
        vn::SendPaths sp;
        vn::RecvPaths rp;
        std::array<int, vn::kMaxPaths> devs{{-1, -1}};
        for (size_t i = 0; i < (with_backup ? vn::kMaxPaths : 1); ++i) {
            const int slot = static_cast<int>(i);
            devs[i] = 10 + slot;
            sp.paths[i] = std::make_unique<FakeSendPath>(lane[i], slot, devs[i]);
            rp.paths[i] = std::make_unique<FakeRecvPath>(lane[i], slot, devs[i]);
        }
        rp.devs = devs;
        if (rebuild) {
            sp.rebuilder = std::make_unique<FakeRebuilder>(lane, fab);
            rp.acceptor = std::make_unique<FakeAcceptor>(fab);
        }
        send = std::make_unique<vn::SendComm>(std::move(sp), devs, cfg, tcfg);
        recv = std::make_unique<vn::RecvComm>(std::move(rp), devs, cfg, tcfg);
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

} // namespace vigil::test::fake
