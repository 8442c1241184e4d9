// SPDX-License-Identifier: Apache-2.0
// Profiler replay scenarios 19-22 (test_profiler_replay.cc has the runner and the overview):
// the shapes of real GPU runs: v7 with user tags and kernel phases, a lost kernel channel,
// kernel stamps of another task, queued and eagerly launched collectives.

#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "replay_support.h"

using namespace replay;

// ---- scenarios 19-22: the shapes of real GPU runs ----------------------------------------

/// One communicator with its proxy thread and user, whose works `tweak` shapes (the n-th work
/// posted is tweak(w, n)), all-reducing one collective per group.
struct Job {
    Comm comm;
    Proxy proxy;
    User user;
    json tasks = json::array();
    int posted = 0;
    std::function<void(Work &, int)> tweak;
    Job(Child &c, Comm cm, std::function<void(Work &, int)> shape)
        : comm(cm), proxy(c), user(c.p), tweak(std::move(shape))
    {
        init_or_fail(c, comm);
        user.post = [this](Task &t) {
            Work w = work_for(t);
            w.log = true;
            w.step_ns = 2000;
            tweak(w, posted++);
            proxy.post(std::move(w));
        };
    }
    /// `n` groups of one all-reduce each, issued back to back; then waits for the launches.
    void all_reduce(int n, size_t count)
    {
        for (int i = 0; i < n; ++i) {
            user.group_start();
            user.all_reduce(comm, count, 2);
            for (const Task &t : user.group_end()) tasks.push_back(task_log(t));
        }
        user.wait_launch();
    }
};

// Scenario 19: v7 (NCCL 2.31): user tags, kernel phases, a mask RAS changes.

constexpr uint64_t kV7Hash = 0x7a7a000000000019ull;

void body_v7(Child &c)
{
    load_or_fail(c, plugin_path(), 7);
    bool kernel = true;
    Job job(c, Comm{kV7Hash, 1, 2, 2, "v7"}, [&](Work &w, int) {
        w.kernel = kernel;
        w.phases = kernel;
    });
    c.out["mask_after_init"] = g_mask;
    for (int i = 0; i < 4; ++i) {
        job.user.user_tag = 1000 + static_cast<uint64_t>(i);
        job.all_reduce(1, 65536);
    }
    job.proxy.wait_idle();
    // RAS switches kernel-channel events off from its own thread (NCCL >= 2.31): collectives
    // started from now on get none, and must not wait for them.
    std::thread ras([] { __atomic_and_fetch(&g_mask, ~ncclProfileKernelCh, __ATOMIC_RELAXED); });
    ras.join();
    kernel = false;
    job.user.user_tag = 0;
    job.all_reduce(3, 65536);
    job.proxy.finish();
    std::this_thread::sleep_for(std::chrono::milliseconds(350)); // past the settle time
    __atomic_or_fetch(&g_mask, ncclProfileKernelCh, __ATOMIC_RELAXED);
    finalize_all(c, {&job.comm});
}

TEST_CASE("19. v7 (NCCL 2.31): user tags, kernel phases, a mask RAS changes after init", "[profiler-replay]")
{
    Outcome o = run_child("v7", {{"VIGIL_PROFILE_EVENTS", "all"}}, body_v7);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    CHECK(o.drv["version"] == 7);
    CHECK(o.process()["abi"] == "v7");
    CHECK((o.drv["mask_after_init"].get<int>() & ncclProfileKernelPhase) != 0);
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 7);
    for (size_t i = 0; i < colls.size(); ++i) {
        const json &r = colls[i];
        INFO("coll " << raw(r));
        CHECK(r["seq"] == i);
        if (i < 4) {
            CHECK(r["user_tag"] == 1000 + i);
            CHECK(r["timing"] == "kernel_gpu");
            CHECK(r["channels_timed"] == 2);
        } else {
            // Kernel channels off: timed by the network work, written without waiting.
            CHECK_FALSE(r.contains("user_tag"));
            CHECK(r["timing"] == "proxy_cpu");
        }
    }
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["kernel_timeouts"] == 0);
    CHECK(st["kernel_anomalies"] == 0);
    CHECK(st["orphans"] == 0);
    CHECK(st["events"] == o.drv["started"]);
    // Three phases per channel of the first four collectives, named by NCCL, on their tracks.
    size_t phases = 0;
    for (const json &e : o.events("X"))
        if (e["name"] == "initial_sync" || e["name"] == "compute" || e["name"] == "final_sync") ++phases;
    CHECK(phases == 4 * 2 * 3);
    CHECK_FALSE(o.tid_of("ch 0 kernel phases").is_null());
}

// ---- scenario 20: a kernel channel that never comes ------------------------------------

void body_missing_channel(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Job job(c, Comm{0x0a155e0000000020ull, 0, 2, 2, nullptr}, [](Work &w, int n) {
        if (n == 0) w.drop_channel = 1; // the first collective's channel 1 is lost
    });
    job.all_reduce(6, 4096);
    job.proxy.wait_idle();
    std::this_thread::sleep_for(std::chrono::milliseconds(600)); // past the kernel timeout
    // One more: written in a regular pass, after the first one's timeout and before finalize.
    job.all_reduce(1, 4096);
    job.proxy.finish();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    finalize_all(c, {&job.comm});
}

TEST_CASE("20. a kernel channel that never comes neither stalls nor leaks", "[profiler-replay]")
{
    Outcome o = run_child("missing-channel", {{"VIGIL_PROFILE_KERNEL_TIMEOUT_MS", "300"}}, body_missing_channel);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    // Written in completion order: the five whole ones at once (not held back by the first),
    // then the first at its timeout, then the one issued after the timeout.
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 7);
    std::vector<int> order;
    for (const json &r : colls) order.push_back(r["seq"].get<int>());
    CHECK(order == std::vector<int>{1, 2, 3, 4, 5, 0, 6});
    const json &first = colls[5];
    CHECK(first["timing"] == "kernel_gpu");
    CHECK(first["channels_timed"] == 1);
    for (size_t i : {0u, 1u, 2u, 3u, 4u, 6u}) CHECK(colls[i]["channels_timed"] == 2);
    const json st = o.stats();
    CHECK(st["kernel_timeouts"] == 1);
    CHECK(st["orphans"] == 0);
}

// ---- scenario 21: kernel stamps of another task (NVIDIA/nccl#2368) -----------------------

void body_bad_stamps(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Job job(c, Comm{0xbad5000000000021ull, 0, 2, 2, nullptr}, [](Work &w, int n) {
        w.bad_stamps = n == 2 ? 1 : n == 4 ? 2 : 0; // the 3rd ends before it begins, the 5th 3 s early
    });
    job.all_reduce(6, 4096);
    job.proxy.finish();
    finalize_all(c, {&job.comm});
}

TEST_CASE("21. kernel stamps of another task are detected, not printed", "[profiler-replay]")
{
    Outcome o = run_child("bad-stamps", {}, body_bad_stamps);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 6);
    for (const json &r : colls) {
        INFO("coll " << raw(r));
        const bool bad = r["seq"] == 2 || r["seq"] == 4;
        CHECK(r["timing"] == (bad ? "invalid" : "kernel_gpu"));
        CHECK(r["duration_us"].is_null() == bad);
        CHECK(r.contains("busbw_GBps") == !bad);
        if (bad) CHECK(r["channels_invalid"] == 2);
    }
    CHECK(o.stats()["kernel_anomalies"] == 2);
    size_t warned = 0;
    for (const json &w : o.drv["warns"]) warned += w.get<std::string>().find("nccl#2368") != std::string::npos;
    CHECK(warned == 1); // once per process
}

// ---- scenario 22: the shapes a real GPU gives ----------------------------------------------

void body_gpu_shapes(Child &c)
{
    load_or_fail(c, plugin_path(), 5);
    Job job(c, Comm{0x69b0000000000022ull, 0, 2, 2, nullptr}, [](Work &w, int n) {
        if (n < 4) {
            w.kernel_ns = 20'000'000; // four issued back to back: each runs 20 ms, in turn
        } else {
            // A small kernel that ran before the proxy saw it, and before NCCL stamped
            // S(Coll): stamps 300 us in the past.
            w.gpu_shift_ns = -300'000;
        }
    });
    job.all_reduce(4, 16 << 20);
    job.proxy.wait_idle();
    job.all_reduce(1, 256);
    job.proxy.finish();
    c.out["tasks"] = job.tasks;
    finalize_all(c, {&job.comm});
}

TEST_CASE("22. queued and eagerly launched collectives: durations are GPU time", "[profiler-replay]")
{
    Outcome o = run_child("gpu-shapes", {}, body_gpu_shapes);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 5);
    const json &plog = o.drv["proxy_log"];
    REQUIRE(plog.size() == 5);
    double prev_queue = -1;
    for (size_t i = 0; i < 4; ++i) {
        const json &r = colls[i];
        INFO("coll " << raw(r));
        CHECK(r["seq"] == i);
        check_kernel_duration(r, o.drv["tasks"][i], plog[i]);
        // Each is its own channels' GPU time (checked above to the stamps): its 20 ms and its
        // network steps, not the queue before it.
        CHECK(r["duration_us"].get<double>() >= 20'000);
        // ...but in its queueing time, which grows down the queue.
        CHECK(r["queue_us"].get<double>() > prev_queue);
        prev_queue = r["queue_us"].get<double>();
    }
    CHECK(prev_queue >= 40'000);
    const json &small = colls[4];
    INFO("small " << raw(small));
    check_kernel_duration(small, o.drv["tasks"][4], plog[4]);
    CHECK(small["duration_us"].get<double>() > 0);
    CHECK(small["queue_us"].get<double>() >= 0);
    CHECK(o.stats()["kernel_anomalies"] == 0);
}
