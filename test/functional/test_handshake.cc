// SPDX-License-Identifier: Apache-2.0
// Functional tests of the TCP fabric's connection setup through the net plugin's core API
// (plugin.h), over real loopback sockets: the listener rejects impostors (wrong nonce, raw
// clients with garbage, truncated or missing hellos, hellos with hostile fields) with one WARN
// each and keeps listening; connect() refuses malformed handles; genuine connections still
// move data afterwards, including grouped (multi-recv) receives.
//
// Run with VIGIL_SOCKET_IFNAME==lo (defaulted here when unset). VIGIL_HANDSHAKE_TIMEOUT_MS is
// forced to 300 before the first plugin_init (parameters are read once per process).
// HANDSHAKE_TEST_VERBOSE=1 echoes every captured WARN to stderr.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "handle.h"
#include "log.h"
#include "plugin.h"
#include "tcp/tcp_setup.h"
#include "tcp/wire.h"

namespace vn = vigil::net;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

constexpr int kTimeoutMs = 300; // VIGIL_HANDSHAKE_TIMEOUT_MS for this process

// Runs before Catch's main, hence before any plugin_init.
const bool g_env_ready = [] {
    setenv("VIGIL_HANDSHAKE_TIMEOUT_MS", "300", 1);
    setenv("VIGIL_SOCKET_IFNAME", "=lo", 0); // keep the caller's choice when given
    return true;
}();

// ---- WARN capture -----------------------------------------------------------------------

std::mutex g_log_mu;
std::vector<std::string> g_warns;

void test_logger(ncclDebugLogLevel level, unsigned long /*flags*/, const char * /*file*/,
                 int /*line*/, const char *fmt, ...)
{
    if (level != NCCL_LOG_WARN) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (std::getenv("HANDSHAKE_TEST_VERBOSE") != nullptr) std::fprintf(stderr, "WARN %s\n", buf);
    std::lock_guard<std::mutex> lock(g_log_mu);
    g_warns.emplace_back(buf);
}

size_t warn_mark()
{
    std::lock_guard<std::mutex> lock(g_log_mu);
    return g_warns.size();
}

std::vector<std::string> warns_since(size_t mark)
{
    std::lock_guard<std::mutex> lock(g_log_mu);
    return {g_warns.begin() + static_cast<std::ptrdiff_t>(std::min(mark, g_warns.size())),
            g_warns.end()};
}

/// WARNs since `mark` containing every one of `needles`.
size_t count_since(size_t mark, std::initializer_list<const char *> needles)
{
    size_t n = 0;
    for (const std::string &w : warns_since(mark)) {
        bool all = true;
        for (const char *s : needles) all = all && w.find(s) != std::string::npos;
        n += all ? 1 : 0;
    }
    return n;
}

std::string dump_since(size_t mark)
{
    std::string out;
    for (const std::string &w : warns_since(mark)) out += "  WARN: " + w + "\n";
    return out.empty() ? "  (no WARN)\n" : out;
}

// The listener's rejection line: "dev lo: rejected connection from <peer>: <why>; still listening".
constexpr const char *kRejected = "rejected connection from";

// ---- Plugin session and comm ownership --------------------------------------------------

/// plugin_init on construction, plugin_finalize on destruction (balanced even when a REQUIRE
/// throws out of the test).
struct Session {
    int rc;
    Session()
    {
        (void)g_env_ready;
        rc = vn::plugin_init(&test_logger, 12);
    }
    ~Session()
    {
        if (rc == 0) vn::plugin_finalize();
    }
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;
};

/// The comms a test opened; closed by close_all() (checked) or by the destructor after a
/// failed REQUIRE. Declared after the Session so it is destroyed first.
struct Comms {
    void *lc = nullptr;
    std::vector<void *> sends;
    std::vector<void *> recvs;

    int close_all()
    {
        int bad = 0;
        for (void *c : sends) bad |= vn::close_send(c);
        for (void *c : recvs) bad |= vn::close_recv(c);
        if (lc != nullptr) bad |= vn::close_listen(lc);
        sends.clear();
        recvs.clear();
        lc = nullptr;
        return bad;
    }
    ~Comms() { close_all(); }
};

using Handle = std::array<uint8_t, vn::ListenHandle::kSize>;

uint32_t get_le32(const uint8_t *p)
{
    return static_cast<uint32_t>(vn::tcp::get_le(p, 4));
}

/// Recomputes the handle's checksum so that a deliberately edited handle is well-formed.
void reseal(Handle &h)
{
    vn::tcp::put_le(h.data() + 104, vn::fnv1a32(h.data(), 104), 4);
}

bool scratch_is_zero(const Handle &h)
{
    return std::all_of(h.begin() + vn::ListenHandle::kScratchOffset, h.end(),
                       [](uint8_t b) { return b == 0; });
}

void sleep_briefly()
{
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

/// listen(0) into `c.lc` and `handle`; returns the decoded handle.
vn::ListenHandle open_listener(Comms &c, Handle &handle)
{
    handle.fill(0xcc);
    REQUIRE(vn::listen(0, handle.data(), &c.lc) == 0);
    REQUIRE(c.lc != nullptr);
    REQUIRE(scratch_is_zero(handle));
    REQUIRE(get_le32(handle.data() + 104) == vn::fnv1a32(handle.data(), 104));
    vn::ListenHandle h;
    std::string why;
    REQUIRE(vn::ListenHandle::decode(handle.data(), &h, &why) == 0);
    REQUIRE(h.addrs.size() >= 1);
    return h;
}

/// Drives connect() with `handle` and accept() alternately until both produced a comm.
void connect_pair(Comms &c, Handle &handle, void **sc, void **rc)
{
    *sc = nullptr;
    *rc = nullptr;
    const size_t mark = warn_mark();
    const auto deadline = Clock::now() + milliseconds(5000);
    while ((*sc == nullptr || *rc == nullptr) && Clock::now() < deadline) {
        if (*sc == nullptr) {
            int r = vn::connect(0, handle.data(), sc);
            INFO(dump_since(mark));
            REQUIRE(r == 0);
            if (*sc != nullptr) c.sends.push_back(*sc);
        }
        if (*rc == nullptr) {
            int r = vn::accept(c.lc, rc);
            REQUIRE(r == 0);
            if (*rc != nullptr) c.recvs.push_back(*rc);
        }
        sleep_briefly();
    }
    REQUIRE(*sc != nullptr);
    REQUIRE(*rc != nullptr);
}

uint8_t pattern(size_t i, uint32_t seed)
{
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u + seed * 40503u + 0x9e3779b9u;
    x ^= x >> 15;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    return static_cast<uint8_t>(x);
}

size_t first_mismatch(const uint8_t *got, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; ++i)
        if (got[i] != pattern(i, seed)) return i;
    return SIZE_MAX;
}

/// Posts one receive of n buffers and one send per entry of `sends` (tag, size), then polls
/// every request to completion. Checks payloads, the reported sizes and guard bytes.
struct SendSpec {
    int tag;
    size_t size;
};

void exchange(void *sc, void *rc, const std::vector<SendSpec> &sends,
              const std::vector<int> &recv_tags, const std::vector<size_t> &capacity,
              uint32_t seed)
{
    const int n = static_cast<int>(recv_tags.size());
    REQUIRE(capacity.size() == recv_tags.size());
    const size_t mark = warn_mark();
    constexpr size_t kGuard = 64;
    constexpr uint8_t kFill = 0xee;
    std::vector<std::vector<uint8_t>> src(sends.size()), dst(static_cast<size_t>(n));
    for (size_t k = 0; k < sends.size(); ++k) {
        src[k].resize(sends[k].size);
        for (size_t i = 0; i < sends[k].size; ++i)
            src[k][i] = pattern(i, seed + static_cast<uint32_t>(sends[k].tag));
    }
    std::vector<void *> data;
    for (int i = 0; i < n; ++i) {
        dst[static_cast<size_t>(i)].assign(capacity[static_cast<size_t>(i)] + kGuard, kFill);
        data.push_back(dst[static_cast<size_t>(i)].data());
    }

    const auto deadline = Clock::now() + milliseconds(5000);
    void *rreq = nullptr;
    while (rreq == nullptr && Clock::now() < deadline) {
        REQUIRE(vn::irecv(rc, n, data.data(), capacity.data(), recv_tags.data(), nullptr, &rreq) == 0);
        if (rreq == nullptr) sleep_briefly();
    }
    REQUIRE(rreq != nullptr);
    std::vector<void *> sreq(sends.size(), nullptr);
    for (size_t k = 0; k < sends.size(); ++k) {
        while (sreq[k] == nullptr && Clock::now() < deadline) {
            REQUIRE(vn::isend(sc, src[k].data(), src[k].size(), sends[k].tag, nullptr, &sreq[k]) == 0);
            if (sreq[k] == nullptr) sleep_briefly();
        }
        REQUIRE(sreq[k] != nullptr);
    }

    bool rdone = false;
    std::vector<bool> sdone(sends.size(), false);
    std::vector<int> rsizes(static_cast<size_t>(n), -1);
    std::vector<int> ssizes(sends.size(), -1);
    auto all_done = [&] {
        return rdone && std::all_of(sdone.begin(), sdone.end(), [](bool b) { return b; });
    };
    while (!all_done() && Clock::now() < deadline) {
        if (!rdone) {
            int done = 0;
            REQUIRE(vn::test(rreq, &done, rsizes.data()) == 0);
            rdone = done != 0;
        }
        for (size_t k = 0; k < sends.size(); ++k) {
            if (sdone[k]) continue;
            int done = 0;
            REQUIRE(vn::test(sreq[k], &done, &ssizes[k]) == 0);
            sdone[k] = done != 0;
        }
        if (!all_done()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    INFO(dump_since(mark));
    REQUIRE(all_done());

    for (size_t k = 0; k < sends.size(); ++k) {
        INFO("send " << k << " tag " << sends[k].tag);
        CHECK(static_cast<size_t>(ssizes[k]) == sends[k].size);
    }
    for (int i = 0; i < n; ++i) {
        const auto ui = static_cast<size_t>(i);
        // The message whose tag this buffer was posted with.
        auto it = std::find_if(sends.begin(), sends.end(),
                               [&](const SendSpec &s) { return s.tag == recv_tags[ui]; });
        REQUIRE(it != sends.end());
        INFO("recv buffer " << i << " tag " << recv_tags[ui] << " expecting " << it->size << " bytes");
        CHECK(rsizes[ui] == static_cast<int>(it->size));
        CHECK(first_mismatch(dst[ui].data(), it->size, seed + static_cast<uint32_t>(it->tag)) ==
              SIZE_MAX);
        CHECK(std::all_of(dst[ui].begin() + static_cast<std::ptrdiff_t>(it->size), dst[ui].end(),
                          [](uint8_t b) { return b == kFill; }));
    }
}

/// One message of `size` bytes, tag `tag`, receive capacity == size.
void transfer(void *sc, void *rc, size_t size, int tag, uint32_t seed)
{
    exchange(sc, rc, {{tag, size}}, {tag}, {size}, seed);
}

// ---- Raw TCP clients --------------------------------------------------------------------

/// A plain blocking socket connected to the listener, for sending arbitrary bytes.
struct RawClient {
    int fd = -1;
    std::string local; // "127.0.0.1:port" as the listener's WARN names it

    explicit RawClient(const vn::Endpoint &to)
    {
        fd = ::socket(to.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd >= 0);
        sockaddr_storage ss;
        socklen_t len = to.to_sockaddr(&ss);
        REQUIRE(::connect(fd, reinterpret_cast<sockaddr *>(&ss), len) == 0);
        sockaddr_storage me{};
        socklen_t mlen = sizeof(me);
        REQUIRE(getsockname(fd, reinterpret_cast<sockaddr *>(&me), &mlen) == 0);
        vn::Endpoint e;
        REQUIRE(vn::Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&me), &e));
        local = e.to_string();
    }
    ~RawClient() { close(); }
    RawClient(const RawClient &) = delete;
    RawClient &operator=(const RawClient &) = delete;

    void close()
    {
        if (fd >= 0) ::close(fd);
        fd = -1;
    }
    void send_all(const uint8_t *p, size_t n)
    {
        while (n > 0) {
            ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
            REQUIRE(w > 0);
            p += w;
            n -= static_cast<size_t>(w);
        }
    }
    /// True once the listener closed this connection (EOF or reset) within `ms`.
    bool closed_by_peer(int ms)
    {
        const auto deadline = Clock::now() + milliseconds(ms);
        uint8_t b[64];
        while (Clock::now() < deadline) {
            pollfd pfd{fd, POLLIN, 0};
            if (poll(&pfd, 1, 10) <= 0) continue;
            ssize_t r = ::recv(fd, b, sizeof(b), MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
            if (r > 0) return false; // the listener answered: not a rejection
        }
        return false;
    }
    /// Reads exactly n bytes within `ms`; false on EOF/timeout.
    bool recv_exact(uint8_t *p, size_t n, int ms)
    {
        const auto deadline = Clock::now() + milliseconds(ms);
        while (n > 0 && Clock::now() < deadline) {
            pollfd pfd{fd, POLLIN, 0};
            if (poll(&pfd, 1, 10) <= 0) continue;
            ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
            if (r <= 0) return false;
            p += r;
            n -= static_cast<size_t>(r);
        }
        return n == 0;
    }
};

std::array<uint8_t, vn::tcp::Hello::kSize> hello_bytes(const vn::tcp::Hello &h)
{
    std::array<uint8_t, vn::tcp::Hello::kSize> b{};
    h.encode(b.data());
    return b;
}

vn::tcp::Hello valid_hello(const vn::ListenHandle &lh, uint64_t conn_id)
{
    vn::tcp::Hello h;
    h.nstreams = 1;
    h.stream = 0;
    h.path_kind = 0;
    h.nonce = lh.nonce;
    h.conn_id = conn_id;
    h.path_id = 0x5151515151515151ULL;
    return h;
}

/// Calls accept() until `done()` or `ms` elapsed; every recvComm it produces is counted in
/// *produced and closed (none is expected where this is used).
template <typename Pred>
void drive_accept(void *lc, int ms, int *produced, Pred done)
{
    const auto deadline = Clock::now() + milliseconds(ms);
    while (Clock::now() < deadline) {
        void *r = nullptr;
        REQUIRE(vn::accept(lc, &r) == 0);
        if (r != nullptr) {
            ++*produced;
            vn::close_recv(r);
        }
        if (done()) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

/// Drives accept() until the listener rejected `client` (a WARN naming its address and
/// `why`), then a little longer to catch duplicates. Checks: exactly one such WARN, exactly
/// one rejection of any kind, no recvComm, the client's connection closed by the listener.
void expect_rejected(void *lc, RawClient &client, const char *why, int wait_ms = 2000)
{
    const size_t mark = warn_mark();
    const std::string peer = client.local + ": "; // the WARN reads "from <peer>: <why>"
    int produced = 0;
    drive_accept(lc, wait_ms, &produced,
                 [&] { return count_since(mark, {kRejected, peer.c_str()}) > 0; });
    drive_accept(lc, 30, &produced, [] { return false; });
    INFO("client " << client.local << ", expected reason \"" << why << "\"\n" << dump_since(mark));
    CHECK(count_since(mark, {kRejected, peer.c_str(), why}) == 1);
    CHECK(count_since(mark, {kRejected}) == 1);
    CHECK(warns_since(mark).size() == 1);
    CHECK(produced == 0);
    if (client.fd >= 0) CHECK(client.closed_by_peer(1000));
}

} // namespace

// =========================================================================================

TEST_CASE("an impostor with a wrong nonce is rejected; the genuine peer still connects",
          "[handshake][nonce]")
{
    Session s;
    REQUIRE(s.rc == 0);
    const int nstreams = static_cast<int>(vn::params().nstreams);
    REQUIRE(vn::params().handshake_timeout_ms == kTimeoutMs);
    Comms c;
    Handle handle;
    const vn::ListenHandle lh = open_listener(c, handle);

    // The impostor's handle: one nonce byte flipped, checksum recomputed (well-formed).
    Handle imp = handle;
    imp[8 + 5] ^= 0x01;
    reseal(imp);
    {
        vn::ListenHandle d;
        std::string why;
        REQUIRE(vn::ListenHandle::decode(imp.data(), &d, &why) == 0);
        REQUIRE(d.nonce != lh.nonce);
        REQUIRE(d.addrs == lh.addrs);
    }

    const size_t mark = warn_mark();
    void *isc = nullptr;
    int crc = 0;
    int produced = 0;
    const auto deadline = Clock::now() + milliseconds(3000);
    while (crc == 0 && isc == nullptr && Clock::now() < deadline) {
        crc = vn::connect(0, imp.data(), &isc);
        void *r = nullptr;
        REQUIRE(vn::accept(c.lc, &r) == 0);
        if (r != nullptr) {
            ++produced;
            c.recvs.push_back(r);
        }
        sleep_briefly();
    }
    if (isc != nullptr) c.sends.push_back(isc);
    // Let the listener finish with whatever the impostor left behind.
    drive_accept(c.lc, 50, &produced, [] { return false; });

    INFO("nstreams " << nstreams << "\n" << dump_since(mark));
    CHECK(isc == nullptr);
    CHECK(crc < 0);
    CHECK((crc == -ECONNREFUSED || crc == -ECONNRESET));
    CHECK(produced == 0);
    // The listener: one WARN per connection of the impostor's path (one per stream).
    // One WARN for the impostor's path, however many streams it opened.
    CHECK(count_since(mark, {kRejected, "wrong nonce"}) == 1);
    CHECK(count_since(mark, {kRejected}) == 1);
    // The connector: exactly one WARN for its failure.
    CHECK(count_since(mark, {"connect from dev", "failed"}) == 1);
    // A failed connect releases its retry state in the handle's scratch.
    CHECK(scratch_is_zero(imp));

    // The listener is still open for the genuine handle.
    void *sc = nullptr, *rc = nullptr;
    connect_pair(c, handle, &sc, &rc);
    CHECK(scratch_is_zero(handle));
    transfer(sc, rc, 1u << 20, 7, 1);
    CHECK(c.close_all() == 0);
}

TEST_CASE("raw clients sending garbage, a truncated hello or nothing are each rejected once",
          "[handshake][raw]")
{
    Session s;
    REQUIRE(s.rc == 0);
    Comms c;
    Handle handle;
    const vn::ListenHandle lh = open_listener(c, handle);
    const vn::Endpoint ep = lh.addrs[0];

    SECTION("garbage")
    {
        RawClient cl(ep);
        std::array<uint8_t, vn::tcp::Hello::kSize> junk;
        for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(0xde ^ (i * 37));
        REQUIRE(vn::tcp::get_le(junk.data(), 4) != vn::tcp::Hello::kMagic);
        cl.send_all(junk.data(), junk.size());
        expect_rejected(c.lc, cl, "bad magic");
    }
    SECTION("truncated hello, then close")
    {
        RawClient cl(ep);
        auto b = hello_bytes(valid_hello(lh, 0x1234));
        cl.send_all(b.data(), 23);
        cl.close(); // expect_rejected skips the EOF check for a closed client
        expect_rejected(c.lc, cl, "closed before completing its hello");
    }
    SECTION("silent client")
    {
        RawClient cl(ep);
        const auto t0 = Clock::now();
        expect_rejected(c.lc, cl, "no hello within", 3000);
        const auto ms =
            std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count();
        CHECK(ms >= kTimeoutMs - 10);
        CHECK(ms < 3000);
    }
    SECTION("all three at once")
    {
        RawClient garbage(ep), trunc(ep), silent(ep);
        std::array<uint8_t, vn::tcp::Hello::kSize> junk;
        junk.fill(0x5a);
        garbage.send_all(junk.data(), junk.size());
        auto b = hello_bytes(valid_hello(lh, 0x4321));
        trunc.send_all(b.data(), 39);
        ::shutdown(trunc.fd, SHUT_WR);
        const size_t mark = warn_mark();
        int produced = 0;
        drive_accept(c.lc, 3000, &produced, [&] { return count_since(mark, {kRejected}) >= 3; });
        drive_accept(c.lc, 30, &produced, [] { return false; });
        INFO(dump_since(mark));
        CHECK(count_since(mark, {kRejected, (garbage.local + ": bad magic").c_str()}) == 1);
        CHECK(count_since(mark, {kRejected, (trunc.local + ": closed before").c_str()}) == 1);
        CHECK(count_since(mark, {kRejected, (silent.local + ": no hello within").c_str()}) == 1);
        CHECK(warns_since(mark).size() == 3);
        CHECK(produced == 0);
        CHECK(garbage.closed_by_peer(1000));
        CHECK(trunc.closed_by_peer(1000));
        CHECK(silent.closed_by_peer(1000));
    }

    SECTION("more silent clients than the listener keeps pending")
    {
        constexpr size_t kMax = vn::rendezvous::kMaxPending;
        constexpr size_t kExtra = 3;
        std::vector<std::unique_ptr<RawClient>> flood;
        for (size_t i = 0; i < kMax + kExtra; ++i) flood.push_back(std::make_unique<RawClient>(ep));
        const size_t mark = warn_mark();
        int produced = 0;
        drive_accept(c.lc, 3000, &produced,
                     [&] { return count_since(mark, {kRejected}) >= kMax + kExtra; });
        drive_accept(c.lc, 30, &produced, [] { return false; });
        INFO(dump_since(mark));
        CHECK(count_since(mark, {kRejected, "too many connections awaiting their hello"}) == kExtra);
        CHECK(count_since(mark, {kRejected, "no hello within"}) == kMax);
        CHECK(warns_since(mark).size() == kMax + kExtra);
        CHECK(produced == 0);
        size_t closed = 0;
        for (auto &cl : flood) closed += cl->closed_by_peer(200) ? 1 : 0;
        CHECK(closed == kMax + kExtra);
    }

    // Whatever happened, a genuine connect still succeeds and moves data.
    const size_t mark = warn_mark();
    void *sc = nullptr, *rc = nullptr;
    connect_pair(c, handle, &sc, &rc);
    transfer(sc, rc, 1u << 20, 3, 2);
    CHECK(warns_since(mark).empty());
    CHECK(c.close_all() == 0);
}

TEST_CASE("hellos with the right nonce but hostile fields are rejected, naming the field",
          "[handshake][fields]")
{
    Session s;
    REQUIRE(s.rc == 0);
    Comms c;
    Handle handle;
    const vn::ListenHandle lh = open_listener(c, handle);
    const vn::Endpoint ep = lh.addrs[0];

    struct Case {
        const char *name;
        void (*edit)(vn::tcp::Hello &);
        const char *why;
    };
    const Case cases[] = {
        {"nstreams 0", [](vn::tcp::Hello &h) { h.nstreams = 0; }, "stream count out of range"},
        {"nstreams 17", [](vn::tcp::Hello &h) { h.nstreams = 17; h.stream = 0; },
         "stream count out of range"},
        {"nstreams 255", [](vn::tcp::Hello &h) { h.nstreams = 255; }, "stream count out of range"},
        {"stream == nstreams", [](vn::tcp::Hello &h) { h.nstreams = 2; h.stream = 2; },
         "stream index out of range"},
        {"stream 200", [](vn::tcp::Hello &h) { h.nstreams = 16; h.stream = 200; },
         "stream index out of range"},
        {"path id 0", [](vn::tcp::Hello &h) { h.path_id = 0; }, "zero path id"},
        {"conn_id 0", [](vn::tcp::Hello &h) { h.conn_id = 0; }, "zero connection id"},
        {"version 1 (before CTS)", [](vn::tcp::Hello &h) { h.version = 1; }, "unsupported version"},
        {"version 2 (no ack delays)", [](vn::tcp::Hello &h) { h.version = 2; },
         "unsupported version"},
        {"version 4", [](vn::tcp::Hello &h) { h.version = 4; }, "unsupported version"},
        {"path kind 2", [](vn::tcp::Hello &h) { h.path_kind = 2; }, "bad path kind"},
    };
    for (const Case &k : cases) {
        INFO("case: " << k.name);
        vn::tcp::Hello h = valid_hello(lh, 0xabcdef01);
        k.edit(h);
        RawClient cl(ep);
        auto b = hello_bytes(h);
        cl.send_all(b.data(), b.size());
        expect_rejected(c.lc, cl, k.why);
    }

    SECTION("a second stream claiming an index already taken")
    {
        vn::tcp::Hello h = valid_hello(lh, 0x77);
        h.nstreams = 2;
        RawClient first(ep), dup(ep);
        auto b = hello_bytes(h);
        first.send_all(b.data(), b.size());
        int produced = 0;
        drive_accept(c.lc, 50, &produced, [] { return false; });
        dup.send_all(b.data(), b.size());
        expect_rejected(c.lc, dup, "duplicate stream index");
        // The incomplete path is dropped after the handshake timeout, closing `first`.
        const size_t mark = warn_mark();
        drive_accept(c.lc, 3000, &produced,
                     [&] { return count_since(mark, {"dropped a connection", "1 of 2 primary streams"}) > 0; });
        INFO(dump_since(mark));
        CHECK(count_since(mark, {"dropped a connection", "1 of 2 primary streams"}) == 1);
        CHECK(produced == 0);
        CHECK(first.closed_by_peer(1000));
    }
    SECTION("a second stream disagreeing on the stream count")
    {
        vn::tcp::Hello h0 = valid_hello(lh, 0x88);
        h0.nstreams = 3;
        vn::tcp::Hello h1 = h0;
        h1.nstreams = 2;
        h1.stream = 1;
        RawClient s0(ep), s1(ep);
        auto b0 = hello_bytes(h0);
        s0.send_all(b0.data(), b0.size());
        int produced = 0;
        drive_accept(c.lc, 50, &produced, [] { return false; });
        auto b1 = hello_bytes(h1);
        s1.send_all(b1.data(), b1.size());
        expect_rejected(c.lc, s1, "differs from its connection's first stream");
        CHECK(produced == 0);
    }
    SECTION("positive control: a valid hello dribbled one byte at a time is accepted")
    {
        RawClient cl(ep);
        auto b = hello_bytes(valid_hello(lh, 0x98));
        void *rc = nullptr;
        for (size_t i = 0; i < b.size(); ++i) {
            cl.send_all(b.data() + i, 1);
            std::this_thread::sleep_for(std::chrono::microseconds(300));
            REQUIRE(vn::accept(c.lc, &rc) == 0);
            if (rc != nullptr) c.recvs.push_back(rc);
            if (i + 1 < b.size()) REQUIRE(rc == nullptr);
        }
        const auto deadline = Clock::now() + milliseconds(2000);
        while (rc == nullptr && Clock::now() < deadline) {
            REQUIRE(vn::accept(c.lc, &rc) == 0);
            if (rc != nullptr) c.recvs.push_back(rc);
            sleep_briefly();
        }
        CHECK(rc != nullptr);
    }
    SECTION("positive control: the same raw hello, unedited, is accepted")
    {
        // Proves the rejections above are about the edited field, not a broken encoder.
        RawClient cl(ep);
        auto b = hello_bytes(valid_hello(lh, 0x99));
        cl.send_all(b.data(), b.size());
        void *rc = nullptr;
        const auto deadline = Clock::now() + milliseconds(2000);
        while (rc == nullptr && Clock::now() < deadline) {
            REQUIRE(vn::accept(c.lc, &rc) == 0);
            sleep_briefly();
        }
        REQUIRE(rc != nullptr);
        c.recvs.push_back(rc);
        std::array<uint8_t, vn::tcp::AcceptAnswer::kSize> ans{};
        REQUIRE(cl.recv_exact(ans.data(), ans.size(), 1000));
        CHECK(vn::tcp::get_le(ans.data(), 4) == vn::tcp::AcceptAnswer::kMagic);
        CHECK(vn::tcp::get_le(ans.data() + 4, 4) == 0);
    }

    // The listener still serves a genuine peer.
    void *sc = nullptr, *rc = nullptr;
    connect_pair(c, handle, &sc, &rc);
    transfer(sc, rc, 300000, 1, 3);
    CHECK(c.close_all() == 0);
}

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
