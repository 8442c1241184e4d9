// SPDX-License-Identifier: Apache-2.0
// Stream socket helpers shared by both halves of a TCP path (stream_io.h).
#include "stream_io.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <sys/socket.h>
#include <sys/uio.h>

namespace vigil::net::tcp {

std::string errno_detail(const char *what, int err)
{
    return std::string(what) + ": " + strerror(err);
}

void fail(PathStatus *st, int err, std::string detail, bool fatal)
{
    st->error = err;
    st->fatal = fatal;
    st->detail = std::move(detail);
}

void lost_stream(PathStatus *st, int err)
{
    fail(st, -err, errno_detail("stream receive failed", err));
    st->peer_eof = err == ECONNRESET;
}

void want_rx_timestamps(int fd)
{
    const int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
}

ssize_t recv_stamped(int fd, uint8_t *to, size_t n, uint64_t *rx_ns)
{
    iovec iov{to, n};
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(timespec))];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof(ctl);
    const ssize_t r = recvmsg(fd, &m, MSG_DONTWAIT);
    if (r <= 0) return r;
    for (cmsghdr *c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS ||
            c->cmsg_len < CMSG_LEN(sizeof(timespec)))
            continue;
        timespec ts;
        std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
        if (ts.tv_sec > 0)
            *rx_ns = std::max<uint64_t>(*rx_ns, static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
                                          static_cast<uint64_t>(ts.tv_nsec));
    }
    return r;
}

uint64_t realtime_ns()
{
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t waited_ns(uint64_t rx_ns, uint64_t bound)
{
    if (rx_ns == 0) return 0;
    const uint64_t now = realtime_ns();
    return now > rx_ns ? std::min(now - rx_ns, bound) : 0;
}

} // namespace vigil::net::tcp
