// SPDX-License-Identifier: Apache-2.0
// The fabric interface: what the transport-agnostic core (comm.h) needs from a path, and what
// a path needs from the core. TCP implements it today (tcp/), verbs will (verbs/). A fabric
// never knows about requests, multi-recv matching or failover; the core never calls socket or
// verbs functions.
#pragma once

#include <cstddef>
#include <cstdint>
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
    /// `len` bytes of message `seq` (located with kPlace) are now in place. Returns 0 or
    /// -errno (more bytes than the message holds).
    virtual int landed(uint64_t seq, uint64_t len) = 0;

protected:
    ~RecvSink() = default;
};

/// A path's view of its own health, reported by progress().
struct PathStatus {
    int error = 0;            ///< 0, or -errno of the first fatal error on this path
    bool peer_closed = false; ///< orderly EOF from the peer at a message boundary
    std::string detail;       ///< with error: what happened, for the one WARN line
};

/// Sending half of one path (TCP: a set of streams; verbs: a QP). Owned by a SendComm and
/// used only under that comm's lock.
class SendPath
{
public:
    virtual ~SendPath() = default;
    /// Queues `m` for transmission after every message posted before it. Never blocks,
    /// never fails: errors surface from progress().
    virtual void post(const OutMessage &m) = 0;
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
    /// Tells the sender that every seq below `ack_seq` is held. Coalesces; never blocks.
    virtual void ack(uint64_t ack_seq) = 0;
    virtual int fd(size_t i) const = 0;
    virtual size_t nfds() const = 0;
    virtual std::string describe() const = 0;
};

} // namespace vigil::net
