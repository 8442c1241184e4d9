// SPDX-License-Identifier: Apache-2.0
// SetupJobs (net_plugin/setup_jobs.h): slow set-up work runs on the process's set-up thread,
// in order, and the submitter only polls.
#include <catch2/catch.hpp>

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "setup_jobs.h"

using vigil::net::SetupJobs;

namespace {

// Polls until `job` is done (the worker runs it as soon as it is queued), 10 s at most.
bool wait_done(const std::shared_ptr<SetupJobs::Job> &job)
{
    for (int i = 0; i < 10000 && !job->done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return job->done();
}

// Records the thread that destroys it.
struct Witness {
    explicit Witness(std::atomic<std::thread::id> *d) : died_on(d) {}
    ~Witness() { died_on->store(std::this_thread::get_id()); }
    Witness(const Witness &) = delete;
    Witness &operator=(const Witness &) = delete;
    std::atomic<std::thread::id> *died_on;
};

} // namespace

TEST_CASE("set-up jobs run on the set-up thread, in order, and report their result", "[setup_jobs]")
{
    SetupJobs &jobs = SetupJobs::process();
    std::vector<int> order;
    std::atomic<std::thread::id> ran_on{};
    char name[32] = {};
    std::vector<std::shared_ptr<SetupJobs::Job>> queued;
    for (int i = 0; i < 5; ++i) {
        queued.push_back(jobs.run([&, i] {
            order.push_back(i); // only the set-up thread touches it, one job at a time
            ran_on.store(std::this_thread::get_id());
            pthread_getname_np(pthread_self(), name, sizeof(name));
            return i == 3 ? -EHOSTUNREACH : 0;
        }));
        REQUIRE(queued.back() != nullptr);
    }
    for (auto &j : queued) REQUIRE(wait_done(j));
    CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
    CHECK(ran_on.load() != std::this_thread::get_id());
    CHECK(std::string(name) == "vigil-setup");
    CHECK(queued[2]->rc() == 0);
    CHECK(queued[3]->rc() == -EHOSTUNREACH);
    CHECK(jobs.pending() == 0);
}

TEST_CASE("a set-up job whose submitter left still runs, and frees what it holds there",
          "[setup_jobs]")
{
    SetupJobs &jobs = SetupJobs::process();
    std::atomic<bool> go{false}, ran{false};
    std::atomic<std::thread::id> died_on{};
    // The first job holds the worker until the second one is queued and its handle dropped.
    auto gate = jobs.run([&] {
        while (!go.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return 0;
    });
    REQUIRE(gate != nullptr);
    {
        auto w = std::make_shared<Witness>(&died_on);
        auto dropped = jobs.run([w, &ran] {
            ran.store(true);
            return 0;
        });
        REQUIRE(dropped != nullptr);
    } // the submitter's handle and its copy of the witness are gone; the job holds the last
    CHECK(died_on.load() == std::thread::id{});
    go.store(true);
    REQUIRE(wait_done(gate));
    for (int i = 0; i < 10000 && jobs.pending() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(ran.load());
    CHECK(died_on.load() != std::thread::id{});
    CHECK(died_on.load() != std::this_thread::get_id());
}

TEST_CASE("a set-up job that throws reports -ENOMEM and the worker goes on", "[setup_jobs]")
{
    SetupJobs &jobs = SetupJobs::process();
    auto bad = jobs.run([]() -> int { throw std::runtime_error("no memory for the QP"); });
    auto next = jobs.run([] { return 0; });
    REQUIRE(bad != nullptr);
    REQUIRE(next != nullptr);
    REQUIRE(wait_done(bad));
    REQUIRE(wait_done(next));
    CHECK(bad->rc() == -ENOMEM);
    CHECK(next->rc() == 0);
}

TEST_CASE("a set-up job's on_done runs on the set-up thread once the job is done", "[setup_jobs]")
{
    std::atomic<bool> saw_done{false};
    std::atomic<std::thread::id> woke_on{};
    std::shared_ptr<SetupJobs::Job> job;
    std::atomic<bool> queued{false};
    job = SetupJobs::process().run([] { return -EAGAIN; },
                                   [&] {
                                       while (!queued.load()) std::this_thread::yield();
                                       saw_done.store(job->done());
                                       woke_on.store(std::this_thread::get_id());
                                   });
    queued.store(true);
    REQUIRE(job != nullptr);
    REQUIRE(wait_done(job));
    for (int i = 0; i < 10000 && woke_on.load() == std::thread::id{}; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(saw_done.load());
    CHECK(woke_on.load() != std::thread::id{});
    CHECK(woke_on.load() != std::this_thread::get_id());
    CHECK(job->rc() == -EAGAIN);
}
