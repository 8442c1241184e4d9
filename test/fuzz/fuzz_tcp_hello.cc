// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the TCP listener's hello handling (net_plugin/tcp/tcp_setup.cc): each hello that
// arrives is checked and filed under its connection, path and stream, until accept() hands out
// the connection or take_rebuilt() a rebuilt path. Stream index, stream count, path kind, path
// count, connection and path ids all come from the peer.
//
// Every input runs against a fresh listener on two loopback devices, its connections being
// AF_UNIX socket pairs (no TCP handshake per hello). Input: records of 41 bytes, at most 24:
//   [0] control: bit 0 the device the connection arrives on, bit 1 call accept() after it,
//       bit 2 poll for a rebuilt path of its connection after it
//   [1,41) the hello; its nonce bytes are XORed with the listener's nonce (zeros there: the
//       right nonce), so the fuzzer reaches what follows the nonce check
// A last accept() and rebuild poll run after the records. Properties: no memory error, no
// leaked socket; a connection handed out has the streams its hellos announced, each path on
// one device, a primary, and slots and devices within bounds.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "clock.h"
#include "fuzz_util.h"
#include "params.h"
#include "progress.h"
#include "tcp/tcp_setup.h"

namespace vn = vigil::net;
namespace tcp = vigil::net::tcp;

namespace {

constexpr size_t kRecord = 1 + tcp::Hello::kSize;
constexpr size_t kMaxRecords = 24;

std::vector<vigil::net::Device> loopback_devices()
{
    std::vector<vigil::net::Device> devs(2);
    for (size_t i = 0; i < devs.size(); ++i) {
        devs[i].name = i == 0 ? "lo" : "lo:1";
        devs[i].addr.family = AF_INET;
        devs[i].addr.addr = {127, 0, 0, 1};
    }
    return devs;
}

void check_paths(const vn::RecvPaths &out)
{
    if (!out.paths[vn::kPrimary]) {
        FUZZ_CHECK(!out.paths[vn::kBackup] && !out.acceptor);
        return;
    }
    FUZZ_CHECK(out.acceptor != nullptr);
    for (int k = 0; k < vn::kMaxPaths; ++k) {
        const auto &p = out.paths[static_cast<size_t>(k)];
        if (!p) continue;
        FUZZ_CHECK(p->identity().slot == k);
        FUZZ_CHECK(p->identity().dev == 0 || p->identity().dev == 1);
        FUZZ_CHECK(p->identity().dev == out.devs[static_cast<size_t>(k)]);
        FUZZ_CHECK(p->identity().id != 0);
    }
}

void check_rebuilt(const std::unique_ptr<vn::RecvPath> &p)
{
    if (!p) return;
    FUZZ_CHECK(p->identity().slot == vn::kPrimary || p->identity().slot == vn::kBackup);
    FUZZ_CHECK(p->identity().dev == 0 || p->identity().dev == 1);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int * /*argc*/, char *** /*argv*/)
{
    vigil::fuzz::init();
    // Its epoll and wake descriptors live for the process: open them before counting.
    (void)vn::ProgressEngine::instance();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const std::vector<vigil::net::Device> devs = loopback_devices();
    std::vector<int> given; // descriptor numbers the listener was handed
    {
        vigil::Params params;
        vn::ListenHandle handle;
        std::shared_ptr<vn::rendezvous::Listening> listener;
        FUZZ_CHECK(tcp::listen(devs, 0, params, &handle, &listener) == 0);
        std::vector<vn::RecvPaths> accepted; // kept until the end, as the core keeps them
        std::vector<std::unique_ptr<vn::RecvPath>> rebuilt;
        std::vector<vigil::net::UniqueFd> peers; // the connecting ends
        vn::Endpoint peer;
        peer.family = AF_INET;
        peer.port = 4242;
        peer.addr = {127, 0, 0, 2};
        auto accept = [&] {
            vn::RecvPaths out;
            FUZZ_CHECK(listener->accept(&out) == 0);
            check_paths(out);
            if (out.paths[vn::kPrimary]) accepted.push_back(std::move(out));
        };
        auto poll_rebuilt = [&](uint64_t conn_id) {
            std::unique_ptr<vn::RecvPath> p;
            if (listener->take_rebuilt(conn_id, &p)) FUZZ_CHECK(p != nullptr);
            for (vn::RecvPaths &a : accepted) {
                std::unique_ptr<vn::RecvPath> q;
                FUZZ_CHECK(a.acceptor->poll(&q) == 0);
                check_rebuilt(q);
                if (q) rebuilt.push_back(std::move(q));
            }
            check_rebuilt(p);
            if (p) rebuilt.push_back(std::move(p));
        };
        for (size_t r = 0; r < kMaxRecords && (r + 1) * kRecord <= size; ++r) {
            const uint8_t *rec = data + r * kRecord;
            std::array<uint8_t, tcp::Hello::kSize> hello;
            std::memcpy(hello.data(), rec + 1, hello.size());
            for (size_t i = 0; i < handle.nonce.size(); ++i) hello[8 + i] ^= handle.nonce[i];
            int sv[2];
            FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
            peers.emplace_back(sv[1]);
            given.push_back(sv[0]);
            listener->arrive(std::make_unique<tcp::TcpArrival>(
                vigil::net::UniqueFd(sv[0]), rec[0] & 1, peer, vigil::now_ns() + 1'000'000'000ull,
                hello.data()));
            if (rec[0] & 2) accept();
            if (rec[0] & 4) poll_rebuilt(tcp::get_le(hello.data() + 24, 8));
        }
        accept();
        poll_rebuilt(0);
    }
    // Every socket the listener filed, handed out or dropped is closed with it.
    for (int fd : given) FUZZ_CHECK(fcntl(fd, F_GETFD) == -1 && errno == EBADF);
    return 0;
}
