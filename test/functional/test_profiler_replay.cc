// SPDX-License-Identifier: Apache-2.0
// Replay driver for the profiler plugin (profiler_plugin/, docs/profiler.md): a stand-in for
// NCCL that dlopens the built library like NCCL does (RTLD_NOW | RTLD_LOCAL, ncclProfiler_v6
// -> v5 -> v4), replays the exact call sequences NCCL produces (docs/nccl-abi.md,
// "Profiler calls and handles" and "Profiler versions and shims": which thread makes which
// call, NULL/stale handles, the v4 shim's behaviour) and checks the trace and summary the
// plugin writes.
//
// The plugin's state is per process (parameters are read and the pools sized at the first
// init), so every scenario runs in a forked child: it clears VIGIL_*, sets its own
// environment (VIGIL_PROFILE_DIR = a fresh directory, ...), loads the library, replays,
// finalizes every context (the last finalize closes the files), dlcloses it like NCCL 2.30.7
// and writes what it observed to driver.json. The Catch2 side then parses every file (the
// trace as a whole, every summary line) and asserts.
//
// Scenarios (TEST_CASE names carry the numbers): 1 AllReduce in a group (v6, v5), 2 Send+Recv
// (v6, v5, and the net plugin library), 3 NULL/foreign/stale handles, 4 a restarted proxy
// step, 5 two communicators, 6 concurrent user and proxy threads, 7 the v4 table, 8 pool
// exhaustion, 9/10 VIGIL_PROFILE_EVENTS, 11 the file bound, 12 PXN, 13 graph replay,
// 14 non-blocking communicator (launch threads come and go), 15 a new communicator after the
// last finalize, with the library kept loaded (NCCL 2.28.9) or dlclosed and reopened (2.30.7).
//
// Then 16-18, the process's life (it exits with a communicator alive, outlives the context
// table, forks a child that exits), and 19-22, the shapes of real GPU runs. The scenarios
// are spread over files by theme: this one has the runner, 1 and 2;
// test_profiler_replay_calls.cc 3-8, _modes.cc 9-15, _exit.cc 16-18 and _gpu.cc 19-22. They
// share the driver: replay_nccl.h (the library as NCCL calls it), replay_threads.h (user,
// launch and proxy threads) and replay_support.h (the fork harness, the common checks).
//
// Environment: PROFILER_REPLAY_SO (libnccl-profiler-vigil.so), PROFILER_REPLAY_NET_SO
// (libnccl-net-vigil.so, which exports the same tables); PROFILER_REPLAY_KEEP=1 keeps the
// scenario directories; PROFILER_REPLAY_VERBOSE=1 echoes the plugin's WARNs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "catch_session.h"
#include "replay_support.h"

using namespace replay;

namespace {

// ---- scenario 1: AllReduce in a group, full replay -------------------------------------

constexpr int kArColls = 20;
constexpr int kArSteps = 4;
constexpr uint64_t kArHash = 0x5f3c9a1e22b07d11ull;

json net_log(const vigilNetProfDescr_v1_t &d)
{
    return {{"type", d.type},           {"slot", d.slot},         {"degraded", d.degraded}, {"state", d.state},
            {"generation", d.generation}, {"dev", d.dev},         {"window_us", d.window_us},
            {"start_ns", d.start_ns},   {"bytes", d.bytes},       {"busy_ns", d.busy_ns},
            {"lat_p99_ns", d.lat_p99_ns}};
}

void body_allreduce(Child &c, const std::string &path, int version)
{
    load_or_fail(c, path, version);
    Comm comm{kArHash, 3, 8, 2, "replay-ar"};
    init_or_fail(c, comm);
    c.out["mask"] = g_mask;
    Proxy proxy(c, &comm);
    User user(c.p);
    json tasks = json::array(), nets = json::array();
    int failover_at = kArColls / 2;
    std::vector<vigilNetProfDescr_v1_t> pending_net;
    user.post = [&](Task &t) {
        Work w = work_for(t);
        w.log = true;
        w.nsteps = kArSteps;
        w.step_bytes = t.count * 4 / (t.nch * kArSteps);
        w.step_ns = 20'000;
        w.net = pending_net;
        proxy.post(std::move(w));
    };
    for (int i = 0; i < kArColls; ++i) {
        // The net plugin's window for this transfer; a failover before collective 10 moves
        // the connection to the backup path (generation 1).
        pending_net.clear();
        if (i == failover_at) {
            vigilNetProfDescr_v1_t f{};
            f.type = vigilNetProfFailover;
            f.slot = 0;
            f.generation = 1;
            f.dev = 0;
            f.start_ns = mono_ns();
            f.bytes = 65536;
            pending_net.push_back(f);
        }
        pending_net.push_back(window_descr(i, i >= failover_at ? 1 : 0, i >= failover_at ? 1 : 0));
        for (const auto &d : pending_net) nets.push_back(net_log(d));
        user.group_start();
        user.all_reduce(comm, 262144 + 256 * static_cast<size_t>(i), 2);
        for (const Task &t : user.group_end()) tasks.push_back(task_log(t));
        if (i == failover_at - 1) proxy.wait_idle(); // a pause in the job: the proxy sleeps
    }
    proxy.finish();
    c.out["tasks"] = tasks;
    c.out["net"] = nets;
    finalize_all(c, {&comm});
}

void check_allreduce(int version)
{
    const std::string tag = "allreduce-v" + std::to_string(version);
    Outcome o = run_child(tag, {{"VIGIL_PROFILE_EVENTS", "all"}},
                          [&](Child &c) { body_allreduce(c, plugin_path(), version); });
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    CHECK(o.drv["version"] == version);
    CHECK(o.drv["name"] == "Vigil");
    CHECK(o.drv["symbols"] == json({{"v4", true}, {"v5", true}, {"v6", true}, {"v7", true}}));
    CHECK((o.drv["mask"].get<int>() & 0xfff) == 0xfff);

    const json proc = o.process();
    CHECK(proc["abi"] == "v" + std::to_string(version));
    CHECK(proc["mask"] == o.drv["mask"]);
    const int64_t m2r = proc["mono_to_realtime_ns"].get<int64_t>();
    const std::string comm = hex(kArHash);

    auto comms = o.of("comm");
    REQUIRE(comms.size() == 1);
    CHECK(comms[0]["comm"] == comm);
    CHECK(comms[0]["name"] == "replay-ar");
    CHECK(comms[0]["rank"] == 3);
    CHECK(comms[0]["nranks"] == 8);
    CHECK(comms[0]["nnodes"] == 2);

    // One coll record per seq, in seq order, with the descriptor's values and kernel timing.
    const json &tasks = o.drv["tasks"];
    const json &plog = o.drv["proxy_log"];
    REQUIRE(tasks.size() == kArColls);
    REQUIRE(plog.size() == kArColls);
    auto colls = o.of("coll");
    REQUIRE(colls.size() == kArColls);
    for (int i = 0; i < kArColls; ++i) {
        const json &r = colls[static_cast<size_t>(i)];
        INFO("coll record " << raw(r));
        CHECK(r["seq"] == i);
        CHECK(r["comm"] == comm);
        CHECK(r["rank"] == 3);
        CHECK(r["nranks"] == 8);
        CHECK(r["func"] == "AllReduce");
        CHECK(r["count"] == 262144 + 256 * i);
        CHECK(r["datatype"] == "ncclFloat32");
        CHECK(r["bytes"] == (262144 + 256 * i) * 4);
        CHECK(r["algo"] == "RING");
        CHECK(r["proto"] == "SIMPLE");
        CHECK(r["channels"] == 2);
        CHECK(r["timing"] == "kernel_gpu");
        check_bandwidth(r, 2.0 * 7 / 8);
        const json &t = tasks[static_cast<size_t>(i)];
        REQUIRE(t["seq"] == i);
        check_start_us(r, t, m2r);
        for (const json &pl : plog)
            if (pl["seq"] == i) check_kernel_duration(r, t, pl);
    }

    // Net records: every window and the failover, with the descriptor's values.
    const json &nets = o.drv["net"];
    auto netrec = o.of("net");
    REQUIRE(netrec.size() == nets.size());
    size_t windows = 0, failovers = 0;
    for (size_t i = 0; i < nets.size(); ++i) {
        const json &d = nets[i], &r = netrec[i];
        INFO("net record " << raw(r) << "\ndescriptor " << d.dump());
        CHECK(r["comm"] == comm);
        CHECK(r["rank"] == 3);
        CHECK(r["dev"] == d["dev"]);
        CHECK(r["slot"] == (d["slot"] == 0 ? "primary" : "backup"));
        CHECK(r["generation"] == d["generation"]);
        CHECK(r["bytes"] == d["bytes"]);
        CHECK(exact_ns(r, "start_us") == d["start_ns"].get<int64_t>() + m2r);
        if (d["type"] == vigilNetProfWindow) {
            ++windows;
            CHECK(r["event"] == "window");
            CHECK(r["window_us"] == d["window_us"]);
            CHECK(std::fabs(r["busy_us"].get<double>() - d["busy_ns"].get<double>() / 1e3) < 0.0015);
            CHECK(std::fabs(r["lat_p99_us"].get<double>() - d["lat_p99_ns"].get<double>() / 1e3) < 0.0015);
            CHECK(std::fabs(r["busy_bw_GBps"].get<double>() - d["bytes"].get<double>() / d["busy_ns"].get<double>()) <
                  1e-4);
            CHECK(r["degraded"] == (d["degraded"] != 0));
            CHECK(r["state"] == "active");
        } else {
            ++failovers;
            CHECK(r["event"] == "failover");
        }
    }
    CHECK(windows == kArColls);
    CHECK(failovers == 1);

    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
    CHECK(st["leaked"] == 0);
    CHECK(st["orphans"] == 0);
    CHECK(st["trace_dropped"] == 0);
    CHECK(st["summary_dropped"] == 0);

    // The trace: process and track names, slices for proxy ops/steps/kernels/API events, b/e
    // pairs for the collectives, an instant for the failover.
    auto procs = o.events("M", "process_name");
    REQUIRE(procs.size() == 1);
    CHECK(procs[0]["args"]["name"] == "rank 3 comm " + comm + " replay-ar");
    const json pid = procs[0]["pid"];
    const auto names = o.thread_names();
    INFO("thread names " << json(names).dump());
    for (const char *n : {"collectives", "api", "groups", "ch 0 send", "ch 0 recv", "ch 1 send", "ch 1 recv",
                          "ch 0 kernel", "ch 1 kernel", "net dev 0 primary", "net dev 0 backup", "ch 0 send s0",
                          "ch 1 recv s3"})
        CHECK(names.count(n) == 1);
    for (const json &e : o.trace["traceEvents"]) {
        INFO("event " << e.dump());
        CHECK(e["pid"] == pid);
        if (e["ph"] == "X") CHECK(e["dur"].get<double>() >= 0);
    }
    CHECK(o.events("X", "send op").size() == kArColls * 2);
    CHECK(o.events("X", "recv op").size() == kArColls * 2);
    CHECK(o.events("X", "kernel").size() == kArColls * 2);
    CHECK(o.events("X", "GroupApi").size() == kArColls);
    CHECK(o.events("X", "AllReduce").size() == kArColls); // CollApi, named by its func
    CHECK(o.events("X", "KernelLaunch").size() == kArColls);
    CHECK(o.events("X", "Group").size() == kArColls);
    auto windows_x = o.events("X", "window");
    CHECK(windows_x.size() == kArColls);
    for (const json &e : windows_x) CHECK(e["dur"] == 1000);
    auto fo = o.events("i", "failover");
    REQUIRE(fo.size() == 1);
    CHECK(fo[0]["args"]["generation"] == 1);
    CHECK(fo[0]["args"]["bytes"] == 65536);

    // Steps: one slice per transfer, its transSize from state 9 / 11 (not the stale value
    // NCCL passes with the other states), and its state times.
    auto steps = o.events("X", "step");
    CHECK(steps.size() == kArColls * 2 * 2 * kArSteps);
    for (const json &s : steps) {
        INFO("step " << s.dump());
        const json &a = s["args"];
        const int k = a["step"].get<int>();
        REQUIRE(k >= 0);
        REQUIRE(k < kArSteps);
        const bool send = a.contains("SendWait_us");
        if (send) {
            CHECK(a.contains("SendGPUWait_us"));
            CHECK(a.contains("SendPeerWait_us"));
        } else {
            CHECK(a.contains("RecvWait_us"));
            CHECK(a.contains("RecvFlushWait_us"));
            CHECK(a.contains("RecvGPUWait_us"));
        }
        // step_bytes = count*4/(2 ch * 4 steps) with count = 262144 + 256*seq
        const uint64_t b = a["bytes"].get<uint64_t>();
        const uint64_t base = b - 64 * static_cast<uint64_t>(k);
        CHECK((base - 131072) % 128 == 0);
        CHECK(base >= 131072);
        CHECK(base < 131072 + 128 * kArColls);
    }

    // Kernel channels: exactly the GPU timers given, placed on the host clock.
    std::multiset<uint64_t> given, seen;
    for (const json &pl : plog)
        for (const json &g : pl["gpu_start"]) given.insert(g.get<uint64_t>());
    for (const json &e : o.events("X", "kernel")) seen.insert(e["args"]["gpu_start_ns"].get<uint64_t>());
    CHECK(given == seen);

    // ProxyCtrl: one Append per posted work item with appendedProxyOps = 2 ch x 2 ops.
    CHECK(names.count("proxy ctrl") == 1);
    auto appends = o.events("X", "Append");
    CHECK(appends.size() == kArColls);
    for (const json &x : appends) {
        INFO("append " << x.dump());
        CHECK(x["args"]["appended"] == 4);
        CHECK(x["args"].contains("AppendEnd_us"));
    }
    // The pause: Idle, then Sleep ... Wakeup, then Active when work arrived.
    CHECK(o.events("X", "Sleep").size() >= 1);
    CHECK(o.events("X", "Idle").size() >= 1);
    CHECK(o.events("X", "Active").size() >= 1);
    for (const json &x : o.events("X", "Sleep")) CHECK(x["args"].contains("Wakeup_us"));

    auto b = o.events("b"), e = o.events("e");
    REQUIRE(b.size() == kArColls);
    REQUIRE(e.size() == kArColls);
    std::map<std::string, double> bts;
    std::set<uint64_t> seqs;
    for (const json &x : b) {
        CHECK(x["cat"] == "coll");
        CHECK(x["name"] == "AllReduce");
        bts[x["id"].get<std::string>()] = x["ts"].get<double>();
        seqs.insert(x["args"]["seq"].get<uint64_t>());
    }
    CHECK(seqs.size() == kArColls);
    for (const json &x : e) {
        INFO("end " << x.dump());
        REQUIRE(bts.count(x["id"].get<std::string>()) == 1);
        CHECK(x["ts"].get<double>() >= bts[x["id"].get<std::string>()]);
    }
}

// ---- scenario 2: Send + Recv in one group --------------------------------------------

constexpr uint64_t kP2pHash = 0x0123456789abcdefull;

void body_p2p(Child &c, const std::string &path, int version)
{
    load_or_fail(c, path, version);
    Comm comm{kP2pHash, 2, 4, 2, nullptr};
    init_or_fail(c, comm);
    Proxy proxy(c);
    User user(c.p);
    json tasks = json::array();
    user.post = [&](Task &t) {
        Work w = work_for(t);
        w.log = true;
        w.step_ns = 10'000;
        w.step_bytes = t.count * 4 / (t.nch * w.nsteps);
        proxy.post(std::move(w));
    };
    user.group_start();
    user.p2p(comm, true, 5, 4096, 2);
    user.p2p(comm, false, 5, 8192, 1);
    for (const Task &t : user.group_end()) tasks.push_back(task_log(t));
    proxy.finish();
    c.out["tasks"] = tasks;
    finalize_all(c, {&comm});
}

void check_p2p(const std::string &tag, const std::string &path, int version)
{
    Outcome o = run_child(tag, {}, [&](Child &c) { body_p2p(c, path, version); });
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    CHECK(o.drv["version"] == version);
    const int64_t m2r = o.process()["mono_to_realtime_ns"].get<int64_t>();
    auto p2p = o.of("p2p");
    REQUIRE(p2p.size() == 2);
    CHECK(o.of("coll").empty());
    const json &tasks = o.drv["tasks"];
    REQUIRE(tasks.size() == 2);
    for (const json &r : p2p) {
        INFO("p2p record " << raw(r));
        const bool send = r["func"] == "Send";
        const json &t = tasks[send ? 0 : 1];
        CHECK(r["func"] == (send ? "Send" : "Recv"));
        CHECK(r["comm"] == hex(kP2pHash));
        CHECK(r["rank"] == 2);
        CHECK(r["nranks"] == 4);
        CHECK(r["peer"] == 5);
        CHECK(r["count"] == (send ? 4096 : 8192));
        CHECK(r["datatype"] == "ncclFloat32");
        CHECK(r["bytes"] == (send ? 16384 : 32768));
        CHECK(r["channels"] == (send ? 2 : 1));
        CHECK(r["timing"] == "kernel_gpu");
        check_bandwidth(r, 1.0);
        check_start_us(r, t, m2r);
    }
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
    CHECK(o.events("b").size() == 2);
    CHECK(o.events("e").size() == 2);
    for (const json &x : o.events("b")) CHECK(x["cat"] == "p2p");
    CHECK(o.events("X", "send op").size() == 2); // 2 channels of the Send
    CHECK(o.events("X", "recv op").size() == 1);
    CHECK(o.events("X", "kernel").size() == 3);
}

} // namespace

// =========================================================================================

TEST_CASE("the plugin library is there", "[profiler-replay]")
{
    INFO("PROFILER_REPLAY_SO must name libnccl-profiler-vigil.so (set by meson test)");
    REQUIRE(!plugin_path().empty());
    REQUIRE(fs::exists(plugin_path()));
}

TEST_CASE("1. AllReduce in a group through the v6 table", "[profiler-replay]") { check_allreduce(6); }

TEST_CASE("1. AllReduce in a group through the v5 table", "[profiler-replay]") { check_allreduce(5); }

TEST_CASE("2. Send + Recv to a remote peer in one group", "[profiler-replay]")
{
    check_p2p("p2p-v6", plugin_path(), 6);
    check_p2p("p2p-v5", plugin_path(), 5);
}

TEST_CASE("2b. the net plugin library exports the same profiler", "[profiler-replay]")
{
    REQUIRE(!net_plugin_path().empty());
    check_p2p("p2p-netlib-v6", net_plugin_path(), 6);
}

int main(int argc, char *argv[])
{
    std::string tmpl = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) +
                       "/vigil-prof-replay-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) {
        std::perror("mkdtemp");
        return 2;
    }
    g_base = buf.data();
    const int rc = vigil::test::run_catch(argc, argv);
    if (rc == 0 && std::getenv("PROFILER_REPLAY_KEEP") == nullptr) {
        std::error_code ec;
        fs::remove_all(g_base, ec);
    } else {
        std::fprintf(stderr, "profiler replay: scenario files kept in %s\n", g_base.c_str());
    }
    return rc;
}
