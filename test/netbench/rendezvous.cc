// SPDX-License-Identifier: Apache-2.0
// vigil-netbench rendezvous (blocking sockets, set-up only).
#include "rendezvous.h"

#include <cerrno>
#include <chrono>
#include <cstring>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <thread>
#include <unistd.h>

namespace vigil::bench {
namespace {

bool write_all(int fd, const void *p, size_t n)
{
    const auto *b = static_cast<const uint8_t *>(p);
    while (n > 0) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        b += w;
        n -= static_cast<size_t>(w);
    }
    return true;
}

bool read_all(int fd, void *p, size_t n)
{
    auto *b = static_cast<uint8_t *>(p);
    while (n > 0) {
        ssize_t r = recv(fd, b, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        b += r;
        n -= static_cast<size_t>(r);
    }
    return true;
}

// Resolves addr into a socket address; "unix:/path" or "host:port".
bool resolve(const std::string &addr, sockaddr_storage *ss, socklen_t *len, std::string *unix_path)
{
    std::memset(ss, 0, sizeof(*ss));
    if (addr.rfind("unix:", 0) == 0) {
        auto *un = reinterpret_cast<sockaddr_un *>(ss);
        *unix_path = addr.substr(5);
        if (unix_path->empty() || unix_path->size() >= sizeof(un->sun_path)) return false;
        un->sun_family = AF_UNIX;
        std::memcpy(un->sun_path, unix_path->c_str(), unix_path->size() + 1);
        *len = sizeof(sockaddr_un);
        return true;
    }
    size_t colon = addr.rfind(':');
    if (colon == std::string::npos) return false;
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(addr.substr(0, colon).c_str(), addr.substr(colon + 1).c_str(), &hints, &res) != 0)
        return false;
    std::memcpy(ss, res->ai_addr, res->ai_addrlen);
    *len = res->ai_addrlen;
    freeaddrinfo(res);
    return true;
}

} // namespace

Rendezvous::~Rendezvous()
{
    for (int fd : peers_)
        if (fd >= 0) close(fd);
    if (listen_fd_ >= 0) close(listen_fd_);
    if (rank_ == 0 && !unix_path_.empty()) unlink(unix_path_.c_str());
}

std::string Rendezvous::open(const std::string &addr, int rank, int nranks, double timeout_s)
{
    rank_ = rank;
    nranks_ = nranks;
    sockaddr_storage ss;
    socklen_t len = 0;
    std::string path;
    if (!resolve(addr, &ss, &len, &path)) return "bad rendezvous address " + addr;
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
    if (rank == 0) {
        unix_path_ = path;
        if (!path.empty()) unlink(path.c_str());
        listen_fd_ = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(listen_fd_, reinterpret_cast<sockaddr *>(&ss), len) != 0 || ::listen(listen_fd_, 64) != 0)
            return "rendezvous bind/listen on " + addr + ": " + strerror(errno);
        peers_.assign(static_cast<size_t>(nranks), -1);
        timeval tv{static_cast<time_t>(timeout_s), 0};
        setsockopt(listen_fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        for (int i = 1; i < nranks; ++i) {
            int fd = accept(listen_fd_, nullptr, nullptr);
            if (fd < 0) return "rendezvous: only " + std::to_string(i - 1) + " of " +
                               std::to_string(nranks - 1) + " peers arrived";
            int32_t r = -1;
            if (!read_all(fd, &r, sizeof(r)) || r < 1 || r >= nranks || peers_[static_cast<size_t>(r)] >= 0) {
                close(fd);
                return "rendezvous: bad or duplicate rank from a peer";
            }
            peers_[static_cast<size_t>(r)] = fd;
        }
        return "";
    }
    for (;;) {
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (connect(fd, reinterpret_cast<sockaddr *>(&ss), len) == 0) {
            int32_t r = rank;
            if (!write_all(fd, &r, sizeof(r))) return "rendezvous: lost rank 0";
            peers_ = {fd};
            return "";
        }
        close(fd);
        if (std::chrono::steady_clock::now() > deadline) return "rendezvous: rank 0 not reachable at " + addr;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

std::string Rendezvous::allgather(const void *mine, size_t len, std::vector<uint8_t> *all)
{
    all->assign(len * static_cast<size_t>(nranks_), 0);
    if (rank_ == 0) {
        std::memcpy(all->data(), mine, len);
        for (int i = 1; i < nranks_; ++i)
            if (!read_all(peers_[static_cast<size_t>(i)], all->data() + len * static_cast<size_t>(i), len))
                return "rendezvous: rank " + std::to_string(i) + " went away";
        for (int i = 1; i < nranks_; ++i)
            if (!write_all(peers_[static_cast<size_t>(i)], all->data(), all->size()))
                return "rendezvous: rank " + std::to_string(i) + " went away";
        return "";
    }
    if (!write_all(peers_[0], mine, len) || !read_all(peers_[0], all->data(), all->size()))
        return "rendezvous: rank 0 went away";
    return "";
}

std::string Rendezvous::barrier()
{
    uint8_t b = 1;
    std::vector<uint8_t> all;
    return allgather(&b, 1, &all);
}

} // namespace vigil::bench
