// SPDX-License-Identifier: Apache-2.0
// Progress engine implementation (epoll, edge-triggered, one loop per engine thread).
#include "progress.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <pthread.h>
#include <sched.h>
#include <string>
#include <system_error>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

namespace vigil::net {
namespace {

// This thread is one of the engine's (quiesce() must not wait there: two engine threads
// waiting for each other's iteration would never return).
thread_local bool t_engine_thread = false;

// The CPUs the process may run on: the main thread's mask (tid = pid). The calling thread's
// may be narrower: NCCL pins its proxy threads near the GPU, and new threads inherit that.
bool process_cpus(cpu_set_t *set)
{
    CPU_ZERO(set);
    return sched_getaffinity(getpid(), sizeof(*set), set) == 0 && CPU_COUNT(set) > 0;
}

} // namespace

bool parse_cpulist(const std::string &list, const cpu_set_t &allowed, cpu_set_t *set)
{
    CPU_ZERO(set);
    const char *p = list.c_str();
    while (*p != '\0' && *p != '\n') {
        char *end = nullptr;
        const long lo = std::strtol(p, &end, 10);
        long hi = lo;
        bool ok = end != p && lo >= 0;
        if (ok && *end == '-') {
            p = end + 1;
            hi = std::strtol(p, &end, 10);
            ok = end != p && hi >= lo;
        }
        ok = ok && (*end == ',' || *end == '\0' || *end == '\n');
        if (!ok) {
            CPU_ZERO(set);
            return false;
        }
        for (long c = lo; c <= hi && c < CPU_SETSIZE; ++c)
            if (CPU_ISSET(static_cast<int>(c), &allowed)) CPU_SET(static_cast<int>(c), set);
        p = *end == ',' ? end + 1 : end;
    }
    return CPU_COUNT(set) > 0;
}

namespace {

// The CPUs of NUMA node `node` (sysfs cpulist, "0-7,16-23") that this process may run on;
// empty when the node or its list is unknown, or none of its CPUs is ours.
bool node_cpus(int node, cpu_set_t *set)
{
    CPU_ZERO(set);
    if (node < 0) return false;
    std::ifstream in("/sys/devices/system/node/node" + std::to_string(node) + "/cpulist");
    std::string list;
    cpu_set_t allowed;
    if (!std::getline(in, list) || !process_cpus(&allowed)) return false;
    return parse_cpulist(list, allowed, set);
}

} // namespace

ProgressEngine &ProgressEngine::instance()
{
    // Never destroyed: ncclNet v8..v10 have no finalize, so the threads may still run at exit,
    // and a joinable std::thread's destructor would call std::terminate.
    static ProgressEngine *engine = new ProgressEngine;
    return *engine;
}

int ProgressEngine::start_shard_locked(int index, int numa)
{
    auto s = std::make_unique<Shard>();
    s->numa = numa;
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (s->epfd < 0) return -errno;
    s->wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->wakefd < 0) {
        const int rc = -errno;
        close(s->epfd);
        return rc;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->wakefd, &ev) != 0) {
        const int rc = -errno;
        close(s->wakefd);
        close(s->epfd);
        return rc;
    }
    s->running.store(true);
    Shard *raw = s.get();
    try {
        s->thread = std::thread([raw] { loop(*raw); });
    } catch (const std::system_error &e) {
        close(s->wakefd);
        close(s->epfd);
        return e.code().value() > 0 ? -e.code().value() : -EAGAIN;
    }
    // Thread names hold 15 characters.
    const std::string name = index == 0 ? "vigil-progress" : "vigil-prog-" + std::to_string(index);
    pthread_setname_np(s->thread.native_handle(), name.substr(0, 15).c_str());
    // Pinned to its node's CPUs; a thread of no known node may run on any of the process's
    // (not only where the thread that created it, maybe a GPU-pinned NCCL thread, may).
    cpu_set_t cpus;
    if (node_cpus(numa, &cpus) || (index > 0 && process_cpus(&cpus))) {
        if (int e = pthread_setaffinity_np(s->thread.native_handle(), sizeof(cpus), &cpus); e != 0)
            VLOG_WARN("progress thread %d: cannot set its CPUs (NUMA node %d): %s", index, numa, strerror(e));
    }
    shards_[static_cast<size_t>(index)] = std::move(s);
    nshards_.store(index + 1, std::memory_order_release);
    return 0;
}

int ProgressEngine::start(int threads)
{
    std::lock_guard<std::mutex> g(mu_);
    per_node_.store(threads < 1 ? 1 : threads > kMaxThreads ? kMaxThreads : threads,
                    std::memory_order_relaxed);
    if (nshards_.load() > 0) return 0;
    return start_shard_locked(0, -1);
}

void ProgressEngine::stop()
{
    std::lock_guard<std::mutex> g(mu_);
    const int n = nshards_.load();
    for (int i = 0; i < n; ++i) {
        Shard &s = *shards_[static_cast<size_t>(i)];
        s.running.store(false);
        uint64_t one = 1;
        [[maybe_unused]] ssize_t w = write(s.wakefd, &one, sizeof(one));
        s.thread.join();
        close(s.wakefd);
        close(s.epfd);
    }
    nshards_.store(0, std::memory_order_release);
    for (int i = 0; i < n; ++i) shards_[static_cast<size_t>(i)].reset();
    per_node_.store(1, std::memory_order_relaxed);
}

void ProgressEngine::bind(ProgressClient *client, int numa_node)
{
    std::lock_guard<std::mutex> g(mu_);
    const int per_node = per_node_.load(std::memory_order_relaxed);
    const int n = nshards_.load();
    int best = 0;
    if (per_node > 1 && n > 0) {
        // Thread 0 (unpinned) counts among the threads of an unknown node.
        const int node = numa_node < 0 ? -1 : numa_node;
        int have = 0;
        best = -1;
        for (int i = 0; i < n; ++i) {
            const Shard &s = *shards_[static_cast<size_t>(i)];
            if (s.numa != node) continue;
            ++have;
            if (best < 0 || s.clients < shards_[static_cast<size_t>(best)]->clients) best = i;
        }
        if ((best < 0 || shards_[static_cast<size_t>(best)]->clients > 0) && have < per_node && n < kMaxShards) {
            if (int e = start_shard_locked(n, node); e == 0) best = n;
            else VLOG_WARN("cannot start progress thread %d: %s; sharing another", n, strerror(-e));
        }
        if (best < 0) { // the node has no thread and none could start: the least loaded of all
            best = 0;
            for (int i = 1; i < nshards_.load(); ++i)
                if (shards_[static_cast<size_t>(i)]->clients < shards_[static_cast<size_t>(best)]->clients) best = i;
        }
    }
    client->thread_ = best;
    ++shards_[static_cast<size_t>(best)]->clients;
}

void ProgressEngine::unbind(ProgressClient *client)
{
    std::lock_guard<std::mutex> g(mu_);
    if (client->thread_ < nshards_.load()) --shards_[static_cast<size_t>(client->thread_)]->clients;
    client->thread_ = 0;
}

namespace {
epoll_event watched(ProgressClient *client, bool wake)
{
    epoll_event ev{};
    ev.events = wake ? EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET : EPOLLET;
    ev.data.ptr = client;
    return ev;
}
} // namespace

int ProgressEngine::add(int fd, ProgressClient *client, bool wake)
{
    Shard *s = shard_of(client);
    if (s == nullptr) return -ENODEV;
    epoll_event ev = watched(client, wake);
    if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) return -errno;
    return 0;
}

void ProgressEngine::interest(int fd, ProgressClient *client, bool wake)
{
    epoll_event ev = watched(client, wake);
    if (Shard *s = shard_of(client)) epoll_ctl(s->epfd, EPOLL_CTL_MOD, fd, &ev); // ENOENT: not watched
}

void ProgressEngine::remove(int fd, ProgressClient *client)
{
    if (Shard *s = shard_of(client)) epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, nullptr);
}

void ProgressEngine::add_ticker(ProgressClient *client)
{
    Shard *s = shard_of(client);
    if (s == nullptr) return;
    std::lock_guard<std::mutex> g(s->tick_mu);
    client->ticking_ = true;
    client->due_ = 0; // due at the next tick
    s->timers.push_back({0, client});
    std::push_heap(s->timers.begin(), s->timers.end(), std::greater<>{});
    s->nudge(0);
}

void ProgressEngine::remove_ticker(ProgressClient *client)
{
    Shard *s = shard_of(client);
    if (s == nullptr) return;
    std::lock_guard<std::mutex> g(s->tick_mu);
    // O(clients of the thread), once per comm's life: the heap's ticks need no lookup. A
    // client the loop has out is not put back (ticking_ is false).
    client->ticking_ = false;
    client->due_ = ProgressClient::kParked;
    std::erase_if(s->timers, [client](const Shard::Timer &t) { return t.client == client; });
    std::make_heap(s->timers.begin(), s->timers.end(), std::greater<>{});
}

void ProgressEngine::wake(ProgressClient *client, uint64_t at_ns)
{
    Shard *s = shard_of(client);
    if (s == nullptr) return;
    std::lock_guard<std::mutex> g(s->tick_mu);
    // Parked (kParked) or out to call (kCalling) compare above any time: both take the new
    // entry, and the loop does not put a client it had out back after the call.
    if (!client->ticking_ || client->due_ <= at_ns) return;
    client->due_ = at_ns;
    s->timers.push_back({at_ns, client});
    std::push_heap(s->timers.begin(), s->timers.end(), std::greater<>{});
    s->nudge(at_ns);
}

void ProgressEngine::Shard::nudge(uint64_t at_ns)
{
    // The loop sleeps until its earliest timer: wake it when this one comes sooner (by more
    // than a tick: a little late is fine, a wake-up per call is not).
    if (at_ns + kTickNs >= sleep_until.load(std::memory_order_acquire)) return;
    sleep_until.store(at_ns, std::memory_order_release);
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t w = write(wakefd, &one, sizeof(one));
}

void ProgressEngine::quiesce()
{
    if (t_engine_thread) return;
    const int n = nshards_.load(std::memory_order_acquire);
    uint64_t seen[kMaxShards];
    for (int i = 0; i < n; ++i) {
        Shard &s = *shards_[static_cast<size_t>(i)];
        seen[i] = s.iterations.load(std::memory_order_acquire);
        uint64_t one = 1;
        [[maybe_unused]] ssize_t w = write(s.wakefd, &one, sizeof(one));
    }
    for (int i = 0; i < n; ++i) {
        Shard &s = *shards_[static_cast<size_t>(i)];
        while (s.iterations.load(std::memory_order_acquire) == seen[i] &&
               s.running.load(std::memory_order_acquire))
            std::this_thread::yield();
    }
}

void ProgressEngine::loop(Shard &s)
{
    t_engine_thread = true;
    constexpr int kMaxEvents = 64;
    epoll_event events[kMaxEvents];
    std::vector<Shard::Timer> due;
    uint64_t next_tick = now_ns() + kTickNs;
    while (s.running.load(std::memory_order_acquire)) {
        // Sleep until the earliest timer (a tick at the least, kIdleNs at the most): a thread
        // whose clients are parked or quiet wakes only for their few timers and their fds.
        int timeout_ms;
        {
            std::lock_guard<std::mutex> g(s.tick_mu);
            const uint64_t now = now_ns();
            uint64_t until = now + kIdleNs;
            if (!s.timers.empty()) until = std::min(until, std::max(s.timers.front().due, next_tick));
            s.sleep_until.store(until, std::memory_order_release);
            timeout_ms = static_cast<int>((until > now ? until - now + 999'999 : 0) / 1'000'000);
        }
        int n = epoll_wait(s.epfd, events, kMaxEvents, timeout_ms);
        if (n < 0) {
            if (errno == EINTR) continue;
            VLOG_WARN("progress: epoll_wait failed: %s", strerror(errno));
            usleep(1000); // cannot happen with a valid epfd; do not spin if it does
            continue;
        }
        // Several events of one batch can name the same client; call it once.
        ProgressClient *last = nullptr;
        for (int i = 0; i < n; ++i) {
            auto *c = static_cast<ProgressClient *>(events[i].data.ptr);
            if (c == nullptr) {
                uint64_t v;
                [[maybe_unused]] ssize_t r = read(s.wakefd, &v, sizeof(v));
                continue;
            }
            if (c == last) continue;
            last = c;
            c->on_ready();
        }
        s.sleep_until.store(0, std::memory_order_release); // awake: nobody needs to nudge
        if (const uint64_t now = now_ns(); now >= next_tick) {
            next_tick = now + kTickNs;
            due.clear();
            {
                std::lock_guard<std::mutex> g(s.tick_mu);
                while (!s.timers.empty() && s.timers.front().due <= now) {
                    std::pop_heap(s.timers.begin(), s.timers.end(), std::greater<>{});
                    const Shard::Timer t = s.timers.back();
                    s.timers.pop_back();
                    if (!t.client->ticking_ || t.client->due_ != t.due) continue; // stale
                    t.client->due_ = kCalling;
                    due.push_back(t);
                }
            }
            // Safe without the lock: remove_ticker() is followed by quiesce(), which waits
            // for this iteration to end.
            for (Shard::Timer &t : due) {
                t.client->on_tick();
                const uint64_t next = t.client->next_tick_ns();
                t.due = next == ProgressClient::kParked ? next : coalesced(std::max(next, now + kTickNs), now);
            }
            std::lock_guard<std::mutex> g(s.tick_mu);
            for (const Shard::Timer &t : due) {
                // Removed meanwhile (and maybe added again: then in the heap already), or woken
                // during the call: its entry stands.
                if (!t.client->ticking_ || t.client->due_ != kCalling) continue;
                t.client->due_ = t.due;
                if (t.due == ProgressClient::kParked) continue; // until wake()
                s.timers.push_back(t);
                std::push_heap(s.timers.begin(), s.timers.end(), std::greater<>{});
            }
        }
        s.iterations.fetch_add(1, std::memory_order_acq_rel);
    }
}

} // namespace vigil::net
