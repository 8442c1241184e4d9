// SPDX-License-Identifier: Apache-2.0
// Socket helpers of the TCP fabric.
#include "socket.h"

#include <atomic>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "clock.h"
#include "log.h"

namespace vigil::net {

int make_socket(int family)
{
    int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
    if (fd >= 0) return fd;
    const int e = errno;
    warn_fd_limit(e, "a TCP socket");
    return -e;
}

namespace {

std::string limit_text(rlim_t v)
{
    return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(static_cast<unsigned long long>(v));
}

} // namespace

void raise_fd_limit()
{
    rlimit rl{};
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
    const rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        VLOG_WARN("cannot raise RLIMIT_NOFILE from %s to its hard limit %s: %s", limit_text(was).c_str(),
                  limit_text(rl.rlim_max).c_str(), strerror(errno));
        return;
    }
    VLOG_INFO(NCCL_INIT | NCCL_NET, "RLIMIT_NOFILE raised from %s to its hard limit %s", limit_text(was).c_str(),
              limit_text(rl.rlim_max).c_str());
}

void warn_fd_limit(int err, const char *what)
{
    if (err != EMFILE && err != ENFILE) return;
    static std::atomic<uint64_t> last{0};
    const uint64_t now = now_ns();
    uint64_t prev = last.load(std::memory_order_relaxed);
    if (prev != 0 && now - prev < 10'000'000'000ull) return;
    if (!last.compare_exchange_strong(prev, now, std::memory_order_relaxed)) return;
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    // (At EMFILE the process holds as many fds as its soft limit allows: none is left to
    // count them with.)
    if (err == EMFILE)
        VLOG_WARN("cannot open %s: this process has reached RLIMIT_NOFILE, %s open file descriptors "
                  "(hard limit %s): raise the hard limit (ulimit -Hn, LimitNOFILE= in a systemd unit, "
                  "the container's nofile ulimit); Vigil raises the soft one to it at init, and each "
                  "connection holds the fds docs/scale.md lists",
                  what, limit_text(rl.rlim_cur).c_str(), limit_text(rl.rlim_max).c_str());
    else
        VLOG_WARN("cannot open %s: the system's file table is full (fs.file-max)", what);
}

int tune_socket(int fd, long buf_bytes)
{
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) return -errno;
    if (buf_bytes > 0) {
        int b = static_cast<int>(buf_bytes);
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b)) != 0) return -errno;
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &b, sizeof(b)) != 0) return -errno;
    }
    return 0;
}

void socket_endpoints(int fd, std::string *local, std::string *peer, std::string *peer_addr)
{
    sockaddr_storage a{}, b{};
    socklen_t la = sizeof(a), lb = sizeof(b);
    Endpoint l, p;
    std::string ls = "?", ps = "?", pa;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&a), &la) == 0 &&
        Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&a), &l))
        ls = l.to_string();
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&b), &lb) == 0 &&
        Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&b), &p)) {
        ps = p.to_string();
        pa = p.address();
    }
    *local = ls;
    *peer = ps;
    if (peer_addr != nullptr) *peer_addr = pa;
}

} // namespace vigil::net
