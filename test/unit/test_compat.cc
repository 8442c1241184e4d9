// SPDX-License-Identifier: Apache-2.0
// The glibc compatibility layer's own code (common/compat/glibc_compat.cc): what it does in
// place of _dl_find_object and pthread_cond_clockwait on a glibc that lacks them, checked
// against this glibc's real ones, and its arc4random.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <pthread.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <set>
#include <thread>

extern "C" {
int vigil_find_object_fallback(void *pc, dl_find_object *out);
int vigil_clockwait_fallback(pthread_cond_t *cond, pthread_mutex_t *mutex, clockid_t clock,
                             const timespec *abstime);
uint32_t __wrap_arc4random();
}

namespace {

int local_function(int x)
{
    return x + 1;
}

timespec after_ms(clockid_t clock, int ms)
{
    timespec t{};
    clock_gettime(clock, &t);
    int64_t ns = t.tv_nsec + int64_t(ms) * 1'000'000;
    t.tv_sec += time_t(ns / 1'000'000'000);
    t.tv_nsec = long(ns % 1'000'000'000);
    return t;
}

} // namespace

TEST_CASE("compat: _dl_find_object from dl_iterate_phdr agrees with glibc's", "[unit][compat]")
{
    // This executable, libc and libstdc++: code addresses in three objects.
    void *pcs[] = {reinterpret_cast<void *>(&local_function), reinterpret_cast<void *>(&std::printf),
                   reinterpret_cast<void *>(&std::terminate)};
    for (void *pc : pcs) {
        dl_find_object want{}, got{};
        REQUIRE(_dl_find_object(pc, &want) == 0);
        REQUIRE(vigil_find_object_fallback(pc, &got) == 0);
        CHECK(got.dlfo_map_start == want.dlfo_map_start);
        CHECK(got.dlfo_map_end == want.dlfo_map_end);
        CHECK(got.dlfo_eh_frame == want.dlfo_eh_frame);
        CHECK(got.dlfo_eh_frame != nullptr);
    }
    dl_find_object none{};
    CHECK(vigil_find_object_fallback(reinterpret_cast<void *>(uintptr_t{16}), &none) == -1);
    CHECK(_dl_find_object(reinterpret_cast<void *>(uintptr_t{16}), &none) == -1);
}

TEST_CASE("compat: pthread_cond_clockwait on CLOCK_MONOTONIC through pthread_cond_timedwait",
          "[unit][compat]")
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    pthread_mutex_lock(&mu);
    // Nobody signals: times out at the deadline, not before.
    const auto t0 = std::chrono::steady_clock::now();
    const timespec deadline = after_ms(CLOCK_MONOTONIC, 60);
    int rc = 0;
    while ((rc = vigil_clockwait_fallback(&cv, &mu, CLOCK_MONOTONIC, &deadline)) == 0) {
    }
    const auto waited = std::chrono::steady_clock::now() - t0;
    CHECK(rc == ETIMEDOUT);
    CHECK(waited >= std::chrono::milliseconds(59));
    CHECK(waited < std::chrono::seconds(5));
    // A deadline already past returns at once.
    const timespec past = after_ms(CLOCK_MONOTONIC, -10);
    CHECK(vigil_clockwait_fallback(&cv, &mu, CLOCK_MONOTONIC, &past) == ETIMEDOUT);
    // A signal wakes it long before a distant deadline.
    bool flag = false;
    std::thread t([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        pthread_mutex_lock(&mu);
        flag = true;
        pthread_cond_signal(&cv);
        pthread_mutex_unlock(&mu);
    });
    const timespec far = after_ms(CLOCK_MONOTONIC, 30'000);
    const auto t1 = std::chrono::steady_clock::now();
    rc = 0;
    while (!flag && rc != ETIMEDOUT) rc = vigil_clockwait_fallback(&cv, &mu, CLOCK_MONOTONIC, &far);
    CHECK(flag);
    CHECK(std::chrono::steady_clock::now() - t1 < std::chrono::seconds(10));
    // A deadline at the end of time (steady_clock::time_point::max() as libstdc++ passes it):
    // one slice of waiting, then a spurious wake-up, never a spin or an error.
    const timespec end_of_time{std::numeric_limits<time_t>::max(), 999'999'999};
    const auto t2 = std::chrono::steady_clock::now();
    CHECK(vigil_clockwait_fallback(&cv, &mu, CLOCK_MONOTONIC, &end_of_time) == 0);
    const auto slice = std::chrono::steady_clock::now() - t2;
    CHECK(slice >= std::chrono::milliseconds(90));
    CHECK(slice < std::chrono::seconds(5));
    const timespec bad{0, 1'000'000'000};
    CHECK(vigil_clockwait_fallback(&cv, &mu, CLOCK_MONOTONIC, &bad) == EINVAL);
    pthread_mutex_unlock(&mu);
    t.join();
}

TEST_CASE("compat: arc4random from getrandom", "[unit][compat]")
{
    std::set<uint32_t> seen;
    for (int i = 0; i < 64; ++i) seen.insert(__wrap_arc4random());
    CHECK(seen.size() >= 60); // 64 draws of 32 random bits: a repeat is a 1 in 2^21 event
}
