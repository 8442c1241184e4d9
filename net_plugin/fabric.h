// SPDX-License-Identifier: Apache-2.0
// The fabric interface: what the transport-agnostic core (comm.h) needs from a path, and what
// a path needs from the core. TCP implements it today (tcp/), verbs will (verbs/). A fabric
// never knows about requests, multi-recv matching or failover; the core never calls socket or
// verbs functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace vigil::net {

/// One message as the core hands it to a send path: sequence number (dense, per connection,
/// from 0), NCCL tag, payload. The payload stays valid until the core has seen the
/// receiver's ack for `seq` (completion contract, design invariant 3), so a path may
/// (re)transmit from it at any time before then.
struct OutMessage {
    uint64_t seq = 0;
    int32_t tag = 0;
    const uint8_t *data = nullptr;
    size_t size = 0;
};

/// Where the receiving core wants the bytes of one frame: `dest` (nullptr with kDiscard).
struct Placement {
    enum Kind { kPlace, kDiscard, kNotPosted, kError } kind = kNotPosted;
    uint8_t *dest = nullptr; ///< address of message offset 0 (the path adds the offset)
    int error = 0;           ///< -errno with kError
};

/// Implemented by the receiving core; called by a receive path from inside progress(), with
/// the comm's lock held. Not thread-safe on its own.
class RecvSink
{
public:
    /// A frame header for message `seq` (tag, total size) arrived on a path of generation
    /// `gen`. Returns where its bytes go, kNotPosted when no irecv covers `seq` yet (the path
    /// must stop reading this stream and ask again later; also returned while an earlier
    /// message of the same multi-recv is not bound yet, because buffers bind in sequence
    /// order as NCCL's IB transport matches CTS entries), kDiscard for a message already
    /// completed (a replay), kError (-EPROTO, -EMSGSIZE) for a frame that contradicts what
    /// was posted.
    virtual Placement locate(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size) = 0;
    /// True while bytes of a frame of generation `gen` for message `seq` may still be written:
    /// no newer generation was adopted and the message is not complete. A path asks before
    /// every payload write and discards the rest of a frame once the answer is false, so a
    /// buffer is never written after its request was reported done (invariant 2).
    virtual bool still_wanted(uint32_t gen, uint64_t seq) = 0;
    /// `len` bytes of message `seq`, from a frame of generation `gen` located with kPlace,
    /// are now in place. Bytes of a stale generation are not counted. Returns 0 or -errno
    /// (more bytes than the message holds).
    virtual int landed(uint64_t seq, uint64_t len, uint32_t gen) = 0;

protected:
    ~RecvSink() = default;
};

/// A path's view of its own health, reported by progress().
struct PathStatus {
    int error = 0;            ///< 0, or -errno of the first fatal error on this path
    bool peer_closed = false; ///< orderly EOF from the peer at a message boundary
    bool heard = false;       ///< bytes arrived from the peer during this call
    int receiver_bound = -1;  ///< send side: last ack's flag (1: the receiving application
                              ///< has not posted for data waiting); -1: no ack this call
    bool failover_requested = false; ///< send side: the receiver asked to leave a path
    uint32_t failed_slot = 0;        ///< ... this one (kPrimary/kBackup), whose port it saw fail
    std::string detail;       ///< with error: what happened, for the one WARN line
};

/// Sending half of one path (TCP: a set of streams; verbs: a QP). Owned by a SendComm and
/// used only under that comm's lock.
class SendPath
{
public:
    virtual ~SendPath() = default;
    /// Positions a path that carries nothing yet (a standby taking over) so that the next
    /// post() is `first_seq` and every frame it writes carries generation `gen`.
    virtual void begin(uint64_t first_seq, uint32_t gen) = 0;
    /// Queues `m` for transmission after every message posted before it. Never blocks,
    /// never fails: errors surface from progress(). Sequence numbers are dense.
    virtual void post(const OutMessage &m) = 0;
    /// True when every posted byte has been written (nothing queued or half written).
    virtual bool idle() const = 0;
    /// Writes a probe frame when idle(), so the receiver hears a quiet path. Never blocks.
    virtual void probe() = 0;
    /// Breaks the path on purpose (fault injection): both ends see it fail.
    virtual void sabotage() = 0;
    /// Local NCCL device index this path leaves from.
    virtual int local_dev() const = 0;
    /// Lowest seq whose payload or descriptor this path may still read (UINT64_MAX when it
    /// holds none). The comm never reuses a message slot at or above it.
    virtual uint64_t oldest_referenced() const { return ~0ull; }
    /// Every seq below `seq` is acknowledged: streams standing between frames may skip them.
    virtual void skip_to(uint64_t /*seq*/) {}
    /// Moves bytes without blocking and collects acks. *acked_seq is raised to the
    /// receiver's cumulative ack (every seq below it is held by the receiver).
    virtual PathStatus progress(uint64_t *acked_seq) = 0;
    /// File descriptors the progress engine should watch (may be empty for fabrics with
    /// their own completion channel). Valid until the path is destroyed.
    virtual int fd(size_t i) const = 0;
    virtual size_t nfds() const = 0;
    /// Human-readable identity for logs: "eth0 10.0.0.1 -> 10.0.0.2:4242 (2 streams)".
    virtual std::string describe() const = 0;
};

/// Receiving half of one path. Owned by a RecvComm; used only under its lock.
class RecvPath
{
public:
    virtual ~RecvPath() = default;
    /// Reads whatever has arrived, placing it through `sink`; queues and flushes acks.
    virtual PathStatus progress(RecvSink &sink) = 0;
    /// Tells the sender that every seq below `ack_seq` is held, as seen at generation `gen`.
    /// Coalesces; never blocks.
    virtual void ack(uint64_t ack_seq, uint32_t gen) = 0;
    /// Asks the sender to leave path `failed_slot` of this connection (sent on this path,
    /// which must be another one). Naming the slot, not a generation, keeps the request valid
    /// when this side has not seen the sender's newest generation yet. Never blocks.
    virtual void request_failover(uint32_t failed_slot) = 0;
    /// Re-sends the current ack so the sender hears this path even when nothing completes
    /// (a receiver that has posted nothing must not look like a dead path). Never blocks.
    virtual void heartbeat() = 0;
    /// Tells the sender (at once, in an ack) whether data waits for a receive the
    /// application has not posted yet, so its telemetry does not blame the path.
    virtual void set_app_bound(bool /*bound*/) {}
    virtual void sabotage() = 0;
    virtual int local_dev() const = 0;
    virtual int fd(size_t i) const = 0;
    virtual size_t nfds() const = 0;
    virtual std::string describe() const = 0;
};

/// Re-establishes the paths of one sending connection after they died (failback and lost
/// backups). Owned by the SendComm; called only under its lock; never blocks.
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
    /// Returns 0 with *out and *slot set when a rebuilt path arrived, 0 with *out empty when
    /// none did.
    virtual int poll(std::unique_ptr<RecvPath> *out, int *slot) = 0;
};

} // namespace vigil::net
