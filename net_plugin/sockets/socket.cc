// SPDX-License-Identifier: Apache-2.0
// Socket helpers of the TCP fabric.
#include "socket.h"

#include <cerrno>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace vigil::net {

int make_socket(int family)
{
    int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
    return fd < 0 ? -errno : fd;
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

void socket_endpoints(int fd, std::string *local, std::string *peer)
{
    sockaddr_storage a{}, b{};
    socklen_t la = sizeof(a), lb = sizeof(b);
    Endpoint l, p;
    std::string ls = "?", ps = "?";
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&a), &la) == 0 &&
        Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&a), &l))
        ls = l.to_string();
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&b), &lb) == 0 &&
        Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&b), &p))
        ps = p.to_string();
    *local = ls;
    *peer = ps;
}

} // namespace vigil::net
