// SPDX-License-Identifier: Apache-2.0
// Progress engine implementation (epoll, edge-triggered, one thread).
#include "progress.h"

#include <cerrno>
#include <cstring>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

namespace vigil::net {

ProgressEngine &ProgressEngine::instance()
{
    // Never destroyed: ncclNet v8..v10 have no finalize, so the thread may still run at exit,
    // and a joinable std::thread's destructor would call std::terminate.
    static ProgressEngine *engine = new ProgressEngine;
    return *engine;
}

int ProgressEngine::start()
{
    std::lock_guard<std::mutex> g(mu_);
    if (running_.load()) return 0;
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) return -errno;
    wakefd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wakefd_ < 0) {
        int rc = -errno;
        close(epfd_);
        epfd_ = -1;
        return rc;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev);
    running_.store(true);
    thread_ = std::thread([this] { loop(); });
    pthread_setname_np(thread_.native_handle(), "vigil-progress");
    return 0;
}

void ProgressEngine::stop()
{
    std::lock_guard<std::mutex> g(mu_);
    if (!running_.load()) return;
    running_.store(false);
    uint64_t one = 1;
    [[maybe_unused]] ssize_t w = write(wakefd_, &one, sizeof(one));
    thread_.join();
    close(wakefd_);
    close(epfd_);
    wakefd_ = epfd_ = -1;
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
    epoll_event ev = watched(client, wake);
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return -errno;
    return 0;
}

void ProgressEngine::interest(int fd, ProgressClient *client, bool wake)
{
    epoll_event ev = watched(client, wake);
    epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev); // ENOENT: no longer watched, nothing to do
}

void ProgressEngine::remove(int fd)
{
    epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
}

void ProgressEngine::add_ticker(ProgressClient *client)
{
    std::lock_guard<std::mutex> g(tick_mu_);
    tickers_.push_back(client);
}

void ProgressEngine::remove_ticker(ProgressClient *client)
{
    std::lock_guard<std::mutex> g(tick_mu_);
    std::erase(tickers_, client);
}

void ProgressEngine::quiesce()
{
    if (!running_.load(std::memory_order_acquire) ||
        thread_.get_id() == std::this_thread::get_id())
        return;
    const uint64_t seen = iterations_.load(std::memory_order_acquire);
    uint64_t one = 1;
    [[maybe_unused]] ssize_t w = write(wakefd_, &one, sizeof(one));
    while (iterations_.load(std::memory_order_acquire) == seen &&
           running_.load(std::memory_order_acquire))
        std::this_thread::yield();
}

void ProgressEngine::loop()
{
    constexpr int kMaxEvents = 64;
    epoll_event events[kMaxEvents];
    std::vector<ProgressClient *> due;
    uint64_t next_tick = now_ns() + kTickNs;
    while (running_.load(std::memory_order_acquire)) {
        int n = epoll_wait(epfd_, events, kMaxEvents, static_cast<int>(kTickNs / 1000000));
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
                [[maybe_unused]] ssize_t r = read(wakefd_, &v, sizeof(v));
                continue;
            }
            if (c == last) continue;
            last = c;
            c->on_ready();
        }
        if (now_ns() >= next_tick) {
            next_tick = now_ns() + kTickNs;
            {
                std::lock_guard<std::mutex> g(tick_mu_);
                due = tickers_;
            }
            // Safe without the lock: remove_ticker() is followed by quiesce(), which waits
            // for this iteration to end.
            for (ProgressClient *c : due) c->on_tick();
        }
        iterations_.fetch_add(1, std::memory_order_acq_rel);
    }
}

} // namespace vigil::net
