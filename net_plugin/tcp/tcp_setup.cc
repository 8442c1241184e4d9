// SPDX-License-Identifier: Apache-2.0
// TCP fabric connection setup: listener (hello validation, nonce check) and connector.
#include "tcp_setup.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <net/if.h>
#include <sys/socket.h>

#include "clock.h"
#include "log.h"
#include "tcp_path.h"

namespace vigil::net::tcp {
namespace {

constexpr uint64_t kRebuildAttemptNs = 300'000'000; // one rebuild attempt, at most

} // namespace

using rendezvous::kBackupGraceNs;
using rendezvous::kMaxGroups;

// ---- listener ---------------------------------------------------------------------------

int TcpListener::create(const std::vector<Device> &devs, int dev_index, const Params &params,
                        ListenHandle *handle, std::shared_ptr<TcpListener> *out)
{
    auto l = std::make_shared<TcpListener>();
    l->devs_ = devs;
    if (int rc = rendezvous::listen_on(dev_index, l->device_addrs(), handle, &l->listening_, &l->nonce_); rc != 0)
        return rc;
    l->timeout_ns_ = static_cast<uint64_t>(params.handshake_timeout_ms) * 1'000'000ull;
    *out = std::move(l);
    return 0;
}

rendezvous::DeviceAddrs TcpListener::device_addrs() const
{
    return {static_cast<int>(devs_.size()), [this](int d) { return devs_[static_cast<size_t>(d)].addr; },
            [this](int d) { return devs_[static_cast<size_t>(d)].name; }};
}

void TcpListener::reject(Pending &p, const char *why)
{
    VLOG_WARN("dev %s: rejected connection from %s: %s; still listening",
              devs_[static_cast<size_t>(p.dev)].name.c_str(), p.peer.to_string().c_str(), why);
    p.fd.reset();
}

// Accepts sockets, reads hellos and files them; moves complete rebuilt paths to rebuilt_.
// Called with mu_ held.
int TcpListener::pump(uint64_t now)
{
    const int rc = rendezvous::accept_all(listening_, device_addrs(), [this] { return pending_.size(); },
                                          [&](UniqueFd fd, int dev, const Endpoint &peer) {
                                              Pending p;
                                              p.fd = std::move(fd);
                                              p.dev = dev;
                                              p.peer = peer;
                                              p.deadline_ns = now + timeout_ns_;
                                              pending_.push_back(std::move(p));
                                          });
    if (rc != 0) return rc;
    for (Pending &p : pending_) {
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
        if (p.fd && p.got == p.buf.size()) take(p);
    }
    std::erase_if(pending_, [](const Pending &p) { return !p.fd; });
    for (Group &g : groups_) {
        // Connections nobody accepts any more (or late backups) expire; their sockets close.
        if (!g.rebuild && g.conn_id != 0 && now > g.deadline_ns + kBackupGraceNs) g = Group{};
        if (!g.rebuild || g.conn_id == 0) continue;
        PathFds &pf = g.paths[static_cast<size_t>(g.rebuild_kind)];
        if (pf.count == g.nstreams) {
            Rebuilt r;
            r.conn_id = g.conn_id;
            r.kind = g.rebuild_kind;
            r.dev = pf.dev;
            r.path_id = pf.path_id;
            for (size_t i = 0; i < g.nstreams; ++i) r.fds.push_back(std::move(pf.fds[i]));
            if (answer(r.fds[0].get())) rebuilt_.push_back(std::move(r));
            g = Group{};
        } else if (now > g.deadline_ns) {
            g = Group{};
        }
    }
    std::erase_if(groups_, [](const Group &g) { return g.conn_id == 0; });
    return 0;
}

bool TcpListener::answer(int fd)
{
    std::array<uint8_t, AcceptAnswer::kSize> ans;
    AcceptAnswer::encode(ans.data(), 0);
    tune_socket(fd, 0);
    // A fresh socket's send buffer holds 8 bytes; a short write means the peer is gone.
    return send(fd, ans.data(), ans.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
           static_cast<ssize_t>(ans.size());
}

int TcpListener::accept(RecvPaths *out)
{
    *out = RecvPaths{};
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t now = now_ns();
    if (int rc = pump(now); rc != 0) return rc;
    for (Group &g : groups_) {
        if (g.conn_id == 0 || g.rebuild) continue;
        PathFds &pri = g.paths[kPrimary];
        if (pri.count == g.nstreams) {
            if (g.primary_done_ns == 0) g.primary_done_ns = now;
            const bool backup_done = g.paths[kBackup].count == g.nstreams;
            if (g.npaths == 1 || backup_done || now - g.primary_done_ns > kBackupGraceNs) {
                complete(g, out);
                if (out->paths[kPrimary]) break;
                continue;
            }
        } else if (now > g.deadline_ns) {
            VLOG_WARN("dev %s: dropped a connection from %s: %zu of %u primary streams arrived "
                      "in time", devs_[static_cast<size_t>(pri.dev)].name.c_str(),
                      g.peer.to_string().c_str(), pri.count, g.nstreams);
            g = Group{};
        }
    }
    std::erase_if(groups_, [](const Group &g) { return g.conn_id == 0; });
    return 0;
}

bool TcpListener::take_rebuilt(uint64_t conn_id, std::unique_ptr<RecvPath> *path)
{
    std::lock_guard<std::mutex> lock(mu_);
    pump(now_ns());
    for (auto it = rebuilt_.begin(); it != rebuilt_.end(); ++it) {
        if (it->conn_id != conn_id) continue;
        PathIdentity id = path_identity(it->kind, it->dev, devs_[static_cast<size_t>(it->dev)].name,
                                        it->path_id, it->fds);
        *path = std::make_unique<TcpRecvPath>(std::move(it->fds), std::move(id));
        rebuilt_.erase(it);
        return true;
    }
    return false;
}

void TcpListener::file_hello(UniqueFd fd, int dev, const Endpoint &peer, const uint8_t *hello)
{
    std::lock_guard<std::mutex> lock(mu_);
    Pending p;
    p.fd = std::move(fd);
    p.dev = dev;
    p.peer = peer;
    p.deadline_ns = now_ns() + timeout_ns_;
    std::memcpy(p.buf.data(), hello, p.buf.size());
    p.got = p.buf.size();
    take(p);
}

// Files a stream whose full hello arrived under its connection and path.
void TcpListener::take(Pending &p)
{
    Hello h;
    if (const char *bad = h.decode(p.buf.data()); bad != nullptr) return reject(p, bad);
    if (!nonce_equal(h.nonce, nonce_)) {
        if (!refusals_.first(h.conn_id)) return p.fd.reset();
        return reject(p, "wrong nonce");
    }
    const bool rebuild = hello_rebuild(h.path_kind);
    if (rebuild && std::find(served_.begin(), served_.end(), h.conn_id) == served_.end())
        return reject(p, "path rebuild for an unknown connection");
    Group *g = nullptr;
    for (Group &c : groups_)
        if (c.conn_id == h.conn_id && c.rebuild == rebuild &&
            (!rebuild || c.rebuild_kind == hello_kind(h.path_kind)))
            g = &c;
    if (g == nullptr) {
        if (groups_.size() >= kMaxGroups) return reject(p, "too many connections being set up");
        groups_.emplace_back();
        g = &groups_.back();
        g->conn_id = h.conn_id;
        g->nstreams = h.nstreams;
        g->npaths = hello_npaths(h.path_kind);
        g->rebuild = rebuild;
        g->rebuild_kind = hello_kind(h.path_kind);
        g->peer = p.peer;
        g->deadline_ns = p.deadline_ns;
    }
    if (h.nstreams != g->nstreams || hello_npaths(h.path_kind) != g->npaths ||
        (rebuild && hello_kind(h.path_kind) != g->rebuild_kind))
        return reject(p, "stream or path count differs from its connection's first stream");
    PathFds &path = g->paths[static_cast<size_t>(hello_kind(h.path_kind))];
    if (path.fds[h.stream]) return reject(p, "duplicate stream index");
    if (path.count > 0 && path.dev != p.dev) return reject(p, "streams of one path on two devices");
    if (path.count > 0 && path.path_id != h.path_id) return reject(p, "streams of one path disagree on its id");
    path.dev = p.dev;
    path.path_id = h.path_id;
    path.fds[h.stream] = std::move(p.fd);
    ++path.count;
}

PathIdentity path_identity(int slot, int dev, const std::string &dev_name, uint64_t path_id,
                           const std::vector<UniqueFd> &fds)
{
    PathIdentity id;
    id.slot = slot;
    id.dev = dev;
    id.dev_name = dev_name;
    id.id = path_id;
    socket_endpoints(fds[0].get(), &id.local, &id.peer);
    id.detail = std::to_string(fds.size()) + " streams";
    return id;
}

// Every wanted stream is here: answer on stream 0 of each complete path and hand the
// paths over.
void TcpListener::complete(Group &g, RecvPaths *out)
{
    RecvPaths paths;
    for (int k = 0; k < kMaxPaths; ++k) {
        PathFds &pf = g.paths[static_cast<size_t>(k)];
        if (pf.count != g.nstreams) continue; // a late backup: dropped, the connector notices
        std::vector<UniqueFd> fds;
        for (size_t i = 0; i < g.nstreams; ++i) fds.push_back(std::move(pf.fds[i]));
        if (!answer(fds[0].get())) {
            VLOG_WARN("dev %s: could not answer a path from %s: %s",
                      devs_[static_cast<size_t>(pf.dev)].name.c_str(), g.peer.to_string().c_str(),
                      strerror(errno));
            if (k == kPrimary) {
                g = Group{};
                return;
            }
            continue;
        }
        PathIdentity id = path_identity(k, pf.dev, devs_[static_cast<size_t>(pf.dev)].name, pf.path_id, fds);
        paths.devs[static_cast<size_t>(k)] = pf.dev;
        paths.paths[static_cast<size_t>(k)] = std::make_unique<TcpRecvPath>(std::move(fds), std::move(id));
    }
    const uint64_t conn_id = g.conn_id;
    g = Group{};
    served_.push_back(conn_id);
    std::vector<int> lfds;
    for (const rendezvous::ListenSocket &l : listening_) lfds.push_back(l.fd.get());
    paths.acceptor = std::make_unique<TcpAcceptor>(shared_from_this(), conn_id, std::move(lfds));
    *out = std::move(paths);
}

bool TcpListener::busy()
{
    std::lock_guard<std::mutex> lock(mu_);
    return !pending_.empty() || !groups_.empty() || !rebuilt_.empty();
}

TcpAcceptor::TcpAcceptor(std::shared_ptr<TcpListener> listener, uint64_t conn_id, std::vector<int> fds)
    : listener_(std::move(listener)), conn_id_(conn_id), fds_(std::move(fds))
{
    for (int fd : fds_) ProgressEngine::instance().add(fd, this);
}

TcpAcceptor::~TcpAcceptor()
{
    for (int fd : fds_) ProgressEngine::instance().remove(fd, this);
    ProgressEngine::instance().quiesce();
}

int TcpAcceptor::poll(std::unique_ptr<RecvPath> *out)
{
    const uint64_t now = now_ns();
    const bool event = event_.exchange(false, std::memory_order_acq_rel);
    if (!event && now < next_sweep_ns_ && !listener_->busy()) return 0;
    next_sweep_ns_ = now + 1'000'000'000ull;
    listener_->take_rebuilt(conn_id_, out);
    return 0;
}

// ---- connectors -------------------------------------------------------------------------

TcpPathConnector::TcpPathConnector(const Device &local, int local_dev, const Endpoint &remote,
                                   const Hello &hello, int nstreams, long buf_bytes,
                                   uint64_t connect_deadline_ns, uint64_t handshake_timeout_ns)
    : local_(local), local_dev_(local_dev), remote_(remote), hello_(hello), buf_bytes_(buf_bytes),
      connect_deadline_ns_(connect_deadline_ns), handshake_timeout_ns_(handshake_timeout_ns),
      streams_(static_cast<size_t>(nstreams))
{
}

int TcpPathConnector::start_connect(UniqueFd *fd)
{
    return rendezvous::start_connect(local_.addr, remote_, true, [this](int s, bool bound) {
        // Pin the stream to its device: the source address, and the interface itself when
        // allowed (SO_BINDTODEVICE needs CAP_NET_RAW; without it routing picks the port).
        if (bound)
            setsockopt(s, SOL_SOCKET, SO_BINDTODEVICE, local_.name.c_str(),
                       static_cast<socklen_t>(local_.name.size()));
        return tune_socket(s, buf_bytes_);
    }, fd);
}

int TcpPathConnector::step(uint64_t now, std::string *why)
{
    switch (state_) {
    case State::kStreams:
        if (int rc = connect_and_hello(now, why); rc != 0) return rc;
        if (state_ != State::kReadAnswer) return 0;
        answer_deadline_ns_ = now + handshake_timeout_ns_;
        [[fallthrough]];
    case State::kReadAnswer:
        return read_answer(now, why);
    case State::kDone:
        return 0;
    }
    return 0;
}

int TcpPathConnector::connect_and_hello(uint64_t now, std::string *why)
{
    bool all_sent = true;
    const auto start = [this](UniqueFd *fd) { return start_connect(fd); };
    for (size_t i = 0; i < streams_.size(); ++i) {
        Stream &st = streams_[i];
        const int c = st.conn.step(now, connect_deadline_ns_, start, why);
        if (c < 0) return c;
        if (c == 0) {
            all_sent = false;
            continue;
        }
        if (st.hello_sent < Hello::kSize) {
            Hello h = hello_;
            h.stream = static_cast<uint8_t>(i);
            std::array<uint8_t, Hello::kSize> bytes;
            h.encode(bytes.data());
            ssize_t n = send(st.conn.fd().get(), bytes.data() + st.hello_sent, Hello::kSize - st.hello_sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) st.hello_sent += static_cast<size_t>(n);
            else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return *why = std::string("sending hello: ") + strerror(errno), -errno;
            if (st.hello_sent < Hello::kSize) all_sent = false;
        }
    }
    if (all_sent) state_ = State::kReadAnswer;
    return 0;
}

int TcpPathConnector::read_answer(uint64_t now, std::string *why)
{
    while (answer_got_ < answer_.size()) {
        ssize_t n = recv(streams_[0].conn.fd().get(), answer_.data() + answer_got_,
                         answer_.size() - answer_got_, MSG_DONTWAIT);
        if (n > 0) {
            answer_got_ += static_cast<size_t>(n);
            continue;
        }
        if (n == 0)
            return *why = "the listener closed the connection (hello rejected: stale handle or "
                          "wrong nonce?)",
                   -ECONNREFUSED;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (now > answer_deadline_ns_)
                return *why = "no answer within VIGIL_HANDSHAKE_TIMEOUT_MS", -ETIMEDOUT;
            return 0;
        }
        if (errno != EINTR) return *why = strerror(errno), -errno;
    }
    if (get_le(answer_.data(), 4) != AcceptAnswer::kMagic || get_le(answer_.data() + 4, 4) != 0)
        return *why = "malformed answer from the listener", -EPROTO;
    state_ = State::kDone;
    return 0;
}

std::vector<UniqueFd> TcpPathConnector::take_fds()
{
    std::vector<UniqueFd> fds;
    for (Stream &st : streams_) fds.push_back(std::move(st.conn.fd()));
    return fds;
}

namespace {

std::unique_ptr<TcpSendPath> make_send_path(int slot, TcpPathConnector &c, int local_dev,
                                            size_t chunk_bytes)
{
    std::vector<UniqueFd> fds = c.take_fds();
    PathIdentity id = path_identity(slot, local_dev, c.local().name, c.path_id(), fds);
    return std::make_unique<TcpSendPath>(std::move(fds), std::move(id), chunk_bytes);
}

} // namespace

TcpConnector::TcpConnector(const std::vector<Device> &devs, const std::array<PathPlan, kMaxPaths> &plan,
                           const ListenHandle &remote, const Params &params)
    : devs_(devs), plan_(plan), nonce_(remote.nonce), params_(params)
{
    while (conn_id_ == 0) random_bytes(&conn_id_, sizeof(conn_id_));
    const uint64_t deadline = now_ns() + static_cast<uint64_t>(params.connect_timeout_ms) * 1'000'000ull;
    const int npaths = plan[kBackup].local_dev >= 0 ? 2 : 1;
    for (int k = 0; k < kMaxPaths; ++k) {
        const PathPlan &pp = plan[static_cast<size_t>(k)];
        if (pp.local_dev < 0) continue;
        Hello h;
        h.nstreams = static_cast<uint8_t>(params.nstreams);
        h.nonce = nonce_;
        h.conn_id = conn_id_;
        while (h.path_id == 0) random_bytes(&h.path_id, sizeof(h.path_id));
        h.path_kind = make_path_kind(k, npaths, false);
        setups_[static_cast<size_t>(k)] = std::make_unique<TcpPathConnector>(
            devs[static_cast<size_t>(pp.local_dev)], pp.local_dev, pp.remote, h,
            static_cast<int>(params.nstreams), static_cast<long>(params.socket_buf_bytes), deadline,
            static_cast<uint64_t>(params.handshake_timeout_ms) * 1'000'000ull);
    }
}

int TcpConnector::progress(SendPaths *out)
{
    *out = SendPaths{};
    const uint64_t now = now_ns();
    bool pending = false;
    for (int k = 0; k < kMaxPaths; ++k) {
        auto &s = setups_[static_cast<size_t>(k)];
        if (!s || s->done()) continue;
        std::string why;
        int rc = s->step(now, &why);
        if (rc == 0) {
            pending = pending || !s->done();
            continue;
        }
        if (k == kPrimary) {
            VLOG_WARN("connect from dev %s to %s failed: %s", s->local().name.c_str(),
                      s->remote().to_string().c_str(), why.c_str());
            return rc;
        }
        VLOG_WARN("backup path from dev %s to %s not established: %s; the connection runs "
                  "without a standby until a rebuild succeeds",
                  s->local().name.c_str(), s->remote().to_string().c_str(), why.c_str());
        s.reset();
    }
    if (pending) return 0;
    for (int k = 0; k < kMaxPaths; ++k) {
        auto &s = setups_[static_cast<size_t>(k)];
        if (!s) continue;
        out->paths[static_cast<size_t>(k)] = make_send_path(k, *s, plan_[static_cast<size_t>(k)].local_dev,
                                                            static_cast<size_t>(params_.chunk_bytes));
    }
    out->rebuilder = std::make_unique<TcpRebuilder>(devs_, plan_, nonce_, conn_id_, params_);
    return 0;
}

TcpRebuilder::TcpRebuilder(std::vector<Device> devs, const std::array<PathPlan, kMaxPaths> &plan,
                           const std::array<uint8_t, 16> &nonce, uint64_t conn_id, const Params &params)
    : devs_(std::move(devs)), plan_(plan), nonce_(nonce), conn_id_(conn_id), params_(params)
{
}

bool TcpRebuilder::can_rebuild(int slot) const
{
    return slot >= 0 && slot < kMaxPaths && plan_[static_cast<size_t>(slot)].local_dev >= 0;
}

int TcpRebuilder::progress(int slot, std::unique_ptr<SendPath> *out)
{
    out->reset();
    if (!can_rebuild(slot)) return -EINVAL;
    const PathPlan &pp = plan_[static_cast<size_t>(slot)];
    auto &a = attempts_[static_cast<size_t>(slot)];
    const uint64_t now = now_ns();
    if (!a) {
        Hello h;
        h.nstreams = static_cast<uint8_t>(params_.nstreams);
        h.nonce = nonce_;
        h.conn_id = conn_id_;
        while (h.path_id == 0) random_bytes(&h.path_id, sizeof(h.path_id));
        h.path_kind = make_path_kind(slot, plan_[kBackup].local_dev >= 0 ? 2 : 1, true);
        // Short attempts: toward a peer whose port is still down a SYN gets no answer, and a
        // fresh attempt after the repair beats waiting out the SYN retransmission timer.
        const uint64_t limit = std::min<uint64_t>(
            static_cast<uint64_t>(params_.handshake_timeout_ms) * 1'000'000ull, kRebuildAttemptNs);
        a = std::make_unique<TcpPathConnector>(devs_[static_cast<size_t>(pp.local_dev)], pp.local_dev,
                                               pp.remote, h, static_cast<int>(params_.nstreams),
                                               static_cast<long>(params_.socket_buf_bytes), now + limit,
                                               limit);
    }
    std::string why;
    if (int rc = a->step(now, &why); rc != 0) {
        VLOG_TRACE(NCCL_NET, "rebuild of %s path from dev %s failed: %s",
                   slot == kPrimary ? "primary" : "backup", a->local().name.c_str(), why.c_str());
        a.reset();
        return rc;
    }
    if (!a->done()) return 0;
    *out = make_send_path(slot, *a, pp.local_dev, static_cast<size_t>(params_.chunk_bytes));
    a.reset();
    return 0;
}

} // namespace vigil::net::tcp
