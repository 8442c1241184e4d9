// SPDX-License-Identifier: Apache-2.0
// Receiver-driven matching, written once and run over every fabric that can run in-process:
// the fake fabric (test/support/fake_fabric.h) and the TCP fabric's real path code over
// socketpairs (test/support/socket_conn.h) in vigil-unit; the verbs fabric's real path code
// over the RDMA lab's rxe ports (test/support/verbs_conn.h) when built with
// VIGIL_MATCHING_VERBS (vigil-verbs-comm, run in the lab's guest). Grouped receives whose sends interleave their
// tags across groups (the pattern that NCCL produces when several GPUs share one connection
// with maxRecvs > 1), sends posted before any receive, receives posted late, sends larger
// and smaller than the posted buffer, and all of it across failover and failback.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "abi_guard.h"
#include "traffic.h"
#ifdef VIGIL_MATCHING_VERBS
#include "verbs_conn.h"
#else
#include "fake_fabric.h"
#include "socket_conn.h"
#endif

namespace vn = vigil::net;
using vigil::test::Traffic;

namespace {

vn::FailoverConfig quick_config()
{
    vn::FailoverConfig c;
    c.fatal_timeout_ns = 5'000'000'000ull;
    c.stall_timeout_ns = 2'000'000'000ull;
    c.probe_interval_ns = 10'000'000ull;
    c.failback_hold_ns = 20'000'000ull;
    c.rebuild_backoff_min_ns = 5'000'000ull;
    c.rebuild_backoff_max_ns = 20'000'000ull;
    return c;
}

#ifdef VIGIL_MATCHING_VERBS
// The verbs fabric's paths between the lab's rxe ports: RDMA writes into the advertised
// buffers, so every buffer is registered. Soft-RoCE under emulation is slow: deadlines x10.
struct VerbsFabric {
    static constexpr const char *kName = "verbs-rxe";
    vigil::test::rdma::Conn c;
    VerbsFabric(const vn::FailoverConfig &cfg, bool backup, bool rebuild) : c(cfg, backup, rebuild) {}
    vn::SendComm &send() { return *c.send; }
    vn::RecvComm &recv() { return *c.recv; }
    void break_path(int slot) { c.break_path(slot); }
    void allow_rebuild(int slot, bool ok) { c.fab.refuse[static_cast<size_t>(slot)] = !ok; }
    static Traffic::Registrar registrar() { return &vigil::test::rdma::Conn::reg; }
    static constexpr uint64_t kSlow = 3;
};
#define MATCHING_FABRICS VerbsFabric
#else
// The fake fabric: every path is a Lane.
struct FakeFabric {
    static constexpr const char *kName = "fake";
    vigil::test::fake::Net n;
    FakeFabric(const vn::FailoverConfig &cfg, bool backup, bool rebuild) : n(cfg, backup, rebuild) {}
    vn::SendComm &send() { return *n.send; }
    vn::RecvComm &recv() { return *n.recv; }
    vigil::test::fake::Lane &current(int slot)
    {
        const auto &r = n.fab.rebuilt[static_cast<size_t>(slot)];
        return r.empty() ? n.lane[static_cast<size_t>(slot)] : n.lane.at(r.back());
    }
    void break_path(int slot) { current(slot).break_link(); }
    void allow_rebuild(int slot, bool ok) { n.fab.refuse[static_cast<size_t>(slot)] = !ok; }
    static Traffic::Registrar registrar() { return {}; }
    static constexpr uint64_t kSlow = 1; // deadline multiplier
};

// The TCP fabric's paths over socketpairs: 3 streams, small chunks (many frames per message).
struct SocketFabric {
    static constexpr const char *kName = "tcp-socketpair";
    vigil::test::sock::Conn c;
    static vigil::test::sock::Options options(bool backup, bool rebuild)
    {
        vigil::test::sock::Options o;
        o.nstreams = 3;
        o.chunk = 4096;
        o.backup = backup;
        o.rebuild = rebuild;
        return o;
    }
    SocketFabric(const vn::FailoverConfig &cfg, bool backup, bool rebuild) : c(cfg, options(backup, rebuild)) {}
    vn::SendComm &send() { return *c.send; }
    vn::RecvComm &recv() { return *c.recv; }
    void break_path(int slot) { c.break_path(slot); }
    void allow_rebuild(int slot, bool ok) { c.fab.refuse[static_cast<size_t>(slot)] = !ok; }
    static Traffic::Registrar registrar() { return {}; }
    static constexpr uint64_t kSlow = 1;
};
#define MATCHING_FABRICS FakeFabric, SocketFabric
#endif

// A plan of grouped receives with random tags, and the sends that fill them: the k-th send
// with tag t must land in the k-th buffer with tag t, counting buffers group by group and,
// within a group, in index order (a send binds to the first unbound buffer with its tag in
// the oldest group that has one). Sends are listed in a random interleaving of the tags.
struct TaggedPlan {
    struct Group {
        std::vector<size_t> caps;
        std::vector<int> tags;
        std::vector<int> expect; // send index per buffer
    };
    std::vector<Group> groups;
    std::vector<std::pair<int32_t, size_t>> sends; // (tag, size), in posting order

    TaggedPlan(std::mt19937_64 &rng, int ngroups, int ntags, size_t max_bytes)
    {
        std::map<int32_t, std::vector<std::pair<size_t, size_t>>> slots; // tag -> (group, buffer)
        for (int g = 0; g < ngroups; ++g) {
            Group gr;
            const int n = 1 + static_cast<int>(rng() % vn::kMaxRecvs);
            for (int i = 0; i < n; ++i) {
                const int32_t tag = static_cast<int32_t>(rng() % static_cast<uint64_t>(ntags));
                gr.tags.push_back(tag);
                gr.caps.push_back(1 + rng() % max_bytes);
                slots[tag].emplace_back(static_cast<size_t>(g), static_cast<size_t>(i));
            }
            gr.expect.assign(static_cast<size_t>(n), -1);
            groups.push_back(gr);
        }
        // Interleave: draw the next tag at random among those with buffers left.
        std::map<int32_t, size_t> next;
        size_t left = 0;
        for (auto &[t, v] : slots) left += v.size();
        while (left > 0) {
            std::vector<int32_t> open;
            for (auto &[t, v] : slots)
                if (next[t] < v.size()) open.push_back(t);
            const int32_t t = open[rng() % open.size()];
            auto [g, b] = slots[t][next[t]++];
            const size_t cap = groups[g].caps[b];
            // Mostly smaller than the buffer, sometimes exactly its size, sometimes empty.
            const size_t size = rng() % 8 == 0 ? cap : (rng() % 16 == 0 ? 0 : rng() % (cap + 1));
            groups[g].expect[b] = static_cast<int>(sends.size());
            sends.emplace_back(t, size);
            --left;
        }
    }
};

// Posts the plan's sends and receives through `t` (receives as the request window allows)
// and runs it to completion.
void run_plan(Traffic &t, const TaggedPlan &p, uint64_t limit_ms, std::function<void()> meanwhile = {})
{
    for (auto [tag, size] : p.sends) t.send(size, tag);
    size_t next = 0;
    const uint64_t deadline = vigil::now_ns() + limit_ms * 1'000'000ull;
    while (!t.finished() || next < p.groups.size()) {
        INFO(t.state());
        REQUIRE(vigil::now_ns() < deadline);
        // Keep at most kMaxRequests receives outstanding, as NCCL does.
        size_t open = 0;
        for (size_t i = 0; i < t.recvs.size(); ++i) open += t.recv_done(static_cast<int>(i)) ? 0 : 1;
        while (next < p.groups.size() && open < static_cast<size_t>(vn::kMaxRequests)) {
            const auto &g = p.groups[next++];
            t.recv(g.caps, g.tags, g.expect);
            ++open;
        }
        t.poll();
        if (meanwhile) meanwhile();
        vigil::test::nap();
    }
    t.check_spent();
}

} // namespace

TEMPLATE_TEST_CASE("grouped receives: sends interleaving their tags across groups bind tag by tag, "
                   "group by group", "[matching]", MATCHING_FABRICS)
{
    INFO("fabric " << TestType::kName);
    std::mt19937_64 rng(0x7A65);
    for (int ntags : {2, 3, 5}) {
        INFO(ntags << " tags");
        TestType fx(quick_config(), true, false);
        Traffic t(fx.send(), fx.recv(), 10'000 * TestType::kSlow, /*per_tag=*/true);
        t.set_registrar(TestType::registrar());
        TaggedPlan plan(rng, 100, ntags, 20'000);
        run_plan(t, plan, 20'000 * TestType::kSlow);
        // Sends of one tag found no entry while another tag's sends completed the group.
        CHECK(t.null_sends > 0);
    }
}

TEMPLATE_TEST_CASE("the aws-ofi-nccl multi-tag pattern: two groups, tags 1,1,0,0", "[matching]",
                   MATCHING_FABRICS)
{
    INFO("fabric " << TestType::kName);
    TestType fx(quick_config(), true, false);
    Traffic t(fx.send(), fx.recv(), 2000 * TestType::kSlow, /*per_tag=*/true);
    t.set_registrar(TestType::registrar());
    const int a = t.send(16384, 1), b = t.send(16384, 1), c = t.send(100, 0), d = t.send(200, 0);
    t.recv({16384, 16384}, {0, 1}, {c, a});
    t.recv({16384, 16384}, {0, 1}, {d, b});
    t.run();
}

TEMPLATE_TEST_CASE("sends posted before any receive get NULL requests until the CTS arrives",
                   "[matching]", MATCHING_FABRICS)
{
    INFO("fabric " << TestType::kName);
    TestType fx(quick_config(), true, false);
    Traffic t(fx.send(), fx.recv(), 2000 * TestType::kSlow);
    t.set_registrar(TestType::registrar());
    for (int i = 0; i < 4; ++i) t.send(1000 + static_cast<size_t>(i), 5);
    t.run_for(20 * TestType::kSlow);
    CHECK_FALSE(t.posted(0));
    CHECK(t.null_sends > 0);
    CHECK(fx.send().stats().null_for_cts > 0);
    t.recv({2000, 2000}, {5, 5}, {0, 1});
    t.recv({1003}, {5}, {2});
    t.recv({1003}, {5}, {3});
    t.run();
}

TEMPLATE_TEST_CASE("receives posted 10-50 ms after the sends", "[matching]", MATCHING_FABRICS)
{
    INFO("fabric " << TestType::kName);
    TestType fx(quick_config(), true, false);
    Traffic t(fx.send(), fx.recv(), 2000 * TestType::kSlow);
    t.set_registrar(TestType::registrar());
    std::mt19937_64 rng(42);
    for (int k = 0; k < 5; ++k) {
        const int first = t.next_id();
        for (int i = 0; i < 3; ++i) t.send(10'000 + rng() % 10'000, 9);
        t.run_for((10 + rng() % 41) * TestType::kSlow);
        t.recv({20'000, 20'000, 20'000}, {9, 9, 9}, {first, first + 1, first + 2});
    }
    t.run();
}

TEMPLATE_TEST_CASE("a send larger than its receive buffer is refused; nothing is written and the "
                   "connection goes on", "[matching]", MATCHING_FABRICS)
{
    INFO("fabric " << TestType::kName);
    TestType fx(quick_config(), true, false);
    std::vector<uint8_t> big(300, 0x11), small(60, 0x22), dst(100 + 32, 0xEE);
    const Traffic::Registrar reg = TestType::registrar();
    auto mr = [&](std::vector<uint8_t> &v, bool send_side) {
        return reg ? reg(v.data(), v.size(), send_side) : nullptr;
    };
    vn::MemRegion *dst_mr = mr(dst, false), *big_mr = mr(big, true), *small_mr = mr(small, true);
    void *data = dst.data();
    size_t cap = 100;
    int tag = 3;
    vn::Request *r = nullptr;
    REQUIRE(fx.recv().irecv(1, &data, &cap, &tag, &dst_mr, &r) == 0);
    REQUIRE(r != nullptr);
    // Wait for the CTS: then the oversize send is refused, not answered NULL.
    vn::Request *s = nullptr;
    int rc = 0;
    for (uint64_t i = 0; i < 2000 * TestType::kSlow && rc == 0; ++i) {
        rc = fx.send().isend(big.data(), big.size(), tag, big_mr, &s);
        REQUIRE(s == nullptr);
        int d = 0;
        REQUIRE(fx.recv().test(r, &d, nullptr) == 0);
        vigil::test::nap();
    }
    CHECK(rc == -EMSGSIZE);
    CHECK(vigil::to_nccl_result(rc) == ncclInvalidUsage);
    // Not sticky: a fitting send takes the same buffer.
    for (uint64_t i = 0; i < 2000 * TestType::kSlow && s == nullptr; ++i)
        REQUIRE(fx.send().isend(small.data(), small.size(), tag, small_mr, &s) == 0);
    REQUIRE(s != nullptr);
    int sizes[vn::kMaxRecvs] = {-1};
    int d = 0, sd = 0, ssize = -1;
    for (uint64_t i = 0; i < 20000 * TestType::kSlow && !(d && sd); ++i) {
        if (!d) REQUIRE(fx.recv().test(r, &d, sizes) == 0);
        if (!sd) REQUIRE(fx.send().test(s, &sd, &ssize) == 0);
        vigil::test::nap();
    }
    REQUIRE(d == 1);
    REQUIRE(sd == 1);
    CHECK(sizes[0] == 60);
    CHECK(ssize == 60);
    CHECK(vigil::test::all_equal(dst.data(), 60, 0x22));
    CHECK(vigil::test::all_equal(dst.data() + 60, dst.size() - 60, 0xEE)); // never past the send
    for (vn::MemRegion *m : {dst_mr, big_mr, small_mr}) vn::MemRegion::unref(m);
}

TEMPLATE_TEST_CASE("interleaved tags across a failover and a failback: exact, exactly once",
                   "[matching][failover]", MATCHING_FABRICS)
{
    INFO("fabric " << TestType::kName);
    std::mt19937_64 rng(0xFA11);
    TestType fx(quick_config(), true, true);
    fx.allow_rebuild(vn::kPrimary, false);
    Traffic t(fx.send(), fx.recv(), 20'000 * TestType::kSlow, /*per_tag=*/true);
    t.set_registrar(TestType::registrar());
    TaggedPlan plan(rng, 400, 3, 30'000);
    int step = 0;
    run_plan(t, plan, 30'000 * TestType::kSlow, [&] {
        ++step;
        if (step == 40) fx.break_path(vn::kPrimary);
        if (step == 120) fx.allow_rebuild(vn::kPrimary, true);
    });
    const auto st = fx.send().stats();
    CHECK(st.failovers >= 1);
    CHECK(st.failbacks + st.rebuilds >= 1);
    CHECK(st.cts_duplicates > 0); // every group went out on both paths
}

TEMPLATE_TEST_CASE("random grouped traffic with paths breaking and healing all along", "[matching][failover][stress]",
                   MATCHING_FABRICS)
{
    INFO("fabric " << TestType::kName);
    std::mt19937_64 rng(0xC0FFEE);
    TestType fx(quick_config(), true, true);
    fx.allow_rebuild(vn::kPrimary, true);
    fx.allow_rebuild(vn::kBackup, true);
    Traffic t(fx.send(), fx.recv(), 60'000 * TestType::kSlow, /*per_tag=*/true);
    t.set_registrar(TestType::registrar());
    TaggedPlan plan(rng, 600, 4, 40'000);
    int step = 0;
    run_plan(t, plan, 60'000 * TestType::kSlow, [&] {
        // One path at a time, as single port failures come.
        if (++step % 97 == 0 && fx.send().stats().alive_paths == vn::kMaxPaths)
            fx.break_path(static_cast<int>(rng() % vn::kMaxPaths));
    });
    CHECK(fx.send().stats().failovers >= 2);
}
