// SPDX-License-Identifier: Apache-2.0
// One connection over the verbs fabric's real path code (verbs/verbs_path.h) in one process,
// on the RDMA lab's rxe ports: the primary path from rxe_a0 to rxe_b0, the backup from rxe_a1
// to rxe_b1, their QPs connected directly (no set-up socket). Paths can be broken (their QPs
// moved to the error state at both ends) and rebuilt (fresh QPs handed to the receiving comm,
// as a listener would). Comms are driven by their test() calls (nothing is attached to the
// progress engine). Only where those ports exist (the lab's guest).
#pragma once

#include <catch2/catch.hpp>

#include <array>
#include <deque>
#include <memory>
#include <string>

#include "fabrics.h"
#include "handover.h"
#include "nccl_abi/net_common.h"
#include "recv_comm.h"
#include "send_comm.h"
#include "verbs/flush.h"
#include "verbs/verbs_fabric.h"
#include "verbs/verbs_path.h"

namespace vigil::test::rdma {

namespace vn = vigil::net;
namespace vf = vigil::net::verbs_fabric;

/// The lab's four ports as one fabric (devices sorted: rxe_a0, rxe_a1, rxe_b0, rxe_b1).
/// Opened once per process. Returns nullptr (with a Catch FAIL) when they are not there.
inline vf::VerbsFabric &lab_fabric()
{
    static std::unique_ptr<vf::VerbsFabric> f = [] {
        vigil::Params p;
        p.ib_hca = "=rxe_a0,rxe_a1,rxe_b0,rxe_b1";
        p.ib_retry_cnt = 5; // rxe: 7 means retry for ever
        p.ib_timeout = 14;
        p.ib_qps_per_conn = 2; // messages spread over two QPs per path
        std::unique_ptr<vf::VerbsFabric> out;
        std::string why;
        const int rc = vf::VerbsFabric::open(p, &out, &why);
        INFO(why);
        REQUIRE(rc == 0);
        REQUIRE(out->devices().size() == 4);
        return out;
    }();
    return *f;
}

/// Both halves of one path from device `from` to device `to`, QPs connected to each other.
struct PathPair {
    std::unique_ptr<vn::SendPath> send;
    std::unique_ptr<vn::RecvPath> recv;
    vf::QpSet *send_qps = nullptr, *recv_qps = nullptr;
};

inline PathPair make_path(int slot, int from, int to)
{
    vf::VerbsFabric &f = lab_fabric();
    static uint64_t next_id = 0;
    auto s = std::make_unique<vf::QpSet>(), r = std::make_unique<vf::QpSet>();
    std::string why;
    INFO(why);
    REQUIRE(s->create(f.port_info(from), f.qp_config(-1), vf::End::kSender, &why) == 0);
    REQUIRE(r->create(f.port_info(to), f.qp_config(-1), vf::End::kReceiver, &why) == 0);
    REQUIRE(s->connect(r->local_end(), &why) == 0);
    REQUIRE(r->connect(s->local_end(), &why) == 0);
    vn::PathIdentity id;
    id.slot = slot;
    id.id = ++next_id;
    id.dev = from;
    id.dev_name = f.dev_name(from);
    id.local = "qp";
    id.peer = "qp";
    PathPair p;
    p.send_qps = s.get();
    p.recv_qps = r.get();
    p.send = std::make_unique<vf::VerbsSendPath>(std::move(s), id);
    id.dev = to;
    id.dev_name = f.dev_name(to);
    p.recv = std::make_unique<vf::VerbsRecvPath>(std::move(r), id);
    return p;
}

/// Shared with the rebuilder and acceptor.
struct Rebuilds {
    std::array<bool, vn::kMaxPaths> refuse{{true, true}};
    std::deque<std::unique_ptr<vn::RecvPath>> handover;
    std::array<vf::QpSet *, vn::kMaxPaths> send_qps{}, recv_qps{};
};

inline constexpr std::array<int, vn::kMaxPaths> kFrom{{0, 1}}, kTo{{2, 3}};

class Rebuilder final : public vn::PathRebuilder
{
public:
    explicit Rebuilder(Rebuilds &r) : r_(r) {}
    bool can_rebuild(int) const override { return true; }
    int progress(int slot, std::unique_ptr<vn::SendPath> *out) override
    {
        const size_t s = static_cast<size_t>(slot);
        if (r_.refuse[s]) return -ECONNREFUSED;
        PathPair p = make_path(slot, kFrom[s], kTo[s]);
        r_.send_qps[s] = p.send_qps;
        r_.recv_qps[s] = p.recv_qps;
        *out = std::move(p.send);
        r_.handover.push_back(std::move(p.recv));
        return 0;
    }

private:
    Rebuilds &r_;
};

/// Both comms of one connection. Buffers must be registered (reg()): RDMA needs keys.
struct Conn {
    Rebuilds fab;
    std::unique_ptr<vn::SendComm> send;
    std::unique_ptr<vn::RecvComm> recv;

    /// With `flush`, the receiving comm gets a flusher (a loopback QP) on each of its devices,
    /// as the listener gives one where the port writes GPU memory.
    Conn(const vn::FailoverConfig &cfg, bool backup, bool rebuild, bool flush = false)
    {
        vn::SendPaths sp;
        vn::RecvPaths rp;
        std::array<int, vn::kMaxPaths> sdev{{-1, -1}}, rdev{{-1, -1}};
        for (int k = 0; k < (backup ? vn::kMaxPaths : 1); ++k) {
            const size_t s = static_cast<size_t>(k);
            PathPair p = make_path(k, kFrom[s], kTo[s]);
            fab.send_qps[s] = p.send_qps;
            fab.recv_qps[s] = p.recv_qps;
            sp.paths[s] = std::move(p.send);
            rp.paths[s] = std::move(p.recv);
            sdev[s] = kFrom[s];
            rdev[s] = kTo[s];
        }
        rp.devs = rdev;
        for (size_t k = 0; flush && k < vn::kMaxPaths; ++k) {
            if (rdev[k] < 0) continue;
            std::unique_ptr<vf::VerbsFlusher> f;
            std::string why;
            INFO(why);
            REQUIRE(vf::VerbsFlusher::create(lab_fabric().port_info(rdev[k]), lab_fabric().qp_config(-1), &f, &why) == 0);
            rp.flushers[k] = std::move(f);
        }
        if (rebuild) {
            sp.rebuilder = std::make_unique<Rebuilder>(fab);
            rp.acceptor = std::make_unique<HandoverAcceptor>(fab.handover);
        }
        send = std::make_unique<vn::SendComm>(std::move(sp), sdev, cfg, vn::TelemetryConfig{});
        recv = std::make_unique<vn::RecvComm>(std::move(rp), rdev, cfg, vn::TelemetryConfig{});
    }
    /// Breaks path `slot`: its QPs go to the error state at both ends.
    void break_path(int slot)
    {
        const size_t s = static_cast<size_t>(slot);
        if (fab.send_qps[s] != nullptr) fab.send_qps[s]->to_error();
        if (fab.recv_qps[s] != nullptr) fab.recv_qps[s]->to_error();
    }
    /// A memory region over [p, p + n) registered on the send (or receive) side's devices.
    /// Null for an empty buffer (nothing to write, nothing to register), as NCCL may pass.
    static vn::MemRegion *reg(const void *p, size_t n, bool send_side)
    {
        if (n == 0) return nullptr;
        auto *m = new vn::MemRegion;
        m->base = static_cast<const uint8_t *>(p);
        m->size = n;
        m->type = NCCL_PTR_HOST;
        const std::array<int, vn::kMaxPaths> &devs = send_side ? kFrom : kTo;
        for (size_t k = 0; k < devs.size(); ++k) {
            m->devs[k].dev = devs[k];
            REQUIRE(lab_fabric().reg_mr(devs[k], const_cast<void *>(p), n, NCCL_PTR_HOST, &m->devs[k].mr) == 0);
        }
        return m;
    }
};

} // namespace vigil::test::rdma
