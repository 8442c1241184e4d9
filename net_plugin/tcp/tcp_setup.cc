// SPDX-License-Identifier: Apache-2.0
// TCP fabric connection setup: listener (hello validation, nonce check) and connector.
#include "tcp_setup.h"

#include <cerrno>
#include <cstring>
#include <net/if.h>
#include <poll.h>
#include <sys/socket.h>

#include "clock.h"
#include "log.h"
#include "tcp_path.h"

namespace vigil::net::tcp {
namespace {

constexpr uint32_t kGeneration = 1; // first generation of a primary path
constexpr uint64_t kRetryNs = 20'000'000; // 20 ms between refused connect attempts

bool transient_connect_error(int err)
{
    return err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH ||
           err == EHOSTUNREACH || err == ENETDOWN;
}

} // namespace

// ---- listener ---------------------------------------------------------------------------

int TcpListener::create(const Device &dev, int dev_index, const Params &params,
                        ListenHandle *handle, std::unique_ptr<TcpListener> *out)
{
    auto l = std::make_unique<TcpListener>();
    int fd = make_socket(dev.addr.family);
    if (fd < 0) return fd;
    l->fd_.reset(fd);
    sockaddr_storage ss;
    Endpoint bind_at = dev.addr;
    bind_at.port = 0;
    socklen_t len = bind_at.to_sockaddr(&ss);
    if (::bind(fd, reinterpret_cast<sockaddr *>(&ss), len) != 0 || ::listen(fd, 128) != 0) {
        int rc = -errno;
        VLOG_WARN("listen on dev %s %s failed: %s", dev.name.c_str(), bind_at.to_string().c_str(),
                  strerror(errno));
        return rc;
    }
    len = sizeof(ss);
    getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len);
    Endpoint bound;
    Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&ss), &bound);
    if (int rc = random_bytes(l->nonce_.data(), l->nonce_.size()); rc != 0) return rc;
    l->dev_ = dev;
    l->timeout_ns_ = static_cast<uint64_t>(params.handshake_timeout_ms) * 1'000'000ull;
    handle->dev = static_cast<uint16_t>(dev_index);
    handle->nonce = l->nonce_;
    handle->addrs = {bound};
    *out = std::move(l);
    return 0;
}

void TcpListener::reject(Pending &p, const char *why)
{
    VLOG_WARN("dev %s: rejected connection from %s: %s; still listening", dev_.name.c_str(),
              p.peer.to_string().c_str(), why);
    p.fd.reset();
}

int TcpListener::accept(std::unique_ptr<RecvComm> *out)
{
    out->reset();
    const uint64_t now = now_ns();
    for (;;) {
        sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = ::accept4(fd_.get(), reinterpret_cast<sockaddr *>(&ss), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE)
                break; // transient: try again on the next call
            int rc = -errno;
            VLOG_WARN("dev %s: accept failed: %s", dev_.name.c_str(), strerror(errno));
            return rc;
        }
        Pending p;
        p.fd.reset(fd);
        Endpoint::from_sockaddr(reinterpret_cast<sockaddr *>(&ss), &p.peer);
        p.deadline_ns = now + timeout_ns_;
        if (pending_.size() >= kMaxPending) {
            reject(p, "too many connections awaiting their hello");
            continue;
        }
        pending_.push_back(std::move(p));
    }
    for (Pending &p : pending_) {
        if (*out) break; // one path per call; the rest waits for the next call
        while (p.fd && p.got < p.buf.size()) {
            ssize_t n = recv(p.fd.get(), p.buf.data() + p.got, p.buf.size() - p.got, MSG_DONTWAIT);
            if (n > 0) {
                p.got += static_cast<size_t>(n);
            } else if (n == 0) {
                reject(p, "closed before completing its hello");
            } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (now > p.deadline_ns) reject(p, "no hello within VIGIL_HANDSHAKE_TIMEOUT_MS");
                break;
            } else if (errno != EINTR) {
                reject(p, strerror(errno));
            }
        }
        if (p.fd && p.got == p.buf.size()) {
            int rc = take(p, out);
            if (rc != 0) return rc;
        }
    }
    std::erase_if(pending_, [](const Pending &p) { return !p.fd; });
    for (Group &g : groups_) {
        if (g.conn_id != 0 && now > g.deadline_ns) {
            VLOG_WARN("dev %s: dropped a path from %s: %zu of %u streams arrived in time",
                      dev_.name.c_str(), g.peer.to_string().c_str(), g.count, g.nstreams);
            g = Group{};
        }
    }
    std::erase_if(groups_, [](const Group &g) { return g.conn_id == 0; });
    return 0;
}

// Files a stream whose full hello arrived under its path; completes the path when it is the
// last one. Returns 0, or -errno if the completed comm could not be set up.
int TcpListener::take(Pending &p, std::unique_ptr<RecvComm> *out)
{
    Hello h;
    if (const char *bad = h.decode(p.buf.data()); bad != nullptr) return reject(p, bad), 0;
    if (!nonce_equal(h.nonce, nonce_)) {
        // One WARN per impostor path, not per stream: its other streams carry the same id.
        if (h.conn_id == last_rejected_conn_) {
            p.fd.reset();
            return 0;
        }
        last_rejected_conn_ = h.conn_id;
        return reject(p, "wrong nonce"), 0;
    }
    Group *g = nullptr;
    for (Group &c : groups_)
        if (c.conn_id == h.conn_id) g = &c;
    if (g == nullptr) {
        if (groups_.size() >= kMaxGroups) return reject(p, "too many paths being set up"), 0;
        groups_.emplace_back();
        g = &groups_.back();
        g->conn_id = h.conn_id;
        g->nstreams = h.nstreams;
        g->path_kind = h.path_kind;
        g->peer = p.peer;
        g->deadline_ns = p.deadline_ns;
    }
    if (h.nstreams != g->nstreams || h.path_kind != g->path_kind)
        return reject(p, "stream count or path kind differs from its path's first stream"), 0;
    if (g->fds[h.stream]) return reject(p, "duplicate stream index"), 0;
    g->fds[h.stream] = std::move(p.fd);
    if (++g->count < g->nstreams) return 0;
    // Every stream is here: answer on stream 0 and hand the path to a new comm.
    std::array<uint8_t, AcceptAnswer::kSize> ans;
    AcceptAnswer::encode(ans.data(), 0);
    std::vector<UniqueFd> fds;
    for (size_t i = 0; i < g->nstreams; ++i) {
        tune_socket(g->fds[i].get(), 0);
        fds.push_back(std::move(g->fds[i]));
    }
    // A fresh socket's send buffer holds 8 bytes; a short write means the peer is gone.
    if (send(fds[0].get(), ans.data(), ans.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
        static_cast<ssize_t>(ans.size())) {
        VLOG_WARN("dev %s: could not answer the path from %s: %s", dev_.name.c_str(),
                  g->peer.to_string().c_str(), strerror(errno));
        *g = Group{};
        return 0;
    }
    std::string desc = "dev " + dev_.name + " " + describe_socket(fds[0].get()) + " (" +
                       std::to_string(fds.size()) + " streams)";
    *g = Group{};
    auto path = std::make_unique<TcpRecvPath>(std::move(fds), kGeneration, desc);
    auto comm = std::make_unique<RecvComm>(std::move(path));
    if (int rc = comm->attach(); rc != 0) return rc;
    VLOG_INFO(NCCL_NET | NCCL_INIT, "accepted %s", desc.c_str());
    *out = std::move(comm);
    return 0;
}

// ---- connector --------------------------------------------------------------------------

TcpConnector::TcpConnector(const Device &local, const ListenHandle &remote, const Params &params)
    : local_(local), remote_(remote.addrs[0]),
      chunk_bytes_(static_cast<size_t>(params.chunk_bytes)),
      buf_bytes_(static_cast<long>(params.socket_buf_bytes)),
      connect_deadline_ns_(now_ns() + static_cast<uint64_t>(params.connect_timeout_ms) * 1'000'000ull),
      handshake_timeout_ns_(static_cast<uint64_t>(params.handshake_timeout_ms) * 1'000'000ull)
{
    hello_.nstreams = static_cast<uint8_t>(params.nstreams);
    hello_.nonce = remote.nonce;
    while (hello_.conn_id == 0) random_bytes(&hello_.conn_id, sizeof(hello_.conn_id));
    streams_.resize(static_cast<size_t>(params.nstreams));
}

int TcpConnector::start_connect(Stream &s)
{
    int fd = make_socket(remote_.family);
    if (fd < 0) return fd;
    s.fd.reset(fd);
    // Pin the stream to our device: source address, and the interface itself when allowed
    // (SO_BINDTODEVICE needs CAP_NET_RAW; without it routing decides the egress port).
    sockaddr_storage ss;
    Endpoint src = local_.addr;
    src.port = 0;
    if (src.family == remote_.family) {
        socklen_t len = src.to_sockaddr(&ss);
        if (::bind(fd, reinterpret_cast<sockaddr *>(&ss), len) != 0) return -errno;
        setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, local_.name.c_str(),
                   static_cast<socklen_t>(local_.name.size()));
    }
    if (int rc = tune_socket(fd, buf_bytes_); rc != 0) return rc;
    socklen_t len = remote_.to_sockaddr(&ss);
    if (::connect(fd, reinterpret_cast<sockaddr *>(&ss), len) != 0 && errno != EINPROGRESS)
        return -errno;
    return 0;
}

int TcpConnector::progress(std::unique_ptr<SendComm> *out)
{
    out->reset();
    const uint64_t now = now_ns();
    auto fail = [&](int rc, const std::string &why) {
        VLOG_WARN("connect from dev %s to %s failed: %s", local_.name.c_str(),
                  remote_.to_string().c_str(), why.c_str());
        return rc;
    };
    bool all_sent = true;
    for (size_t i = 0; i < streams_.size(); ++i) {
        Stream &s = streams_[i];
        if (!s.connected) {
            if (!s.fd) {
                if (now < s.retry_at_ns) {
                    all_sent = false;
                    continue;
                }
                if (int rc = start_connect(s); rc != 0 && !transient_connect_error(-rc))
                    return fail(rc, strerror(-rc));
            }
            pollfd pfd{s.fd.get(), POLLOUT, 0};
            if (poll(&pfd, 1, 0) <= 0) {
                all_sent = false;
                continue;
            }
            int err = 0;
            socklen_t len = sizeof(err);
            getsockopt(s.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
            if (err != 0) {
                if (!transient_connect_error(err)) return fail(-err, strerror(err));
                if (now > connect_deadline_ns_)
                    return fail(-err, std::string(strerror(err)) + " until VIGIL_CONNECT_TIMEOUT_MS");
                s.fd.reset();
                s.retry_at_ns = now + kRetryNs;
                all_sent = false;
                continue;
            }
            s.connected = true;
        }
        if (s.hello_sent < Hello::kSize) {
            hello_.stream = static_cast<uint8_t>(i);
            hello_.encode(hello_bytes_.data());
            ssize_t n = send(s.fd.get(), hello_bytes_.data() + s.hello_sent,
                             Hello::kSize - s.hello_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) s.hello_sent += static_cast<size_t>(n);
            else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return fail(-errno, std::string("sending hello: ") + strerror(errno));
            if (s.hello_sent < Hello::kSize) all_sent = false;
        }
    }
    if (!all_sent) return 0;
    if (answer_deadline_ns_ == 0) answer_deadline_ns_ = now + handshake_timeout_ns_;
    while (answer_got_ < answer_.size()) {
        ssize_t n = recv(streams_[0].fd.get(), answer_.data() + answer_got_,
                         answer_.size() - answer_got_, MSG_DONTWAIT);
        if (n > 0) {
            answer_got_ += static_cast<size_t>(n);
            continue;
        }
        if (n == 0)
            return fail(-ECONNREFUSED, "the listener closed the connection (hello rejected: "
                                       "stale handle or wrong nonce?)");
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (now > answer_deadline_ns_)
                return fail(-ETIMEDOUT, "no answer within VIGIL_HANDSHAKE_TIMEOUT_MS");
            return 0;
        }
        if (errno != EINTR) return fail(-errno, strerror(errno));
    }
    if (get_le(answer_.data(), 4) != AcceptAnswer::kMagic || get_le(answer_.data() + 4, 4) != 0)
        return fail(-EPROTO, "malformed answer from the listener");
    std::vector<UniqueFd> fds;
    for (Stream &s : streams_) fds.push_back(std::move(s.fd));
    std::string desc = "dev " + local_.name + " " + describe_socket(fds[0].get()) + " (" +
                       std::to_string(fds.size()) + " streams)";
    auto path = std::make_unique<TcpSendPath>(std::move(fds), kGeneration, chunk_bytes_, desc);
    auto comm = std::make_unique<SendComm>(std::move(path));
    if (int rc = comm->attach(); rc != 0) return fail(rc, "progress engine registration failed");
    VLOG_INFO(NCCL_NET | NCCL_INIT, "connected %s", desc.c_str());
    *out = std::move(comm);
    return 0;
}

} // namespace vigil::net::tcp
