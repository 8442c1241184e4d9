// SPDX-License-Identifier: Apache-2.0
// PollThread (poll_thread.h).
#include "poll_thread.h"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <system_error>
#include <unistd.h>

#include "log.h"

namespace vigil::net {

int PollThread::start(int fd, const std::string &thread_name, std::string what, OnReadable on_readable)
{
    if (thread_.joinable()) return -EBUSY;
    stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (stop_fd_ < 0) return -errno;
    fd_ = fd;
    what_ = std::move(what);
    on_readable_ = std::move(on_readable);
    try {
        thread_ = std::thread([this] { run(); });
    } catch (const std::system_error &e) {
        ::close(stop_fd_);
        stop_fd_ = -1;
        return e.code().value() > 0 ? -e.code().value() : -EAGAIN;
    }
    pthread_setname_np(thread_.native_handle(), thread_name.substr(0, 15).c_str());
    return 0;
}

void PollThread::stop() noexcept
{
    if (!thread_.joinable()) return;
    const uint64_t one = 1;
    if (::write(stop_fd_, &one, sizeof one) != sizeof one)
        VLOG_WARN("%s: cannot wake its event thread: %s", what_.c_str(), strerror(errno));
    thread_.join();
    ::close(stop_fd_);
    stop_fd_ = -1;
}

void PollThread::run() noexcept
{
    pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    for (;;) {
        const int ready = ::poll(fds, 2, -1);
        if (ready < 0) {
            if (errno == EINTR) continue;
            VLOG_WARN("%s: poll: %s; no more port events", what_.c_str(), strerror(errno));
            return;
        }
        if (fds[1].revents != 0) return;
        if ((fds[0].revents & (POLLERR | POLLHUP | POLLNVAL)) != 0 && (fds[0].revents & POLLIN) == 0) {
            VLOG_WARN("%s: its fd failed; no more port events", what_.c_str());
            return;
        }
        try {
            on_readable_();
        } catch (const std::exception &e) {
            VLOG_WARN("%s: handling an event failed: %s", what_.c_str(), e.what());
        } catch (...) {
            VLOG_WARN("%s: handling an event failed", what_.c_str());
        }
    }
}

} // namespace vigil::net
