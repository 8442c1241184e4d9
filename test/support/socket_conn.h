// SPDX-License-Identifier: Apache-2.0
// One connection over the TCP fabric's real path code (tcp/tcp_path.h) without a network:
// each path is N stream socketpairs (AF_UNIX, non-blocking), so the tests exercise framing,
// partial writes, control frames and the back channel exactly as over TCP. Paths can be
// broken (shut down, both ends see it) and rebuilt (a fresh set of socketpairs handed to the
// receiving comm, as a listener would). Not thread-safe; comms are driven by their test()
// calls (nothing is attached to the progress engine).
#pragma once

#include <catch2/catch.hpp>

#include <array>
#include <deque>
#include <memory>
#include <string>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

#include "handover.h"
#include "recv_comm.h"
#include "send_comm.h"
#include "tcp/tcp_path.h"

namespace vigil::test::sock {

namespace vn = vigil::net;
namespace vt = vigil::net::tcp;

struct Options {
    int nstreams = 2;
    size_t chunk = 64 * 1024;
    int sndbuf = 0; // > 0: SO_SNDBUF of every socket (small values force partial writes)
    bool backup = true;
    bool rebuild = false;
};

/// The fds of one path's streams, both ends, for the test to break.
struct PathFds {
    std::vector<int> send_side, recv_side;
};

/// A path's two halves over fresh socketpairs.
inline void make_path(const Options &o, int slot, std::unique_ptr<vn::SendPath> *sp,
                      std::unique_ptr<vn::RecvPath> *rp, PathFds *fds)
{
    std::vector<vigil::net::UniqueFd> a, b;
    *fds = PathFds{};
    for (int i = 0; i < o.nstreams; ++i) {
        int sv[2];
        REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
        if (o.sndbuf > 0)
            for (int fd : sv) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &o.sndbuf, sizeof(o.sndbuf));
        a.emplace_back(sv[0]);
        b.emplace_back(sv[1]);
        fds->send_side.push_back(sv[0]);
        fds->recv_side.push_back(sv[1]);
    }
    const int dev = 20 + slot;
    static uint64_t next_id = 0;
    vn::PathIdentity id;
    id.id = ++next_id;
    id.slot = slot;
    id.dev = dev;
    id.dev_name = "sock" + std::to_string(dev);
    // Moved in, not assigned from literals: GCC 12 at -O3 reports a false -Wrestrict on a
    // one-character literal's assignment once it is inlined here (GCC bug 105329).
    id.local = std::string("a");
    id.peer = std::string("b");
    id.detail = std::to_string(o.nstreams) + " streams";
    *sp = std::make_unique<vt::TcpSendPath>(std::move(a), id, o.chunk);
    std::swap(id.local, id.peer); // the receiving end: "b", its peer "a"
    *rp = std::make_unique<vt::TcpRecvPath>(std::move(b), id);
}

/// What the rebuilder and acceptor share with the test.
struct Rebuilds {
    std::array<bool, vn::kMaxPaths> refuse{{true, true}};
    std::array<int, vn::kMaxPaths> built{{0, 0}};
    std::deque<std::unique_ptr<vn::RecvPath>> handover;
    std::array<PathFds, vn::kMaxPaths> *fds = nullptr; // updated with each rebuilt path
    Options opt;
};

class Rebuilder final : public vn::PathRebuilder
{
public:
    explicit Rebuilder(Rebuilds &r) : r_(r) {}
    bool can_rebuild(int) const override { return true; }
    int progress(int slot, std::unique_ptr<vn::SendPath> *out) override
    {
        const size_t s = static_cast<size_t>(slot);
        if (r_.refuse[s]) return -ECONNREFUSED;
        std::unique_ptr<vn::RecvPath> rp;
        make_path(r_.opt, slot, out, &rp, &(*r_.fds)[s]);
        r_.handover.push_back(std::move(rp));
        ++r_.built[s];
        return 0;
    }

private:
    Rebuilds &r_;
};

/// Both comms of one connection over socketpair paths.
struct Conn {
    std::array<PathFds, vn::kMaxPaths> fds;
    Rebuilds fab;
    std::unique_ptr<vn::SendComm> send;
    std::unique_ptr<vn::RecvComm> recv;

    Conn(const vn::FailoverConfig &cfg, const Options &o)
    {
        fab.opt = o;
        fab.fds = &fds;
        vn::SendPaths sp;
        vn::RecvPaths rp;
        std::array<int, vn::kMaxPaths> devs{{-1, -1}};
        for (int k = 0; k < (o.backup ? vn::kMaxPaths : 1); ++k) {
            const size_t s = static_cast<size_t>(k);
            make_path(o, k, &sp.paths[s], &rp.paths[s], &fds[s]);
            devs[s] = 20 + k;
        }
        rp.devs = devs;
        if (o.rebuild) {
            sp.rebuilder = std::make_unique<Rebuilder>(fab);
            rp.acceptor = std::make_unique<HandoverAcceptor>(fab.handover);
        }
        send = std::make_unique<vn::SendComm>(std::move(sp), devs, cfg, vn::TelemetryConfig{});
        recv = std::make_unique<vn::RecvComm>(std::move(rp), devs, cfg, vn::TelemetryConfig{});
    }
    /// Breaks path `slot` as a dead port would look to both ends (every stream reset).
    void break_path(int slot)
    {
        for (int fd : fds[static_cast<size_t>(slot)].send_side) shutdown(fd, SHUT_RDWR);
        for (int fd : fds[static_cast<size_t>(slot)].recv_side) shutdown(fd, SHUT_RDWR);
    }
};

} // namespace vigil::test::sock
