// SPDX-License-Identifier: Apache-2.0
// Verbs connection set-up: hello/answer/ready over one TCP socket per path.
#include "verbs_setup.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/socket.h>

#include "clock.h"
#include "flush.h"
#include "log.h"
#include "names.h"
#include "nccl_abi/net_common.h"
#include "verbs_fabric.h"

namespace vigil::net::verbs_fabric {
namespace {

constexpr uint64_t kRebuildAttemptNs = 2'000'000'000; // one rebuild attempt, at most (QP set-up included)

std::string qp_list(const PathEnd &e)
{
    std::string s;
    for (uint32_t i = 0; i < e.nqps; ++i) {
        char b[16];
        std::snprintf(b, sizeof(b), "%s0x%x", i ? "," : "", e.qpn[i]);
        s += b;
    }
    return s;
}

} // namespace

Hello make_hello(const std::array<VerbsPlan, kMaxPaths> &plan, int slot, const std::array<uint8_t, 16> &nonce,
                 uint64_t conn_id, bool rebuild)
{
    Hello h;
    h.slot = static_cast<uint8_t>(slot);
    h.npaths = plan[kBackup].local_dev >= 0 ? 2 : 1;
    h.rebuild = rebuild ? 1 : 0;
    h.nonce = nonce;
    h.conn_id = conn_id;
    while (h.path_id == 0) random_bytes(&h.path_id, sizeof(h.path_id));
    h.peer_dev = static_cast<uint32_t>(plan[static_cast<size_t>(slot)].peer_dev);
    const VerbsPlan &other = plan[static_cast<size_t>(1 - slot)];
    h.other_dev = other.local_dev >= 0 && other.peer_dev >= 0 ? static_cast<uint32_t>(other.peer_dev) : Hello::kNoDev;
    return h;
}

// ---- PathSetup ------------------------------------------------------------------------------

PathSetup::PathSetup(VerbsFabric &fabric, int local_dev, const Endpoint &remote, const Hello &hello,
                     uint64_t deadline_ns, int traffic_class)
    : fabric_(fabric), role_(Role::kConnector), state_(State::kConnect), local_dev_(local_dev), remote_(remote),
      deadline_ns_(deadline_ns), tc_(traffic_class), hello_(hello)
{
}

PathSetup::PathSetup(VerbsFabric &fabric, int local_dev, UniqueFd fd, const Endpoint &peer, uint64_t deadline_ns)
    : fabric_(fabric), role_(Role::kListener), state_(State::kReadHello), local_dev_(local_dev), remote_(peer),
      fd_(std::move(fd)), deadline_ns_(deadline_ns)
{
}

PathIdentity PathSetup::identity() const
{
    PathIdentity id;
    id.slot = hello_.slot;
    id.dev = local_dev_;
    id.dev_name = fabric_.dev_name(local_dev_);
    id.id = hello_.path_id;
    if (qps_) {
        id.local = "gid " + qps_->gid_text(true);
        id.peer = qps_->gid_text(false);
        id.detail = "qp " + qp_list(qps_->local_end()) + " -> " + qp_list(qps_->remote());
    }
    return id;
}

int PathSetup::connect_step(uint64_t now, std::string *why)
{
    const auto start = [this](UniqueFd *fd) {
        // The set-up socket may route anywhere: binding to the device's address is best effort.
        return rendezvous::start_connect(fabric_.bootstrap(local_dev_), remote_, false, [](int s, bool) {
            (void)tune_socket(s, 0);
            return 0;
        }, fd);
    };
    const int c = conn_.step(now, deadline_ns_, start, why);
    if (c <= 0) return c;
    fd_ = std::move(conn_.fd());
    // Connected: make the QPs and say hello.
    qps_ = std::make_unique<QpSet>();
    if (int rc = qps_->create(fabric_.port_info(local_dev_), fabric_.qp_config(tc_), why); rc != 0) return rc;
    hello_.end = qps_->local_end();
    hello_.end.ring_addr = 0; // the sender's ring is never written
    hello_.end.ring_rkey = 0;
    out_.assign(Hello::kSize, 0);
    hello_.encode(out_.data());
    out_off_ = 0;
    state_ = State::kSendHello;
    deadline_ns_ = now + fabric_.handshake_timeout_ns();
    return 0;
}

int PathSetup::send_rest(bool *all, std::string *why)
{
    *all = false;
    while (out_off_ < out_.size()) {
        ssize_t n = send(fd_.get(), out_.data() + out_off_, out_.size() - out_off_, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            out_off_ += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
        return *why = std::string("set-up send failed: ") + strerror(n < 0 ? errno : EPIPE), n < 0 ? -errno : -EPIPE;
    }
    *all = true;
    return 0;
}

int PathSetup::recv_rest(size_t want, bool *all, std::string *why)
{
    *all = false;
    while (in_got_ < want) {
        ssize_t n = recv(fd_.get(), in_.data() + in_got_, want - in_got_, MSG_DONTWAIT);
        if (n > 0) {
            in_got_ += static_cast<size_t>(n);
            continue;
        }
        if (n == 0) return *why = "the peer closed the set-up socket", -ECONNRESET;
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
        return *why = std::string("set-up receive failed: ") + strerror(errno), -errno;
    }
    *all = true;
    return 0;
}

template <class Check> int PathSetup::step(uint64_t now, std::string *why, Check &&check)
{
    bool all = false;
    for (;;) {
        switch (state_) {
        case State::kConnect:
            if (int rc = connect_step(now, why); rc != 0) return rc;
            if (state_ == State::kConnect) return 0;
            continue;
        case State::kSendHello:
            if (int rc = send_rest(&all, why); rc != 0) return rc;
            if (!all) break;
            state_ = State::kReadAnswer;
            in_got_ = 0;
            continue;
        case State::kReadAnswer: {
            if (int rc = recv_rest(Answer::kSize, &all, why); rc != 0) {
                if (rc == -ECONNRESET) *why = "the listener closed the connection (hello rejected: stale handle or wrong nonce?)";
                return rc;
            }
            if (!all) break;
            Answer a;
            if (const char *bad = a.decode(in_.data())) return *why = std::string("answer: ") + bad, -EPROTO;
            if (a.status != 0)
                return *why = std::string("the listener could not set up its end: ") + strerror(static_cast<int>(a.status)),
                       -static_cast<int>(a.status);
            if (a.end.ring_addr == 0 || a.end.ring_rkey == 0) return *why = "answer without a record ring", -EPROTO;
            if (int rc = qps_->connect(a.end, why); rc != 0) return rc;
            out_.assign(4, 0);
            put_le(out_.data(), kReadyMagic, 4);
            out_off_ = 0;
            state_ = State::kSendReady;
            continue;
        }
        case State::kSendReady:
            if (int rc = send_rest(&all, why); rc != 0) return rc;
            if (!all) break;
            state_ = State::kDone;
            fd_.close_orderly();
            return 0;
        case State::kReadHello: {
            if (int rc = recv_rest(Hello::kSize, &all, why); rc != 0) return rc;
            if (!all) break;
            if (const char *bad = hello_.decode(in_.data())) return *why = bad, -EPROTO;
            if (const char *no = check(hello_); no != nullptr) return *why = no, -EACCES;
            Answer a;
            qps_ = std::make_unique<QpSet>();
            int rc = qps_->create(fabric_.port_info(local_dev_), fabric_.qp_config(-1), why);
            if (rc == 0) rc = qps_->connect(hello_.end, why);
            if (rc != 0) a.status = static_cast<uint32_t>(-rc);
            else a.end = qps_->local_end();
            out_.assign(Answer::kSize, 0);
            a.encode(out_.data());
            out_off_ = 0;
            state_ = State::kSendAnswer;
            if (rc != 0) {
                bool ignored = false;
                std::string w;
                send_rest(&ignored, &w); // tell the connector why, best effort
                return rc;
            }
            continue;
        }
        case State::kSendAnswer:
            if (int rc = send_rest(&all, why); rc != 0) return rc;
            if (!all) break;
            state_ = State::kReadReady;
            in_got_ = 0;
            continue;
        case State::kReadReady:
            if (int rc = recv_rest(4, &all, why); rc != 0) return rc;
            if (!all) break;
            if (get_le(in_.data(), 4) != kReadyMagic) return *why = "bad ready word", -EPROTO;
            state_ = State::kDone;
            fd_.close_orderly();
            return 0;
        case State::kDone:
            return 0;
        }
        if (now > deadline_ns_) return *why = "no progress within VIGIL_HANDSHAKE_TIMEOUT_MS", -ETIMEDOUT;
        return 0;
    }
}

// ---- listener -------------------------------------------------------------------------------

int VerbsListener::create(VerbsFabric &fabric, int dev, ListenHandle *handle, std::shared_ptr<VerbsListener> *out)
{
    auto l = std::make_shared<VerbsListener>(fabric);
    if (int rc = rendezvous::listen_on(dev, l->device_addrs(), handle, &l->listening_, &l->nonce_); rc != 0)
        return rc;
    *out = std::move(l);
    return 0;
}

rendezvous::DeviceAddrs VerbsListener::device_addrs() const
{
    return {static_cast<int>(fabric_.devices().size()), [this](int d) { return fabric_.bootstrap(d); },
            [this](int d) { return fabric_.dev_name(d); }};
}

void VerbsListener::finish(PathSetup &s, uint64_t now)
{
    const Hello &h = s.hello();
    auto path = std::make_unique<VerbsRecvPath>(s.take_qps(), s.identity());
    if (h.rebuild) {
        rebuilt_.push_back(Rebuilt{h.conn_id, std::move(path)});
        return;
    }
    Group *g = nullptr;
    for (Group &c : groups_)
        if (c.conn_id == h.conn_id) g = &c;
    if (g == nullptr) {
        if (groups_.size() >= rendezvous::kMaxGroups) {
            VLOG_WARN("dev %s: too many connections being set up; dropped one", fabric_.dev_name(s.local_dev()).c_str());
            return;
        }
        g = &groups_.emplace_back();
        g->conn_id = h.conn_id;
        g->npaths = h.npaths;
        g->deadline_ns = now + fabric_.handshake_timeout_ns();
    }
    g->devs[h.slot] = s.local_dev();
    if (h.other_dev != Hello::kNoDev && h.other_dev < fabric_.devices().size())
        g->devs[1 - h.slot] = static_cast<int>(h.other_dev);
    if (g->paths[h.slot]) {
        VLOG_WARN("dev %s: a second %s path for one connection; dropped", fabric_.dev_name(s.local_dev()).c_str(),
                  h.slot == kPrimary ? "primary" : "backup");
        return;
    }
    g->paths[h.slot] = std::move(path);
}

int VerbsListener::pump(uint64_t now)
{
    const int rc = rendezvous::accept_all(listening_, device_addrs(), [this] { return pending_.size(); },
                                          [&](UniqueFd fd, int dev, const Endpoint &peer) {
                                              pending_.push_back(std::make_unique<PathSetup>(
                                                  fabric_, dev, std::move(fd), peer,
                                                  now + fabric_.handshake_timeout_ns()));
                                          });
    auto check = [&](const Hello &h) -> const char * {
        if (!nonce_equal(h.nonce, nonce_)) return "wrong nonce";
        if (h.rebuild && std::find(served_.begin(), served_.end(), h.conn_id) == served_.end())
            return "path rebuild for an unknown connection";
        return nullptr;
    };
    for (auto &p : pending_) {
        std::string why;
        const int rc = p->step(now, &why, check);
        if (rc != 0) {
            // One WARN per impostor connection, not per path. A rebuild that fails (its port,
            // or the peer's, is still down) is expected while a path heals: INFO.
            const bool quiet = p->hello().rebuild || !fabric_.port_active(p->local_dev());
            const bool repeat = why == "wrong nonce" && !refusals_.first(p->hello().conn_id);
            if (quiet)
                VLOG_INFO(NCCL_NET, "dev %s: path set-up from %s failed: %s",
                          fabric_.dev_name(p->local_dev()).c_str(), p->remote().to_string().c_str(), why.c_str());
            else if (!repeat)
                VLOG_WARN("dev %s: rejected connection from %s: %s; still listening",
                          fabric_.dev_name(p->local_dev()).c_str(), p->remote().to_string().c_str(), why.c_str());
            p.reset();
            continue;
        }
        if (p->done()) {
            finish(*p, now);
            p.reset();
        }
    }
    std::erase_if(pending_, [](const auto &p) { return !p; });
    return rc;
}

int VerbsListener::accept(RecvPaths *out)
{
    *out = RecvPaths{};
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t now = now_ns();
    if (int rc = pump(now); rc != 0) return rc;
    for (Group &g : groups_) {
        if (g.conn_id == 0) continue;
        if (g.paths[kPrimary]) {
            if (g.primary_done_ns == 0) g.primary_done_ns = now;
            if (g.npaths == 1 || g.paths[kBackup] || now - g.primary_done_ns > rendezvous::kBackupGraceNs) {
                out->paths[kPrimary] = std::move(g.paths[kPrimary]);
                out->paths[kBackup] = std::move(g.paths[kBackup]);
                out->devs = g.devs;
                out->acceptor = std::make_unique<VerbsAcceptor>(shared_from_this(), g.conn_id);
                add_flushers(out);
                served_.push_back(g.conn_id);
                g = Group{};
                break;
            }
        } else if (now > g.deadline_ns + rendezvous::kBackupGraceNs) {
            g = Group{}; // a backup whose primary never came
        }
    }
    std::erase_if(groups_, [](const Group &g) { return g.conn_id == 0; });
    return 0;
}

void VerbsListener::add_flushers(RecvPaths *out)
{
    // Only a device that can write GPU memory (GPUDirect RDMA) needs NCCL's flush.
    for (int s = 0; s < kMaxPaths; ++s) {
        const int dev = out->devs[static_cast<size_t>(s)];
        if (dev < 0 || (fabric_.devices()[static_cast<size_t>(dev)].ptr_support & NCCL_PTR_CUDA) == 0) continue;
        std::unique_ptr<VerbsFlusher> f;
        std::string why;
        if (VerbsFlusher::create(fabric_.port_info(dev), fabric_.qp_config(-1), &f, &why) != 0)
            VLOG_WARN("dev %s: no flush QP (%s): receives into GPU memory there are not flushed",
                      fabric_.dev_name(dev).c_str(), why.c_str());
        out->flushers[static_cast<size_t>(s)] = std::move(f);
    }
}

bool VerbsListener::take_rebuilt(uint64_t conn_id, std::unique_ptr<RecvPath> *out)
{
    std::lock_guard<std::mutex> lock(mu_);
    pump(now_ns());
    for (auto it = rebuilt_.begin(); it != rebuilt_.end(); ++it) {
        if (it->conn_id != conn_id) continue;
        *out = std::move(it->path);
        rebuilt_.erase(it);
        return true;
    }
    return false;
}

int VerbsAcceptor::poll(std::unique_ptr<RecvPath> *out)
{
    l_->take_rebuilt(conn_id_, out);
    return 0;
}

// ---- connector ------------------------------------------------------------------------------

VerbsConnector::VerbsConnector(VerbsFabric &fabric, const std::array<VerbsPlan, kMaxPaths> &plan,
                               const ListenHandle &h)
    : fabric_(fabric), plan_(plan), nonce_(h.nonce)
{
    while (conn_id_ == 0) random_bytes(&conn_id_, sizeof(conn_id_));
    const uint64_t deadline = now_ns() + fabric.connect_timeout_ns();
    for (int k = 0; k < kMaxPaths; ++k) {
        const VerbsPlan &p = plan_[static_cast<size_t>(k)];
        if (p.local_dev < 0) continue;
        setups_[static_cast<size_t>(k)] =
            std::make_unique<PathSetup>(fabric, p.local_dev, p.remote, make_hello(plan_, k, nonce_, conn_id_, false),
                                        deadline, p.traffic_class);
    }
}

int VerbsConnector::progress(SendPaths *out)
{
    *out = SendPaths{};
    const uint64_t now = now_ns();
    bool pending = false;
    auto none = [](const Hello &) -> const char * { return nullptr; };
    for (int k = 0; k < kMaxPaths; ++k) {
        auto &s = setups_[static_cast<size_t>(k)];
        if (!s || s->done()) continue;
        std::string why;
        if (int rc = s->step(now, &why, none); rc != 0) {
            if (k == kPrimary) {
                VLOG_WARN("connect from dev %s to %s failed: %s", fabric_.dev_name(s->local_dev()).c_str(),
                          s->remote().to_string().c_str(), why.c_str());
                return rc;
            }
            VLOG_WARN("backup path from dev %s to %s not established: %s; the connection runs without a "
                      "standby until a rebuild succeeds",
                      fabric_.dev_name(s->local_dev()).c_str(), s->remote().to_string().c_str(), why.c_str());
            s.reset();
            continue;
        }
        pending = pending || !s->done();
    }
    if (pending) return 0;
    for (int k = 0; k < kMaxPaths; ++k) {
        auto &s = setups_[static_cast<size_t>(k)];
        if (!s) continue;
        PathIdentity id = s->identity();
        out->paths[static_cast<size_t>(k)] = std::make_unique<VerbsSendPath>(s->take_qps(), std::move(id));
    }
    out->rebuilder = std::make_unique<VerbsRebuilder>(fabric_, plan_, nonce_, conn_id_);
    return 0;
}

VerbsRebuilder::VerbsRebuilder(VerbsFabric &fabric, const std::array<VerbsPlan, kMaxPaths> &plan,
                               const std::array<uint8_t, 16> &nonce, uint64_t conn_id)
    : fabric_(fabric), plan_(plan), nonce_(nonce), conn_id_(conn_id)
{
}

bool VerbsRebuilder::can_rebuild(int slot) const
{
    return slot >= 0 && slot < kMaxPaths && plan_[static_cast<size_t>(slot)].local_dev >= 0;
}

int VerbsRebuilder::progress(int slot, std::unique_ptr<SendPath> *out)
{
    out->reset();
    if (!can_rebuild(slot)) return -EINVAL;
    auto &a = attempts_[static_cast<size_t>(slot)];
    const uint64_t now = now_ns();
    if (!a) {
        const VerbsPlan &p = plan_[static_cast<size_t>(slot)];
        // No attempt while the local port is down: PORT_ACTIVE will reset the backoff.
        if (!fabric_.port_active(p.local_dev)) return -ENETDOWN;
        // Short attempts: towards a port still down nothing answers, and a fresh attempt after
        // the repair beats waiting out a long one.
        const uint64_t limit = std::min<uint64_t>(fabric_.handshake_timeout_ns(), kRebuildAttemptNs);
        a = std::make_unique<PathSetup>(fabric_, p.local_dev, p.remote, make_hello(plan_, slot, nonce_, conn_id_, true),
                                        now + limit, p.traffic_class);
    }
    std::string why;
    auto none = [](const Hello &) -> const char * { return nullptr; };
    if (int rc = a->step(now, &why, none); rc != 0) {
        VLOG_TRACE(NCCL_NET, "rebuild of %s path from dev %s failed: %s", slot == kPrimary ? "primary" : "backup",
                   fabric_.dev_name(a->local_dev()).c_str(), why.c_str());
        a.reset();
        return rc;
    }
    if (!a->done()) return 0;
    PathIdentity id = a->identity();
    *out = std::make_unique<VerbsSendPath>(a->take_qps(), std::move(id));
    a.reset();
    return 0;
}

} // namespace vigil::net::verbs_fabric
