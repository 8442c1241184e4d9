// SPDX-License-Identifier: Apache-2.0
// Connection setup of the TCP fabric: the listener behind NCCL's listen()/accept() and the
// connector behind connect(). Both are non-blocking state machines: every call does what it
// can without waiting and reports "not yet" (NCCL calls again).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../comm.h"
#include "../devices.h"
#include "../handle.h"
#include "params.h"
#include "socket.h"
#include "wire.h"

namespace vigil::net::tcp {

/// NCCL's listenComm: a listening socket on one device plus the half-open connections that
/// have not yet proven they hold this listener's nonce. Not thread-safe (NCCL drives one
/// listenComm from one proxy thread). Bounded: at most kMaxPending sockets awaiting a hello
/// and kMaxGroups partially connected paths; excess connections are closed with a WARN.
class TcpListener
{
public:
    static constexpr size_t kMaxPending = 64;
    static constexpr size_t kMaxGroups = 16;

    /// Binds and listens on `dev`'s address; fills `handle` (version, address, fresh nonce).
    /// Returns 0 or -errno.
    static int create(const Device &dev, int dev_index, const Params &params,
                      ListenHandle *handle, std::unique_ptr<TcpListener> *out);

    /// Accepts, reads hellos, rejects impostors (one WARN per rejected connection; one per
    /// path for a wrong nonce; the listener stays open) and
    /// returns 0 with *out set once every stream of one path has arrived; 0 with *out empty
    /// when none is complete yet; -errno when the listening socket itself failed.
    int accept(std::unique_ptr<RecvComm> *out);

private:
    struct Pending {
        UniqueFd fd;
        Endpoint peer;
        uint64_t deadline_ns = 0;
        std::array<uint8_t, Hello::kSize> buf{};
        size_t got = 0;
    };
    struct Group {
        uint64_t conn_id = 0;
        uint8_t nstreams = 0;
        uint8_t path_kind = 0;
        size_t count = 0;
        std::array<UniqueFd, kMaxStreams> fds;
        Endpoint peer;
        uint64_t deadline_ns = 0;
    };

    void reject(Pending &p, const char *why);
    int take(Pending &p, std::unique_ptr<RecvComm> *out);

    UniqueFd fd_;
    Device dev_;
    std::array<uint8_t, 16> nonce_{};
    uint64_t timeout_ns_ = 0;
    std::vector<Pending> pending_;
    std::vector<Group> groups_;
    uint64_t last_rejected_conn_ = 0; // conn_id of the last path rejected for its nonce
};

/// The retry state of one NCCL connect(): streams connecting, hellos going out, then the
/// listener's answer. Not thread-safe (one proxy thread drives one connect).
class TcpConnector
{
public:
    TcpConnector(const Device &local, const ListenHandle &remote, const Params &params);

    /// Returns 0 with *out set once connected and accepted; 0 with *out empty while in
    /// progress; -errno on failure (refused past VIGIL_CONNECT_TIMEOUT_MS, rejected by the
    /// listener, handshake timeout), after one WARN.
    int progress(std::unique_ptr<SendComm> *out);

private:
    struct Stream {
        UniqueFd fd;
        bool connected = false;
        size_t hello_sent = 0;
        uint64_t retry_at_ns = 0;
    };
    int start_connect(Stream &s);

    Device local_;
    Endpoint remote_;
    Hello hello_;
    std::array<uint8_t, Hello::kSize> hello_bytes_{};
    std::vector<Stream> streams_;
    size_t chunk_bytes_;
    long buf_bytes_;
    uint64_t connect_deadline_ns_;
    uint64_t handshake_timeout_ns_;
    uint64_t answer_deadline_ns_ = 0;
    std::array<uint8_t, AcceptAnswer::kSize> answer_{};
    size_t answer_got_ = 0;
};

} // namespace vigil::net::tcp
