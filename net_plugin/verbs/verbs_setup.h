// SPDX-License-Identifier: Apache-2.0
// Connection set-up of the verbs fabric. Each path is set up over one TCP socket, as NCCL's
// IB transport does: the connector creates its QPs (INIT) and sends a hello (its QPs, GID,
// the listener's nonce, connection and path ids); the listener checks the nonce, creates its
// QPs, drives them to RTS towards the connector's and answers with its end (QPs and record
// ring); the connector drives its QPs to RTS and sends a ready word, after which the path
// carries traffic and the socket closes. Every step is non-blocking; NCCL calls again.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../fabric.h"
#include "../handle.h"
#include "../rendezvous.h"
#include "../sockets/socket.h"
#include "verbs_path.h"
#include "verbs_wire.h"

namespace vigil::net::verbs_fabric {

class VerbsFabric;

/// One path being set up, on either side: the socket, the bytes of the current message, and
/// the QPs. Not thread-safe.
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
    const Hello &hello() const { return hello_; }
    int local_dev() const { return local_dev_; }
    const Endpoint &remote() const { return remote_; }
    /// The finished path's identity and QPs (once done()).
    PathIdentity identity() const;
    std::unique_ptr<QpSet> take_qps() { return std::move(qps_); }

private:
    enum class State { kConnect, kSendHello, kReadAnswer, kSendReady, kReadHello, kSendAnswer, kReadReady, kDone };
    /// kConnect: the socket connects (rendezvous::Connect), then the QPs and the hello.
    int connect_step(uint64_t now, std::string *why);
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
    std::vector<uint8_t> out_;
    size_t out_off_ = 0;
    std::array<uint8_t, Hello::kSize> in_{};
    size_t in_got_ = 0;
};

/// NCCL's listenComm of the verbs fabric: a listening socket on the comm's device and on up
/// to three other devices (where backup paths arrive), the paths being set up, and, after
/// accept(), the rebuilt paths of the connections it produced (kept alive by their
/// acceptors). Thread-safe (one lock). Bounded as the TCP listener (rendezvous.h):
/// kMaxPending sockets in set-up, kMaxGroups connections half set up.
class VerbsListener : public std::enable_shared_from_this<VerbsListener>
{
public:

    static int create(VerbsFabric &fabric, int dev, ListenHandle *handle, std::shared_ptr<VerbsListener> *out);
    int accept(RecvPaths *out);
    bool take_rebuilt(uint64_t conn_id, std::unique_ptr<RecvPath> *out);

    explicit VerbsListener(VerbsFabric &f) : fabric_(f) {}

private:
    struct Group {
        uint64_t conn_id = 0;
        int npaths = 1;
        std::array<std::unique_ptr<VerbsRecvPath>, kMaxPaths> paths;
        std::array<int, kMaxPaths> devs{{-1, -1}};
        uint64_t deadline_ns = 0;
        uint64_t primary_done_ns = 0;
    };
    struct Rebuilt {
        uint64_t conn_id = 0;
        std::unique_ptr<VerbsRecvPath> path;
    };
    /// Accepts set-up sockets and steps every path being set up. 0, or -errno when the
    /// listening socket of the handle's device failed.
    int pump(uint64_t now);
    /// This listener's devices for the rendezvous helpers.
    rendezvous::DeviceAddrs device_addrs() const;
    void finish(PathSetup &s, uint64_t now);
    /// A flusher for each slot of `out` whose device writes GPU memory.
    void add_flushers(RecvPaths *out);

    VerbsFabric &fabric_;
    std::mutex mu_;
    std::vector<rendezvous::ListenSocket> listening_;
    std::array<uint8_t, 16> nonce_{};
    std::vector<std::unique_ptr<PathSetup>> pending_;
    std::vector<Group> groups_;
    std::vector<uint64_t> served_;
    std::vector<Rebuilt> rebuilt_;
    rendezvous::NonceRefusals refusals_;
};

/// The rebuilt paths of one connection, from the listener that produced it.
class VerbsAcceptor final : public PathAcceptor
{
public:
    VerbsAcceptor(std::shared_ptr<VerbsListener> l, uint64_t conn_id) : l_(std::move(l)), conn_id_(conn_id) {}
    int poll(std::unique_ptr<RecvPath> *out) override;

private:
    std::shared_ptr<VerbsListener> l_;
    uint64_t conn_id_;
};

/// Where a connection's paths go: local device and the listener's address and device.
struct VerbsPlan {
    int local_dev = -1;
    Endpoint remote;
    int peer_dev = -1;
    int traffic_class = -1; ///< NCCL's, for this connection (-1: unset)
};

/// One NCCL connect() of the verbs fabric.
class VerbsConnector final : public Connector
{
public:
    VerbsConnector(VerbsFabric &fabric, const std::array<VerbsPlan, kMaxPaths> &plan, const ListenHandle &h);
    int progress(SendPaths *out) override;

private:
    VerbsFabric &fabric_;
    std::array<VerbsPlan, kMaxPaths> plan_;
    std::array<std::unique_ptr<PathSetup>, kMaxPaths> setups_;
    std::array<uint8_t, 16> nonce_{};
    uint64_t conn_id_ = 0;
};

/// Rebuilds a sending connection's dead paths to the same devices.
class VerbsRebuilder final : public PathRebuilder
{
public:
    VerbsRebuilder(VerbsFabric &fabric, const std::array<VerbsPlan, kMaxPaths> &plan,
                   const std::array<uint8_t, 16> &nonce, uint64_t conn_id);
    bool can_rebuild(int slot) const override;
    int progress(int slot, std::unique_ptr<SendPath> *out) override;

private:
    VerbsFabric &fabric_;
    std::array<VerbsPlan, kMaxPaths> plan_;
    std::array<std::unique_ptr<PathSetup>, kMaxPaths> attempts_;
    std::array<uint8_t, 16> nonce_;
    uint64_t conn_id_;
};

/// The hello of slot `slot` of a connection following `plan`.
Hello make_hello(const std::array<VerbsPlan, kMaxPaths> &plan, int slot, const std::array<uint8_t, 16> &nonce,
                 uint64_t conn_id, bool rebuild);

} // namespace vigil::net::verbs_fabric
