// SPDX-License-Identifier: Apache-2.0
// The fabric-neutral part of connection set-up: the retrying non-blocking connect and the
// connector's side of the rendezvous (the listener's is rendezvous_listen.cc).
#include "rendezvous.h"

#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include "clock.h"
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
        // The address now, the port at connect(), where the kernel picks it per destination:
        // thousands of connections to one listening socket (the process's ListenHub) would
        // otherwise each scan the source address's whole port range at bind(), more slowly
        // the more of it is taken (by this run, or the TIME_WAIT of the last).
        const int one = 1;
        setsockopt(s, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
        const socklen_t len = from.to_sockaddr(&ss);
        bound = ::bind(s, reinterpret_cast<sockaddr *>(&ss), len) == 0;
        if (!bound && bind_required) return -errno;
    }
    if (int rc = prepare(s, bound); rc != 0) return rc;
    const socklen_t len = remote.to_sockaddr(&ss);
    if (::connect(s, reinterpret_cast<sockaddr *>(&ss), len) != 0 && errno != EINPROGRESS)
        return -errno;
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
        if (now > deadline_ns)
            return *why = std::string(strerror(err)) + " until the connect deadline", -err;
        fd_.reset();
        retry_at_ns_ = now + kRetryNs;
        return 0;
    }
    connected_ = true;
    return 1;
}

// ---- the connector's side -----------------------------------------------------------------

namespace {

/// The Intro of slot `slot` of connection `conn_id`: a fresh path id, npaths from `side`'s
/// plan.
Intro make_intro(const ConnectSide &side, int slot, const std::array<uint8_t, 16> &nonce,
                 uint64_t conn_id, bool rebuild)
{
    Intro in;
    in.nonce = nonce;
    in.conn_id = conn_id;
    while (in.path_id == 0) random_bytes(&in.path_id, sizeof(in.path_id));
    in.slot = slot;
    in.npaths = side.plans(kBackup) ? 2 : 1;
    in.rebuild = rebuild;
    return in;
}

} // namespace

Connecting::Connecting(std::shared_ptr<ConnectSide> side, const std::array<uint8_t, 16> &nonce)
    : side_(std::move(side)), nonce_(nonce)
{
    while (conn_id_ == 0) random_bytes(&conn_id_, sizeof(conn_id_));
    const uint64_t now = now_ns();
    for (int k = 0; k < kMaxPaths; ++k) {
        if (!side_->plans(k)) continue;
        const int rc = side_->dial(make_intro(*side_, k, nonce_, conn_id_, false), now,
                                   &dials_[static_cast<size_t>(k)]);
        if (rc != 0 && k == kPrimary) failed_ = rc;
    }
}

int Connecting::progress(SendPaths *out)
{
    *out = SendPaths{};
    if (failed_ != 0 || !dials_[kPrimary]) {
        VLOG_WARN("connect failed: the primary path could not start: %s",
                  strerror(failed_ ? -failed_ : EINVAL));
        return failed_ != 0 ? failed_ : -EINVAL;
    }
    const uint64_t now = now_ns();
    bool pending = false;
    for (int k = 0; k < kMaxPaths; ++k) {
        std::unique_ptr<Dial> &d = dials_[static_cast<size_t>(k)];
        if (!d || d->done()) continue;
        std::string why;
        if (int rc = d->step(now, &why); rc != 0) {
            if (k == kPrimary) {
                VLOG_WARN("connect from dev %s to %s failed: %s", d->local_name().c_str(),
                          d->remote().to_string().c_str(), why.c_str());
                return rc;
            }
            VLOG_WARN(
                "backup path from dev %s to %s not established: %s; the connection runs without a "
                "standby until a rebuild succeeds",
                d->local_name().c_str(), d->remote().to_string().c_str(), why.c_str());
            d.reset();
            continue;
        }
        pending = pending || !d->done();
    }
    if (pending) return 0;
    for (int k = 0; k < kMaxPaths; ++k)
        if (std::unique_ptr<Dial> &d = dials_[static_cast<size_t>(k)])
            out->paths[static_cast<size_t>(k)] = d->build();
    out->rebuilder = std::make_unique<Rebuilding>(side_, nonce_, conn_id_);
    return 0;
}

namespace {
std::atomic<int> g_dials_in_flight{0}; // Rebuilding's attempts in progress, this process
} // namespace

Rebuilding::Rebuilding(std::shared_ptr<ConnectSide> side, const std::array<uint8_t, 16> &nonce,
                       uint64_t conn_id)
    : side_(std::move(side)), nonce_(nonce), conn_id_(conn_id)
{
}

Rebuilding::~Rebuilding()
{
    for (int i = 0; i < kMaxPaths; ++i) end_attempt(i);
}

void Rebuilding::end_attempt(int slot) noexcept
{
    std::unique_ptr<Dial> &a = attempts_[static_cast<size_t>(slot)];
    if (!a) return;
    a.reset();
    g_dials_in_flight.fetch_sub(1, std::memory_order_relaxed);
}

bool Rebuilding::can_rebuild(int slot) const
{
    return slot >= 0 && slot < kMaxPaths && side_->plans(slot);
}

int Rebuilding::progress(int slot, std::unique_ptr<SendPath> *out)
{
    out->reset();
    if (!can_rebuild(slot)) return -EINVAL;
    std::unique_ptr<Dial> &a = attempts_[static_cast<size_t>(slot)];
    const uint64_t now = now_ns();
    if (!a) {
        // Paced: wait for a place among the process's attempts (reported as in progress).
        if (g_dials_in_flight.fetch_add(1, std::memory_order_relaxed) >= kMaxDialsInFlight) {
            g_dials_in_flight.fetch_sub(1, std::memory_order_relaxed);
            return 0;
        }
        const int rc = side_->dial(make_intro(*side_, slot, nonce_, conn_id_, true), now, &a);
        if (rc != 0 || !a) {
            g_dials_in_flight.fetch_sub(1, std::memory_order_relaxed);
            a.reset();
            return rc != 0 ? rc : -EIO;
        }
    }
    std::string why;
    if (int rc = a->step(now, &why); rc != 0) {
        VLOG_TRACE(NCCL_NET, "rebuild of %s path from dev %s failed: %s",
                   slot == kPrimary ? "primary" : "backup", a->local_name().c_str(), why.c_str());
        end_attempt(slot);
        return rc;
    }
    if (!a->done()) return 0;
    *out = a->build();
    end_attempt(slot);
    return 0;
}

} // namespace vigil::net::rendezvous
