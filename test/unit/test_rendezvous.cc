// SPDX-License-Identifier: Apache-2.0
// The rendezvous core (net_plugin/rendezvous.h) over a scripted fabric: how the listener groups
// set-up sockets into paths and paths into one accept(), what it refuses and how often it
// says so, what it hands out for a rebuild, and how the connector and rebuilder treat their
// dials. The fabrics' own halves are tested with real sockets (test/functional's handshake
// test for TCP, the RDMA lab for verbs).
#include <catch2/catch.hpp>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "clock.h"
#include "log.h"
#include "rendezvous.h"

namespace {

namespace vn = vigil::net;
namespace rdv = vigil::net::rendezvous;

std::vector<std::pair<ncclDebugLogLevel, std::string>> g_lines;

void capture(ncclDebugLogLevel level, unsigned long, const char *, int, const char *fmt, ...)
{
    char buf[1200];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    g_lines.emplace_back(level, buf);
}

struct Capture {
    Capture()
    {
        g_lines.clear();
        vigil::log::set_logger(&capture);
    }
    ~Capture() { vigil::log::set_logger(nullptr); }
    // Lines at `level` that contain `what`.
    static int count(ncclDebugLogLevel level, const std::string &what)
    {
        int n = 0;
        for (const auto &[l, s] : g_lines) n += l == level && s.find(what) != std::string::npos;
        return n;
    }
};

// A path end that only carries its identity (the rendezvous never moves data).
class StubRecvPath final : public vn::RecvPath
{
public:
    explicit StubRecvPath(vn::PathIdentity id) : id_(std::move(id)) {}
    const vn::PathIdentity &identity() const override { return id_; }
    vn::PathStatus progress(vn::RecvSink &) override { return {}; }
    void advertise(const vn::CtsGroup &) override {}
    void ack(uint64_t, uint32_t) override {}
    void request_failover(uint32_t) override {}
    void heartbeat() override {}
    void goodbye() override {}
    void fence(vn::RecvSink &) override {}
    void sabotage() override {}
    int fd(size_t) const override { return -1; }
    size_t nfds() const override { return 0; }

private:
    vn::PathIdentity id_;
};

class StubSendPath final : public vn::SendPath
{
public:
    explicit StubSendPath(vn::PathIdentity id) : id_(std::move(id)) {}
    const vn::PathIdentity &identity() const override { return id_; }
    void begin(uint64_t, uint32_t, int, uint64_t) override {}
    void post(const vn::OutMessage &) override {}
    bool idle() const override { return true; }
    void probe() override {}
    void goodbye() override {}
    void sabotage() override {}
    vn::PathStatus progress(vn::SendSink &) override { return {}; }
    int fd(size_t) const override { return -1; }
    size_t nfds() const override { return 0; }

private:
    vn::PathIdentity id_;
};

// A set-up socket whose hello is `intro`: judged on its first step, done on its `steps`-th.
class ScriptedArrival final : public rdv::Arrival
{
public:
    ScriptedArrival(int dev, const rdv::Intro &intro, int steps)
        : Arrival(dev, vn::Endpoint{}), intro_(intro), left_(steps)
    {
    }
    int step(uint64_t, const Check &check, std::string *why) override
    {
        if (!judged_) {
            judged_ = true;
            if (const char *no = check(intro_)) return *why = no, -EACCES;
        }
        done_ = --left_ <= 0;
        return 0;
    }
    bool done() const override { return done_; }
    const rdv::Intro &intro() const override { return intro_; }

private:
    rdv::Intro intro_;
    int left_;
    bool judged_ = false;
    bool done_ = false;
};

// Two loopback "devices"; builds a stub path per complete slot and records the parts' order.
class ScriptedAcceptSide final : public rdv::AcceptSide
{
public:
    std::vector<std::vector<int>> built; // per build: the parts' indices, in the order given
    int handed_out = 0;
    bool quiet = false;
    uint64_t timeout_ns = 5'000'000'000ull;

    rdv::DeviceAddrs devices() const override
    {
        return {2,
                [](int) {
                    vn::Endpoint e;
                    e.family = AF_INET;
                    e.addr = {127, 0, 0, 1};
                    return e;
                },
                [](int d) { return "lo" + std::to_string(d); }};
    }
    uint64_t handshake_timeout_ns() const override { return timeout_ns; }
    const char *part_name() const override { return "stream"; }
    std::unique_ptr<rdv::Arrival> arrive(vn::UniqueFd, int, const vn::Endpoint &, uint64_t) override
    {
        return nullptr; // nothing connects to the listening sockets in these tests
    }
    std::unique_ptr<vn::RecvPath> build(int slot, int dev, std::vector<std::unique_ptr<rdv::Arrival>> parts,
                                        std::string *) override
    {
        std::vector<int> order;
        for (const auto &p : parts) order.push_back(p->intro().part);
        built.push_back(order);
        vn::PathIdentity id;
        id.slot = slot;
        id.dev = dev;
        id.id = parts.front()->intro().path_id;
        return std::make_unique<StubRecvPath>(id);
    }
    void accepted(vn::RecvPaths *) override { ++handed_out; }
    bool quiet_failure(const rdv::Arrival &) const override { return quiet; }
};

struct Listener {
    ScriptedAcceptSide *side = nullptr;
    std::shared_ptr<rdv::Listening> l;
    vn::ListenHandle handle;
    explicit Listener(uint64_t timeout_ns = 5'000'000'000ull)
    {
        auto s = std::make_unique<ScriptedAcceptSide>();
        s->timeout_ns = timeout_ns;
        side = s.get();
        REQUIRE(rdv::Listening::create(std::move(s), 0, &handle, &l) == 0);
    }
    rdv::Intro intro(uint64_t conn, int slot, int part, int nparts, int npaths) const
    {
        rdv::Intro in;
        in.nonce = handle.nonce;
        in.conn_id = conn;
        in.path_id = conn * 10 + static_cast<uint64_t>(slot) + 1;
        in.slot = slot;
        in.part = part;
        in.nparts = nparts;
        in.npaths = npaths;
        return in;
    }
    // A set-up socket: Listening::arrive() steps it once (the hello is judged), and each
    // accept() or take_rebuilt() once more until its `steps` are done.
    void arrive(int dev, const rdv::Intro &in, int steps = 1)
    {
        l->arrive(std::make_unique<ScriptedArrival>(dev, in, steps));
    }
    vn::RecvPaths accept()
    {
        vn::RecvPaths out;
        REQUIRE(l->accept(&out) == 0);
        return out;
    }
};

} // namespace

TEST_CASE("the listener hands out a connection once every part of both its paths is here",
          "[rendezvous]")
{
    Capture cap;
    Listener t;
    // Two streams per path; they arrive out of order, one takes a second step, and the
    // backup's come later.
    t.arrive(0, t.intro(7, vn::kPrimary, 1, 2, 2), 2);
    t.arrive(0, t.intro(7, vn::kPrimary, 0, 2, 2));
    CHECK(t.l->busy());
    CHECK(!t.accept().paths[vn::kPrimary]); // primary complete: the backup has its grace
    t.arrive(1, t.intro(7, vn::kBackup, 0, 2, 2));
    CHECK(!t.accept().paths[vn::kPrimary]);
    t.arrive(1, t.intro(7, vn::kBackup, 1, 2, 2));
    vn::RecvPaths out = t.accept();
    REQUIRE(out.paths[vn::kPrimary]);
    REQUIRE(out.paths[vn::kBackup]);
    CHECK(out.paths[vn::kPrimary]->identity().dev == 0);
    CHECK(out.paths[vn::kBackup]->identity().dev == 1);
    CHECK(out.paths[vn::kBackup]->identity().id == 72);
    CHECK(out.devs == std::array<int, vn::kMaxPaths>{{0, 1}});
    CHECK(out.acceptor != nullptr);
    CHECK(t.side->handed_out == 1);
    // Every path got its parts in stream order.
    CHECK(t.side->built == std::vector<std::vector<int>>{{0, 1}, {0, 1}});
    CHECK(Capture::count(NCCL_LOG_WARN, "") == 0);
    CHECK(!t.accept().paths[vn::kPrimary]); // handed out once
}

TEST_CASE("a slot without a path gets the device its hello named", "[rendezvous]")
{
    Listener t;
    rdv::Intro in = t.intro(9, vn::kPrimary, 0, 1, 1);
    in.other_dev = 1;
    t.arrive(0, in);
    vn::RecvPaths out = t.accept();
    REQUIRE(out.paths[vn::kPrimary]);
    CHECK(!out.paths[vn::kBackup]);
    CHECK(out.devs == std::array<int, vn::kMaxPaths>{{0, 1}});
    // A device the listener does not have is not taken on trust.
    in = t.intro(10, vn::kPrimary, 0, 1, 1);
    in.other_dev = 2;
    t.arrive(0, in);
    out = t.accept();
    REQUIRE(out.paths[vn::kPrimary]);
    CHECK(out.devs == std::array<int, vn::kMaxPaths>{{0, -1}});
}

TEST_CASE("the listener refuses what does not fit, once per impostor connection", "[rendezvous]")
{
    Capture cap;
    Listener t;
    SECTION("a wrong nonce: one WARN per connection, however many set-up sockets it opens")
    {
        for (int part = 0; part < 3; ++part) {
            rdv::Intro in = t.intro(5, vn::kPrimary, part, 3, 1);
            in.nonce[0] ^= 1;
            t.arrive(0, in);
        }
        CHECK(Capture::count(NCCL_LOG_WARN, "rejected connection") == 1);
        CHECK(Capture::count(NCCL_LOG_WARN, "wrong nonce") == 1);
        CHECK(!t.l->busy());
    }
    SECTION("a rebuild for a connection this listener did not produce")
    {
        rdv::Intro in = t.intro(5, vn::kBackup, 0, 1, 2);
        in.rebuild = true;
        t.arrive(1, in);
        CHECK(Capture::count(NCCL_LOG_WARN, "path rebuild for an unknown connection") == 1);
    }
    SECTION("fields out of range, even past a fabric's decode")
    {
        t.arrive(0, t.intro(5, vn::kPrimary, 2, 2, 1));
        t.arrive(0, t.intro(5, 2, 0, 1, 1));
        t.arrive(0, t.intro(5, vn::kPrimary, 0, 1, 3));
        CHECK(Capture::count(NCCL_LOG_WARN, "malformed hello") == 3);
    }
    SECTION("parts that disagree with their connection's first")
    {
        t.arrive(0, t.intro(5, vn::kPrimary, 0, 2, 1));
        t.arrive(0, t.intro(5, vn::kPrimary, 0, 2, 1));   // the same stream again
        t.arrive(0, t.intro(5, vn::kPrimary, 1, 3, 1));   // another stream count
        t.arrive(1, t.intro(5, vn::kPrimary, 1, 2, 1));   // another device
        rdv::Intro other_id = t.intro(5, vn::kPrimary, 1, 2, 1);
        other_id.path_id = 99;
        t.arrive(0, other_id);
        CHECK(Capture::count(NCCL_LOG_WARN, "duplicate stream index") == 1);
        CHECK(Capture::count(NCCL_LOG_WARN, "stream or path count differs") == 1);
        CHECK(Capture::count(NCCL_LOG_WARN, "streams of one path on two devices") == 1);
        CHECK(Capture::count(NCCL_LOG_WARN, "streams of one path disagree on its id") == 1);
        t.arrive(0, t.intro(5, vn::kPrimary, 1, 2, 1)); // the right one still completes it
        CHECK(t.accept().paths[vn::kPrimary] != nullptr);
    }
    SECTION("a failure the fabric expects is INFO")
    {
        t.side->quiet = true;
        rdv::Intro in = t.intro(5, vn::kPrimary, 0, 1, 1);
        in.nonce[3] ^= 1;
        t.arrive(0, in);
        CHECK(Capture::count(NCCL_LOG_WARN, "") == 0);
        CHECK(Capture::count(NCCL_LOG_INFO, "path set-up from") == 1);
    }
}

TEST_CASE("a backup gets its grace, then the connection goes without it; an incomplete "
          "primary is dropped at the deadline",
          "[rendezvous]")
{
    Capture cap;
    Listener t(50 * 1'000'000ull); // a 50 ms handshake timeout
    SECTION("the backup never comes: the primary alone, kBackupGraceNs after it was complete")
    {
        t.arrive(0, t.intro(4, vn::kPrimary, 0, 1, 2));
        // accept() first sees the primary complete just before the handshake deadline: the
        // grace runs from there, past the deadline plus the grace, and the connection must
        // not expire meanwhile.
        std::this_thread::sleep_for(std::chrono::milliseconds(45));
        const uint64_t t0 = vigil::now_ns();
        vn::RecvPaths out;
        while (!out.paths[vn::kPrimary]) {
            REQUIRE(vigil::now_ns() - t0 < 3 * rdv::kBackupGraceNs);
            out = t.accept();
            if (!out.paths[vn::kPrimary]) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        CHECK(vigil::now_ns() - t0 >= rdv::kBackupGraceNs);
        CHECK(!out.paths[vn::kBackup]);
        // Its late backup is not taken, and the group it opens expires.
        t.arrive(1, t.intro(4, vn::kBackup, 0, 1, 2));
        CHECK(!t.accept().paths[vn::kPrimary]);
    }
    SECTION("one of two primary streams: dropped with one WARN once the deadline passed")
    {
        t.arrive(0, t.intro(6, vn::kPrimary, 0, 2, 1));
        CHECK(!t.accept().paths[vn::kPrimary]);
        std::this_thread::sleep_for(std::chrono::milliseconds(80));
        CHECK(!t.accept().paths[vn::kPrimary]);
        CHECK(Capture::count(NCCL_LOG_WARN, "dropped a connection") == 1);
        CHECK(Capture::count(NCCL_LOG_WARN, "1 of 2 primary streams") == 1);
        CHECK(!t.l->busy());
        // Its second stream, late, opens a group of its own that never completes.
        t.arrive(0, t.intro(6, vn::kPrimary, 1, 2, 1));
        CHECK(!t.accept().paths[vn::kPrimary]);
    }
}

TEST_CASE("a rebuilt path waits in the listener for its connection's acceptor", "[rendezvous]")
{
    Listener t;
    t.arrive(0, t.intro(3, vn::kPrimary, 0, 2, 2));
    t.arrive(0, t.intro(3, vn::kPrimary, 1, 2, 2));
    t.arrive(1, t.intro(3, vn::kBackup, 0, 2, 2));
    t.arrive(1, t.intro(3, vn::kBackup, 1, 2, 2));
    vn::RecvPaths conn = t.accept();
    REQUIRE(conn.paths[vn::kPrimary]);
    rdv::Intro in = t.intro(3, vn::kPrimary, 0, 2, 2);
    in.rebuild = true;
    in.path_id = 1234;
    t.arrive(0, in);
    std::unique_ptr<vn::RecvPath> p;
    CHECK(!t.l->take_rebuilt(3, &p)); // one of two streams
    in.part = 1;
    t.arrive(0, in);
    CHECK(!t.l->take_rebuilt(4, &p)); // another connection's
    REQUIRE(t.l->take_rebuilt(3, &p));
    REQUIRE(p);
    CHECK(p->identity().slot == vn::kPrimary);
    CHECK(p->identity().id == 1234);
    CHECK(!t.l->busy());

    // An unfinished rebuild (one of two streams) is replaced by the sender's next attempt:
    // its streams are not refused as duplicates, and the path built is the newer one.
    Capture cap;
    in.part = 0;
    in.path_id = 1300;
    t.arrive(0, in);
    in.path_id = 1301; // the next attempt, from its first stream again
    t.arrive(0, in);
    CHECK(Capture::count(NCCL_LOG_WARN, "duplicate stream index") == 0);
    in.part = 1;
    t.arrive(0, in);
    REQUIRE(t.l->take_rebuilt(3, &p));
    REQUIRE(p);
    CHECK(p->identity().id == 1301);
}

TEST_CASE("listeners share the hub's sockets; a hello reaches the listener its nonce names",
          "[rendezvous]")
{
    Capture cap;
    auto side = std::make_unique<ScriptedAcceptSide>();
    ScriptedAcceptSide *sp = side.get();
    auto hub = std::make_shared<rdv::ListenHub>(std::move(side));
    std::weak_ptr<rdv::ListenHub> weak = hub;
    std::array<vn::ListenHandle, 3> h;
    std::array<std::shared_ptr<rdv::Listening>, 3> l;
    const std::array<int, 3> dev{{0, 1, 0}};
    for (size_t i = 0; i < 3; ++i) REQUIRE(rdv::Listening::create(hub, dev[i], &h[i], &l[i]) == 0);
    // One socket per device, whatever the number of listeners: each handle names both, its
    // own device first, and carries its own nonce.
    CHECK(hub->sockets() == 2);
    REQUIRE(h[0].addrs.size() == 2);
    REQUIRE(h[1].addrs.size() == 2);
    CHECK(h[0].addrs == h[2].addrs);
    CHECK(h[1].addrs[0] == h[0].addrs[1]);
    CHECK(h[1].addrs[1] == h[0].addrs[0]);
    CHECK(h[1].addr_devs == std::vector<uint8_t>{1, 0});
    CHECK(h[0].nonce != h[1].nonce);
    CHECK(h[0].nonce != h[2].nonce);

    auto intro = [&](size_t who, uint64_t conn) {
        rdv::Intro in;
        in.nonce = h[who].nonce;
        in.conn_id = conn;
        in.path_id = conn * 10 + 1;
        return in;
    };
    hub->arrive(std::make_unique<ScriptedArrival>(1, intro(1, 7), 1));
    hub->arrive(std::make_unique<ScriptedArrival>(0, intro(2, 8), 1));
    vn::RecvPaths out;
    REQUIRE(l[0]->accept(&out) == 0);
    CHECK(!out.paths[vn::kPrimary]); // neither was its
    REQUIRE(l[1]->accept(&out) == 0);
    REQUIRE(out.paths[vn::kPrimary]);
    CHECK(out.paths[vn::kPrimary]->identity().id == 71);
    CHECK(out.paths[vn::kPrimary]->identity().dev == 1);
    REQUIRE(l[2]->accept(&out) == 0);
    REQUIRE(out.paths[vn::kPrimary]);
    CHECK(out.paths[vn::kPrimary]->identity().id == 81);
    CHECK(sp->handed_out == 2);
    CHECK(Capture::count(NCCL_LOG_WARN, "") == 0);

    // A closed listener's nonce is nobody's: its hellos are impostors'.
    const rdv::Intro late = intro(0, 9);
    l[0].reset();
    hub->arrive(std::make_unique<ScriptedArrival>(0, late, 1));
    CHECK(Capture::count(NCCL_LOG_WARN, "wrong nonce") == 1);
    CHECK(hub->sockets() == 2);
    // The hub, and its sockets, go with its last listener (and the acceptor of the
    // connection it produced); the next listener opens a new one.
    out = vn::RecvPaths{};
    l[1].reset();
    l[2].reset();
    hub.reset();
    CHECK(weak.expired());
    rdv::HubSlot slot;
    auto a = slot.get([] { return std::make_unique<ScriptedAcceptSide>(); });
    CHECK(slot.get([] { return std::make_unique<ScriptedAcceptSide>(); }) == a);
}

TEST_CASE("a rebuilt path is built at once and wakes its connection's comm", "[rendezvous]")
{
    Capture cap;
    Listener t;
    t.arrive(0, t.intro(3, vn::kPrimary, 0, 1, 2));
    t.arrive(1, t.intro(3, vn::kBackup, 0, 1, 2));
    vn::RecvPaths conn = t.accept();
    REQUIRE(conn.paths[vn::kPrimary]);
    int wakes = 0;
    conn.acceptor->set_wake([&] { ++wakes; });
    std::unique_ptr<vn::RecvPath> p;
    REQUIRE(conn.acceptor->poll(&p) == 0); // the first poll looks: nothing yet
    CHECK(!p);
    rdv::Intro in = t.intro(3, vn::kBackup, 0, 2, 2);
    in.rebuild = true;
    in.path_id = 555;
    t.arrive(1, in);
    CHECK(wakes == 0); // one of its two streams
    CHECK(conn.acceptor->poll(&p) == 0);
    CHECK(!p);
    in.part = 1;
    t.arrive(1, in); // filed by the hub: built, and the comm woken, with nobody polling
    CHECK(wakes == 1);
    CHECK(t.side->built.size() == 3);
    REQUIRE(conn.acceptor->poll(&p) == 0);
    REQUIRE(p);
    CHECK(p->identity().id == 555);
    CHECK(p->identity().slot == vn::kBackup);

    // Once the connection closed, a rebuild for it is refused, and nothing is woken.
    conn.acceptor.reset();
    in.part = 0;
    in.nparts = 1;
    in.path_id = 556;
    t.arrive(1, in);
    CHECK(wakes == 1);
    CHECK(Capture::count(NCCL_LOG_WARN, "path rebuild for an unknown connection") == 1);
    CHECK(!t.l->busy());
}

namespace {

// A dial that finishes after `steps` steps, or fails with `fail` then.
struct DialScript {
    int steps = 1;
    int fail = 0;
};

class ScriptedDial final : public rdv::Dial
{
public:
    ScriptedDial(const rdv::Intro &in, DialScript s) : in_(in), s_(s) {}
    int step(uint64_t, std::string *why) override
    {
        if (--s_.steps > 0) return 0;
        if (s_.fail != 0) return *why = "scripted", s_.fail;
        done_ = true;
        return 0;
    }
    bool done() const override { return done_; }
    std::unique_ptr<vn::SendPath> build() override
    {
        vn::PathIdentity id;
        id.slot = in_.slot;
        id.id = in_.path_id;
        return std::make_unique<StubSendPath>(id);
    }
    std::string local_name() const override { return "lo" + std::to_string(in_.slot); }
    const vn::Endpoint &remote() const override { return remote_; }

private:
    rdv::Intro in_;
    DialScript s_;
    vn::Endpoint remote_;
    bool done_ = false;
};

class ScriptedConnectSide final : public rdv::ConnectSide
{
public:
    std::array<bool, vn::kMaxPaths> planned{{true, true}};
    std::map<int, DialScript> script; // per slot, for the next dial
    int refuse = 0;                   // dial() fails with this while non-zero
    std::vector<rdv::Intro> dialed;

    bool plans(int slot) const override { return planned[static_cast<size_t>(slot)]; }
    int dial(const rdv::Intro &in, uint64_t, std::unique_ptr<rdv::Dial> *out) override
    {
        if (refuse != 0) return refuse;
        dialed.push_back(in);
        *out = std::make_unique<ScriptedDial>(in, script[in.slot]);
        return 0;
    }
};

} // namespace

TEST_CASE("the connector needs its primary; a backup that fails costs only the standby",
          "[rendezvous]")
{
    Capture cap;
    auto side = std::make_shared<ScriptedConnectSide>();
    const std::array<uint8_t, 16> nonce{{1, 2, 3}};
    SECTION("both up")
    {
        side->script[vn::kBackup] = {3, 0};
        rdv::Connecting c(side, nonce);
        vn::SendPaths out;
        REQUIRE(c.progress(&out) == 0);
        CHECK(!out.paths[vn::kPrimary]); // waits for the backup's dial
        REQUIRE(c.progress(&out) == 0);
        REQUIRE(c.progress(&out) == 0);
        REQUIRE(out.paths[vn::kPrimary]);
        REQUIRE(out.paths[vn::kBackup]);
        CHECK(out.rebuilder != nullptr);
        REQUIRE(side->dialed.size() == 2);
        const rdv::Intro &p = side->dialed[0], &b = side->dialed[1];
        CHECK(p.conn_id == b.conn_id);
        CHECK(p.conn_id != 0);
        CHECK(p.path_id != b.path_id);
        CHECK((p.npaths == 2 && b.npaths == 2 && !p.rebuild && p.nonce == nonce));
    }
    SECTION("the backup fails")
    {
        side->script[vn::kBackup] = {1, -ECONNREFUSED};
        rdv::Connecting c(side, nonce);
        vn::SendPaths out;
        REQUIRE(c.progress(&out) == 0);
        REQUIRE(out.paths[vn::kPrimary]);
        CHECK(!out.paths[vn::kBackup]);
        CHECK(Capture::count(NCCL_LOG_WARN, "backup path from dev lo1") == 1);
    }
    SECTION("the primary fails")
    {
        side->script[vn::kPrimary] = {1, -ETIMEDOUT};
        rdv::Connecting c(side, nonce);
        vn::SendPaths out;
        CHECK(c.progress(&out) == -ETIMEDOUT);
        CHECK(Capture::count(NCCL_LOG_WARN, "connect from dev lo0") == 1);
    }
}

TEST_CASE("the rebuilder dials one slot again, as a rebuild of the same connection", "[rendezvous]")
{
    auto side = std::make_shared<ScriptedConnectSide>();
    side->planned[vn::kBackup] = false;
    rdv::Connecting c(side, {});
    vn::SendPaths conn;
    REQUIRE(c.progress(&conn) == 0);
    REQUIRE(conn.rebuilder);
    vn::PathRebuilder &r = *conn.rebuilder;
    CHECK(r.can_rebuild(vn::kPrimary));
    CHECK(!r.can_rebuild(vn::kBackup));
    std::unique_ptr<vn::SendPath> p;
    CHECK(r.progress(vn::kBackup, &p) == -EINVAL);
    side->refuse = -ENETDOWN; // the local port is down: no attempt starts
    CHECK(r.progress(vn::kPrimary, &p) == -ENETDOWN);
    side->refuse = 0;
    side->script[vn::kPrimary] = {2, 0};
    REQUIRE(r.progress(vn::kPrimary, &p) == 0);
    CHECK(!p);
    REQUIRE(r.progress(vn::kPrimary, &p) == 0);
    REQUIRE(p);
    REQUIRE(side->dialed.size() == 2);
    const rdv::Intro &first = side->dialed[0], &again = side->dialed[1];
    CHECK(again.rebuild);
    CHECK(again.conn_id == first.conn_id);
    CHECK(again.path_id != first.path_id);
    CHECK(again.npaths == 1);
    CHECK(p->identity().id == again.path_id);
}
