// SPDX-License-Identifier: Apache-2.0
// Verbs connection set-up: hello/answer/ready over one TCP socket per path.
#include "verbs_setup.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
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

Hello make_hello(const std::array<VerbsPlan, kMaxPaths> &plan, const rendezvous::Intro &intro)
{
    Hello h;
    h.slot = static_cast<uint8_t>(intro.slot);
    h.npaths = static_cast<uint8_t>(intro.npaths);
    h.rebuild = intro.rebuild ? 1 : 0;
    h.nonce = intro.nonce;
    h.conn_id = intro.conn_id;
    h.path_id = intro.path_id;
    h.peer_dev = static_cast<uint32_t>(plan[static_cast<size_t>(intro.slot)].peer_dev);
    const VerbsPlan &other = plan[static_cast<size_t>(1 - intro.slot)];
    h.other_dev = other.local_dev >= 0 && other.peer_dev >= 0 ? static_cast<uint32_t>(other.peer_dev)
                                                               : Hello::kNoDev;
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
        id.peer_port = id.peer;
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
    // Connected: make the QPs (on the set-up thread), then say hello.
    start_qp_work([port = fabric_.port_info(local_dev_), cfg = fabric_.qp_config(tc_)](QpWork &w) {
        w.qps = std::make_unique<QpSet>();
        return w.qps->create(port, cfg, End::kSender, &w.why);
    }, State::kMakeQps);
    return 0;
}

void PathSetup::QpWork::run() noexcept
{
    try {
        rc = fn(*this);
    } catch (const std::exception &e) {
        rc = -ENOMEM;
        why = std::string("QP set-up failed: ") + e.what();
    } catch (...) {
        rc = -ENOMEM;
        why = "QP set-up failed: an unknown exception";
    }
}

void PathSetup::start_qp_work(std::function<int(QpWork &)> work, State next_state)
{
    work_ = std::make_shared<QpWork>();
    work_->qps = std::move(qps_);
    work_->fn = std::move(work);
    state_ = next_state;
    job_ = SetupJobs::process().run([w = work_] { w->run(); return 0; }, wake_);
    if (!job_) work_->run(); // no set-up thread: here, as before it existed
}

bool PathSetup::qp_work_done(int *rc, std::string *why)
{
    if (job_ && !job_->done()) return false;
    *rc = work_->rc; // written before the job's done() (release) turned true
    job_.reset();
    qps_ = std::move(work_->qps);
    if (*rc != 0) *why = work_->why;
    work_.reset();
    return true;
}

void PathSetup::send_hello(uint64_t now)
{
    hello_.end = qps_->local_end();
    hello_.end.ring_addr = 0; // the sender's record ring is never written
    out_.assign(Hello::kSize, 0);
    hello_.encode(out_.data());
    out_off_ = 0;
    state_ = State::kSendHello;
    deadline_ns_ = now + fabric_.handshake_timeout_ns();
}

void PathSetup::answer(int rc)
{
    Answer a;
    if (rc != 0) a.status = static_cast<uint32_t>(-rc);
    else a.end = qps_->local_end();
    out_.assign(Answer::kSize, 0);
    a.encode(out_.data());
    out_off_ = 0;
    state_ = State::kSendAnswer;
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
        case State::kMakeQps: {
            int rc = 0;
            if (!qp_work_done(&rc, why)) return 0; // local work: no deadline while it runs
            if (role_ == Role::kConnector) {
                if (rc != 0) return rc;
                send_hello(now);
                continue;
            }
            answer(rc);
            if (rc != 0) {
                bool ignored = false;
                std::string w;
                send_rest(&ignored, &w); // tell the connector why, best effort
                return rc;
            }
            continue;
        }
        case State::kConnectQps: {
            int rc = 0;
            if (!qp_work_done(&rc, why)) return 0;
            if (rc != 0) return rc;
            out_.assign(4, 0);
            put_le(out_.data(), kReadyMagic, 4);
            out_off_ = 0;
            state_ = State::kSendReady;
            continue;
        }
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
            if (a.end.ring_addr == 0) return *why = "answer without a record ring", -EPROTO;
            start_qp_work([end = a.end](QpWork &w) { return w.qps->connect(end, &w.why); }, State::kConnectQps);
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
            start_qp_work([port = fabric_.port_info(local_dev_), cfg = fabric_.qp_config(-1),
                           end = hello_.end](QpWork &w) {
                w.qps = std::make_unique<QpSet>();
                int rc = w.qps->create(port, cfg, End::kReceiver, &w.why);
                if (rc == 0) rc = w.qps->connect(end, &w.why);
                return rc;
            }, State::kMakeQps);
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

// ---- the rendezvous's halves ---------------------------------------------------------------

namespace {

/// The listener's half of one path: a PathSetup in the listener's role.
class VerbsArrival final : public rendezvous::Arrival
{
public:
    VerbsArrival(VerbsFabric &fabric, int dev, UniqueFd fd, const Endpoint &peer,
                 uint64_t deadline_ns)
        : Arrival(dev, peer), fabric_(fabric), setup_(fabric, dev, std::move(fd), peer, deadline_ns)
    {
    }
    int step(uint64_t now, const Check &check, std::string *why) override
    {
        return setup_.step(now, why, [&](const Hello &h) {
            intro_.nonce = h.nonce;
            intro_.conn_id = h.conn_id;
            intro_.path_id = h.path_id;
            intro_.slot = h.slot;
            intro_.npaths = h.npaths;
            intro_.rebuild = h.rebuild != 0;
            intro_.other_dev =
                h.other_dev < fabric_.devices().size() ? static_cast<int>(h.other_dev) : -1;
            return check(intro_);
        });
    }
    bool done() const override { return setup_.done(); }
    const rendezvous::Intro &intro() const override { return intro_; }
    void set_wake(std::function<void()> wake) override { setup_.set_wake(std::move(wake)); }
    PathSetup &setup() { return setup_; }

private:
    VerbsFabric &fabric_;
    PathSetup setup_;
    rendezvous::Intro intro_;
};

/// What the verbs fabric's listener is made of.
class VerbsAcceptSide final : public rendezvous::AcceptSide
{
public:
    explicit VerbsAcceptSide(VerbsFabric &f) : fabric_(f) {}
    rendezvous::DeviceAddrs devices() const override
    {
        return {static_cast<int>(fabric_.devices().size()),
                [this](int d) { return fabric_.bootstrap(d); },
                [this](int d) { return fabric_.dev_name(d); }};
    }
    uint64_t handshake_timeout_ns() const override { return fabric_.handshake_timeout_ns(); }
    const char *part_name() const override { return "set-up socket"; }
    std::unique_ptr<rendezvous::Arrival> arrive(UniqueFd fd, int dev, const Endpoint &peer,
                                                uint64_t deadline_ns) override
    {
        return std::make_unique<VerbsArrival>(fabric_, dev, std::move(fd), peer, deadline_ns);
    }
    std::unique_ptr<RecvPath> build(int /*slot*/, int /*dev*/,
                                    std::vector<std::unique_ptr<rendezvous::Arrival>> parts,
                                    std::string * /*why*/) override
    {
        PathSetup &s = static_cast<VerbsArrival &>(*parts.front()).setup();
        return std::make_unique<VerbsRecvPath>(s.take_qps(), s.identity());
    }
    void accepted(RecvPaths *out) override;
    bool quiet_failure(const rendezvous::Arrival &a) const override
    {
        // A rebuild that fails (its port, or the peer's, is still down) is expected while a
        // path heals.
        return a.intro().rebuild || !fabric_.port_active(a.dev());
    }

private:
    VerbsFabric &fabric_;
};

void VerbsAcceptSide::accepted(RecvPaths *out)
{
    // Only a device that can write GPU memory (GPUDirect RDMA) needs NCCL's flush.
    for (int s = 0; s < kMaxPaths; ++s) {
        const int dev = out->devs[static_cast<size_t>(s)];
        if (dev < 0 ||
            (fabric_.devices()[static_cast<size_t>(dev)].ptr_support & NCCL_PTR_CUDA) == 0)
            continue;
        std::unique_ptr<VerbsFlusher> f;
        std::string why;
        if (VerbsFlusher::create(fabric_.port_info(dev), fabric_.qp_config(-1), &f, &why) != 0)
            VLOG_WARN("dev %s: no flush QP (%s): receives into GPU memory there are not flushed",
                      fabric_.dev_name(dev).c_str(), why.c_str());
        out->flushers[static_cast<size_t>(s)] = std::move(f);
    }
}

/// The connector's half of one path: a PathSetup in the connector's role.
class VerbsDial final : public rendezvous::Dial
{
public:
    VerbsDial(VerbsFabric &fabric, const VerbsPlan &p, const Hello &h, uint64_t deadline_ns)
        : fabric_(fabric), setup_(fabric, p.local_dev, p.remote, h, deadline_ns, p.traffic_class)
    {
    }
    int step(uint64_t now, std::string *why) override
    {
        return setup_.step(now, why, [](const Hello &) -> const char * { return nullptr; });
    }
    bool done() const override { return setup_.done(); }
    std::unique_ptr<SendPath> build() override
    {
        PathIdentity id = setup_.identity();
        return std::make_unique<VerbsSendPath>(setup_.take_qps(), std::move(id));
    }
    std::string local_name() const override { return fabric_.dev_name(setup_.local_dev()); }
    const Endpoint &remote() const override { return setup_.remote(); }

private:
    VerbsFabric &fabric_;
    PathSetup setup_;
};

} // namespace

std::unique_ptr<rendezvous::AcceptSide> accept_side(VerbsFabric &fabric)
{
    return std::make_unique<VerbsAcceptSide>(fabric);
}

int VerbsConnectSide::dial(const rendezvous::Intro &intro, uint64_t now,
                           std::unique_ptr<rendezvous::Dial> *out)
{
    const VerbsPlan &p = plan_[static_cast<size_t>(intro.slot)];
    uint64_t deadline = now + fabric_.connect_timeout_ns();
    if (intro.rebuild) {
        // No attempt while the local port is down: PORT_ACTIVE will reset the backoff.
        if (!fabric_.port_active(p.local_dev)) return -ENETDOWN;
        // Short attempts: towards a port still down nothing answers, and a fresh attempt after
        // the repair beats waiting out a long one.
        deadline = now + std::min<uint64_t>(fabric_.handshake_timeout_ns(), kRebuildAttemptNs);
    }
    *out = std::make_unique<VerbsDial>(fabric_, p, make_hello(plan_, intro), deadline);
    return 0;
}

} // namespace vigil::net::verbs_fabric
