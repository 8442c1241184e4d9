// SPDX-License-Identifier: Apache-2.0
// Connection setup of the TCP fabric: the listener behind NCCL's listen()/accept() and the
// connector behind connect(). Both are non-blocking state machines: every call does what it
// can without waiting and reports "not yet" (NCCL calls again).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../fabric.h"
#include "../handle.h"
#include "../progress.h"
#include "../rendezvous.h"
#include "../sockets/interfaces.h"
#include "params.h"
#include "../sockets/socket.h"
#include "wire.h"

namespace vigil::net::tcp {

/// NCCL's listenComm: a listening socket on the comm's device and on up to three other
/// devices (where backup paths arrive), plus the half-open connections that have not yet
/// proven they hold this listener's nonce. After accept() it stays alive inside the acceptor
/// of the connection it produced (NCCL closes the listenComm at once), to take that
/// connection's rebuilt paths. Thread-safe (one internal lock: NCCL's proxy thread and the
/// progress engine may both drive it). Bounded (rendezvous.h): at most kMaxPending sockets
/// awaiting a hello and kMaxGroups partially connected connections; excess connections are
/// closed with a WARN.
class TcpListener : public std::enable_shared_from_this<TcpListener>
{
public:
    /// Listens on devs[dev_index] and, for backups, up to ListenHandle::kMaxAddrs - 1 other
    /// devices; fills `handle` (version, addresses with their device indices, fresh nonce).
    /// Returns 0 or -errno (only the primary device's socket is required).
    static int create(const std::vector<Device> &devs, int dev_index, const Params &params,
                      ListenHandle *handle, std::shared_ptr<TcpListener> *out);

    /// Accepts, reads hellos, rejects impostors (one WARN per rejected connection; one per
    /// path for a wrong nonce; the listener stays open) and returns 0 with *out filled once a
    /// connection's paths have arrived; 0 with *out empty when none is complete yet; -errno
    /// when the primary listening socket itself failed.
    int accept(RecvPaths *out);

    /// A rebuilt path of connection `conn_id` that arrived complete, if any.
    bool take_rebuilt(uint64_t conn_id, std::unique_ptr<RecvPath> *path);
    /// What accept() does once a connection's Hello::kSize hello bytes have arrived, without
    /// the socket reads around it (tests and fuzzing feed it bytes): validates `hello`
    /// (hostile), checks the nonce and files the connected socket `fd` under its connection
    /// and path, or rejects it with one WARN and closes it. `dev`: index, into the devices
    /// given to create(), of the device it arrived on; `peer`: its remote address. A later
    /// accept() or take_rebuilt() completes the connection. Thread-safe.
    void file_hello(UniqueFd fd, int dev, const Endpoint &peer, const uint8_t *hello);
    /// True while connections are half set up (a hello or a path still incomplete).
    bool busy();

private:
    struct Pending {
        UniqueFd fd;
        int dev = 0;
        Endpoint peer;
        uint64_t deadline_ns = 0;
        std::array<uint8_t, Hello::kSize> buf{};
        size_t got = 0;
    };
    struct PathFds {
        std::array<UniqueFd, kMaxStreams> fds;
        size_t count = 0;
        int dev = 0;
        uint64_t path_id = 0;
    };
    struct Group {
        uint64_t conn_id = 0;
        uint8_t nstreams = 0;
        int npaths = 1;
        bool rebuild = false;
        int rebuild_kind = 0;
        std::array<PathFds, kMaxPaths> paths;
        Endpoint peer;
        uint64_t deadline_ns = 0;
        uint64_t primary_done_ns = 0;
    };
    struct Rebuilt {
        uint64_t conn_id = 0;
        int kind = 0;
        int dev = 0;
        uint64_t path_id = 0;
        std::vector<UniqueFd> fds;
    };

    int pump(uint64_t now);
    /// This listener's devices for the rendezvous helpers.
    rendezvous::DeviceAddrs device_addrs() const;
    void reject(Pending &p, const char *why);
    void take(Pending &p);
    void complete(Group &g, RecvPaths *out);
    bool answer(int fd);

    std::mutex mu_;
    std::vector<rendezvous::ListenSocket> listening_;
    std::vector<Device> devs_;
    std::array<uint8_t, 16> nonce_{};
    uint64_t timeout_ns_ = 0;
    std::vector<Pending> pending_;
    std::vector<Group> groups_;
    std::vector<uint64_t> served_; // conn_ids of the connections this listener produced
    std::vector<Rebuilt> rebuilt_;
    rendezvous::NonceRefusals refusals_;
};

/// Where one path of a connection goes: from local device `local_dev` (-1: no such path)
/// to the listener's address `remote`.
struct PathPlan {
    int local_dev = -1;
    Endpoint remote;
};

/// Sets up one path: its streams connect (retrying refusals until a deadline), say hello and
/// wait for the listener's answer. Non-blocking; not thread-safe.
///
///   kStreams --every stream connected and its hello sent--> kReadAnswer
///   kReadAnswer --the listener's answer, valid--> kDone
///
/// A refusal past the connect deadline, a socket error, a closed or malformed answer, or no
/// answer within the handshake timeout fails step() (the caller drops the connector).
class TcpPathConnector
{
public:
    TcpPathConnector(const Device &local, int local_dev, const Endpoint &remote, const Hello &hello,
                     int nstreams, long buf_bytes, uint64_t connect_deadline_ns,
                     uint64_t handshake_timeout_ns);
    /// 0 while in progress (done() tells completion), or -errno with *why.
    int step(uint64_t now, std::string *why);
    bool done() const { return state_ == State::kDone; }
    uint64_t path_id() const { return hello_.path_id; }
    std::vector<UniqueFd> take_fds();
    const Device &local() const { return local_; }
    const Endpoint &remote() const { return remote_; }

private:
    enum class State { kStreams, kReadAnswer, kDone };
    struct Stream {
        rendezvous::Connect conn;
        size_t hello_sent = 0;
    };
    /// kStreams: steps every stream's connect and sends its hello; kReadAnswer once all sent.
    int connect_and_hello(uint64_t now, std::string *why);
    /// kReadAnswer: reads the listener's answer on stream 0; kDone once it is whole and valid.
    int read_answer(uint64_t now, std::string *why);
    /// rendezvous::Connect's start: bound to the local device (and pinned to its interface
    /// where allowed), tuned before the handshake.
    int start_connect(UniqueFd *fd);

    Device local_;
    int local_dev_;
    Endpoint remote_;
    Hello hello_;
    long buf_bytes_;
    uint64_t connect_deadline_ns_;
    uint64_t handshake_timeout_ns_;
    std::vector<Stream> streams_;
    std::array<uint8_t, AcceptAnswer::kSize> answer_{};
    size_t answer_got_ = 0;
    uint64_t answer_deadline_ns_ = 0; // set on entering kReadAnswer
    State state_ = State::kStreams;
};

/// The retry state of one NCCL connect(): the primary and (optionally) the backup path being
/// set up. Not thread-safe (one proxy thread drives one connect). The connection completes
/// once the primary is accepted; a backup that cannot be established is dropped with one
/// WARN and the connection runs without a standby until a rebuild succeeds.
class TcpConnector final : public Connector
{
public:
    TcpConnector(const std::vector<Device> &devs, const std::array<PathPlan, kMaxPaths> &plan,
                 const ListenHandle &remote, const Params &params);

    /// Returns 0 with *out filled once connected and accepted; 0 with *out empty while in
    /// progress; -errno on failure (refused past VIGIL_CONNECT_TIMEOUT_MS, rejected by the
    /// listener, handshake timeout), after one WARN.
    int progress(SendPaths *out) override;

private:
    std::vector<Device> devs_;
    std::array<PathPlan, kMaxPaths> plan_;
    std::array<std::unique_ptr<TcpPathConnector>, kMaxPaths> setups_;
    std::array<uint8_t, 16> nonce_{};
    uint64_t conn_id_ = 0;
    Params params_;
};

/// Rebuilds a sending connection's dead paths to the same remote endpoints: each attempt
/// is one TcpPathConnector with the rebuild flag, bounded by VIGIL_HANDSHAKE_TIMEOUT_MS.
class TcpRebuilder final : public PathRebuilder
{
public:
    TcpRebuilder(std::vector<Device> devs, const std::array<PathPlan, kMaxPaths> &plan,
                 const std::array<uint8_t, 16> &nonce, uint64_t conn_id, const Params &params);
    bool can_rebuild(int slot) const override;
    int progress(int slot, std::unique_ptr<SendPath> *out) override;

private:
    std::vector<Device> devs_;
    std::array<PathPlan, kMaxPaths> plan_;
    std::array<std::unique_ptr<TcpPathConnector>, kMaxPaths> attempts_;
    std::array<uint8_t, 16> nonce_;
    uint64_t conn_id_;
    Params params_;
};

/// The receiving side's view of a listener for rebuilt paths of one connection. Its
/// listening sockets are watched by the progress engine, so poll() only touches the sockets
/// after a connection arrived or while a handshake is half done (plus once a second, as a
/// safety net): idle connections cost no system calls.
class TcpAcceptor final : public PathAcceptor, public ProgressClient
{
public:
    /// `fds`: the listener's listening sockets (watched until destruction).
    TcpAcceptor(std::shared_ptr<TcpListener> listener, uint64_t conn_id, std::vector<int> fds);
    ~TcpAcceptor() override;
    int poll(std::unique_ptr<RecvPath> *out) override;
    void on_ready() noexcept override { event_.store(true, std::memory_order_release); }
    void on_tick() noexcept override {}

private:
    std::shared_ptr<TcpListener> listener_;
    uint64_t conn_id_;
    std::vector<int> fds_;
    std::atomic<bool> event_{true};
    uint64_t next_sweep_ns_ = 0;
};

/// The identity of path `path_id` over the connected streams `fds` (their endpoints, their
/// count).
PathIdentity path_identity(int slot, int dev, const std::string &dev_name, uint64_t path_id,
                           const std::vector<UniqueFd> &fds);

} // namespace vigil::net::tcp
