// SPDX-License-Identifier: Apache-2.0
// The fabric interface: everything the transport-agnostic core needs from a transport (TCP in
// tcp/, verbs in verbs/), and everything a transport may assume about the core.
//
//   Fabric        the provider: devices and their properties, listen/connect/accept that
//                 produce paths, memory registration per device, port events
//   SendPath      the sending half of one path (TCP: a set of streams; verbs: QPs)
//   RecvPath      the receiving half
//   SendSink /    what a path reports into while the core runs its progress(): acks and CTS
//   RecvSink      groups on the send side; frame placement on the receive side
//
// Matching is receiver-driven, as in NCCL's IB transport: every irecv() is advertised to the
// sender as a CTS group (one entry per receive buffer: tag, capacity, address and keys), and a
// send binds to an entry with its tag in the oldest group that still has unbound entries.
// The core numbers bound messages densely per connection (the sequence number) and replays
// every message the receiver has not acknowledged on another path after a failure, under a
// new generation. A fabric never knows about requests, matching or failover; the core never
// calls socket or verbs functions.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "handle.h"

namespace vigil::net {

// ---- Limits ------------------------------------------------------------------------------

/// Most receive buffers one irecv may group (the maxRecvs NCCL may be told; NCCL's IB
/// transport reports 8: docs/nccl-abi.md, "NCCL's IB transport").
inline constexpr int kMaxRecvs = 8;
/// Outstanding requests per comm object (NCCL_NET_MAX_REQUESTS,
/// v2.28.9-1:src/include/plugin/nccl_net.h:33).
inline constexpr int kMaxRequests = 32;
/// Messages in flight per connection: NCCL_NET_MAX_REQUESTS x maxRecvs sends
/// (docs/nccl-abi.md, "Net plugin semantics NCCL relies on", grouped receives). Also the size
/// of the receiver's sequence window.
inline constexpr int kMaxInflight = kMaxRequests * kMaxRecvs;
/// Largest message: test() reports sizes as int.
inline constexpr uint64_t kMaxMessageBytes = 0x7fffffff;
/// CTS groups the sender may hold before binding them: every irecv the receiver can have
/// outstanding (its kMaxRequests requests), twice over for groups advertised while the
/// sender's view of completed ones lags.
inline constexpr int kMaxCtsGroups = 2 * kMaxRequests;

// ---- Path slots ----------------------------------------------------------------------------

/// Path slots of a connection: the primary on the comm's own device and the backup on another
/// device (a hot standby, or with multipath a second carrier: send_comm.h). kMaxPaths is only
/// this: path slots per connection.
inline constexpr int kPrimary = 0;
inline constexpr int kBackup = 1;
inline constexpr int kMaxPaths = 2;

/// Who a path is, for logs, telemetry and events. Plain value, filled by the fabric when the
/// path is built; never parsed back from text.
struct PathIdentity {
    int slot = kPrimary;  ///< kPrimary or kBackup
    int dev = -1;         ///< local NCCL device index
    std::string dev_name; ///< "eth0", "rxe_a0:1"
    std::string local;    ///< local endpoint: "10.0.0.1:41234", a GID
    std::string peer;     ///< remote endpoint
    std::string peer_port; ///< the remote port it reaches: an address without a transport
                           ///< port, a GID. Paths of one dev and peer_port share liveness
                           ///< (PortPairs); "" when the fabric cannot name it
    std::string detail;   ///< fabric specifics: "2 streams", "qp 0x11"
    uint64_t id = 0;      ///< this path instance, the same at both ends (chosen by the
                          ///< connecting side); 0 when the fabric has none

    /// "primary dev eth0 10.0.0.1:41234 -> 10.0.0.2:5000 (2 streams)".
    std::string describe() const;
};

// ---- Memory --------------------------------------------------------------------------------

/// A fabric's registration of one buffer on one device (verbs: an MR). Immutable after
/// creation; shared (a fabric may cache registrations, regIsGlobal) and released with its
/// last reference.
class FabricMr
{
public:
    virtual ~FabricMr() = default;
    uint32_t lkey = 0; ///< local key (verbs); 0 where the fabric needs none
    uint32_t rkey = 0; ///< remote key (verbs); 0 where the fabric needs none
};

/// NCCL's mhandle: one buffer registered for one comm, on every device that comm's paths
/// use, so that a failover never registers anything. Reference-counted: NCCL holds one
/// reference (regMr/deregMr) and every message or receive in flight holds one, so a buffer
/// deregistered with requests in flight stays registered until they are done. Thread-safe
/// reference counting; the rest is immutable after registration.
struct MemRegion {
    const uint8_t *base = nullptr;
    size_t size = 0;
    int type = 0; ///< NCCL_PTR_HOST / NCCL_PTR_CUDA / NCCL_PTR_DMABUF
    struct OnDevice {
        int dev = -1;
        std::shared_ptr<FabricMr> mr; ///< null when the fabric needs no registration
    };
    std::array<OnDevice, kMaxPaths> devs{}; ///< one per distinct device of the comm's paths
    std::atomic<int> refs{1};

    /// The registration on `dev`, or nullptr (none needed, or not registered there).
    const FabricMr *on(int dev) const
    {
        for (const OnDevice &d : devs)
            if (d.dev == dev) return d.mr.get();
        return nullptr;
    }
    /// True when [p, p + n) lies inside the registered buffer.
    bool covers(const void *p, size_t n) const
    {
        const auto *q = static_cast<const uint8_t *>(p);
        return q >= base && n <= size && static_cast<size_t>(q - base) <= size - n;
    }
    void ref() { refs.fetch_add(1, std::memory_order_relaxed); }
    /// Drops one reference; deletes the region with the last.
    static void unref(MemRegion *m)
    {
        if (m != nullptr && m->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete m;
    }
};

// ---- CTS ----------------------------------------------------------------------------------

/// One receive buffer of a posted group, as the sender sees it.
struct CtsEntry {
    uint64_t addr = 0;  ///< buffer address (where an RDMA fabric writes)
    uint64_t size = 0;  ///< capacity, bytes (<= kMaxMessageBytes)
    int32_t tag = 0;
    std::array<uint32_t, kMaxPaths> rkey{}; ///< remote key per path slot (verbs), else 0
};

/// One irecv() as advertised to the sender (clear to send). Groups are numbered densely per
/// connection from 0; group g's messages get the sequence numbers
/// [first_seq, first_seq + n), in the order the sender binds them.
struct CtsGroup {
    uint64_t index = 0;
    uint64_t first_seq = 0;
    int n = 0; ///< 1..kMaxRecvs
    std::array<CtsEntry, kMaxRecvs> entries{};
};

// ---- Sending -------------------------------------------------------------------------------

/// One bound message, or one piece of it, as the core hands it to a send path. The payload
/// and `mr` stay valid until the core has seen the receiver's ack for `seq` (a send completes
/// only then, design invariant 3), so a path may (re)transmit from them at any time before.
/// A path that does not stripe (SendPath::stripes) is only ever given whole messages.
struct OutMessage {
    uint64_t seq = 0;   ///< dense per connection, from 0
    int32_t tag = 0;
    const uint8_t *data = nullptr; ///< offset 0 of the message
    size_t size = 0;    ///< of the whole message, <= dest.size
    size_t offset = 0;  ///< the piece this path sends: bytes [offset, offset + length) ...
    size_t length = 0;  ///< ... (the whole message: 0 and size)
    const MemRegion *mr = nullptr; ///< NCCL's mhandle (may be null where the fabric needs none)
    uint64_t group = 0; ///< CTS group the message is bound to
    int entry = 0;      ///< ... and the entry (receive buffer) within it
    CtsEntry dest;      ///< that entry
};

/// A path's view of its own health, reported by progress().
struct PathStatus {
    int error = 0;      ///< 0, or -errno of the first error on this path (the path is lost)
    bool fatal = false; ///< with error: no other path can fix this (protection or access
                        ///< error, a peer breaking the protocol): the connection fails at once
    bool peer_closed = false; ///< the peer closed the connection in order (its closeSend /
                              ///< closeRecv said goodbye on this path)
    bool peer_eof = false;    ///< with error: the peer's end of this path closed without a
                              ///< goodbye (its process died, or it fenced the path)
    bool heard = false;       ///< something arrived from the peer during this call
    bool failover_requested = false; ///< send side: the receiver asked to leave a path ...
    uint32_t failed_slot = 0;        ///< ... this one, whose port it saw fail
    uint64_t wait_ns = 0;  ///< send side: for the newest ack read in this call, how long the end
                           ///< points let arrived data wait (the receiver before reading it,
                           ///< this end before reading the ack), ns; 0 when unknown ...
    uint64_t wait_ack = 0; ///< ... and that ack's cumulative seq (comm_telemetry.cc) ...
    uint64_t wait_stalled_ns = 0; ///< ... and the receiver's part of it alone, ns: the part
                                  ///< that stalls a path with more in flight
    std::string detail;       ///< with error: what happened, for the one WARN line
};

/// Implemented by the sending core, one per path slot; called by a send path from inside
/// progress(), with the comm's lock held.
class SendSink
{
public:
    /// The receiver holds every message below `seq` (cumulative; acks of any generation are
    /// true statements about what the receiver holds).
    virtual void acked(uint64_t seq) = 0;
    /// The receiver holds message `seq`, possibly ahead of the cumulative ack (an RDMA path
    /// learns this from the receiver's answer to a generation notice). The send completes.
    virtual void held(uint64_t seq) = 0;
    /// `len` bytes of message `seq` that this path carried in generation `gen` are in the
    /// receiver's memory (an RDMA path learns this from a piece's write completing; a TCP path
    /// from the receiver's landed report, BackHeader::kLanded). The core adds up what landed
    /// in its current generation and completes the send once it covers the message; bytes of
    /// an older generation are not counted (it was replayed). The path's share of the message
    /// ends in its meter once its own bytes of this generation landed, so a fast path striping
    /// beside a slow one is not charged the slow one's time, and what a path still has on the
    /// way is known per path. `late_ns`: how long before now they landed, as far as the path
    /// can tell (TCP: how much longer than its floor the report took on the way back,
    /// ReturnDelay; an RDMA completion is not late: 0). The core dates the landing that much
    /// earlier, at most back to the piece's post.
    virtual void landed(uint64_t seq, uint64_t len, uint32_t gen, uint64_t late_ns) = 0;
    /// The receiver advertised group `g`. Each path delivers groups in index order, possibly
    /// repeating ones other paths delivered. Returns 0, or -EPROTO when `g` contradicts what
    /// was advertised before (the path reports it as a fatal error).
    virtual int cts(const CtsGroup &g) = 0;

protected:
    ~SendSink() = default;
};

/// Sending half of one path. Owned by a SendComm and used only under its lock.
class SendPath
{
public:
    virtual ~SendPath() = default;
    virtual const PathIdentity &identity() const = 0;
    /// Makes an idle path (a standby taking over, or a rebuilt one; with stripes(), also one
    /// still sending the previous generation's pieces) carry generation `gen`
    /// from sequence number `first_seq` on, and tells the receiver so before any message of
    /// that generation: a generation notice naming `abandoned`, the path slot the sender left
    /// because it failed, and that path's id (the receiver must stop that path writing into its
    /// buffers; slot -1 when the previous path left in order, or there was none). The core then
    /// posts every message it holds no ack for and has not seen held (SendSink::held), in
    /// increasing order; a path may drop those the receiver reports holding (reporting them
    /// through SendSink::held), never send them twice into a buffer that may already be
    /// NCCL's again. A path whose writes cannot be recalled (RDMA) and that still has writes
    /// of the old generation in flight sends the notice once they completed, so the
    /// receiver's answer counts every one that lands.
    virtual void begin(uint64_t first_seq, uint32_t gen, int abandoned, uint64_t abandoned_id) = 0;
    /// Queues `m` for transmission after every message posted before it. Never blocks,
    /// never fails: errors surface from progress(). (seq, offset) increase; sequence numbers
    /// are dense except where a replay skips messages the core already saw held, or, on a
    /// path that stripes, where another path carries the whole message.
    virtual void post(const OutMessage &m) = 0;
    /// True when every posted message has left completely (TCP: written; verbs: its work
    /// requests completed), so a switch to another path cannot leave a write behind.
    virtual bool idle() const = 0;
    /// Sends a probe when idle(), so the receiver hears a quiet path. Never blocks.
    virtual void probe() = 0;
    /// Tells the receiver, best effort and without blocking, that this connection is being
    /// closed in order (closeSend), so it does not mistake the close for a failure.
    virtual void goodbye() = 0;
    /// Breaks the path on purpose (fault injection): both ends see it fail.
    virtual void sabotage() = 0;
    /// Lowest seq whose payload or descriptor this path may still read (UINT64_MAX when it
    /// holds none). The comm never reuses a message slot at or above it.
    virtual uint64_t oldest_referenced() const { return ~0ull; }
    /// Every seq below `seq` is acknowledged: a path may drop what it still queues of them.
    virtual void skip_to(uint64_t /*seq*/) {}
    /// True when the path takes pieces of messages (OutMessage::offset/length; the receiver
    /// counts a message's bytes whichever path of its generation they came on) and begin()
    /// while frames of the old generation are still in flight (it finishes or drops them, and
    /// nothing of the old generation counts at the receiver once the notice arrived). The
    /// core stripes a connection over its paths only when every one of them does.
    virtual bool stripes() const { return false; }
    /// With stripes(): whether another piece may be posted now: the path's own queue has
    /// room and it holds less than `limit` bytes not yet on the wire (TCP: queued, and unsent
    /// in its sockets' buffers, which a slow port holds by the megabyte; verbs: queued, and
    /// writes not completed). Bytes already on the wire do not count: the port, not the
    /// queue, paces what they cost. Cheap: a path that needs a system call to tell makes it
    /// at most once between two progress() calls.
    virtual bool can_post(uint64_t /*limit*/) const { return true; }
    /// Moves bytes without blocking, reporting acks and CTS groups into `sink`.
    virtual PathStatus progress(SendSink &sink) = 0;
    /// The progress engine is about to progress this path: take the readiness notifications it
    /// saw and, when `arm`, ask for the next one (verbs: the completion channel's events, then
    /// the CQ armed again). The core calls it only from the engine, right before progress(),
    /// and passes `arm` false while the application polls through test() itself: then no
    /// completion wakes the engine thread (a wake-up and a lock hand-off per completion halve
    /// small-message rates), and the engine's tick takes over within two ticks once the
    /// polling stops. Nothing to do for sockets (their readiness is edge-triggered).
    virtual void rearm(bool /*arm*/) {}
    /// File descriptors the progress engine should watch (may be none: the engine's tick then
    /// drives the path). Valid until the path is destroyed.
    virtual int fd(size_t i) const = 0;
    virtual size_t nfds() const = 0;
};

/// Where the receiving core wants the bytes of one frame.
struct Placement {
    enum Kind { kPlace, kDiscard, kError } kind = kError;
    uint8_t *dest = nullptr; ///< with kPlace: address of message offset 0 (the path adds the offset)
    int error = 0;           ///< with kError: -EPROTO or -EMSGSIZE
};

/// What the receiver holds, as it answers a generation notice: every message below `floor`,
/// and message floor + k where bit k of `complete` is set.
struct Holding {
    uint64_t floor = 0;
    std::array<uint64_t, kMaxInflight / 64> complete{};
    bool has(uint64_t seq) const
    {
        if (seq < floor) return true;
        const uint64_t k = seq - floor;
        return k < kMaxInflight && (complete[k / 64] >> (k % 64) & 1) != 0;
    }
};

/// Where a receive path that writes the bytes itself puts them (the stream model: TCP). The
/// path reads a frame's header and asks locate() where its bytes go, asks still_wanted()
/// before every payload write, and reports landed() once the frame's bytes are in place.
/// Called with the comm's lock held, from inside the path's progress().
class StreamSink
{
public:
    /// A frame of message `seq` (whole size `size`), bound by the sender to entry `entry` of
    /// its CTS group, with tag `tag`, arrived in generation `gen`. Returns where its bytes go:
    /// kPlace (the first frame of a message binds its entry), kDiscard for a message already
    /// completed or a stale generation (a replay), kError for a frame that contradicts what
    /// was advertised (a tag or entry that is not there, a size beyond the buffer, a sequence
    /// number outside the window). A kError is fatal for the connection.
    virtual Placement locate(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry) = 0;
    /// True while bytes of a frame of generation `gen` for message `seq` may still be
    /// written: no newer generation was adopted and the message is not complete. A path that
    /// writes the bytes itself asks before every payload write and discards the rest of a
    /// frame once the answer is false, so a buffer is never written after its request was
    /// reported done (invariant 2).
    virtual bool still_wanted(uint32_t gen, uint64_t seq) = 0;
    /// `len` bytes of message `seq`, from a frame of generation `gen` located with kPlace,
    /// are in place. Bytes of a stale generation are not counted. Returns 1 when they counted
    /// (the path reports them to the sender as landed on it), 0 when they did not, or -EPROTO
    /// (more bytes than the message holds).
    virtual int landed(uint64_t seq, uint64_t len, uint32_t gen) = 0;

protected:
    ~StreamSink() = default;
};

/// What a receive path reports when its sender writes the bytes straight into the advertised
/// buffers (the direct model: RDMA). The path places nothing; it learns from a record or an
/// immediate that bytes are in place and says so. Called with the comm's lock held, from
/// inside the path's progress(), drain() or fence().
class DirectSink
{
public:
    /// A whole message, `size` bytes of message `seq` for entry `entry` with tag `tag`, sent
    /// in generation `gen`, is in place in its buffer: a fabric whose sender writes payloads
    /// straight into the advertised buffers (RDMA) learns this from a record that follows
    /// the payload on one QP. Completes the message whatever its generation, unless it is
    /// complete already (then nothing happens): the sender may have seen the record
    /// acknowledged and completed its send, so the message will not come again. Returns 0,
    /// or -EPROTO / -EMSGSIZE for a record that contradicts what was advertised (fatal for
    /// the connection).
    virtual int whole(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry) = 0;
    /// As whole() for a message described in fewer bits (RDMA: the immediate of the one
    /// write that carried it): its sequence number only modulo 2^`bits` (bits > log2 of
    /// kMaxInflight + 1) and no tag. The message is the one with that residue in
    /// [floor - 2^(bits-1), floor + 2^(bits-1)) around the receiver's window floor (below the
    /// floor: a replay of a completed message, ignored), and its tag is its entry's.
    virtual int whole_short(uint32_t gen, uint64_t seq_residue, int bits, uint64_t size, int entry) = 0;
    /// A piece of a striped message written straight into its buffer (RDMA): `len` bytes of
    /// the message with sequence number residue `seq_residue` (as whole_short()), for entry
    /// `entry` (its tag is the entry's), sent in generation `gen`, are in place. Its size
    /// comes with the message's last piece (piece_last()); until then the bytes are bounded
    /// by the buffer's capacity. A message counts the pieces of the newest generation it
    /// has seen: a newer one restarts its count (the sender replays it whole), an older one
    /// is ignored, so every byte counts once; a piece of a generation older than the
    /// connection's still counts for a message that has none newer (the write landed, and
    /// the sender may have seen it land and completed the send). Returns 0, or -EPROTO /
    /// -EMSGSIZE (fatal for the connection).
    virtual int piece(uint32_t gen, uint64_t seq_residue, int bits, uint64_t len, int entry) = 0;
    /// The last piece of striped message `seq` (whole size `size`, tag `tag`, entry `entry`,
    /// generation `gen`): its `len` bytes are in place, from a record that followed them on
    /// one QP. Counted as piece() counts; completes the message once its pieces cover
    /// `size`. Returns 0, or -EPROTO / -EMSGSIZE (fatal for the connection).
    virtual int piece_last(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry,
                           uint64_t len) = 0;

protected:
    ~DirectSink() = default;
};

/// Implemented by the receiving core, one per path slot: what a receive path reports. A path
/// uses one placement model, StreamSink's or DirectSink's (a third fabric picks the one that
/// matches who writes the bytes: its receiver, or its sender's NIC), and generation() in
/// either. Called by a receive path from inside progress(), drain() or fence(), with the
/// comm's lock held. A sink never calls back into any path: what its calls mean for paths
/// (acks, fencing a path the sender left, draining the others, the answer to a generation
/// notice) the core applies after the path's call returns, so a path is never re-entered,
/// nor a sibling driven, while one is on the stack.
class RecvSink : public StreamSink, public DirectSink
{
public:
    /// The sender's generation notice (SendPath::begin): from sequence number `first_seq` on,
    /// messages come in generation `gen`; `abandoned` is the slot it left because it failed
    /// (-1: none) and `abandoned_id` that path's id (0: unknown). The generation counts at
    /// once for the frames that follow. Once the path's call returned, the core fences that
    /// path, drains every other live path (RecvPath::drain) and calls RecvPath::answer() on
    /// this one with what it then holds: every write of an older generation that will ever
    /// land has landed and is counted, so a fabric whose writes cannot be discarded (RDMA)
    /// tells the sender which messages not to replay.
    virtual void generation(uint32_t gen, uint64_t first_seq, int abandoned, uint64_t abandoned_id) = 0;

protected:
    ~RecvSink() = default;
};

/// Receiving half of one path. Owned by a RecvComm; used only under its lock.
class RecvPath
{
public:
    virtual ~RecvPath() = default;
    virtual const PathIdentity &identity() const = 0;
    /// Reads whatever has arrived, placing it through `sink`; flushes queued acks and CTS.
    virtual PathStatus progress(RecvSink &sink) = 0;
    /// As SendPath::rearm().
    virtual void rearm(bool /*arm*/) {}
    /// Tells the sender that group `g` is posted. Queued in order behind earlier ones; never
    /// blocks.
    virtual void advertise(const CtsGroup &g) = 0;
    /// Tells the sender that every seq below `ack_seq` is held, as seen at generation `gen`:
    /// sent now where the fabric can (the core calls it once per progress that moved the
    /// window, after the path's progress() returned). Coalesces; never blocks.
    virtual void ack(uint64_t ack_seq, uint32_t gen) = 0;
    /// The receiver's answer to generation `gen`'s notice (RecvSink::generation), given after
    /// the progress() that reported it: `h` is what it holds. A fabric whose sender writes
    /// into the receiver's buffers (RDMA) sends it, and its sender writes nothing of the new
    /// generation before it arrives; TCP, whose receiver discards what it holds, needs none.
    /// Never blocks.
    virtual void answer(uint32_t /*gen*/, const Holding & /*h*/) {}
    /// Asks the sender to leave path `failed_slot` of this connection (sent on this path,
    /// which must be another one). Naming the slot, not a generation, keeps the request valid
    /// when this side has not seen the sender's newest generation yet. Never blocks.
    virtual void request_failover(uint32_t failed_slot) = 0;
    /// Re-sends the current ack so the sender hears this path even when nothing completes
    /// (a receiver that has posted nothing must not look like a dead path). Never blocks.
    virtual void heartbeat() = 0;
    /// As SendPath::goodbye(), for closeRecv.
    virtual void goodbye() = 0;
    /// Reports through `sink` what has already arrived and needs no reply (whole messages of a
    /// fabric that writes into the advertised buffers), sending nothing; anything else waits
    /// for the next progress(). The core drains every other live path before it answers a
    /// generation notice, so its answer counts every message whose writes have landed. A
    /// fabric whose receive side writes the bytes itself (TCP) has nothing to drain.
    virtual void drain(RecvSink & /*sink*/) {}
    /// The path is done (the sender left it after a failure, it failed here, or the peer
    /// closed it): stop it writing into any buffer from now on (verbs: move its QPs to the
    /// error state; TCP: shut its streams), then report what had already landed, as drain()
    /// does. The path is dead after this; the core calls it once per path.
    virtual void fence(RecvSink &sink) = 0;
    virtual void sabotage() = 0;
    virtual int fd(size_t i) const = 0;
    virtual size_t nfds() const = 0;
};

// ---- Rebuilding dead paths ---------------------------------------------------------------

/// Re-establishes the paths of one sending connection after they died (failback and lost
/// backups), to the same devices. Owned by the SendComm; called only under its lock; never
/// blocks.
class PathRebuilder
{
public:
    virtual ~PathRebuilder() = default;
    /// True when slot `slot` (kPrimary/kBackup) has somewhere to be rebuilt to.
    virtual bool can_rebuild(int slot) const = 0;
    /// Starts or continues one attempt for `slot`. Returns 0 with *out set when the path is
    /// up (accepted by the peer), 0 with *out empty while in progress, -errno when this
    /// attempt failed (the caller backs off and calls again later).
    virtual int progress(int slot, std::unique_ptr<SendPath> *out) = 0;
};

/// Hands a receiving connection the paths its peer rebuilt. Owned by the RecvComm; called
/// only under its lock; never blocks.
class PathAcceptor
{
public:
    virtual ~PathAcceptor() = default;
    /// Returns 0 with *out set when a rebuilt path arrived (its slot in its identity), 0 with
    /// *out empty when none did.
    virtual int poll(std::unique_ptr<RecvPath> *out) = 0;
    /// `wake` is called (from any thread, under the listener's lock: it must not block or
    /// call back into the acceptor) when a rebuilt path is ready for poll(), so a receiving
    /// comm with no timer of its own is woken for it.
    virtual void set_wake(std::function<void()> /*wake*/) {}
};

// ---- The provider ------------------------------------------------------------------------

/// What NCCL's getProperties reports for one device, decided by the fabric from the hardware
/// (docs/nccl-abi.md, "Net plugin semantics NCCL relies on" and "NCCL's IB transport").
/// Plain value.
struct DeviceProps {
    std::string name;      ///< unique per host ("eth0", "mlx5_0:1"): NCCL keys topology by it
    std::string pci_path;  ///< sysfs PCI path, or empty for virtual devices (NCCL then assumes CPU 0)
    uint64_t guid = 0;
    int ptr_support = 0;   ///< NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF
    bool reg_is_global = false; ///< registrations are cached (cheap re-registration)
    bool force_flush = false;
    int speed_mbps = 0;    ///< link speed, Mbit/s
    int port = 0;          ///< port number on the device (verbs), else 0
    float latency_us = 0;
    int max_comms = 0;
    int max_recvs = 1;     ///< 1..kMaxRecvs
    uint64_t max_p2p_bytes = 0;
    uint64_t max_coll_bytes = 0;
    int numa_node = -1;
    std::string address;   ///< the device's address, for logs ("10.0.0.1", a GID)
};

/// Where a new connection's paths go: per slot, the local device and the index of the
/// listener's address (in its handle) to reach; -1 for a slot without a path.
struct ConnectPlan {
    std::array<int, kMaxPaths> local_dev{{-1, -1}};
    std::array<int, kMaxPaths> remote{{-1, -1}};
    int traffic_class = -1; ///< NCCL's per-communicator traffic class (v11+ config), -1: unset
};

/// The paths of a new sending connection and what rebuilds them.
struct SendPaths {
    std::array<std::unique_ptr<SendPath>, kMaxPaths> paths; ///< [kPrimary] always set
    std::unique_ptr<PathRebuilder> rebuilder;               ///< may be null
};

/// NCCL's iflush on one device: makes what an RDMA fabric wrote into GPU memory visible to
/// the GPU before NCCL hands it over, by an RDMA READ of the received buffer through a QP
/// connected to itself on the device the writes came through; the READ's completion is
/// ordered after those writes on the PCIe path (NCCL's IB transport does the same:
/// docs/nccl-abi.md, "NCCL's IB transport"). Owned by a RecvComm; used under its lock; never
/// blocks.
class Flusher
{
public:
    virtual ~Flusher() = default;
    /// Starts reading a few bytes at `data`, inside `mr` (registered on this device): the
    /// `*ticket`-th read (from 0). Reads complete in the order they started. Returns 0, or
    /// -errno with nothing started (-EAGAIN: kMaxRequests reads are in flight).
    virtual int start(const void *data, const FabricMr &mr, uint64_t *ticket) = 0;
    /// Reads completed so far (every ticket below *completed). Returns 0, or -errno once the
    /// flusher failed (its device did; the data path finds that too): no read completes after.
    virtual int progress(uint64_t *completed) = 0;
};

/// The paths of a new receiving connection and what hands it rebuilt ones.
struct RecvPaths {
    std::array<std::unique_ptr<RecvPath>, kMaxPaths> paths; ///< [kPrimary] always set
    std::unique_ptr<PathAcceptor> acceptor;                 ///< may be null
    /// A flusher per slot's device, where that device can write GPU memory (GPUDirect RDMA);
    /// null elsewhere, and then iflush has nothing to do.
    std::array<std::unique_ptr<Flusher>, kMaxPaths> flushers;
    /// Local device of each slot as the sender planned it, also for a slot whose path is not
    /// (yet) up: a rebuilt path arrives there, so registrations must cover it. -1: none.
    std::array<int, kMaxPaths> devs{{-1, -1}};
};

/// One NCCL connect() in progress (non-blocking). Driven by one proxy thread.
class Connector
{
public:
    virtual ~Connector() = default;
    /// 0 with *out filled once connected and accepted; 0 with *out empty while in progress;
    /// -errno on failure, after one WARN.
    virtual int progress(SendPaths *out) = 0;
};

/// NCCL's listenComm. Thread-safe: accept() may race with the fabric's own threads.
class Listener
{
public:
    virtual ~Listener() = default;
    /// 0 with *out filled once a connection's paths have arrived; 0 with *out empty when none
    /// is complete yet; -errno when the listener itself failed. Impostors are rejected with one
    /// WARN each and the listener keeps listening.
    virtual int accept(RecvPaths *out) = 0;
};

/// Receives port events (a device's port went down or came back). Called from the fabric's
/// event thread; must not block on anything that thread holds.
class PortEventSink
{
public:
    virtual void port_changed(int dev, bool up, const std::string &cause) = 0;

protected:
    ~PortEventSink() = default;
};

/// A transport provider. Created once per process by the plugin's global set-up; its
/// methods are thread-safe.
class Fabric
{
public:
    virtual ~Fabric() = default;
    /// "tcp", "verbs".
    virtual const char *name() const = 0;
    /// One entry per NCCL device, stable for the fabric's lifetime.
    virtual const std::vector<DeviceProps> &devices() const = 0;
    /// Opens a listener on `dev` (and, for backup paths, on other devices) and fills `handle`.
    virtual int listen(int dev, ListenHandle *handle, std::unique_ptr<Listener> *out) = 0;
    /// Starts a connection to the listener of `handle` along `plan`. Returns 0 or -errno.
    virtual int connect(const ConnectPlan &plan, const ListenHandle &handle,
                        std::unique_ptr<Connector> *out) = 0;
    /// Registers [data, data + size) of memory `type` on `dev`. *out stays null when the
    /// fabric needs no registration. Returns 0, -EINVAL for a memory type the device does not
    /// support, or -errno.
    virtual int reg_mr(int dev, void *data, size_t size, int type, std::shared_ptr<FabricMr> *out) = 0;
    /// As reg_mr, for a DMA-BUF file descriptor (NCCL's regMrDmaBuf). -EOPNOTSUPP unless the
    /// device reports NCCL_PTR_DMABUF.
    virtual int reg_mr_dmabuf(int dev, void *data, size_t size, int type, uint64_t offset, int fd,
                              std::shared_ptr<FabricMr> *out) = 0;
    /// Starts delivering port events to `sink` (which outlives stop_events()). Returns 0 or
    /// -errno (failures are then found by the data path and the watchdogs only).
    virtual int start_events(PortEventSink *sink) = 0;
    virtual void stop_events() = 0;
};

} // namespace vigil::net
