// SPDX-License-Identifier: Apache-2.0
// Helpers of the handshake tests (test_handshake*.cc): WARN capture, plugin sessions, genuine
// connections and transfers, raw TCP clients and the listener's rejection checks.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
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
#include "warn_capture.h"

namespace vn = vigil::net;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Shared by both test files: one definition each (inline), so that one WARN log and one
// environment set-up serve the whole process.
namespace handshake_test {

inline constexpr int kTimeoutMs = 300; // VIGIL_HANDSHAKE_TIMEOUT_MS for this process

// Runs before Catch's main, hence before any plugin_init.
inline const bool g_env_ready = [] {
    setenv("VIGIL_HANDSHAKE_TIMEOUT_MS", "300", 1);
    setenv("VIGIL_SOCKET_IFNAME", "=lo", 0); // keep the caller's choice when given
    return true;
}();

// ---- WARN capture -----------------------------------------------------------------------

// The plugin's WARN lines (HANDSHAKE_TEST_VERBOSE=1 echoes them).
using vigil::test::g_warn_mu;
using vigil::test::g_warns;
inline constexpr char kVerboseEnv[] = "HANDSHAKE_TEST_VERBOSE";

inline size_t warn_mark()
{
    std::lock_guard<std::mutex> lock(g_warn_mu);
    return g_warns.size();
}

inline std::vector<std::string> warns_since(size_t mark)
{
    std::lock_guard<std::mutex> lock(g_warn_mu);
    return {g_warns.begin() + static_cast<std::ptrdiff_t>(std::min(mark, g_warns.size())),
            g_warns.end()};
}

/// WARNs since `mark` containing every one of `needles`.
inline size_t count_since(size_t mark, std::initializer_list<const char *> needles)
{
    size_t n = 0;
    for (const std::string &w : warns_since(mark)) {
        bool all = true;
        for (const char *s : needles) all = all && w.find(s) != std::string::npos;
        n += all ? 1 : 0;
    }
    return n;
}

inline std::string dump_since(size_t mark)
{
    std::string out;
    for (const std::string &w : warns_since(mark)) out += "  WARN: " + w + "\n";
    return out.empty() ? "  (no WARN)\n" : out;
}

// The listener's rejection line: "dev lo: rejected connection from <peer>: <why>; still listening".
inline constexpr const char *kRejected = "rejected connection from";

// ---- Plugin session and comm ownership --------------------------------------------------

/// plugin_init on construction, plugin_finalize on destruction (balanced even when a REQUIRE
/// throws out of the test).
struct Session {
    int rc;
    Session()
    {
        (void)g_env_ready;
        rc = vn::plugin_init(&vigil::test::warn_logger<kVerboseEnv>, 12);
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

inline uint32_t get_le32(const uint8_t *p)
{
    return static_cast<uint32_t>(vn::tcp::get_le(p, 4));
}

/// Recomputes the handle's checksum so that a deliberately edited handle is well-formed.
inline void reseal(Handle &h)
{
    vn::tcp::put_le(h.data() + 104, vn::fnv1a32(h.data(), 104), 4);
}

inline bool scratch_is_zero(const Handle &h)
{
    return std::all_of(h.begin() + vn::ListenHandle::kScratchOffset, h.end(),
                       [](uint8_t b) { return b == 0; });
}

inline void sleep_briefly()
{
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

/// listen(0) into `c.lc` and `handle`; returns the decoded handle.
inline vn::ListenHandle open_listener(Comms &c, Handle &handle)
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
inline void connect_pair(Comms &c, Handle &handle, void **sc, void **rc)
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

inline uint8_t pattern(size_t i, uint32_t seed)
{
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u + seed * 40503u + 0x9e3779b9u;
    x ^= x >> 15;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    return static_cast<uint8_t>(x);
}

inline size_t first_mismatch(const uint8_t *got, size_t n, uint32_t seed)
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

inline void exchange(void *sc, void *rc, const std::vector<SendSpec> &sends,
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
inline void transfer(void *sc, void *rc, size_t size, int tag, uint32_t seed)
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

inline std::array<uint8_t, vn::tcp::Hello::kSize> hello_bytes(const vn::tcp::Hello &h)
{
    std::array<uint8_t, vn::tcp::Hello::kSize> b{};
    h.encode(b.data());
    return b;
}

inline vn::tcp::Hello valid_hello(const vn::ListenHandle &lh, uint64_t conn_id)
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
inline void drive_accept(void *lc, int ms, int *produced, Pred done)
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
/// `why`), then a little longer to catch duplicates. Checks: exactly one such WARN since
/// `mark`, exactly one rejection of any kind, no recvComm, the client's connection closed by
/// the listener. Take `mark` before the client sends: the progress engine accepts and judges
/// what arrives on the listening socket at once, before the test's next accept() call.
inline void expect_rejected(void *lc, RawClient &client, const char *why, size_t mark,
                            int wait_ms = 2000)
{
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

} // namespace handshake_test
