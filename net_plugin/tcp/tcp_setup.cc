// SPDX-License-Identifier: Apache-2.0
// TCP fabric connection set-up: its halves of the rendezvous (a stream's hello on the
// listener's side, a path's streams on the connector's).
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

/// The listener's answer on stream 0 of a complete path. A fresh socket's send buffer holds
/// its 8 bytes: a short write means the peer is gone.
bool answer(int fd)
{
    std::array<uint8_t, AcceptAnswer::kSize> ans;
    AcceptAnswer::encode(ans.data(), 0);
    tune_socket(fd, 0);
    return send(fd, ans.data(), ans.size(), MSG_NOSIGNAL | MSG_DONTWAIT) ==
           static_cast<ssize_t>(ans.size());
}

/// What the TCP fabric's listener is made of: its devices and the handshake timeout.
class TcpAcceptSide final : public rendezvous::AcceptSide
{
public:
    TcpAcceptSide(std::vector<Device> devs, const Params &params)
        : devs_(std::move(devs)),
          timeout_ns_(static_cast<uint64_t>(params.handshake_timeout_ms) * 1'000'000ull)
    {
    }
    rendezvous::DeviceAddrs devices() const override
    {
        return {static_cast<int>(devs_.size()),
                [this](int d) { return devs_[static_cast<size_t>(d)].addr; },
                [this](int d) { return devs_[static_cast<size_t>(d)].name; }};
    }
    uint64_t handshake_timeout_ns() const override { return timeout_ns_; }
    const char *part_name() const override { return "stream"; }
    std::unique_ptr<rendezvous::Arrival> arrive(UniqueFd fd, int dev, const Endpoint &peer,
                                                uint64_t deadline_ns) override
    {
        return std::make_unique<TcpArrival>(std::move(fd), dev, peer, deadline_ns);
    }
    // Answers on stream 0 and makes the path of the streams.
    std::unique_ptr<RecvPath> build(int slot, int dev,
                                    std::vector<std::unique_ptr<rendezvous::Arrival>> parts,
                                    std::string *why) override
    {
        std::vector<UniqueFd> fds;
        const uint64_t path_id = parts.front()->intro().path_id;
        for (auto &a : parts) fds.push_back(static_cast<TcpArrival &>(*a).take_fd());
        if (!answer(fds[0].get())) return *why = strerror(errno), nullptr;
        PathIdentity id =
            path_identity(slot, dev, devs_[static_cast<size_t>(dev)].name, path_id, fds);
        return std::make_unique<TcpRecvPath>(std::move(fds), std::move(id));
    }

private:
    std::vector<Device> devs_;
    uint64_t timeout_ns_;
};

} // namespace

std::unique_ptr<rendezvous::AcceptSide> accept_side(const std::vector<Device> &devs,
                                                    const Params &params)
{
    return std::make_unique<TcpAcceptSide>(devs, params);
}

int listen(const std::vector<Device> &devs, int dev, const Params &params, ListenHandle *handle,
           std::shared_ptr<rendezvous::Listening> *out)
{
    return rendezvous::Listening::create(std::make_unique<TcpAcceptSide>(devs, params), dev, handle,
                                         out);
}

// ---- the listener's half of a stream --------------------------------------------------------

TcpArrival::TcpArrival(UniqueFd fd, int dev, const Endpoint &peer, uint64_t deadline_ns)
    : Arrival(dev, peer), fd_(std::move(fd)), deadline_ns_(deadline_ns)
{
}

TcpArrival::TcpArrival(UniqueFd fd, int dev, const Endpoint &peer, uint64_t deadline_ns,
                       const uint8_t *hello)
    : TcpArrival(std::move(fd), dev, peer, deadline_ns)
{
    std::memcpy(buf_.data(), hello, buf_.size());
    got_ = buf_.size();
}

int TcpArrival::step(uint64_t now, const Check &check, std::string *why)
{
    if (state_ == State::kDone) return 0;
    while (got_ < buf_.size()) {
        const ssize_t n = recv(fd_.get(), buf_.data() + got_, buf_.size() - got_, MSG_DONTWAIT);
        if (n > 0) {
            got_ += static_cast<size_t>(n);
        } else if (n == 0) {
            return *why = "closed before completing its hello", -ECONNRESET;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (now > deadline_ns_)
                return *why = "no hello within VIGIL_HANDSHAKE_TIMEOUT_MS", -ETIMEDOUT;
            return 0;
        } else if (errno != EINTR) {
            return *why = strerror(errno), -errno;
        }
    }
    return judge(check, why);
}

int TcpArrival::judge(const Check &check, std::string *why)
{
    Hello h;
    const char *bad = h.decode(buf_.data());
    intro_.conn_id = h.conn_id; // one WARN per impostor connection needs it even when refused
    if (bad != nullptr) return *why = bad, -EPROTO;
    intro_.nonce = h.nonce;
    intro_.path_id = h.path_id;
    intro_.slot = hello_kind(h.path_kind);
    intro_.npaths = hello_npaths(h.path_kind);
    intro_.rebuild = hello_rebuild(h.path_kind);
    intro_.part = h.stream;
    intro_.nparts = h.nstreams;
    if (const char *no = check(intro_); no != nullptr) return *why = no, -EACCES;
    state_ = State::kDone;
    return 0;
}

PathIdentity path_identity(int slot, int dev, const std::string &dev_name, uint64_t path_id,
                           const std::vector<UniqueFd> &fds)
{
    PathIdentity id;
    id.slot = slot;
    id.dev = dev;
    id.dev_name = dev_name;
    id.id = path_id;
    socket_endpoints(fds[0].get(), &id.local, &id.peer, &id.peer_port);
    id.detail = std::to_string(fds.size()) + " streams";
    return id;
}

// ---- the connector's half of a path ------------------------------------------------------

TcpPathConnector::TcpPathConnector(const Device &local, int local_dev, const Endpoint &remote,
                                   const Hello &hello, int nstreams, const Params &params,
                                   uint64_t connect_deadline_ns, uint64_t handshake_timeout_ns)
    : local_(local), local_dev_(local_dev), remote_(remote), hello_(hello),
      buf_bytes_(static_cast<long>(params.socket_buf_bytes)),
      chunk_bytes_(static_cast<size_t>(params.chunk_bytes)),
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
            ssize_t n = send(st.conn.fd().get(), bytes.data() + st.hello_sent,
                             Hello::kSize - st.hello_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
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

std::unique_ptr<SendPath> TcpPathConnector::build()
{
    std::vector<UniqueFd> fds;
    for (Stream &st : streams_) fds.push_back(std::move(st.conn.fd()));
    PathIdentity id =
        path_identity(hello_kind(hello_.path_kind), local_dev_, local_.name, hello_.path_id, fds);
    return std::make_unique<TcpSendPath>(std::move(fds), std::move(id), chunk_bytes_);
}

int TcpConnectSide::dial(const rendezvous::Intro &intro, uint64_t now,
                         std::unique_ptr<rendezvous::Dial> *out)
{
    const PathPlan &pp = plan_[static_cast<size_t>(intro.slot)];
    Hello h;
    h.nstreams = static_cast<uint8_t>(params_.nstreams);
    h.nonce = intro.nonce;
    h.conn_id = intro.conn_id;
    h.path_id = intro.path_id;
    h.path_kind = make_path_kind(intro.slot, intro.npaths, intro.rebuild);
    const uint64_t handshake = static_cast<uint64_t>(params_.handshake_timeout_ms) * 1'000'000ull;
    const uint64_t connect =
        intro.rebuild ? std::min(handshake, kRebuildAttemptNs)
                      : static_cast<uint64_t>(params_.connect_timeout_ms) * 1'000'000ull;
    *out = std::make_unique<TcpPathConnector>(devs_[static_cast<size_t>(pp.local_dev)],
                                              pp.local_dev, pp.remote, h,
                                              static_cast<int>(params_.nstreams), params_,
                                              now + connect, intro.rebuild ? connect : handshake);
    return 0;
}

} // namespace vigil::net::tcp
