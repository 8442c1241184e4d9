// SPDX-License-Identifier: Apache-2.0
// RAII file descriptor and the few socket helpers both fabrics use (TCP for its streams, verbs
// for its set-up sockets).
#pragma once

#include <string>
#include <unistd.h>
#include <sys/socket.h>

#include <utility>

#include "../handle.h"

namespace vigil::net {

/// Owns one file descriptor; closes it on destruction. Move-only.
class UniqueFd
{
public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    UniqueFd(UniqueFd &&o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    UniqueFd &operator=(UniqueFd &&o) noexcept
    {
        if (this != &o) reset(std::exchange(o.fd_, -1));
        return *this;
    }
    UniqueFd(const UniqueFd &) = delete;
    UniqueFd &operator=(const UniqueFd &) = delete;
    ~UniqueFd() { reset(); }
    int get() const { return fd_; }
    int release() { return std::exchange(fd_, -1); }
    void reset(int fd = -1)
    {
        if (fd_ >= 0) ::close(fd_);
        fd_ = fd;
    }
    explicit operator bool() const { return fd_ >= 0; }
    /// Orderly close of a connected stream socket: FIN first, then whatever the peer sent
    /// and we never read (late acks, heartbeats) is read and dropped, then close(). Closing
    /// with unread data makes the kernel send a reset instead, which the peer would report as
    /// a failed path although this was a normal closeSend/closeRecv. Never blocks.
    void close_orderly()
    {
        if (fd_ < 0) return;
        ::shutdown(fd_, SHUT_WR);
        char sink[4096];
        for (int i = 0; i < 64 && ::recv(fd_, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
        }
        reset();
    }

private:
    int fd_ = -1;
};

/// Non-blocking, close-on-exec TCP socket of `family`. Returns -errno on failure; out of
/// file descriptors (EMFILE, ENFILE) it also says so (warn_fd_limit).
int make_socket(int family);
/// Raises this process's RLIMIT_NOFILE soft limit to its hard limit, as NCCL's bootstrap does
/// for its own sockets (NCCL src/bootstrap.cc, setFilesLimit(), called by bootstrapRoot): a
/// job at scale holds thousands of connections, each with several sockets (docs/scale.md).
/// Logs the change at INFO; a failure is logged and otherwise ignored. Thread-safe.
void raise_fd_limit();
/// One WARN, at most every 10 s per process, when an fd could not be created (`err`: EMFILE
/// or ENFILE; other values are ignored): what was being opened, the process's RLIMIT_NOFILE
/// soft and hard limits, and how to raise them. Thread-safe.
void warn_fd_limit(int err, const char *what);
/// TCP_NODELAY, and SO_SNDBUF/SO_RCVBUF when buf_bytes > 0. Returns 0 or -errno.
int tune_socket(int fd, long buf_bytes);
/// Local and peer endpoint of a connected socket ("?" on failure), and, when `peer_addr` is
/// given, the peer's address without its port ("10.0.0.2", "fe80::1"; "" on failure).
void socket_endpoints(int fd, std::string *local, std::string *peer, std::string *peer_addr = nullptr);

} // namespace vigil::net
