// SPDX-License-Identifier: Apache-2.0
// Handshake tests of the connector's side and the data path (test_handshake.cc has the
// listener's side and the overview): connect() refuses malformed handles, multi-recv binds
// messages by tag, and connect() fails cleanly against a listener that misbehaves.

#include <catch2/catch.hpp>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "handshake_support.h"

using namespace handshake_test;

// =========================================================================================

TEST_CASE("connect refuses a malformed handle with -EINVAL and one WARN", "[handshake][handle]")
{
    Session s;
    REQUIRE(s.rc == 0);
    Comms c;
    Handle good;
    open_listener(c, good);

    struct Case {
        const char *name;
        void (*edit)(Handle &);
        const char *why;
    };
    const Case cases[] = {
        {"bad checksum", [](Handle &h) { h[104] ^= 0xff; }, "bad checksum"},
        {"payload edited, checksum stale", [](Handle &h) { h[9] ^= 0x10; }, "bad checksum"},
        {"zeroed buffer", [](Handle &h) { h.fill(0); }, "bad magic"},
        {"all ones", [](Handle &h) { h.fill(0xff); }, "bad magic"},
        {"version 9", [](Handle &h) { h[4] = 9; reseal(h); }, "unsupported version"},
        {"address count 0", [](Handle &h) { h[5] = 0; reseal(h); }, "address count out of range"},
        {"address count 5", [](Handle &h) { h[5] = 5; reseal(h); }, "address count out of range"},
        {"family 5", [](Handle &h) { h[24] = 5; reseal(h); }, "bad address family"},
        {"port 0", [](Handle &h) { h[26] = 0; h[27] = 0; reseal(h); }, "zero port"},
        {"unused entry non-zero", [](Handle &h) { h[44 + 7] = 1; reseal(h); },
         "non-zero unused address entry"},
    };
    for (const Case &k : cases) {
        INFO("case: " << k.name);
        Handle h = good;
        k.edit(h);
        const Handle before = h;
        const size_t mark = warn_mark();
        void *sc = reinterpret_cast<void *>(0x1); // must be cleared
        const auto t0 = Clock::now();
        const int r = vn::connect(0, h.data(), &sc);
        const auto us =
            std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count();
        INFO(dump_since(mark));
        CHECK(r == -EINVAL);
        CHECK(sc == nullptr);
        CHECK(us < 100000); // immediately, no retry loop
        CHECK(count_since(mark, {"malformed handle", k.why}) == 1);
        CHECK(warns_since(mark).size() == 1);
        CHECK(h == before); // connect left the handle (and its scratch) alone
    }

    SECTION("NULL handle and unknown device")
    {
        const size_t mark = warn_mark();
        void *sc = reinterpret_cast<void *>(0x1);
        CHECK(vn::connect(0, nullptr, &sc) == -EINVAL);
        CHECK(sc == nullptr);
        Handle h = good;
        sc = reinterpret_cast<void *>(0x1);
        CHECK(vn::connect(vn::device_count(), h.data(), &sc) == -EINVAL);
        CHECK(sc == nullptr);
        CHECK(vn::connect(-1, h.data(), &sc) == -EINVAL);
        CHECK(h == good);
        CHECK(warns_since(mark).size() == 3); // one WARN each
    }

    // Nothing was left behind: the genuine handle still works.
    void *sc = nullptr, *rc = nullptr;
    connect_pair(c, good, &sc, &rc);
    transfer(sc, rc, 4096, 0, 4);
    CHECK(c.close_all() == 0);
}

TEST_CASE("multi-recv over the real TCP path binds messages by tag", "[handshake][multirecv]")
{
    Session s;
    REQUIRE(s.rc == 0);
    REQUIRE(vn::params().max_recvs == 8);
    Comms c;
    Handle handle;
    open_listener(c, handle);
    void *sc = nullptr, *rc = nullptr;
    connect_pair(c, handle, &sc, &rc);

    // Buffer i is posted with tag 7-i; sends go out with tags 0..7 in order.
    const std::vector<int> recv_tags = {7, 6, 5, 4, 3, 2, 1, 0};
    SECTION("mixed sizes, one to several chunks")
    {
        const std::vector<SendSpec> sends = {
            {0, 1},         {1, 100},     {2, 4096},          {3, 65537},
            {4, 524288},    {5, 524289},  {6, (1u << 20) + 3}, {7, 3000}};
        std::vector<size_t> cap;
        for (int t : recv_tags) cap.push_back(sends[static_cast<size_t>(t)].size + 1000);
        exchange(sc, rc, sends, recv_tags, cap, 10);
        // A second round on the same connection: sequence numbers carry on.
        exchange(sc, rc, sends, recv_tags, cap, 20);
    }
    SECTION("with an empty message")
    {
        const std::vector<SendSpec> sends = {{0, 10}, {1, 0},   {2, 777}, {3, 0},
                                             {4, 1},  {5, 800000}, {6, 5}, {7, 0}};
        std::vector<size_t> cap;
        for (int t : recv_tags) cap.push_back(sends[static_cast<size_t>(t)].size + 16);
        exchange(sc, rc, sends, recv_tags, cap, 30);
    }
    // Single receives still work after grouped ones.
    transfer(sc, rc, 12345, 42, 40);
    CHECK(c.close_all() == 0);
}

// ---- The connector against a hostile listener -------------------------------------------

namespace {

/// A plain listening socket standing in for a peer's listener; the handle names it.
struct RawServer {
    int fd = -1;
    vn::ListenHandle lh;
    RawServer()
    {
        fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd >= 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) == 0);
        REQUIRE(::listen(fd, 64) == 0);
        socklen_t len = sizeof(a);
        REQUIRE(getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0);
        vn::Endpoint e;
        REQUIRE(vn::Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&a), &e));
        lh.dev = 0;
        for (size_t i = 0; i < lh.nonce.size(); ++i) lh.nonce[i] = static_cast<uint8_t>(0xa0 + i);
        lh.addrs = {e};
    }
    ~RawServer() { ::close(fd); }
    RawServer(const RawServer &) = delete;
    RawServer &operator=(const RawServer &) = delete;

    Handle handle() const
    {
        Handle h;
        REQUIRE(lh.encode(h.data()) == 0);
        return h;
    }
};

/// The server side of one connect(): the accepted streams, indexed by their hello's stream.
struct Accepted {
    std::vector<int> fds; // fds[i] carries stream i
    ~Accepted()
    {
        for (int f : fds)
            if (f >= 0) ::close(f);
    }
};

/// Calls connect() until every stream said hello to `srv`; checks each hello. The connector
/// then waits for the answer (sc stays NULL).
void take_hellos(RawServer &srv, Handle &h, Accepted *acc)
{
    const size_t nstreams = static_cast<size_t>(vn::params().nstreams);
    acc->fds.assign(nstreams, -1);
    uint64_t conn_id = 0;
    size_t got = 0;
    const auto deadline = Clock::now() + milliseconds(2000);
    while (got < nstreams && Clock::now() < deadline) {
        void *sc = nullptr;
        REQUIRE(vn::connect(0, h.data(), &sc) == 0);
        REQUIRE(sc == nullptr); // nothing answered yet
        pollfd pfd{srv.fd, POLLIN, 0};
        if (poll(&pfd, 1, 1) <= 0) continue;
        int f = ::accept4(srv.fd, nullptr, nullptr, SOCK_CLOEXEC);
        REQUIRE(f >= 0);
        timeval tv{1, 0};
        setsockopt(f, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        std::array<uint8_t, vn::tcp::Hello::kSize> b{};
        // The connector sends the hello from inside connect(); keep calling it meanwhile.
        size_t n = 0;
        while (n < b.size() && Clock::now() < deadline) {
            void *sc2 = nullptr;
            REQUIRE(vn::connect(0, h.data(), &sc2) == 0);
            ssize_t r = ::recv(f, b.data() + n, b.size() - n, MSG_DONTWAIT);
            if (r > 0) n += static_cast<size_t>(r);
            else REQUIRE((r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)));
        }
        REQUIRE(n == b.size());
        vn::tcp::Hello hello;
        const char *bad = hello.decode(b.data());
        INFO((bad ? bad : "ok"));
        REQUIRE(bad == nullptr);
        CHECK(hello.nonce == srv.lh.nonce);
        CHECK(hello.nstreams == nstreams);
        CHECK(hello.path_kind == 0);
        CHECK(hello.path_id != 0);
        CHECK(hello.conn_id != 0);
        if (conn_id == 0) conn_id = hello.conn_id;
        CHECK(hello.conn_id == conn_id); // one path: one conn_id on every stream
        REQUIRE(hello.stream < nstreams);
        REQUIRE(acc->fds[hello.stream] == -1); // each stream index once
        acc->fds[hello.stream] = f;
        ++got;
    }
    REQUIRE(got == nstreams);
}

/// Calls connect() until it returns non-zero or a comm, or `ms` pass.
int finish_connect(Handle &h, void **sc, int ms)
{
    *sc = nullptr;
    const auto deadline = Clock::now() + milliseconds(ms);
    int r = 0;
    while (r == 0 && *sc == nullptr && Clock::now() < deadline) {
        r = vn::connect(0, h.data(), sc);
        sleep_briefly();
    }
    return r;
}

} // namespace

TEST_CASE("connect fails cleanly, with one WARN, against a listener that misbehaves",
          "[handshake][connector]")
{
    Session s;
    REQUIRE(s.rc == 0);
    RawServer srv;
    Handle h = srv.handle();
    Accepted acc;
    take_hellos(srv, h, &acc);
    const size_t mark = warn_mark();
    void *sc = nullptr;
    std::array<uint8_t, vn::tcp::AcceptAnswer::kSize> ans{};

    SECTION("the listener closes every stream")
    {
        for (int &f : acc.fds) ::close(std::exchange(f, -1));
        const int r = finish_connect(h, &sc, 2000);
        INFO(dump_since(mark));
        CHECK(r == -ECONNREFUSED);
        CHECK(count_since(mark, {"connect from dev", "listener closed the connection"}) == 1);
        CHECK(warns_since(mark).size() == 1);
    }
    SECTION("the listener closes mid-answer")
    {
        vn::tcp::AcceptAnswer::encode(ans.data(), 0);
        REQUIRE(::send(acc.fds[0], ans.data(), 5, MSG_NOSIGNAL) == 5);
        for (int &f : acc.fds) ::close(std::exchange(f, -1));
        const int r = finish_connect(h, &sc, 2000);
        INFO(dump_since(mark));
        CHECK(r == -ECONNREFUSED);
        CHECK(count_since(mark, {"connect from dev", "listener closed the connection"}) == 1);
        CHECK(warns_since(mark).size() == 1);
    }
    SECTION("an answer with a bad magic")
    {
        vn::tcp::AcceptAnswer::encode(ans.data(), 0);
        ans[0] ^= 0xff;
        REQUIRE(::send(acc.fds[0], ans.data(), ans.size(), MSG_NOSIGNAL) == 8);
        const int r = finish_connect(h, &sc, 2000);
        INFO(dump_since(mark));
        CHECK(r == -EPROTO);
        CHECK(count_since(mark, {"connect from dev", "malformed answer"}) == 1);
        CHECK(warns_since(mark).size() == 1);
    }
    SECTION("an answer with a non-zero status")
    {
        vn::tcp::AcceptAnswer::encode(ans.data(), 1);
        REQUIRE(::send(acc.fds[0], ans.data(), ans.size(), MSG_NOSIGNAL) == 8);
        const int r = finish_connect(h, &sc, 2000);
        INFO(dump_since(mark));
        CHECK(r == -EPROTO);
        CHECK(count_since(mark, {"connect from dev", "malformed answer"}) == 1);
        CHECK(warns_since(mark).size() == 1);
    }
    SECTION("no answer at all")
    {
        const auto t0 = Clock::now();
        const int r = finish_connect(h, &sc, 3000);
        const auto ms = std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
        INFO(dump_since(mark));
        CHECK(r == -ETIMEDOUT);
        CHECK(ms < 3000);
        CHECK(count_since(mark, {"connect from dev", "no answer within"}) == 1);
        CHECK(warns_since(mark).size() == 1);
    }
    SECTION("positive control: a correct answer yields a sendComm")
    {
        vn::tcp::AcceptAnswer::encode(ans.data(), 0);
        REQUIRE(::send(acc.fds[0], ans.data(), ans.size(), MSG_NOSIGNAL) == 8);
        const int r = finish_connect(h, &sc, 2000);
        INFO(dump_since(mark));
        CHECK(r == 0);
        REQUIRE(sc != nullptr);
        CHECK(warns_since(mark).empty());
        CHECK(vn::close_send(sc) == 0);
        sc = nullptr;
    }
    CHECK(sc == nullptr);
    CHECK(scratch_is_zero(h)); // a finished connect (either way) releases its retry state
}
