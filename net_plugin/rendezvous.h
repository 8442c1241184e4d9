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
#include <unordered_map>
#include <vector>

#include "fabric.h"
#include "handle.h"
#include "progress.h"
#include "sockets/socket.h"

namespace vigil::net::rendezvous {

/// Bounds of the listening side, on both fabrics.
/// Set-up sockets accepted and awaiting their hello (or their fabric's exchange), per
/// ListenHub: above it the hub stops accepting and the kernel's backlog holds the rest.
inline constexpr size_t kMaxPending = 256;
inline constexpr size_t kMaxGroups = 16; ///< per listener: connections with some but not all paths here
/// How long a connection whose primary path is complete waits for its backup.
inline constexpr uint64_t kBackupGraceNs = 1'000'000'000ull;
/// Between two connects to a listener that refused (or could not be reached).
inline constexpr uint64_t kRetryNs = 20'000'000;

/// A listening socket and the fabric's device it listens on.
struct ListenSocket {
    UniqueFd fd;
    int dev = 0;
};

/// The fabric's view of its devices for listening: how many, each one's address to listen
/// at (its port is ignored), and its name for log lines.
struct DeviceAddrs {
    int count = 0;
    std::function<Endpoint(int dev)> addr;
    std::function<std::string(int dev)> name;
};

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
    /// How the arrival asks to be stepped again at once, when work it waits for finishes
    /// off the listener's threads (verbs: its QP work, SetupJobs); without it the listener
    /// steps it at its next engine tick. Any thread may call `wake`, even after the listener
    /// is gone. Default: not needed.
    virtual void set_wake(std::function<void()> /*wake*/) {}
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

class Listening;
class Accepting;

/// The listening side of one fabric in one process: one listening socket per device, shared
/// by every listener (NCCL's listenComm, a Listening) the fabric makes, as NCCL's bootstrap
/// and aws-ofi-nccl's cm share one endpoint. A hello names its listener by the nonce of that
/// listener's handle. Costs 1 fd and 1 epoll entry per device per process, not per
/// connection: a receiving connection keeps its listener (for the sender's rebuilds) without
/// keeping sockets.
///
/// A set-up socket's life: accepted (at most kMaxPending in flight; above, the hub stops
/// accepting and the kernel's backlog holds the rest) -> its Arrival steps here: its hello
/// is routed by nonce and judged by that listener, then the fabric's exchange -> filed under
/// its listener. A hello whose nonce no listener has is refused (one WARN per impostor
/// connection); the hub keeps listening.
///
/// Driven by the progress engine (its listening sockets are watched; it ticks only while
/// set-up sockets or half-built rebuilds are open, else it is parked) and by every
/// listener's accept(), so that NCCL's accept loop does not wait for a tick. The sockets
/// open with the first listen() and close with the hub, when its last listener is gone.
/// Thread-safe (one lock, taken before any listener's).
class ListenHub final : public ProgressClient
{
public:
    explicit ListenHub(std::unique_ptr<AcceptSide> side);
    ~ListenHub();
    ListenHub(const ListenHub &) = delete;
    ListenHub &operator=(const ListenHub &) = delete;

    AcceptSide &side() const { return *side_; }
    /// Opens the listening sockets of device `dev` and, for backup paths, of up to
    /// ListenHandle::kMaxAddrs - 1 other devices, where not open yet (a device whose socket
    /// cannot listen gets no backups, with one INFO per listen); fills `handle` with their
    /// addresses, `dev` and `nonce`. 0, or -errno when `dev`'s own socket fails (one WARN).
    int listen(int dev, const std::array<uint8_t, 16> &nonce, ListenHandle *handle);
    /// Accepts what waits, steps every set-up socket and files the finished ones under their
    /// listeners; expires listeners' half-built rebuilds. Never blocks.
    void pump(uint64_t now);
    /// -errno once accepting on device `dev`'s socket failed for good, else 0.
    int failed(int dev) const;
    /// Steps and files `a` as if it had been accepted on a listening socket (tests and
    /// fuzzing hand set-up sockets of their own).
    void arrive(std::unique_ptr<Arrival> a);
    /// True while set-up sockets are in flight.
    bool busy() const;
    /// Listening sockets open (for tests).
    size_t sockets() const;

    void on_ready() noexcept override;
    void on_tick() noexcept override;
    uint64_t next_tick_ns() const noexcept override;

private:
    friend class Listening;
    /// A listener's life in the hub (its constructor and destructor).
    void attach(Listening *l);
    void detach(Listening *l);
    /// Opens device `d`'s listening socket if it is not open; 0 or -errno.
    int open_locked(int d, bool required);
    int pump_locked(uint64_t now);
    /// Steps one set-up socket; false once it is gone (refused, failed or filed).
    bool step_locked(std::unique_ptr<Arrival> &a, uint64_t now);
    Listening *find_locked(const std::array<uint8_t, 16> &nonce) const;
    /// Judges a hello: its fields, then its listener; sets *impostor for an unknown nonce.
    const char *check_locked(const Intro &in, bool *impostor);
    /// Logs why `a` is refused: one WARN per `impostor` connection (wrong nonce), INFO
    /// where the fabric expects the failure.
    void refuse_locked(const Arrival &a, const std::string &why, bool impostor = false);
    std::string dev_name(int dev) const;

    std::unique_ptr<AcceptSide> side_;
    mutable std::mutex mu_;
    std::vector<ListenSocket> listening_;           // by opening order
    std::vector<int> failed_;                       // per device: -errno once accept failed
    std::vector<std::unique_ptr<Arrival>> pending_; // accepted, not filed yet
    // Attached listeners by the first 8 bytes of their nonce (the whole nonce is compared).
    std::unordered_multimap<uint64_t, Listening *> listeners_;
    std::vector<Listening *> grouping_;             // listeners with half-built groups
    NonceRefusals refusals_;
    std::atomic<bool> ticking_{false}; // engine timer wanted (pending_ or grouping_)
    bool watched_ = false;             // registered with the progress engine
    // An eventfd among the watched fds: an arrival whose off-thread work finished writes it
    // (Arrival::set_wake), and the engine pumps at once. Shared with those wakes, which may
    // outlive the hub (the fd closes with the last of them).
    std::shared_ptr<UniqueFd> kick_;
    /// The wake handed to each arrival (empty while the engine does not watch the hub).
    std::function<void()> waker_locked() const;
};

/// Where a fabric keeps its hub: the live one, or a new one once the last is gone (its
/// listeners all closed, as at NCCL's finalize). Thread-safe.
class HubSlot
{
public:
    /// The fabric's hub; `make` gives the AcceptSide of a new one.
    std::shared_ptr<ListenHub> get(const std::function<std::unique_ptr<AcceptSide>()> &make)
    {
        std::lock_guard<std::mutex> lock(mu_);
        std::shared_ptr<ListenHub> h = hub_.lock();
        if (!h) hub_ = h = std::make_shared<ListenHub>(make());
        return h;
    }

private:
    std::mutex mu_;
    std::weak_ptr<ListenHub> hub_;
};

/// NCCL's listenComm, on either fabric: its handle's nonce, the connections with some but
/// not all of their paths here (at most kMaxGroups), and, after accept(), the rebuilt paths
/// of the connections it produced: it lives on inside their acceptors (NCCL closes the
/// listenComm at once), at about 300 bytes and no fd. Its sockets are the hub's.
/// Thread-safe (one lock, taken after the hub's).
///
/// A set-up socket the hub filed here goes under its connection, slot and part; once every
/// part of a slot is here the fabric builds the path: for a rebuild at once (its acceptor is
/// told, and take_rebuilt() hands it over), for a new connection when accept() hands the
/// connection out (its primary complete, and its backup too or kBackupGraceNs after the
/// primary). A rebuild for a connection this listener did not produce, or parts that
/// disagree, are refused with one WARN and the socket is closed.
class Listening : public std::enable_shared_from_this<Listening>
{
public:
    /// A listener on `hub`: listens on device `dev` and, for backups, up to
    /// ListenHandle::kMaxAddrs - 1 other devices; fills `handle`. 0, or -errno when `dev`'s
    /// own socket fails.
    static int create(std::shared_ptr<ListenHub> hub, int dev, ListenHandle *handle,
                      std::shared_ptr<Listening> *out);
    /// As above on a hub of its own (tests and fuzzing).
    static int create(std::unique_ptr<AcceptSide> side, int dev, ListenHandle *handle,
                      std::shared_ptr<Listening> *out);
    Listening(std::shared_ptr<ListenHub> hub, int dev);
    ~Listening();
    Listening(const Listening &) = delete;
    Listening &operator=(const Listening &) = delete;

    /// 0 with *out filled once a connection is complete; 0 with *out empty when none is;
    /// -errno when the listening socket of the handle's device failed.
    int accept(RecvPaths *out);
    /// A rebuilt path of connection `conn_id` that is complete, if any (true, *out set).
    /// Pumps the hub first.
    bool take_rebuilt(uint64_t conn_id, std::unique_ptr<RecvPath> *out);
    /// Steps and files `a` through the hub (tests and fuzzing).
    void arrive(std::unique_ptr<Arrival> a) { hub_->arrive(std::move(a)); }
    /// True while set-up sockets are in flight at the hub, connections are half set up here,
    /// or rebuilt paths wait.
    bool busy();

private:
    friend class ListenHub;
    friend class Accepting;
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

    // Called by the hub with its lock held; each takes this listener's.
    /// Judges a hello the hub routed here (its fields are checked): nullptr, or why not.
    const char *check(const Intro &in);
    /// Files a finished arrival under its connection, slot and part; builds a complete
    /// rebuilt path at once. Empty, or why `a` is refused (then `a` is still the caller's).
    std::string file(std::unique_ptr<Arrival> &a, uint64_t now);
    /// Drops expired half-built groups; true while any group is left.
    bool expire(uint64_t now);

    bool expire_locked(uint64_t now);
    Group *group_for(const Intro &in);
    /// Builds the path in `slot` of `g`, or returns nullptr (logged).
    std::unique_ptr<RecvPath> build(Group &g, int slot);
    void hand_out(Group &g, RecvPaths *out);

    std::shared_ptr<ListenHub> hub_;
    int dev_;
    std::array<uint8_t, 16> nonce_{};
    mutable std::mutex mu_;
    std::vector<Group> groups_;
    std::vector<uint64_t> served_; // conn_ids of the connections this listener produced
    std::vector<Rebuilt> rebuilt_;
    std::vector<Accepting *> acceptors_; // of the served connections still open
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

/// Hands one receiving connection the paths its peer rebuilt. The hub files a rebuilt path
/// as soon as it is complete and calls the connection's wake function, so poll() touches the
/// listener only after that (plus once a second, as a safety net that also pumps the hub):
/// an idle connection costs no system call and no lock.
class Accepting final : public PathAcceptor
{
public:
    Accepting(std::shared_ptr<Listening> l, uint64_t conn_id);
    ~Accepting() override;
    int poll(std::unique_ptr<RecvPath> *out) override;
    void set_wake(std::function<void()> wake) override;

private:
    friend class Listening;
    /// A rebuilt path of this connection was filed (under the listener's lock).
    void rebuilt() noexcept;

    std::shared_ptr<Listening> l_;
    uint64_t conn_id_;
    std::function<void()> wake_; // under the listener's lock
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
