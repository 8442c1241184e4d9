// SPDX-License-Identifier: Apache-2.0
// Connection set-up, one layer for both fabrics (aws-ofi-nccl's cm/ has the same shape: a
// listener, a receiver and a connector that carry an opaque per-fabric part). The core here
// owns everything that is not "build my half of a path from these bytes":
//   - the listening sockets a listen handle names, accepting within kMaxPending, the
//     retrying non-blocking connect, one WARN per impostor connection;
//   - Listening: set-up sockets in flight, the nonce and rebuild checks, grouping a
//     connection's sockets into paths and its paths into one accept(), the grace a backup
//     gets, the served connections and their rebuilt paths;
//   - Connecting and Rebuilding: one Dial per planned path, the primary's failure failing
//     the connect and the backup's costing only the standby.
// A fabric supplies an AcceptSide (its Arrival: the listener's half of one set-up socket)
// and a ConnectSide (its Dial: the connector's half of one path), each an explicit state
// machine over its own hello (tcp/tcp_setup.cc, verbs/verbs_setup.cc).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fabric.h"
#include "handle.h"
#include "progress.h"
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
int listen_on(int dev, const DeviceAddrs &devs, ListenHandle *handle,
              std::vector<ListenSocket> *out, std::array<uint8_t, 16> *nonce);

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

// ---- The per-fabric halves ----------------------------------------------------------------

/// What a path's hello says, in the fabric-neutral terms the rendezvous groups by: the
/// connector fills one per path it dials; the listener's Arrival fills one from the hello
/// it read (hostile until `check` accepted it). Plain value.
struct Intro {
    std::array<uint8_t, 16> nonce{}; ///< the listener's, from its handle
    uint64_t conn_id = 0;  ///< random per connection, non-zero
    uint64_t path_id = 0;  ///< random per path, non-zero
    int slot = kPrimary;   ///< kPrimary or kBackup
    int npaths = 1;        ///< paths the connection opened at connect: 1 or 2
    bool rebuild = false;  ///< rebuilds a path of a connection this listener produced
    int part = 0;          ///< this set-up socket's index among the path's (TCP: its stream)
    int nparts = 1;        ///< set-up sockets that make the path, 1..255 (TCP: streams)
    int other_dev = -1;    ///< listener's device the other slot's path lands on, -1: unsaid
};

/// The listener's half of one set-up socket: a fabric's state machine that reads the
/// connector's hello, has it judged, does the rest of its fabric's exchange and keeps what
/// the fabric builds its half of the path from (opaque to the core). Not thread-safe (used
/// under the listener's lock).
class Arrival
{
public:
    /// Judges a hello that arrived: nullptr to go on, else why not (the socket is refused).
    using Check = std::function<const char *(const Intro &)>;
    Arrival(int dev, const Endpoint &peer) : dev_(dev), peer_(peer) {}
    virtual ~Arrival() = default;
    /// Moves as far as possible without waiting. 0 while in progress (done() tells
    /// completion), or -errno with *why (the core logs it and drops the arrival). An
    /// implementation calls `check` once, as soon as its hello is decoded and valid.
    virtual int step(uint64_t now, const Check &check, std::string *why) = 0;
    virtual bool done() const = 0;
    /// What the hello said; conn_id 0 until it was read.
    virtual const Intro &intro() const = 0;
    /// The listener's device (index) it arrived on, and the connector's address.
    int dev() const { return dev_; }
    const Endpoint &peer() const { return peer_; }

private:
    int dev_;
    Endpoint peer_;
};

/// What a fabric's listener is made of. Called under the listener's lock, never
/// concurrently; never blocks.
class AcceptSide
{
public:
    virtual ~AcceptSide() = default;
    /// The fabric's devices, for listening and for log lines.
    virtual DeviceAddrs devices() const = 0;
    /// How long one set-up socket may take (VIGIL_HANDSHAKE_TIMEOUT_MS), ns.
    virtual uint64_t handshake_timeout_ns() const = 0;
    /// What a path is made of, singular, for log lines: "stream", "set-up socket".
    virtual const char *part_name() const = 0;
    /// The listener's half of set-up socket `fd`, accepted on device `dev` from `peer`.
    virtual std::unique_ptr<Arrival> arrive(UniqueFd fd, int dev, const Endpoint &peer,
                                            uint64_t deadline_ns) = 0;
    /// Builds the listener's half of a path from its set-up sockets' arrivals, every one
    /// done(), in part order, all on device `dev`. nullptr with *why when that fails (the
    /// connector notices: it gets no answer, or a closed socket).
    virtual std::unique_ptr<RecvPath>
    build(int slot, int dev, std::vector<std::unique_ptr<Arrival>> parts, std::string *why) = 0;
    /// A new connection's paths, just before accept() hands them out (verbs: its flushers).
    virtual void accepted(RecvPaths * /*out*/) {}
    /// True when a failed set-up is expected and not worth a WARN (verbs: a rebuild, or a
    /// local port that is down): it is logged at INFO.
    virtual bool quiet_failure(const Arrival & /*a*/) const { return false; }
};

/// The connector's half of one path: a fabric's state machine that connects, says the
/// hello of its Intro and finishes its fabric's exchange. Not thread-safe.
class Dial
{
public:
    virtual ~Dial() = default;
    /// 0 while in progress (done() tells completion), or -errno with *why.
    virtual int step(uint64_t now, std::string *why) = 0;
    virtual bool done() const = 0;
    /// The connector's half of the finished path (once done(); once).
    virtual std::unique_ptr<SendPath> build() = 0;
    /// The local device's name and the listener's address, for log lines.
    virtual std::string local_name() const = 0;
    virtual const Endpoint &remote() const = 0;
};

/// What a fabric's connector is made of: the plan of one connection. Used by one thread at a
/// time (the proxy thread's connect, then the send comm's lock).
class ConnectSide
{
public:
    virtual ~ConnectSide() = default;
    /// True when the plan has a path in `slot`.
    virtual bool plans(int slot) const = 0;
    /// Starts the connector's half of the path `intro` names (its slot, ids, nonce, rebuild
    /// flag). The fabric picks its deadlines (a rebuild's attempts are short). 0, or -errno
    /// when no attempt can start now (verbs: the local port is down).
    virtual int dial(const Intro &intro, uint64_t now, std::unique_ptr<Dial> *out) = 0;
};

// ---- The core ---------------------------------------------------------------------------------

/// NCCL's listenComm, on either fabric: the listening sockets, the set-up sockets in flight
/// (at most kMaxPending), the connections with some but not all of their paths here (at most
/// kMaxGroups), and, after accept(), the rebuilt paths of the connections it produced: it
/// lives on inside their acceptors (NCCL closes the listenComm at once).
/// Thread-safe (one lock: NCCL's proxy thread and the progress engine may both drive it).
///
/// A set-up socket's life: accepted -> its Arrival steps (hello, check, the fabric's
/// exchange) -> filed under its connection, slot and part -> once every part of a slot is
/// here the fabric builds the path: for a rebuild at once (take_rebuilt() hands it over),
/// for a new connection when accept() hands the connection out (its primary complete, and
/// its backup too or kBackupGraceNs after the primary). A hello with the wrong nonce, a
/// rebuild for a connection this listener did not produce, or parts that disagree are
/// refused with one WARN and the socket is closed; the listener keeps listening.
class Listening : public std::enable_shared_from_this<Listening>
{
public:
    /// Listens on device `dev` and, for backups, up to ListenHandle::kMaxAddrs - 1 other
    /// devices of `side`; fills `handle`. 0, or -errno when `dev`'s own socket fails.
    static int create(std::unique_ptr<AcceptSide> side, int dev, ListenHandle *handle,
                      std::shared_ptr<Listening> *out);
    explicit Listening(std::unique_ptr<AcceptSide> side) : side_(std::move(side)) {}

    /// 0 with *out filled once a connection is complete; 0 with *out empty when none is;
    /// -errno when the listening socket of the handle's device failed.
    int accept(RecvPaths *out);
    /// A rebuilt path of connection `conn_id` that is complete, if any (true, *out set).
    bool take_rebuilt(uint64_t conn_id, std::unique_ptr<RecvPath> *out);
    /// Steps and files `a` as if it had been accepted on a listening socket (tests and
    /// fuzzing hand it set-up sockets of their own).
    void arrive(std::unique_ptr<Arrival> a);
    /// True while set-up sockets or connections are half set up, or rebuilt paths wait.
    bool busy();
    /// The listening sockets (for the acceptors' watch).
    std::vector<int> listening_fds() const;

private:
    struct Slot {
        std::vector<std::unique_ptr<Arrival>> parts; // by part index
        size_t count = 0;
        int dev = -1;
        uint64_t path_id = 0;
    };
    struct Group {
        uint64_t conn_id = 0;
        bool rebuild = false;
        int rebuild_slot = 0;
        int npaths = 1;
        int nparts = 1;
        std::array<Slot, kMaxPaths> slots;
        std::array<int, kMaxPaths> hint{{-1, -1}}; // devices the hellos named
        Endpoint peer;
        uint64_t deadline_ns = 0;
        uint64_t primary_done_ns = 0;
        bool complete(int slot) const
        {
            return slots[static_cast<size_t>(slot)].count == static_cast<size_t>(nparts);
        }
    };
    struct Rebuilt {
        uint64_t conn_id = 0;
        std::unique_ptr<RecvPath> path;
    };

    /// Accepts set-up sockets, steps every arrival, files finished ones, expires groups and
    /// builds complete rebuilt paths. Called with mu_ held.
    int pump(uint64_t now);
    /// Judges a hello; sets *impostor for a wrong nonce.
    const char *check(const Intro &in, bool *impostor);
    /// Steps one arrival; false once it is gone (refused, failed or filed).
    bool step(std::unique_ptr<Arrival> &a, uint64_t now);
    /// Logs why `a` is refused: one WARN per `impostor` connection (wrong nonce), INFO where
    /// the fabric expects the failure.
    void refuse(const Arrival &a, const std::string &why, bool impostor = false);
    void file(std::unique_ptr<Arrival> a, uint64_t now);
    Group *group_for(const Intro &in);
    /// Builds the path in `slot` of `g`, or returns nullptr (logged).
    std::unique_ptr<RecvPath> build(Group &g, int slot);
    void hand_out(Group &g, RecvPaths *out);
    std::string dev_name(int dev) const;

    std::unique_ptr<AcceptSide> side_;
    mutable std::mutex mu_;
    std::vector<ListenSocket> listening_;
    std::array<uint8_t, 16> nonce_{};
    std::vector<std::unique_ptr<Arrival>> pending_;
    std::vector<Group> groups_;
    std::vector<uint64_t> served_; // conn_ids of the connections this listener produced
    std::vector<Rebuilt> rebuilt_;
    NonceRefusals refusals_;
};

/// NCCL's listenComm object: the Listening it shares with the acceptors of the connections
/// it produced.
class ListenComm final : public Listener
{
public:
    explicit ListenComm(std::shared_ptr<Listening> l) : l_(std::move(l)) {}
    int accept(RecvPaths *out) override { return l_->accept(out); }

private:
    std::shared_ptr<Listening> l_;
};

/// Hands one receiving connection the paths its peer rebuilt. The listening sockets are
/// watched by the progress engine, so poll() touches the listener only after a connection
/// arrived or while set-up is half done (plus once a second, as a safety net): an idle
/// connection costs no system calls.
class Accepting final : public PathAcceptor, public ProgressClient
{
public:
    Accepting(std::shared_ptr<Listening> l, uint64_t conn_id);
    ~Accepting() override;
    int poll(std::unique_ptr<RecvPath> *out) override;
    void on_ready() noexcept override { event_.store(true, std::memory_order_release); }
    void on_tick() noexcept override {}

private:
    std::shared_ptr<Listening> l_;
    uint64_t conn_id_;
    std::vector<int> fds_;
    std::atomic<bool> event_{true};
    uint64_t next_sweep_ns_ = 0;
};

/// One NCCL connect(): a Dial per planned slot. Completes once every dial is done (the
/// primary's is required: its failure fails the connect after one WARN; a backup that
/// fails is dropped with one WARN and the connection runs without a standby until a
/// rebuild succeeds). Driven by one proxy thread.
class Connecting final : public Connector
{
public:
    /// `nonce`: the listener's, from its handle. Starts the dials at once.
    Connecting(std::shared_ptr<ConnectSide> side, const std::array<uint8_t, 16> &nonce);
    int progress(SendPaths *out) override;

private:
    std::shared_ptr<ConnectSide> side_;
    std::array<uint8_t, 16> nonce_;
    uint64_t conn_id_ = 0;
    std::array<std::unique_ptr<Dial>, kMaxPaths> dials_;
    int failed_ = 0; // -errno of a dial that could not start
};

/// Rebuilds a sending connection's dead paths along its plan: one Dial at a time per slot,
/// with the connection's id and the rebuild flag. Paced per process: at most
/// kMaxDialsInFlight rebuild attempts are in progress at once across every connection (a
/// port that heals under thousands of connections would otherwise start thousands of
/// connects and handshakes in one timer pass, stalling the data path); the others wait,
/// reporting "in progress", and start as earlier attempts end.
class Rebuilding final : public PathRebuilder
{
public:
    static constexpr int kMaxDialsInFlight = 64;
    Rebuilding(std::shared_ptr<ConnectSide> side, const std::array<uint8_t, 16> &nonce,
               uint64_t conn_id);
    ~Rebuilding() override;
    bool can_rebuild(int slot) const override;
    int progress(int slot, std::unique_ptr<SendPath> *out) override;

private:
    /// Ends slot `slot`'s attempt and gives its place back.
    void end_attempt(int slot) noexcept;

    std::shared_ptr<ConnectSide> side_;
    std::array<uint8_t, 16> nonce_;
    uint64_t conn_id_;
    std::array<std::unique_ptr<Dial>, kMaxPaths> attempts_;
};

} // namespace vigil::net::rendezvous
