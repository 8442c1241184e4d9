// SPDX-License-Identifier: Apache-2.0
// What the two fabrics' connection set-up share, whatever a path is made of (TCP: streams
// that each say hello; verbs: one set-up socket that trades QP ends): the listener's bounds,
// the listening sockets a listen handle names, accepting set-up sockets within those bounds,
// the non-blocking connect that retries refusals until a deadline, and one WARN per impostor
// connection. Each fabric keeps its own hello and what it builds from it (tcp/tcp_setup.cc,
// verbs/verbs_setup.cc).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fabric.h"
#include "handle.h"
#include "sockets/socket.h"

namespace vigil::net::rendezvous {

/// Bounds of one listener (NCCL's listenComm), on both fabrics.
inline constexpr size_t kMaxPending = 64; ///< set-up sockets awaiting their hello
inline constexpr size_t kMaxGroups = 16;  ///< connections with some but not all paths here
/// How long a connection whose primary path is complete waits for its backup.
inline constexpr uint64_t kBackupGraceNs = 1'000'000'000ull;
/// Between two connects to a listener that refused (or could not be reached).
inline constexpr uint64_t kRetryNs = 20'000'000;

/// A listening socket and the fabric's device it listens on.
struct ListenSocket {
    UniqueFd fd;
    int dev = 0;
};

/// The fabric's view of its devices for listen_on(): how many, each one's address to listen
/// at (its port is ignored), and its name for log lines.
struct DeviceAddrs {
    int count = 0;
    std::function<Endpoint(int dev)> addr;
    std::function<std::string(int dev)> name;
};

/// Listens on device `dev` and, for backup paths, on up to ListenHandle::kMaxAddrs - 1 other
/// devices (a device whose socket cannot listen gets no backups, with one INFO); fills
/// `handle` (the listening addresses with their devices, `dev`, a fresh nonce, also in
/// *nonce) and `out`. Returns 0, or -errno when the socket on `dev` itself fails (one WARN).
int listen_on(int dev, const DeviceAddrs &devs, ListenHandle *handle, std::vector<ListenSocket> *out,
              std::array<uint8_t, 16> *nonce);

/// Accepts every connection waiting on `sockets` (non-blocking, close-on-exec) and hands it
/// to `take(fd, dev, peer)`; while `pending()` set-up sockets are open already (kMaxPending
/// or more), closes it with one WARN naming `devs.name(dev)` instead. Transient failures
/// (nothing waiting, EMFILE, an aborted connection) end the pass. Returns 0, or -errno when
/// the first socket (the handle's own device) failed; another one failing costs only backups
/// (one WARN).
int accept_all(std::vector<ListenSocket> &sockets, const DeviceAddrs &devs,
               const std::function<size_t()> &pending,
               const std::function<void(UniqueFd fd, int dev, const Endpoint &peer)> &take);

/// One non-blocking TCP connect that retries refused or unreachable attempts every kRetryNs
/// until its deadline. Not thread-safe; one per set-up socket.
class Connect
{
public:
    /// Makes and binds the socket as the fabric wants it and starts connect() on it
    /// (EINPROGRESS is success). 0 or -errno.
    using Start = std::function<int(UniqueFd *fd)>;
    /// 1 once connected (fd() then holds the socket), 0 while trying, or -errno with *why
    /// after `deadline_ns` or a failure that retrying cannot cure.
    int step(uint64_t now, uint64_t deadline_ns, const Start &start, std::string *why);
    UniqueFd &fd() { return fd_; }
    bool connected() const { return connected_; }

private:
    UniqueFd fd_;
    uint64_t retry_at_ns_ = 0;
    bool connected_ = false;
};

/// Starts a non-blocking connect from `src` (its port ignored; no bind when its family
/// differs from `remote`'s) to `remote` on a fresh socket in *fd. `bind_required`: a failed
/// bind fails the attempt (else the kernel picks the source). `prepare(fd, bound)` runs
/// between bind and connect (socket options that must precede the handshake) and may fail
/// it. 0 or -errno.
int start_connect(const Endpoint &src, const Endpoint &remote, bool bind_required,
                  const std::function<int(int fd, bool bound)> &prepare, UniqueFd *fd);

/// NCCL's listenComm as the core sees it: a fabric's listener `L` (with accept(RecvPaths *)),
/// shared with the acceptors of the connections it produced, which keep it alive after NCCL
/// closes the listenComm to take their rebuilt paths.
template <class L> class ListenComm final : public Listener
{
public:
    explicit ListenComm(std::shared_ptr<L> l) : l_(std::move(l)) {}
    int accept(RecvPaths *out) override { return l_->accept(out); }

private:
    std::shared_ptr<L> l_;
};

/// One WARN per impostor connection, not one per path or stream: its paths and streams carry
/// one connection id. Not thread-safe (used under the listener's lock).
class NonceRefusals
{
public:
    /// True the first time in a row connection `conn_id` is refused for a wrong nonce.
    bool first(uint64_t conn_id)
    {
        const bool f = conn_id != last_;
        last_ = conn_id;
        return f;
    }

private:
    uint64_t last_ = 0;
};

} // namespace vigil::net::rendezvous
