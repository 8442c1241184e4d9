// SPDX-License-Identifier: Apache-2.0
// The verbs fabric's comms on the lab's rxe ports, beyond what the shared matching cases
// (test/unit/test_matching.cc, built into this executable too) check: messages larger than
// one RDMA write across a failover, a remote-key error that must fail the connection at once
// (no failover: the same write fails on any path), unregistered memory refused with a clear
// error, the registration cache, and multipath: messages striped over both ports' paths.
#include <catch2/catch.hpp>

#include <vector>

#include "abi_guard.h"
#include "nccl_abi/net_common.h"
#include "traffic.h"
#include "verbs_conn.h"

namespace vn = vigil::net;
using vigil::test::Traffic;
using vigil::test::rdma::Conn;

namespace {

vn::FailoverConfig lab_config()
{
    vn::FailoverConfig c;
    c.fatal_timeout_ns = 30'000'000'000ull;
    c.stall_timeout_ns = 10'000'000'000ull;
    c.probe_interval_ns = 20'000'000ull;
    c.failback_hold_ns = 50'000'000ull;
    c.rebuild_backoff_min_ns = 10'000'000ull;
    c.rebuild_backoff_max_ns = 100'000'000ull;
    return c;
}

// Polls both comms' requests until `done` or `limit_ms`; every test() must return 0.
template <class Done>
bool poll_until(Done done, uint64_t limit_ms)
{
    const uint64_t deadline = vigil::now_ns() + limit_ms * 1'000'000ull;
    while (!done()) {
        if (vigil::now_ns() > deadline) return false;
        vigil::test::nap();
    }
    return true;
}

} // namespace

TEST_CASE("messages of several RDMA writes each, spread over two QPs, exact across a failover and "
          "a failback", "[comm]")
{
    Conn c(lab_config(), true, true);
    c.fab.refuse = {false, false};
    Traffic t(*c.send, *c.recv, 120'000);
    t.set_registrar(&Conn::reg);
    // 3 MiB and odd sizes: several writes per message (kMaxWriteBytes), records on both QPs.
    const std::vector<size_t> sizes{3u << 20, (3u << 20) + 1, 1, 4096, (1u << 20) - 3, 0, 2u << 20};
    for (int round = 0; round < 3; ++round)
        for (size_t sz : sizes) {
            const int id = t.send(sz, 7);
            t.recv({4u << 20}, {7}, {id});
        }
    // Break the primary as soon as the first message is posted (Soft-RoCE may have written
    // it already, but the sender has not seen its completion), the rest waiting behind it.
    for (int i = 0; !t.posted(0); ++i) {
        REQUIRE(i < 100'000);
        t.poll_recvs();
        t.post_sends();
    }
    REQUIRE_FALSE(t.finished());
    c.break_path(vn::kPrimary);
    t.run();
    const auto st = c.send->stats();
    CHECK(st.failovers >= 1);
    // The primary comes back (rebuilt) and carries traffic again.
    for (int i = 0; i < 3; ++i) {
        const int id = t.send(1u << 20, 8);
        t.recv({1u << 20}, {8}, {id});
    }
    t.run();
    CHECK(c.send->stats().failbacks + c.send->stats().rebuilds >= 1);
}

TEST_CASE("each path end's queues are as deep as its role needs, and a full window of small "
          "messages with its CTS groups still completes exactly", "[comm]")
{
    namespace vf = vigil::net::verbs_fabric;
    Conn c(lab_config(), true, false);
    for (size_t k = 0; k < vn::kMaxPaths; ++k) {
        // A sending end posts the data and hears only control messages and credits; a
        // receiving end the other way round. Providers may grant more than asked.
        const vigil::verbs::QpCaps &s = c.fab.send_qps[k]->qp(0).caps();
        const vigil::verbs::QpCaps &r = c.fab.recv_qps[k]->qp(0).caps();
        CHECK(s.max_send_wr >= vf::kDeepDepth);
        CHECK(r.max_recv_wr >= vf::kDeepDepth);
        CHECK(s.max_recv_wr >= vf::kShallowDepth);
        CHECK(r.max_send_wr >= vf::kShallowDepth);
        CHECK(s.max_recv_wr < vf::kDeepDepth);
        CHECK(r.max_send_wr < vf::kDeepDepth);
        CHECK(c.fab.recv_qps[k]->send_depth() == vf::kShallowDepth);
    }
    static_assert(vf::kDataDepth < vn::kMaxInflight);
    // NCCL's most: kMaxRequests grouped receives of kMaxRecvs each, a CTS group per receive
    // on the receiving end's shallow send queue, and kMaxInflight sends at once, more than
    // the sender's QP takes (kDataDepth): the rest wait for its completions.
    Traffic t(*c.send, *c.recv, 60'000, true);
    t.set_registrar(&Conn::reg);
    for (int round = 0; round < 2; ++round) {
        std::vector<int> ids;
        for (int i = 0; i < vn::kMaxInflight; ++i) ids.push_back(t.send(static_cast<size_t>(8 + i % 5), i % vn::kMaxRecvs));
        for (int g = 0; g < vn::kMaxRequests; ++g) {
            std::vector<size_t> caps;
            std::vector<int> tags, expect;
            for (int b = 0; b < vn::kMaxRecvs; ++b) {
                caps.push_back(64);
                tags.push_back(b);
                expect.push_back(ids[static_cast<size_t>(g * vn::kMaxRecvs + b)]);
            }
            t.recv(caps, tags, expect);
        }
        t.run();
    }
    CHECK(c.send->stats().failovers == 0);
}

TEST_CASE("multipath: messages striped over both ports, exact while the active path fails, "
          "fails back, and the shared path fails",
          "[comm]")
{
    vn::FailoverConfig cfg = lab_config();
    cfg.multipath = true;
    cfg.piece_bytes = 64 << 10; // many pieces per message, both paths busy
    Conn c(cfg, true, true);
    c.fab.refuse = {false, false};
    Traffic t(*c.send, *c.recv, 120'000);
    t.set_registrar(&Conn::reg);
    // Odd sizes: a last piece shorter than the others, messages of one piece, of none.
    const std::vector<size_t> sizes{(1u << 20) + 3, 100, 300000, 0, 2u << 20, (64u << 10) + 1};
    // Queues `rounds` rounds of every size; returns the id of the first message.
    auto queue = [&](int rounds, int tag) {
        int first = -1;
        for (int k = 0; k < rounds; ++k)
            for (size_t sz : sizes) {
                const int id = t.send(sz, tag);
                if (first < 0) first = id;
                t.recv({2u << 20}, {tag}, {id});
            }
        return first;
    };
    // Drives both comms until message `id` is posted, so what follows is in flight.
    auto until_posted = [&](int id) {
        for (int i = 0; !t.posted(id); ++i) {
            REQUIRE(i < 100'000);
            t.poll_recvs();
            t.post_sends();
        }
    };
    queue(1, 1);
    t.run();
    CHECK(c.send->stats().pieces > 0); // the backup carried pieces beside the primary
    CHECK(c.send->stats().failovers == 0);

    // The active path breaks with pieces in flight on both.
    until_posted(queue(3, 2) + 1);
    REQUIRE_FALSE(t.finished());
    c.break_path(vn::kPrimary);
    t.run();
    CHECK(c.send->stats().failovers == 1);

    // The rebuilt primary takes the connection back; then the backup shares again.
    for (int k = 0; c.send->stats().failbacks == 0; ++k) {
        REQUIRE(k < 200);
        queue(1, 3);
        t.run();
    }
    const uint64_t before = c.send->stats().pieces;
    queue(3, 3);
    t.run();
    CHECK(c.send->stats().pieces > before);

    // Now the shared path breaks mid-stream: a new generation on the primary replays.
    until_posted(queue(3, 4) + 1);
    REQUIRE_FALSE(t.finished());
    c.break_path(vn::kBackup);
    t.run();
    const auto st = c.send->stats();
    CHECK(st.failovers == 2);
    CHECK(st.generation >= 4);
    t.check_spent();
}

TEST_CASE("a receive buffer advertised with a wrong remote key fails the connection at once, with "
          "no failover", "[comm][access]")
{
    Conn c(lab_config(), true, false);
    std::vector<uint8_t> src(64 << 10, 0x3C), dst(64 << 10, 0xEE);
    vn::MemRegion *smr = Conn::reg(src.data(), src.size(), true);
    // The receiver's region names keys that no MR has: the RDMA write draws a remote access
    // error (a protection class completion), which another path would draw too.
    auto *dmr = new vn::MemRegion;
    dmr->base = dst.data();
    dmr->size = dst.size();
    dmr->type = NCCL_PTR_HOST;
    for (size_t k = 0; k < vn::kMaxPaths; ++k) {
        auto bogus = std::make_shared<vn::FabricMr>();
        bogus->lkey = 0x00BAD000u + static_cast<uint32_t>(k);
        bogus->rkey = 0x00BAD000u + static_cast<uint32_t>(k);
        dmr->devs[k].dev = vigil::test::rdma::kTo[k];
        dmr->devs[k].mr = bogus;
    }
    void *data = dst.data();
    size_t cap = dst.size();
    int tag = 1;
    vn::Request *r = nullptr, *s = nullptr;
    REQUIRE(c.recv->irecv(1, &data, &cap, &tag, &dmr, &r) == 0);
    REQUIRE(poll_until(
        [&] {
            int d = 0;
            REQUIRE(c.recv->test(r, &d, nullptr) == 0);
            REQUIRE(c.send->isend(src.data(), src.size(), tag, smr, &s) == 0);
            return s != nullptr;
        },
        20'000));
    int rc = 0, d = 0, size = -1;
    REQUIRE(poll_until(
        [&] {
            rc = c.send->test(s, &d, &size);
            return rc != 0 || d == 1;
        },
        30'000));
    CHECK(d == 0);
    CHECK(rc == -EACCES);
    CHECK(vigil::to_nccl_result(rc) == ncclRemoteError);
    CHECK(c.send->stats().failovers == 0);
    CHECK(vigil::test::all_equal(dst.data(), dst.size(), 0xEE));
    vn::MemRegion::unref(smr);
    vn::MemRegion::unref(dmr);
}

TEST_CASE("isend from memory not registered on the path's device is refused with a clear error",
          "[comm][access]")
{
    Conn c(lab_config(), true, false);
    std::vector<uint8_t> src(4096, 0x11), dst(4096, 0xEE);
    vn::MemRegion *dmr = Conn::reg(dst.data(), dst.size(), false);
    void *data = dst.data();
    size_t cap = dst.size();
    int tag = 2;
    vn::Request *r = nullptr, *s = nullptr;
    REQUIRE(c.recv->irecv(1, &data, &cap, &tag, &dmr, &r) == 0);
    int rc = 0;
    REQUIRE(poll_until(
        [&] {
            int d = 0;
            REQUIRE(c.recv->test(r, &d, nullptr) == 0);
            rc = c.send->isend(src.data(), src.size(), tag, nullptr, &s);
            return rc != 0 || s != nullptr;
        },
        20'000));
    // Refused at isend or at the first test: either way an error NCCL reports, never a hang
    // and never a failover (the backup would refuse it the same way).
    if (rc == 0) {
        int d = 0, size = -1;
        REQUIRE(poll_until(
            [&] {
                rc = c.send->test(s, &d, &size);
                return rc != 0 || d == 1;
            },
            20'000));
    }
    CHECK(rc != 0);
    CHECK(c.send->stats().failovers == 0);
    CHECK(vigil::test::all_equal(dst.data(), dst.size(), 0xEE));
    vn::MemRegion::unref(dmr);
}

TEST_CASE("registrations are cached per HCA: a buffer inside a registered one shares its MR",
          "[comm][mr]")
{
    auto &f = vigil::test::rdma::lab_fabric();
    std::vector<uint8_t> buf(1 << 20);
    std::shared_ptr<vn::FabricMr> a, b, other;
    REQUIRE(f.reg_mr(0, buf.data(), buf.size(), NCCL_PTR_HOST, &a) == 0);
    REQUIRE(f.reg_mr(0, buf.data() + 4096, 8192, NCCL_PTR_HOST, &b) == 0);
    CHECK(a.get() == b.get());
    CHECK(a->rkey != 0);
    REQUIRE(f.reg_mr(1, buf.data(), buf.size(), NCCL_PTR_HOST, &other) == 0); // another HCA: its own MR
    CHECK(other.get() != a.get());
    // A type this port cannot reach is refused.
    std::shared_ptr<vn::FabricMr> cuda;
    CHECK(f.reg_mr(0, buf.data(), buf.size(), NCCL_PTR_CUDA, &cuda) == -EINVAL);
    CHECK(cuda == nullptr);
}

TEST_CASE("iflush: a read through each receiving port's loopback QP, after the writes, completes "
          "the flush", "[comm][flush]")
{
    Conn c(lab_config(), true, false, /*flush=*/true);
    Traffic t(*c.send, *c.recv, 60'000);
    t.set_registrar(&Conn::reg);
    const int a = t.send(200'000, 3), b = t.send(64, 3);
    const int r = t.recv({256'000, 128}, {3, 3}, {a, b});
    t.run();
    REQUIRE(t.recv_done(r));
    // The buffers as NCCL would flush them: device memory (here host memory typed so, which
    // the read path treats alike: rxe has no GPUDirect).
    auto &rv = t.recvs[static_cast<size_t>(r)];
    std::vector<vn::MemRegion *> mrs;
    struct Unref {
        std::vector<vn::MemRegion *> &v;
        ~Unref()
        {
            for (vn::MemRegion *m : v) vn::MemRegion::unref(m);
        }
    } unref{mrs};
    for (size_t k = 0; k < rv.bufs.size(); ++k) {
        vn::MemRegion *m = Conn::reg(rv.bufs[k].data(), rv.bufs[k].size(), false);
        m->type = NCCL_PTR_CUDA;
        mrs.push_back(m);
    }
    void *data[2] = {rv.bufs[0].data(), rv.bufs[1].data()};
    int sizes[2] = {200'000, 64};
    vn::Request *f = nullptr;
    REQUIRE(c.recv->iflush(2, data, sizes, mrs.data(), &f) == 0);
    REQUIRE(f != nullptr);
    int d = 0;
    const uint64_t deadline = vigil::now_ns() + 30'000'000'000ull;
    while (d == 0) {
        REQUIRE(vigil::now_ns() < deadline);
        REQUIRE(c.recv->test(f, &d, nullptr) == 0);
        vigil::test::nap();
    }
    // Host memory needs none: NULL, nothing to wait for.
    for (vn::MemRegion *m : mrs) m->type = NCCL_PTR_HOST;
    REQUIRE(c.recv->iflush(2, data, sizes, mrs.data(), &f) == 0);
    CHECK(f == nullptr);
}

