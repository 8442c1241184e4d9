// SPDX-License-Identifier: Apache-2.0
// Connection set-up of the verbs fabric. Each path is set up over one TCP socket, as NCCL's
// IB transport does: the connector creates its QPs (INIT) and sends a hello (its QPs, GID,
// the listener's nonce, connection and path ids); the listener checks the nonce, creates its
// QPs, drives them to RTS towards the connector's and answers with its end (QPs and record
// ring); the connector drives its QPs to RTS and sends a ready word, after which the path
// carries traffic and the socket closes. Every step is non-blocking; NCCL calls again.
// These are the verbs fabric's halves of the rendezvous (rendezvous.h), which does the
// listening, grouping, nonce checks, grace, rebuilds and the primary/backup policy.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../fabric.h"
#include "../handle.h"
#include "../rendezvous.h"
#include "../setup_jobs.h"
#include "../sockets/socket.h"
#include "verbs_path.h"
#include "verbs_wire.h"

namespace vigil::net::verbs_fabric {

class VerbsFabric;

/// One path being set up, on either side: the socket, the bytes of the current message, and
/// the QPs. Not thread-safe.
///
///   connector: kConnect --connected--> kMakeQps --QPs made--> kSendHello --sent-->
///              kReadAnswer --answer valid--> kConnectQps --QPs at RTS--> kSendReady --sent-->
///              kDone
///   listener:  kReadHello --hello valid and accepted--> kMakeQps --QPs made, at RTS-->
///              kSendAnswer --sent--> kReadReady --ready word--> kDone
///
/// kMakeQps and kConnectQps are the QP work (SetupJobs): it runs on the process's set-up
/// thread while step() returns "in progress", so whoever steps the set-up (NCCL's proxy
/// thread, a comm's rebuild under its lock, the listener hub on a progress thread) never
/// waits for it; the deadline is not judged while it runs (the work is local and always
/// ends). A socket error, a closed socket, a malformed or refused message, a QP that cannot
/// be made or connected, or no progress by the deadline fails step(); the set-up socket
/// closes in order at kDone.
class PathSetup
{
public:
    enum class Role { kConnector, kListener };
    /// Connector side: connects from device `local_dev` to `remote` (the listener's device
    /// `peer_dev` in its handle) as slot `slot` of connection `conn_id`.
    PathSetup(VerbsFabric &fabric, int local_dev, const Endpoint &remote, const Hello &hello,
              uint64_t deadline_ns, int traffic_class);
    /// Listener side: an accepted socket on device `local_dev`.
    PathSetup(VerbsFabric &fabric, int local_dev, UniqueFd fd, const Endpoint &peer, uint64_t deadline_ns);

    /// Moves as far as possible. 0 while in progress (done() tells completion), or -errno
    /// with *why. Listener side: `check` judges the hello (nullptr = accept, else why not).
    template <class Check> int step(uint64_t now, std::string *why, Check &&check);
    bool done() const { return state_ == State::kDone; }
    int local_dev() const { return local_dev_; }
    const Endpoint &remote() const { return remote_; }
    /// The finished path's identity and QPs (once done()).
    PathIdentity identity() const;
    std::unique_ptr<QpSet> take_qps() { return std::move(qps_); }
    /// Called on the set-up thread when QP work finishes (Arrival::set_wake).
    void set_wake(std::function<void()> wake) { wake_ = std::move(wake); }

private:
    enum class State {
        kConnect, kMakeQps, kSendHello, kReadAnswer, kConnectQps, kSendReady, kReadHello, kSendAnswer, kReadReady,
        kDone
    };
    /// The QP work in flight on the set-up thread: the QP set it makes or connects, and why it
    /// failed. Shared with the job, so a set-up dropped meanwhile frees nothing under it.
    struct QpWork {
        std::unique_ptr<QpSet> qps;
        std::string why;
        std::function<int(QpWork &)> fn;
        int rc = 0; ///< fn's result once it ran: 0 or -errno, with why
        /// Runs fn once, on whichever thread; an exception is -ENOMEM with why.
        void run() noexcept;
    };
    /// kConnect: the socket connects (rendezvous::Connect), then the QPs are asked for.
    int connect_step(uint64_t now, std::string *why);
    /// Runs `work` (on qps_, moved to the job) on the set-up thread, or here when that thread
    /// cannot start; state_ becomes `next_state`.
    void start_qp_work(std::function<int(QpWork &)> work, State next_state);
    /// Whether the QP work finished: qps_ is back, and *rc is its result (with *why).
    bool qp_work_done(int *rc, std::string *why);
    /// The hello and the move to kSendHello, once the connector's QPs exist.
    void send_hello(uint64_t now);
    /// The answer to the hello (the listener's end, or why it has none), into out_.
    void answer(int rc);
    /// Writes the rest of out_; true when all of it is written.
    int send_rest(bool *all, std::string *why);
    /// Reads up to `want` bytes into in_; true when they are all there.
    int recv_rest(size_t want, bool *all, std::string *why);

    VerbsFabric &fabric_;
    Role role_;
    State state_;
    int local_dev_;
    Endpoint remote_;
    rendezvous::Connect conn_; // connector side, until connected
    UniqueFd fd_;
    uint64_t deadline_ns_;
    int tc_ = -1;
    Hello hello_;
    std::unique_ptr<QpSet> qps_;
    std::shared_ptr<QpWork> work_;
    std::shared_ptr<SetupJobs::Job> job_;
    std::function<void()> wake_;
    std::vector<uint8_t> out_;
    size_t out_off_ = 0;
    std::array<uint8_t, Hello::kSize> in_{};
    size_t in_got_ = 0;
};

/// What the verbs fabric's listening side is made of (its hub's AcceptSide: set-up sockets
/// on the devices' bootstrap addresses).
std::unique_ptr<rendezvous::AcceptSide> accept_side(VerbsFabric &fabric);

/// Where a connection's paths go: local device and the listener's address and device.
struct VerbsPlan {
    int local_dev = -1;
    Endpoint remote;
    int peer_dev = -1;
    int traffic_class = -1; ///< NCCL's, for this connection (-1: unset)
};

/// The verbs plan of one connection, for the rendezvous's connector and rebuilder.
class VerbsConnectSide final : public rendezvous::ConnectSide
{
public:
    VerbsConnectSide(VerbsFabric &fabric, const std::array<VerbsPlan, kMaxPaths> &plan)
        : fabric_(fabric), plan_(plan)
    {
    }
    bool plans(int slot) const override { return plan_[static_cast<size_t>(slot)].local_dev >= 0; }
    /// A connect's dials share VIGIL_CONNECT_TIMEOUT_MS; a rebuild's attempt is at most 2 s
    /// (QP set-up included) and does not start while the local port is down (-ENETDOWN: a
    /// PORT_ACTIVE event resets the caller's backoff).
    int dial(const rendezvous::Intro &intro, uint64_t now,
             std::unique_ptr<rendezvous::Dial> *out) override;

private:
    VerbsFabric &fabric_;
    std::array<VerbsPlan, kMaxPaths> plan_;
};

/// The hello of the path `intro` names, of a connection following `plan` (the listener's
/// devices of both slots).
Hello make_hello(const std::array<VerbsPlan, kMaxPaths> &plan, const rendezvous::Intro &intro);

} // namespace vigil::net::verbs_fabric
