// SPDX-License-Identifier: Apache-2.0
// The call patterns of other plugins' functional suites (aws-ofi-nccl's among them), run
// against the built libnccl-net-vigil.so through the NCCL-style loader, through every ncclNet
// version it exports:
//   - grouped receives whose sends interleave their tags across the groups (several GPUs
//     sharing one connection with maxRecvs > 1), sends posted before the receives;
//   - four threads driving one plugin context, each over its own connection;
//   - ten connections accepted from one listen comm;
//   - deregMr and close with requests still in flight, then a new connection;
//   - register and deregister around every message;
//   - dlopen / traffic / dlclose / dlopen cycles through every version (ncclNet v8-v10 have
//     no finalize, so the plugin's threads outlive the last communicator);
//   - cross-rail connections, device i to device j != i, between two processes (tag [rails]:
//     it runs as two ranks in two hosts of the routed namespace lab, PEER_RANK 0 or 1 meeting
//     at PEER_RDV; the loopback run excludes it).
// PEER_PLUGIN names the library. Every payload is checked byte by byte.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <dlfcn.h>

#include "loader.h"
#include "prof_driver.h"
#include "rendezvous.h"
#include "tuner_driver.h"

namespace {

using vigil::bench::NetPlugin;
using Clock = std::chrono::steady_clock;

const char *plugin_path()
{
    const char *p = std::getenv("PEER_PLUGIN");
    return p != nullptr ? p : "vigil";
}

uint8_t pattern(uint64_t msg, uint64_t k)
{
    uint64_t x = (msg + 1) * 0x9E3779B97F4A7C15ULL ^ (k + 3) * 0xC2B2AE3D27D4EB4FULL;
    x ^= x >> 29;
    return static_cast<uint8_t>(x);
}

/// One loaded plugin at one ncclNet version, initialised.
struct Plugin {
    NetPlugin net;
    int ndev = 0;
    explicit Plugin(int version)
    {
        const std::string e = net.load(plugin_path(), version);
        INFO(e);
        REQUIRE(e.empty());
        REQUIRE(net.version() == version);
        REQUIRE(net.init(0x5045455253ull) == ncclSuccess);
        REQUIRE(net.devices(&ndev) == ncclSuccess);
        REQUIRE(ndev >= 1);
    }
    ~Plugin() { net.finalize(); }
};

/// A connected pair: send comm from `from_dev`, receive comm on `to_dev`.
struct Pair {
    void *sc = nullptr, *rc = nullptr;
};

/// NCCL's pattern: listen, then connect and accept polled until both produce a comm.
Pair connect_pair(NetPlugin &net, int from_dev, int to_dev)
{
    std::array<uint8_t, NCCL_NET_HANDLE_MAXSIZE> handle{};
    void *lc = nullptr;
    REQUIRE(net.listen(to_dev, handle.data(), &lc) == ncclSuccess);
    REQUIRE(lc != nullptr);
    Pair p;
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (p.sc == nullptr || p.rc == nullptr) {
        REQUIRE(Clock::now() < deadline);
        if (p.sc == nullptr) REQUIRE(net.connect(from_dev, handle.data(), &p.sc) == ncclSuccess);
        if (p.rc == nullptr) REQUIRE(net.accept(lc, &p.rc) == ncclSuccess);
    }
    REQUIRE(net.close_listen(lc) == ncclSuccess);
    return p;
}

void close_pair(NetPlugin &net, Pair &p)
{
    REQUIRE(net.close_send(p.sc) == ncclSuccess);
    REQUIRE(net.close_recv(p.rc) == ncclSuccess);
    p = Pair{};
}

/// A check that works from any thread (Catch's assertions do not): throws with the expression.
#define ENSURE(cond)                                                                               \
    do {                                                                                           \
        if (!(cond))                                                                               \
            throw std::runtime_error(where + "line " + std::to_string(__LINE__) + ": " #cond);     \
    } while (0)

/// Grouped traffic over one pair: `groups` receives of random 1..maxRecvs buffers with tags
/// from [0, ntags), the sends interleaving their tags, each tag posted in order as its own
/// proxy would, retried while the plugin answers NULL. The k-th send of a tag must land in
/// the k-th buffer of that tag, counting group by group. With `churn_mr`, every buffer is
/// registered just before it is posted and deregistered right after it completes. Throws
/// std::runtime_error on the first wrong result.
void grouped_traffic(NetPlugin &net, Pair &p, int max_recvs, int groups, int ntags, uint32_t seed,
                     bool churn_mr = false, bool sends_first = true)
{
    std::mt19937_64 rng(seed);
    std::string where; // context for a failure
    struct Buf {
        std::vector<uint8_t> mem;
        size_t cap = 0;
        int tag = 0;
        int msg = -1;
        void *mh = nullptr;
    };
    struct Group {
        std::vector<Buf> bufs;
        void *req = nullptr;
        bool posted = false, done = false;
    };
    struct Send {
        int tag = 0;
        std::vector<uint8_t> data;
        void *mh = nullptr;
        void *req = nullptr;
        bool done = false;
        Group *g = nullptr;
        size_t b = 0;
    };
    std::vector<Group> gs(static_cast<size_t>(groups));
    std::map<int, std::vector<std::pair<size_t, size_t>>> slots;
    for (size_t g = 0; g < gs.size(); ++g) {
        const int n = 1 + static_cast<int>(rng() % static_cast<uint64_t>(max_recvs));
        for (int i = 0; i < n; ++i) {
            Buf b;
            b.tag = static_cast<int>(rng() % static_cast<uint64_t>(ntags));
            b.cap = 1 + rng() % 70'000;
            b.mem.assign(b.cap + 16, 0xA5);
            gs[g].bufs.push_back(std::move(b));
            slots[gs[g].bufs.back().tag].emplace_back(g, static_cast<size_t>(i));
        }
    }
    std::vector<Send> sends;
    std::map<int, size_t> next;
    size_t left = 0;
    for (auto &[t, v] : slots) left += v.size();
    while (left-- > 0) {
        std::vector<int> open;
        for (auto &[t, v] : slots)
            if (next[t] < v.size()) open.push_back(t);
        const int t = open[rng() % open.size()];
        auto [g, b] = slots[t][next[t]++];
        Buf &buf = gs[g].bufs[b];
        Send s;
        s.tag = t;
        s.data.resize(rng() % 4 == 0 ? buf.cap : rng() % (buf.cap + 1));
        buf.msg = static_cast<int>(sends.size());
        for (size_t k = 0; k < s.data.size(); ++k) s.data[k] = pattern(sends.size() + seed, k);
        s.g = &gs[g];
        s.b = b;
        if (!churn_mr && p.sc != nullptr)
            ENSURE(net.reg_mr(p.sc, s.data.data(), std::max<size_t>(s.data.size(), 1), &s.mh) == ncclSuccess);
        sends.push_back(std::move(s));
    }
    if (!churn_mr && p.rc != nullptr)
        for (Group &g : gs)
            for (Buf &b : g.bufs) ENSURE(net.reg_mr(p.rc, b.mem.data(), b.mem.size(), &b.mh) == ncclSuccess);

    // One side only (the other in another process): its half of the work is all there is.
    size_t next_group = 0, open_groups = 0, groups_done = p.rc != nullptr ? 0 : gs.size(),
           sends_done = p.sc != nullptr ? 0 : sends.size();
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    int rounds = 0;
    while (groups_done < gs.size() || sends_done < sends.size()) {
        ENSURE(Clock::now() < deadline);
        ++rounds;
        // Receives: up to NCCL_NET_MAX_REQUESTS outstanding (after a few rounds of sends
        // answered NULL when sends_first).
        while (p.rc != nullptr && (!sends_first || rounds > 3) && next_group < gs.size() &&
               open_groups < NCCL_NET_MAX_REQUESTS) {
            Group &g = gs[next_group];
            std::vector<void *> data, mhs;
            std::vector<size_t> sizes;
            std::vector<int> tags;
            for (Buf &b : g.bufs) {
                if (churn_mr) ENSURE(net.reg_mr(p.rc, b.mem.data(), b.mem.size(), &b.mh) == ncclSuccess);
                data.push_back(b.mem.data());
                sizes.push_back(b.cap);
                tags.push_back(b.tag);
                mhs.push_back(b.mh);
            }
            ENSURE(net.irecv(p.rc, static_cast<int>(g.bufs.size()), data.data(), sizes.data(), tags.data(),
                              mhs.data(), &g.req) == ncclSuccess);
            if (g.req == nullptr) {
                if (churn_mr)
                    for (Buf &b : g.bufs) ENSURE(net.dereg_mr(p.rc, b.mh) == ncclSuccess);
                break;
            }
            g.posted = true;
            ++next_group;
            ++open_groups;
        }
        // Sends: each tag in order, independently.
        std::vector<int> blocked;
        for (Send &s : sends) {
            if (p.sc == nullptr) break;
            if (s.req != nullptr || s.done || std::find(blocked.begin(), blocked.end(), s.tag) != blocked.end())
                continue;
            if (churn_mr && s.mh == nullptr)
                ENSURE(net.reg_mr(p.sc, s.data.data(), std::max<size_t>(s.data.size(), 1), &s.mh) == ncclSuccess);
            ENSURE(net.isend(p.sc, s.data.data(), s.data.size(), s.tag, s.mh, &s.req) == ncclSuccess);
            if (s.req == nullptr) blocked.push_back(s.tag);
        }
        for (Send &s : sends) {
            if (s.req == nullptr || s.done) continue;
            int done = 0, size = -1;
            ENSURE(net.test(s.req, &done, &size) == ncclSuccess);
            if (!done) continue;
            ENSURE(size == static_cast<int>(s.data.size()));
            s.done = true;
            s.req = nullptr;
            ++sends_done;
            if (churn_mr) {
                ENSURE(net.dereg_mr(p.sc, s.mh) == ncclSuccess);
                s.mh = nullptr;
            }
        }
        for (size_t gi = 0; gi < next_group; ++gi) {
            Group &g = gs[gi];
            if (g.done) continue;
            int done = 0;
            std::array<int, 64> sizes{};
            sizes.fill(-1);
            ENSURE(net.test(g.req, &done, sizes.data()) == ncclSuccess);
            if (!done) continue;
            for (size_t b = 0; b < g.bufs.size(); ++b) {
                Buf &buf = g.bufs[b];
                const Send &s = sends[static_cast<size_t>(buf.msg)];
                where = "group " + std::to_string(gi) + " buffer " + std::to_string(b) + " <- send " +
                        std::to_string(buf.msg) + ": ";
                ENSURE(sizes[b] == static_cast<int>(s.data.size()));
                ENSURE(std::equal(s.data.begin(), s.data.end(), buf.mem.begin()));
                ENSURE(std::all_of(buf.mem.begin() + static_cast<long>(s.data.size()), buf.mem.end(),
                                    [](uint8_t x) { return x == 0xA5; }));
                if (churn_mr) ENSURE(net.dereg_mr(p.rc, buf.mh) == ncclSuccess);
            }
            g.done = true;
            --open_groups;
            ++groups_done;
        }
    }
    if (!churn_mr) {
        if (p.sc != nullptr)
            for (Send &s : sends) ENSURE(net.dereg_mr(p.sc, s.mh) == ncclSuccess);
        if (p.rc != nullptr)
            for (Group &g : gs)
                for (Buf &b : g.bufs) ENSURE(net.dereg_mr(p.rc, b.mh) == ncclSuccess);
    }
}

int max_recvs_of(NetPlugin &net)
{
    vigil::bench::DevProps props;
    REQUIRE(net.properties(0, &props) == ncclSuccess);
    return props.max_recvs;
}

} // namespace

TEST_CASE("grouped receives with tags interleaved across groups, through every ncclNet version",
          "[peer][multirecv]")
{
    for (int v = 8; v <= 12; ++v) {
        INFO("ncclNet v" << v);
        Plugin pl(v);
        const int mr = max_recvs_of(pl.net);
        REQUIRE(mr == 8);
        Pair p = connect_pair(pl.net, 0, 0);
        REQUIRE_NOTHROW(grouped_traffic(pl.net, p, mr, 120, 2, 100 + static_cast<uint32_t>(v)));
        REQUIRE_NOTHROW(grouped_traffic(pl.net, p, mr, 120, 5, 200 + static_cast<uint32_t>(v), false, false));
        close_pair(pl.net, p);
    }
}

TEST_CASE("four threads drive one plugin context, each over its own connection", "[peer][threads]")
{
    Plugin pl(12);
    std::vector<Pair> pairs;
    for (int i = 0; i < 4; ++i) pairs.push_back(connect_pair(pl.net, 0, 0));
    std::vector<std::thread> threads;
    std::vector<std::string> errors(4);
    for (int i = 0; i < 4; ++i)
        threads.emplace_back([&, i] {
            try {
                grouped_traffic(pl.net, pairs[static_cast<size_t>(i)], 8, 80, 3, 300 + static_cast<uint32_t>(i));
            } catch (const std::exception &e) {
                errors[static_cast<size_t>(i)] = e.what();
            }
        });
    for (std::thread &t : threads) t.join();
    for (const std::string &e : errors) CHECK(e.empty());
    for (Pair &p : pairs) close_pair(pl.net, p);
}

TEST_CASE("ten connections accepted from one listen comm", "[peer][listen]")
{
    Plugin pl(11);
    std::array<uint8_t, NCCL_NET_HANDLE_MAXSIZE> handle{};
    void *lc = nullptr;
    REQUIRE(pl.net.listen(0, handle.data(), &lc) == ncclSuccess);
    std::vector<Pair> pairs(10);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    // Every connect uses its own copy of the handle, as NCCL's peers each have theirs.
    std::vector<std::array<uint8_t, NCCL_NET_HANDLE_MAXSIZE>> handles(10, handle);
    size_t accepted = 0;
    std::vector<void *> rcs;
    while (accepted < pairs.size() ||
           std::any_of(pairs.begin(), pairs.end(), [](const Pair &p) { return p.sc == nullptr; })) {
        REQUIRE(Clock::now() < deadline);
        for (size_t i = 0; i < pairs.size(); ++i)
            if (pairs[i].sc == nullptr) REQUIRE(pl.net.connect(0, handles[i].data(), &pairs[i].sc) == ncclSuccess);
        void *rc = nullptr;
        REQUIRE(pl.net.accept(lc, &rc) == ncclSuccess);
        if (rc != nullptr) {
            rcs.push_back(rc);
            ++accepted;
        }
    }
    REQUIRE(pl.net.close_listen(lc) == ncclSuccess);
    // Which recvComm belongs to which sendComm is found by the traffic itself: send a
    // distinct message on each and match receives by content.
    std::vector<std::vector<uint8_t>> out(10), in(10, std::vector<uint8_t>(64, 0));
    std::vector<void *> sreq(10, nullptr), rreq(10, nullptr);
    for (size_t i = 0; i < 10; ++i) {
        int tag = 1;
        size_t size = 64;
        void *d = in[i].data();
        while (rreq[i] == nullptr) REQUIRE(pl.net.irecv(rcs[i], 1, &d, &size, &tag, nullptr, &rreq[i]) == ncclSuccess);
    }
    for (size_t i = 0; i < 10; ++i) {
        out[i].assign(64, static_cast<uint8_t>(i + 1));
        while (sreq[i] == nullptr)
            REQUIRE(pl.net.isend(pairs[i].sc, out[i].data(), 64, 1, nullptr, &sreq[i]) == ncclSuccess);
    }
    std::vector<bool> seen(10, false);
    for (size_t i = 0; i < 10; ++i) {
        int done = 0;
        while (!done) REQUIRE(pl.net.test(rreq[i], &done, nullptr) == ncclSuccess);
        done = 0;
        while (!done) REQUIRE(pl.net.test(sreq[i], &done, nullptr) == ncclSuccess);
    }
    for (size_t i = 0; i < 10; ++i) {
        const uint8_t v = in[i][0];
        REQUIRE(v >= 1);
        REQUIRE(v <= 10);
        CHECK(std::all_of(in[i].begin(), in[i].end(), [v](uint8_t x) { return x == v; }));
        CHECK_FALSE(seen[v - 1]);
        seen[v - 1] = true;
    }
    for (size_t i = 0; i < 10; ++i) {
        REQUIRE(pl.net.close_send(pairs[i].sc) == ncclSuccess);
        REQUIRE(pl.net.close_recv(rcs[i]) == ncclSuccess);
    }
}

TEST_CASE("deregMr and close with requests in flight, then a new connection", "[peer][close]")
{
    Plugin pl(10);
    for (int round = 0; round < 3; ++round) {
        INFO("round " << round);
        Pair p = connect_pair(pl.net, 0, 0);
        std::vector<uint8_t> big(8 << 20, 0x33), dst(8 << 20, 0);
        void *smh = nullptr, *rmh = nullptr;
        REQUIRE(pl.net.reg_mr(p.sc, big.data(), big.size(), &smh) == ncclSuccess);
        REQUIRE(pl.net.reg_mr(p.rc, dst.data(), dst.size(), &rmh) == ncclSuccess);
        void *rreq = nullptr, *sreq = nullptr;
        int tag = 0;
        size_t size = dst.size();
        void *d = dst.data();
        REQUIRE(pl.net.irecv(p.rc, 1, &d, &size, &tag, &rmh, &rreq) == ncclSuccess);
        REQUIRE(rreq != nullptr);
        const auto deadline = Clock::now() + std::chrono::seconds(5);
        while (sreq == nullptr) {
            REQUIRE(Clock::now() < deadline);
            REQUIRE(pl.net.isend(p.sc, big.data(), big.size(), 0, smh, &sreq) == ncclSuccess);
        }
        // Both requests are in flight: deregister and close without waiting for them.
        REQUIRE(pl.net.dereg_mr(p.sc, smh) == ncclSuccess);
        REQUIRE(pl.net.dereg_mr(p.rc, rmh) == ncclSuccess);
        close_pair(pl.net, p);
    }
    // The plugin is intact: a fresh connection carries checked traffic.
    Pair p = connect_pair(pl.net, 0, 0);
    REQUIRE_NOTHROW(grouped_traffic(pl.net, p, 8, 40, 2, 400));
    close_pair(pl.net, p);
}

TEST_CASE("register and deregister around every message", "[peer][mr]")
{
    Plugin pl(9);
    Pair p = connect_pair(pl.net, 0, 0);
    REQUIRE_NOTHROW(grouped_traffic(pl.net, p, 8, 150, 3, 500, /*churn_mr=*/true));
    close_pair(pl.net, p);
}

TEST_CASE("dlopen, traffic, dlclose and dlopen again, three times per ncclNet version", "[peer][unload]")
{
    // NCCL 2.22-2.25 and 2.28 dlclose the net plugin after the last communicator is destroyed
    // and dlopen it for the next one. Before v11 there is no finalize: the progress thread is
    // still running when dlclose returns, so the library must stay mapped.
    for (int v = 8; v <= 12; ++v) {
        for (int cycle = 0; cycle < 3; ++cycle) {
            INFO("ncclNet v" << v << " cycle " << cycle);
            NetPlugin net;
            REQUIRE(net.load(plugin_path(), v).empty());
            REQUIRE(net.init(0x554e4c4f4144ull + static_cast<uint64_t>(cycle)) == ncclSuccess);
            int ndev = 0;
            REQUIRE(net.devices(&ndev) == ncclSuccess);
            Pair p = connect_pair(net, 0, 0);
            REQUIRE_NOTHROW(grouped_traffic(net, p, 8, 20, 2, 600 + static_cast<uint32_t>(v * 3 + cycle)));
            close_pair(net, p);
            REQUIRE(net.finalize() == ncclSuccess);
            net.unload();
            // Long enough for every thread of the plugin to wake (probes every 100 ms).
            std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
    }
}

TEST_CASE("the tuner and the profiler libraries survive dlclose and dlopen, three times", "[peer][unload]")
{
    // NCCL unloads them too (2.30 the profiler at its last finalize, 2.28 the tuner with the
    // net plugin); their threads (the tuner's publisher, the profiler's writer) must end with
    // their last finalize.
    const char *tuner = std::getenv("PEER_TUNER");
    const char *prof = std::getenv("PEER_PROFILER");
    REQUIRE(tuner != nullptr);
    REQUIRE(prof != nullptr);
    // One process is one rank here: no store, or the tuner would wait for the other rank's
    // health record before its first decision (safety over liveness, docs/tuner.md).
    setenv("VIGIL_TUNER_STORE", "none", 1);
    // What must not outlive a finalize: the libraries are never unmapped (-z nodelete), so
    // a thread left behind would not crash here; it is counted instead.
    auto threads = [] {
        size_t n = 0;
        for (const auto &e : std::filesystem::directory_iterator("/proc/self/task")) n += e.is_directory();
        return n;
    };
    const size_t before = threads();
    for (int cycle = 0; cycle < 3; ++cycle) {
        INFO("cycle " << cycle);
        {
            vigil::bench::TunerDriver t;
            REQUIRE(t.load(tuner, nullptr).empty());
            REQUIRE(t.init(0x7475000000ull + static_cast<uint64_t>(cycle), 2, 1).empty());
            for (int i = 0; i < 300; ++i) (void)t.collective(4 /* AllReduce */, 1 << 20, 2);
            t.finalize(); // and dlclose
        }
        void *lib = dlopen(prof, RTLD_NOW | RTLD_LOCAL);
        REQUIRE(lib != nullptr);
        {
            vigil::bench::ProfDriver p;
            REQUIRE(p.load(lib, prof).empty());
            REQUIRE(p.init(0x7072000000ull + static_cast<uint64_t>(cycle), 2, 0).empty());
            for (uint64_t s = 0; s < 50; ++s) {
                void *coll = p.coll(s, "AllReduce", 1024, "ncclFloat32", 1);
                void *op = p.op_start(coll, 0, 1, 1, 4096, true);
                p.stop(op);
            }
            p.finalize();
        }
        dlclose(lib);
        // Thread exits are asynchronous to join's return on some kernels: give them a moment.
        for (int i = 0; i < 50 && threads() != before; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        CHECK(threads() == before);
    }
    unsetenv("VIGIL_TUNER_STORE");
}

TEST_CASE("cross-rail connections: device i to device j != i, between two hosts", "[rails]")
{
    const char *rank_s = std::getenv("PEER_RANK");
    const char *rdv_s = std::getenv("PEER_RDV");
    REQUIRE(rank_s != nullptr);
    REQUIRE(rdv_s != nullptr);
    const int rank = std::atoi(rank_s);
    vigil::bench::Rendezvous rdv;
    REQUIRE(rdv.open(rdv_s, rank, 2, 30).empty());
    Plugin pl(12);
    REQUIRE(pl.ndev >= 2);
    for (int from = 0; from < pl.ndev; ++from)
        for (int to = 0; to < pl.ndev; ++to) {
            if (from == to) continue;
            INFO("rank 0 dev " << from << " -> rank 1 dev " << to);
            // Rank 1 listens on `to`; rank 0 connects from `from`, then sends what rank 1
            // receives and checks.
            std::array<uint8_t, NCCL_NET_HANDLE_MAXSIZE> handle{};
            void *lc = nullptr;
            if (rank == 1) REQUIRE(pl.net.listen(to, handle.data(), &lc) == ncclSuccess);
            std::vector<uint8_t> all;
            REQUIRE(rdv.allgather(handle.data(), handle.size(), &all).empty());
            Pair p;
            const auto deadline = Clock::now() + std::chrono::seconds(20);
            if (rank == 0) {
                std::memcpy(handle.data(), all.data() + handle.size(), handle.size());
                while (p.sc == nullptr) {
                    REQUIRE(Clock::now() < deadline);
                    REQUIRE(pl.net.connect(from, handle.data(), &p.sc) == ncclSuccess);
                }
            } else {
                while (p.rc == nullptr) {
                    REQUIRE(Clock::now() < deadline);
                    REQUIRE(pl.net.accept(lc, &p.rc) == ncclSuccess);
                }
                REQUIRE(pl.net.close_listen(lc) == ncclSuccess);
            }
            REQUIRE_NOTHROW(grouped_traffic(pl.net, p, 8, 60, 3, 600 + static_cast<uint32_t>(from * 8 + to)));
            REQUIRE(rdv.barrier().empty());
            if (p.sc != nullptr) REQUIRE(pl.net.close_send(p.sc) == ncclSuccess);
            if (p.rc != nullptr) REQUIRE(pl.net.close_recv(p.rc) == ncclSuccess);
        }
}
