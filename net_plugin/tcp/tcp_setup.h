// SPDX-License-Identifier: Apache-2.0
// Connection set-up of the TCP fabric: its halves of the rendezvous (rendezvous.h). A path is
// `nstreams` connected sockets; each stream says the 40-byte hello (wire.h) and the listener
// answers on stream 0 once every stream of the path is there. Everything else (listening,
// grouping, nonce checks, grace, rebuilds, the primary/backup policy) is the rendezvous's.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../fabric.h"
#include "../handle.h"
#include "../rendezvous.h"
#include "../sockets/interfaces.h"
#include "../sockets/socket.h"
#include "params.h"
#include "wire.h"

namespace vigil::net::tcp {

/// What the TCP fabric's listening side is made of (its hub's AcceptSide).
std::unique_ptr<rendezvous::AcceptSide> accept_side(const std::vector<Device> &devs,
                                                    const Params &params);

/// Opens a listener on devs[dev] and, for backups, up to ListenHandle::kMaxAddrs - 1 other
/// devices, on a hub of its own (tests and fuzzing; the fabric shares one); fills `handle`.
/// 0 or -errno (only the primary device's socket is required).
int listen(const std::vector<Device> &devs, int dev, const Params &params, ListenHandle *handle,
           std::shared_ptr<rendezvous::Listening> *out);

/// The listener's half of one stream: reads its hello and has it judged.
///
///   kReadHello --Hello::kSize bytes, valid, accepted by the check--> kDone
///
/// A closed socket, a socket error, a malformed hello, a refusal or no whole hello by the
/// deadline fails step(). Not thread-safe.
class TcpArrival final : public rendezvous::Arrival
{
public:
    TcpArrival(UniqueFd fd, int dev, const Endpoint &peer, uint64_t deadline_ns);
    /// As above with the hello already read (tests and fuzzing feed bytes): `hello` holds
    /// Hello::kSize bytes, hostile.
    TcpArrival(UniqueFd fd, int dev, const Endpoint &peer, uint64_t deadline_ns,
               const uint8_t *hello);
    int step(uint64_t now, const Check &check, std::string *why) override;
    bool done() const override { return state_ == State::kDone; }
    const rendezvous::Intro &intro() const override { return intro_; }
    /// The stream's socket (once done(); once).
    UniqueFd take_fd() { return std::move(fd_); }

private:
    enum class State { kReadHello, kDone };
    /// The whole hello is in buf_: decodes and judges it.
    int judge(const Check &check, std::string *why);

    State state_ = State::kReadHello;
    UniqueFd fd_;
    uint64_t deadline_ns_;
    std::array<uint8_t, Hello::kSize> buf_{};
    size_t got_ = 0;
    rendezvous::Intro intro_;
};

/// Where one path of a connection goes: from local device `local_dev` (-1: no such path)
/// to the listener's address `remote`.
struct PathPlan {
    int local_dev = -1;
    Endpoint remote;
};

/// The connector's half of one path: its streams connect (retrying refusals until a
/// deadline), say hello and wait for the listener's answer. Non-blocking; not thread-safe.
///
///   kStreams --every stream connected and its hello sent--> kReadAnswer
///   kReadAnswer --the listener's answer, valid--> kDone
///
/// A refusal past the connect deadline, a socket error, a closed or malformed answer, or no
/// answer within the handshake timeout fails step() (the caller drops the dial).
class TcpPathConnector final : public rendezvous::Dial
{
public:
    TcpPathConnector(const Device &local, int local_dev, const Endpoint &remote, const Hello &hello,
                     int nstreams, const Params &params, uint64_t connect_deadline_ns,
                     uint64_t handshake_timeout_ns);
    int step(uint64_t now, std::string *why) override;
    bool done() const override { return state_ == State::kDone; }
    std::unique_ptr<SendPath> build() override;
    std::string local_name() const override { return local_.name; }
    const Endpoint &remote() const override { return remote_; }

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
    size_t chunk_bytes_;
    uint64_t connect_deadline_ns_;
    uint64_t handshake_timeout_ns_;
    std::vector<Stream> streams_;
    std::array<uint8_t, AcceptAnswer::kSize> answer_{};
    size_t answer_got_ = 0;
    uint64_t answer_deadline_ns_ = 0; // set on entering kReadAnswer
    State state_ = State::kStreams;
};

/// The TCP plan of one connection, for the rendezvous's connector and rebuilder.
class TcpConnectSide final : public rendezvous::ConnectSide
{
public:
    TcpConnectSide(std::vector<Device> devs, const std::array<PathPlan, kMaxPaths> &plan,
                   const Params &params)
        : devs_(std::move(devs)), plan_(plan), params_(params)
    {
    }
    bool plans(int slot) const override { return plan_[static_cast<size_t>(slot)].local_dev >= 0; }
    /// A connect's dials share VIGIL_CONNECT_TIMEOUT_MS; a rebuild's attempt is short (at
    /// most 300 ms): towards a peer whose port is still down a SYN gets no answer, and a
    /// fresh attempt after the repair beats waiting out the SYN retransmission timer.
    int dial(const rendezvous::Intro &intro, uint64_t now,
             std::unique_ptr<rendezvous::Dial> *out) override;

private:
    std::vector<Device> devs_;
    std::array<PathPlan, kMaxPaths> plan_;
    Params params_;
};

/// The identity of path `path_id` over the connected streams `fds` (their endpoints, their
/// count).
PathIdentity path_identity(int slot, int dev, const std::string &dev_name, uint64_t path_id,
                           const std::vector<UniqueFd> &fds);

} // namespace vigil::net::tcp
