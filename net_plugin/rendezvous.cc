// SPDX-License-Identifier: Apache-2.0
// The fabric-neutral part of connection set-up: listening sockets, bounded accepting, the
// retrying non-blocking connect.
#include "rendezvous.h"

#include <cerrno>
#include <cstring>
#include <poll.h>
#include <sys/socket.h>

#include "log.h"

namespace vigil::net::rendezvous {
namespace {

// A connect that failed for one of these may succeed later: the listener is not up yet, or
// a route or link is coming back.
bool transient_connect_error(int err)
{
    return err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH || err == EHOSTUNREACH ||
           err == ENETDOWN;
}

} // namespace

int listen_on(int dev, const DeviceAddrs &devs, ListenHandle *handle, std::vector<ListenSocket> *out,
              std::array<uint8_t, 16> *nonce)
{
    std::vector<int> order{dev};
    for (int d = 0; d < devs.count; ++d)
        if (d != dev && order.size() < ListenHandle::kMaxAddrs) order.push_back(d);
    handle->addrs.clear();
    handle->addr_devs.clear();
    out->clear();
    for (int d : order) {
        Endpoint at = devs.addr(d);
        at.port = 0;
        const int fd = make_socket(at.family);
        if (fd < 0) return fd;
        UniqueFd owned(fd);
        sockaddr_storage ss;
        socklen_t len = at.to_sockaddr(&ss);
        if (::bind(fd, reinterpret_cast<sockaddr *>(&ss), len) != 0 || ::listen(fd, 128) != 0) {
            const int rc = -errno;
            if (d == dev) {
                VLOG_WARN("listen on dev %s %s failed: %s", devs.name(d).c_str(), at.to_string().c_str(),
                          strerror(errno));
                return rc;
            }
            VLOG_INFO(NCCL_NET, "no backup listener on dev %s: %s", devs.name(d).c_str(), strerror(errno));
            continue;
        }
        len = sizeof(ss);
        getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len);
        Endpoint bound;
        Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&ss), &bound);
        handle->addrs.push_back(bound);
        handle->addr_devs.push_back(static_cast<uint8_t>(d));
        out->push_back(ListenSocket{std::move(owned), d});
    }
    if (int rc = random_bytes(nonce->data(), nonce->size()); rc != 0) return rc;
    handle->dev = static_cast<uint16_t>(dev);
    handle->nonce = *nonce;
    return 0;
}

int accept_all(std::vector<ListenSocket> &sockets, const DeviceAddrs &devs,
               const std::function<size_t()> &pending,
               const std::function<void(UniqueFd fd, int dev, const Endpoint &peer)> &take)
{
    for (ListenSocket &ls : sockets) {
        for (;;) {
            sockaddr_storage ss;
            socklen_t len = sizeof(ss);
            const int fd = ::accept4(ls.fd.get(), reinterpret_cast<sockaddr *>(&ss), &len,
                                     SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
                    errno == ECONNABORTED || errno == EMFILE || errno == ENFILE)
                    break; // nothing now, or transient: try again on the next call
                const int rc = -errno;
                VLOG_WARN("dev %s: accept failed: %s", devs.name(ls.dev).c_str(), strerror(errno));
                if (&ls == &sockets.front()) return rc;
                break; // a backup device's listener failing costs only backups
            }
            UniqueFd owned(fd);
            Endpoint peer;
            Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&ss), &peer);
            if (pending() >= kMaxPending) {
                VLOG_WARN("dev %s: rejected connection from %s: too many connections awaiting their "
                          "hello; still listening", devs.name(ls.dev).c_str(), peer.to_string().c_str());
                continue;
            }
            take(std::move(owned), ls.dev, peer);
        }
    }
    return 0;
}

int start_connect(const Endpoint &src, const Endpoint &remote, bool bind_required,
                  const std::function<int(int fd, bool bound)> &prepare, UniqueFd *fd)
{
    const int s = make_socket(remote.family);
    if (s < 0) return s;
    fd->reset(s);
    sockaddr_storage ss;
    Endpoint from = src;
    from.port = 0;
    bool bound = false;
    if (from.family == remote.family) {
        const socklen_t len = from.to_sockaddr(&ss);
        bound = ::bind(s, reinterpret_cast<sockaddr *>(&ss), len) == 0;
        if (!bound && bind_required) return -errno;
    }
    if (int rc = prepare(s, bound); rc != 0) return rc;
    const socklen_t len = remote.to_sockaddr(&ss);
    if (::connect(s, reinterpret_cast<sockaddr *>(&ss), len) != 0 && errno != EINPROGRESS) return -errno;
    return 0;
}

int Connect::step(uint64_t now, uint64_t deadline_ns, const Start &start, std::string *why)
{
    if (connected_) return 1;
    if (!fd_) {
        if (now < retry_at_ns_) return 0;
        if (int rc = start(&fd_); rc != 0) {
            if (!transient_connect_error(-rc) || now > deadline_ns) return *why = strerror(-rc), rc;
            fd_.reset();
            retry_at_ns_ = now + kRetryNs;
            return 0;
        }
    }
    pollfd pfd{fd_.get(), POLLOUT, 0};
    if (poll(&pfd, 1, 0) <= 0) {
        if (now > deadline_ns) return *why = "connect did not complete in time", -ETIMEDOUT;
        return 0;
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
        if (!transient_connect_error(err)) return *why = strerror(err), -err;
        if (now > deadline_ns) return *why = std::string(strerror(err)) + " until the connect deadline", -err;
        fd_.reset();
        retry_at_ns_ = now + kRetryNs;
        return 0;
    }
    connected_ = true;
    return 1;
}

} // namespace vigil::net::rendezvous
