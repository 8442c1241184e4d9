// SPDX-License-Identifier: Apache-2.0
// Profiler replay scenarios 9-15 (test_profiler_replay.cc has the runner and the overview):
// VIGIL_PROFILE_EVENTS, the file bound, PXN, CUDA graph replay, non-blocking communicators
// and a new communicator after the last finalize.

#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "replay_support.h"

using namespace replay;

namespace {

// ---- scenarios 9, 10: VIGIL_PROFILE_EVENTS -------------------------------------------------

void body_mask(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0x3a5cull, 0, 2, 1, nullptr};
    int mask = 0x7fff; // must be overwritten
    const ncclResult_t rc = c.p.init(comm, &mask);
    c.out["rc"] = rc;
    c.out["mask"] = mask;
    c.out["ctx_null"] = comm.ctx == nullptr;
    Descr d{};
    d.type = ncclProfileColl;
    d.coll.func = "AllReduce";
    d.coll.datatype = "ncclFloat32";
    d.coll.count = 1;
    d.coll.nChannels = 1;
    void *h = kPoison;
    c.p.start_raw(comm.ctx, &h, d);
    c.out["coll_null"] = h == nullptr;
    if (h != nullptr && h != kPoison) c.p.stop(h);
    c.p.stop(nullptr);
    c.p.record(nullptr, ncclProfilerProxyStepSendWait, nullptr);
    c.out["finalize_rc"] = c.p.finalize(comm.ctx);
    dlclose(c.p.lib);
}

// ---- scenario 11: file bound -------------------------------------------------------------

void body_bound(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0xb0d0000000000011ull, 0, 2, 2, nullptr};
    init_or_fail(c, comm);
    Proxy proxy(c);
    User user(c.p);
    user.post = [&](Task &t) {
        Work w = work_for(t);
        w.nsteps = 8;
        w.step_ns = 500;
        proxy.post(std::move(w));
    };
    for (int i = 0; i < 40; ++i) {
        user.group_start();
        user.all_reduce(comm, 65536, 2);
        user.group_end();
    }
    proxy.finish();
    finalize_all(c, {&comm});
}

// ---- scenario 12: PXN --------------------------------------------------------------------

void body_pxn(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0x9e70000000000012ull, 2, 8, 2, nullptr};
    init_or_fail(c, comm);
    Prof &p = c.p;
    // An op posted by another local rank's process: its context and parent pointers are
    // that process's (docs/nccl-abi.md, "Profiler calls and handles"); dereferencing either
    // would crash here.
    void *const their_ctx = reinterpret_cast<void *>(uintptr_t{0x10});
    void *const their_parent = reinterpret_cast<void *>(uintptr_t{0x28});
    json r = json::object();
    for (int dir = 0; dir < 2; ++dir) {
        Descr d{};
        d.type = ncclProfileProxyOp;
        d.parentObj = their_parent;
        d.rank = 5;
        d.proxyOp.pid = getpid() + 1;
        d.proxyOp.channelId = 3;
        d.proxyOp.peer = 9;
        d.proxyOp.nSteps = 2;
        d.proxyOp.chunkSize = 4096;
        d.proxyOp.isSend = dir == 0;
        void *op = p.start(their_ctx, d);
        r[dir == 0 ? "send_op" : "recv_op"] = op != nullptr;
        Args a{};
        if (op) p.record(op, ncclProfilerProxyOpInProgress_v4, &a);
        for (int k = 0; k < 2; ++k) {
            Descr s{};
            s.type = ncclProfileProxyStep;
            s.parentObj = op;
            s.rank = 5;
            s.proxyStep.step = k;
            void *step = p.start(their_ctx, s);
            r[(dir == 0 ? "send_step" : "recv_step") + std::to_string(k)] = step != nullptr;
            if (op && step) {
                a.proxyStep.transSize = 4096;
                p.record(step, dir == 0 ? ncclProfilerProxyStepSendWait : ncclProfilerProxyStepRecvFlushWait, &a);
            }
            if (dir == 0 && k == 0) {
                vigilNetProfDescr_v1_t nd = window_descr(0, 0, 0);
                Descr n{};
                n.type = ncclProfileNetPlugin;
                n.parentObj = step;
                n.netPlugin.id = VIGIL_PROFILER_NET_ID;
                n.netPlugin.data = &nd;
                void *nh = p.start(their_ctx, n);
                r["net"] = nh != nullptr;
                if (nh) p.stop(nh);
            }
            if (step) p.stop(step);
        }
        if (op) p.stop(op);
    }
    c.out["pxn"] = r;
    // Our own work still goes through afterwards.
    Proxy proxy(c);
    User user(p);
    user.post = [&](Task &t) { proxy.post(work_for(t)); };
    user.group_start();
    user.all_reduce(comm, 8192, 1);
    user.group_end();
    proxy.finish();
    finalize_all(c, {&comm});
}

// ---- scenario 13: CUDA graph replay --------------------------------------------------------

void body_graph(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0x6a9e000000000013ull, 0, 4, 2, nullptr};
    init_or_fail(c, comm);
    Proxy proxy(c);
    User user(c.p);
    json tasks = json::array();
    user.post = [&](Task &t) {
        Work w = work_for(t);
        w.log = true;
        w.step_ns = 2000;
        proxy.post(std::move(w));
    };
    // Capture: GroupApi/CollApi graphCaptured, KernelLaunch once; the plan has proxy ops, so
    // hostStreamPlanTask is a host node and Group/Coll come at every replay.
    user.graph = true;
    user.group_start();
    user.all_reduce(comm, 777216, 2);
    std::vector<Task> captured = user.group_end();
    user.graph = false;
    if (captured.size() != 1) throw std::runtime_error("capture produced no task");
    c.out["captured_api"] = reinterpret_cast<uintptr_t>(captured[0].api);
    // Other work meanwhile: with VIGIL_PROFILE_POOL=64 the CollApi's slot is reused.
    for (int i = 0; i < 30; ++i) {
        user.group_start();
        user.all_reduce(comm, 1024, 2);
        for (const Task &t : user.group_end()) tasks.push_back(task_log(t));
    }
    // Replays, from a CUDA host-callback thread: Coll.parentObj is the CollApi handle from
    // capture time, stopped long ago.
    std::thread cb([&] {
        for (int r = 0; r < 3; ++r) {
            Task t = captured[0];
            std::vector<Task *> v{&t};
            launch_plan(c.p, comm, v, user.post);
            std::lock_guard<std::mutex> g(c.mu);
            tasks.push_back(task_log(t));
        }
    });
    cb.join();
    proxy.finish();
    c.out["tasks"] = tasks;
    finalize_all(c, {&comm});
}


// ---- scenario 14: non-blocking communicator (a launch thread per group) ------------------

constexpr int kNbGroups = 300;

void body_nonblocking(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0x0b10c000000000014ull, 1, 4, 2, "nb"};
    init_or_fail(c, comm);
    Proxy proxy(c, &comm);
    {
        User user(c.p);
        user.nonblocking = true;
        user.post = [&](Task &t) {
            Work w = work_for(t);
            w.nsteps = 2;
            w.step_ns = 1000;
            proxy.post(std::move(w));
        };
        for (int i = 0; i < kNbGroups; ++i) {
            user.group_start();
            user.all_reduce(comm, 2048 + static_cast<size_t>(i), 2);
            user.group_end();
        }
        user.wait_launch();
    }
    proxy.finish();
    finalize_all(c, {&comm});
}

// ---- scenario 15: the last communicator goes, another comes ---------------------------------

constexpr uint64_t kSess1 = 0x5e5510000000000aull, kSess2 = 0x5e5520000000000bull;

/// One non-blocking communicator's life on the main (user) thread: init, `n` collectives
/// launched from NCCL pthreads, its proxy thread, ncclCommDestroy (proxy joined, finalize).
/// With the default events the user thread itself records nothing (API events are not
/// selected); the launch and proxy threads that did have exited before finalize.
void session(Child &c, Comm &comm, int n)
{
    init_or_fail(c, comm);
    Proxy proxy(c, &comm);
    User user(c.p);
    user.nonblocking = true;
    user.post = [&](Task &t) { proxy.post(work_for(t)); };
    for (int i = 0; i < n; ++i) {
        user.group_start();
        user.all_reduce(comm, 4096, 2);
        user.group_end();
    }
    user.wait_launch();
    proxy.finish();
    c.check(c.p.finalize(comm.ctx) == ncclSuccess, "finalize failed");
}

void body_sessions(Child &c, bool unload)
{
    load_or_fail(c, plugin_path(), 6);
    Comm a{kSess1, 0, 2, 2, "first"}, b{kSess2, 1, 2, 2, "second"};
    const uint64_t before = c.p.started.load();
    session(c, a, 5);
    c.out["started1"] = c.p.started.load() - before;
    if (unload) {
        // NCCL 2.30.7 dlcloses the plugin when its last communicator is finalized and
        // dlopens it again for the next one. The plugin libraries are linked -z nodelete,
        // so the library must stay mapped through that and serve the next session.
        dlclose(c.p.lib);
        void *still = dlopen(plugin_path().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        c.out["still_loaded"] = still != nullptr;
        if (still) dlclose(still);
        c.p.forget();
        load_or_fail(c, plugin_path(), 6);
    }
    const uint64_t mid = c.p.started.load();
    session(c, b, 7);
    c.out["started2"] = c.p.started.load() - mid;
    dlclose(c.p.lib);
}

} // namespace

// =========================================================================================

TEST_CASE("9. a bad VIGIL_PROFILE_EVENTS gets a WARN and the default events", "[profiler-replay]")
{
    // Observability never stops a job, nor switches itself off for a typo: the default set.
    Outcome o = run_child("bad-events", {{"VIGIL_PROFILE_EVENTS", "coll,bogus"}}, body_mask);
    REQUIRE_CHILD_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    CHECK(o.drv["rc"] == ncclSuccess);
    const int want = ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileKernelCh |
                     ncclProfileNetPlugin;
    CHECK((o.drv["mask"].get<int>() & want) == want);
    CHECK(o.drv["ctx_null"] == false);
    CHECK(o.drv["coll_null"] == false);
    CHECK(o.drv["finalize_rc"] == ncclSuccess);
    bool warned = false;
    for (const json &w : o.drv["warns"]) {
        const std::string t = w.get<std::string>();
        warned |= t.find("bogus") != std::string::npos && t.find("using the default") != std::string::npos;
    }
    CHECK(warned);
}

TEST_CASE("10. VIGIL_PROFILE_EVENTS through init's mask", "[profiler-replay]")
{
    struct Case {
        const char *text;
        int must;
    };
    const Case cases[] = {
        {"coll", ncclProfileColl | ncclProfileP2p | ncclProfileGroup},
        {"net", ncclProfileNetPlugin | ncclProfileProxyStep | ncclProfileProxyOp},
        {"4095", 4095},
        {"all", 4095},
        {" coll , kernel-ch ", ncclProfileColl | ncclProfileKernelCh},
    };
    for (const Case &k : cases) {
        Outcome o = run_child("mask", {{"VIGIL_PROFILE_EVENTS", k.text}}, body_mask);
        INFO("VIGIL_PROFILE_EVENTS=\"" << k.text << "\" driver " << o.drv.dump());
        REQUIRE_CHILD_OK(o);
        CHECK(o.drv["rc"] == ncclSuccess);
        CHECK(o.drv["ctx_null"] == false);
        const int mask = o.drv["mask"].get<int>();
        CHECK((mask & k.must) == k.must);
        CHECK((mask & ~0xffff) == 0);
        CHECK((mask & 0x7000) == 0); // copy-engine events: never asked for
        if (std::string(k.text) == "4095") CHECK(mask == 4095);
        CHECK(o.drv["coll_null"] == false);
        REQUIRE_FILES_OK(o);
        CHECK(o.process()["mask"] == mask);
    }
}

TEST_CASE("11. VIGIL_PROFILE_MAX_BYTES bounds the trace", "[profiler-replay]")
{
    Outcome o = run_child("bound", {{"VIGIL_PROFILE_EVENTS", "all"}, {"VIGIL_PROFILE_MAX_BYTES", "65536"}},
                          body_bound);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    CHECK(o.trace_bytes <= 65536 + 16);
    CHECK(o.trace_bytes > 60000);
    const json st = o.stats();
    INFO("stats " << raw(st));
    CHECK(st["trace_dropped"].get<uint64_t>() > 0);
    CHECK(o.summary_bytes <= 65536 + 512);
    CHECK(o.of("coll").size() == 40); // the summary had room for all of them
    CHECK(st["summary_dropped"] == 0);
    REQUIRE_NO_DROPS(st);
}

TEST_CASE("12. PXN: another process's proxy op", "[profiler-replay]")
{
    Outcome o = run_child("pxn", {{"VIGIL_PROFILE_EVENTS", "all"}}, body_pxn);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    const json &r = o.drv["pxn"];
    CHECK(r["send_step0"] == true);
    CHECK(r["send_step1"] == true);
    CHECK(r["recv_step0"] == true);
    CHECK(r["recv_step1"] == true);
    CHECK(r["net"] == true);
    // The op and its steps are in the trace, marked foreign.
    int foreign_ops = 0;
    for (const json &e : o.events("X")) {
        if ((e["name"] == "send op" || e["name"] == "recv op") && e["args"]["foreign"] == true) {
            ++foreign_ops;
            CHECK(e["args"]["peer"] == 9);
        }
    }
    CHECK(foreign_ops == 2);
    int pxn_steps = 0;
    const std::set<std::string> names = o.thread_names();
    for (const char *t : {"ch 3 send s0", "ch 3 send s1", "ch 3 recv s0", "ch 3 recv s1"}) {
        INFO("track " << t);
        CHECK(names.count(t) == 1);
    }
    for (const json &e : o.events("X", "step"))
        if (e["args"]["bytes"] == 4096) ++pxn_steps;
    CHECK(pxn_steps == 4);
    REQUIRE(o.of("coll").size() == 1);
    CHECK(o.of("coll")[0]["timing"] == "kernel_gpu");
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["foreign_handles"] == 0);
    CHECK(st["events"] == o.drv["started"]);
}

TEST_CASE("13. graph replay: Coll parent is a long-stopped CollApi", "[profiler-replay]")
{
    Outcome o = run_child("graph", {{"VIGIL_PROFILE_EVENTS", "all"}, {"VIGIL_PROFILE_POOL", "64"}}, body_graph);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    const int64_t m2r = o.process()["mono_to_realtime_ns"].get<int64_t>();
    std::map<uint64_t, json> tasks;
    for (const json &t : o.drv["tasks"]) tasks[t["seq"].get<uint64_t>()] = t;
    REQUIRE(tasks.size() == 33);
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 33);
    int replays = 0;
    for (const json &r : colls) {
        INFO("coll " << raw(r));
        const uint64_t s = r["seq"].get<uint64_t>();
        REQUIRE(tasks.count(s) == 1);
        CHECK(r["count"] == tasks[s]["count"]);
        CHECK(r["timing"] == "kernel_gpu");
        CHECK(r["channels"] == 2);
        check_bandwidth(r, 2.0 * 3 / 4);
        check_start_us(r, tasks[s], m2r);
        if (s >= 30) {
            ++replays;
            CHECK(r["count"] == 777216);
            CHECK(r["bytes"] == 777216 * 4);
        }
    }
    CHECK(replays == 3);
    // The capture's API events carry graphCaptured.
    int captured = 0;
    for (const json &e : o.events("X", "AllReduce"))
        if (e["args"]["graph_captured"] == true) ++captured;
    CHECK(captured == 1);
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
}

TEST_CASE("14. non-blocking communicator: a new launch thread per group", "[profiler-replay]")
{
    // Pools are per thread and given back when a thread exits: 300 launch threads in turn
    // must fit in 4 pools (main, proxy, the current launch thread).
    Outcome o = run_child("nonblocking", {{"VIGIL_PROFILE_EVENTS", "all"}, {"VIGIL_PROFILE_THREADS", "4"}},
                          body_nonblocking);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    auto colls = o.of("coll");
    CHECK(colls.size() == kNbGroups);
    std::set<uint64_t> seqs;
    for (const json &r : colls) {
        seqs.insert(r["seq"].get<uint64_t>());
        CHECK(r["timing"] == "kernel_gpu");
    }
    CHECK(seqs.size() == kNbGroups);
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
    CHECK(o.events("X", "GroupApi").size() == kNbGroups);
    CHECK(o.events("X", "KernelLaunch").size() == kNbGroups);
}

void check_sessions(bool unload)
{
    Outcome o = run_child(unload ? "sessions-reload" : "sessions", {}, [&](Child &c) { body_sessions(c, unload); });
    REQUIRE_CHILD_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    // "A process that destroys its last communicator and creates another starts a new pair
    // of files rather than truncating the first" (writer.cc, open_files).
    REQUIRE(o.summaries.size() == 2);
    REQUIRE(o.traces.size() == 2);
    std::map<std::string, int> colls_of;
    for (size_t i = 0; i < 2; ++i) {
        Outcome one = o;
        one.summaries = {o.summaries[i]};
        one.traces = {o.traces[i]};
        load_files(one, o.summaries[i], o.traces[i]);
        INFO("files " << o.summaries[i] << " " << o.traces[i]);
        REQUIRE_FILES_OK(one);
        for (const json &r : one.of("coll")) colls_of[r["comm"].get<std::string>()]++;
        auto comms = one.of("comm");
        REQUIRE(comms.size() == 1);
        const bool first = comms[0]["comm"] == hex(kSess1);
        CHECK(one.of("coll").size() == (first ? 5u : 7u));
        const json st = one.stats();
        INFO("stats " << raw(st));
        REQUIRE_NO_DROPS(st);
        CHECK(st["foreign_handles"] == 0);
        // Each file's stats describe that file, like its trace_dropped/summary_dropped/orphans
        // (reset per session), not the whole process's history.
        CHECK(st["events"] == o.drv[first ? "started1" : "started2"]);
    }
    if (unload) CHECK(o.drv["still_loaded"] == true); // -z nodelete: dlclose unmaps nothing
    CHECK(colls_of[hex(kSess1)] == 5);
    CHECK(colls_of[hex(kSess2)] == 7);
}

TEST_CASE("15a. a second communicator after the last finalize (plugin stays loaded)", "[profiler-replay]")
{
    check_sessions(false);
}

TEST_CASE("15b. a second communicator after dlclose and dlopen (NCCL 2.30.7)", "[profiler-replay]")
{
    check_sessions(true);
}
