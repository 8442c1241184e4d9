// SPDX-License-Identifier: Apache-2.0
// The TCP fabric's path (send_path.cc, recv_path.cc, over stream_io.h): N streams (TCP
// connections) between two devices. Posted messages (or pieces of them, when the core stripes
// one message over several paths) are cut into chunks of VIGIL_CHUNK_BYTES, dealt round-robin
// over the streams, each chunk behind a FrameHeader; the
// receiver writes each chunk straight into the posted buffer. Stream 0 also
// carries the control frames (probe, generation notice, goodbye) one way and the back channel
// (acks, CTS groups, failover requests, goodbye) the other.
//
// Wait time. Every stream that carries data towards this host asks the kernel for receive
// timestamps (SO_TIMESTAMPNS: when the newest bytes of a read arrived), so each end knows how
// long data sat in its socket before it read it. The receiver puts that age into each ack
// (the ack delay, wire.h); the sender adds how long the ack itself sat unread and reports the
// sum with the ack (PathStatus::wait_ns), so a busy host's late reader is not taken for a slow
// path. Costs nothing per message beyond a clock read per ack: the timestamp comes with the
// recvmsg() that reads the data anyway.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "../fabric.h"
#include "../pow2_ring.h"
#include "../sockets/socket.h"
#include "return_delay.h"
#include "wire.h"

namespace vigil::net::tcp {

/// Sending half. Not thread-safe: used under the owning SendComm's lock.
/// Memory: a FIFO of posted pieces, 16 at first (2 KiB), doubling in post() while more are
/// queued (kFifo, 60 KiB, under the deepest multipath queues; never past kMaxFifo).
/// Stripes (SendPath::stripes): takes pieces of messages, and begin() while frames of the old
/// generation are still being written (each stream finishes the frame it is in the middle of,
/// so the stream stays a sequence of whole frames, and drops the rest of the old generation).
class TcpSendPath final : public SendPath
{
public:
    /// Takes ownership of the connected, non-blocking stream sockets (stream i = fds[i]).
    /// Frames carry generation 1 until begin() says otherwise.
    TcpSendPath(std::vector<UniqueFd> fds, PathIdentity id, size_t chunk_bytes);
    /// Closes every stream in order (UniqueFd::close_orderly).
    ~TcpSendPath() override;

    const PathIdentity &identity() const override { return id_; }
    void begin(uint64_t first_seq, uint32_t gen, int abandoned, uint64_t abandoned_id) override;
    void post(const OutMessage &m) override;
    bool idle() const override;
    void probe() override;
    void goodbye() override;
    void sabotage() override;
    uint64_t oldest_referenced() const override;
    void skip_to(uint64_t seq) override;
    bool stripes() const override { return true; }
    bool can_post(uint64_t limit) const override;
    PathStatus progress(SendSink &sink) override;
    int fd(size_t i) const override { return streams_[i].fd.get(); }
    size_t nfds() const override { return streams_.size(); }

    /// Pieces posted and not yet passed by every stream: every message of a connection in
    /// flight once (kMaxInflight), and as many again for pieces (the core posts pieces only
    /// while can_post()).
    static constexpr uint64_t kFifo = 2 * kMaxInflight;
    /// The FIFO never grows past this: beyond what the core can fill (kFifo pieces posted
    /// while can_post(), then up to kMaxInflight whole messages once the connection stops
    /// striping, before the streams pass them). A piece posted past it, or when memory runs
    /// out, fails the path: progress() answers -ENOMEM and the connection fails over.
    static constexpr size_t kMaxFifo = 4 * kFifo;

private:
    /// One posted piece: bytes [m.offset, m.offset + m.length) of message m.seq.
    struct Msg {
        OutMessage m;
        uint32_t first_stream = 0;
        uint64_t nchunks = 0;
    };
    /// A stream's position: the chunk of which posted piece (FIFO index) it sends next, and
    /// how much of that frame (header + payload) is already written.
    struct Cursor {
        uint64_t idx = 0;
        uint64_t chunk = 0;
        bool chunk_set = false;
        size_t written = 0;
    };
    /// The frame a stream was in the middle of when begin() dropped the old generation: its
    /// rest goes out first.
    struct Tail {
        std::array<uint8_t, FrameHeader::kSize> hdr{};
        const uint8_t *payload = nullptr;
        size_t len = 0;     // payload bytes
        size_t written = 0; // of header + payload
        uint64_t seq = 0;
        bool active = false;
    };
    struct Stream {
        UniqueFd fd;
        uint32_t index = 0;
        Cursor cur;
        Tail tail;
    };

    /// Moves `c` to the stream's next frame at or after it; false when none is posted.
    bool seek(uint32_t stream, Cursor *c) const;
    void frame(const Cursor &c, FrameHeader *h, const uint8_t **payload) const;
    /// Queues a control frame on stream 0 (written before the next data frame there).
    void control(FrameHeader::Kind kind, uint64_t seq, uint8_t entry, uint64_t path = 0);
    /// Writes the rest of `s`'s tail frame; 0 when done or the socket is full (tail still
    /// active), else the error (in *st).
    int pump_tail(Stream &s, PathStatus *st);
    /// Writes queued control frames on stream 0 at a frame boundary; as pump_tail().
    int pump_control(Stream &s, PathStatus *st);
    int pump(Stream &s, PathStatus *st);
    void read_back(SendSink &sink, PathStatus *st);
    /// One whole back-channel message (`h` decoded, `msg` its bytes from the header on).
    /// False when reading stops: the receiver's goodbye, or the path failed.
    bool on_back(const BackHeader &h, const uint8_t *msg, SendSink &sink, PathStatus *st);
    /// Reads the back channel (stream 0), noting when the newest byte read arrived.
    ssize_t recv_back(uint8_t *to, size_t n);

    std::vector<Stream> streams_;
    static constexpr size_t kMinFifo = 16;
    /// Posted piece `idx`.
    Msg &at(uint64_t idx) { return fifo_.at(idx); }
    const Msg &at(uint64_t idx) const { return fifo_.at(idx); }
    /// Makes room for one more piece: doubles the FIFO when full, the pieces some stream has
    /// still to send moving to their place. False at kMaxFifo or out of memory.
    bool make_room();
    Pow2Ring<Msg> fifo_{kMinFifo};
    int post_error_ = 0; // -ENOMEM: post() could not queue a piece; progress() reports it
    uint64_t end_idx_ = 0; // FIFO index of the next post
    uint32_t next_first_ = 0;
    PathIdentity id_;
    uint32_t gen_ = 1;
    size_t chunk_;
    // Control frames waiting for stream 0 ([ctl_off_, ctl_len_) unwritten).
    std::array<uint8_t, 4 * FrameHeader::kSize> ctl_{};
    size_t ctl_len_ = 0, ctl_off_ = 0;
    // The back channel being read, [back_lo_, back_hi_) unparsed: one read takes whatever
    // arrived (an ack and a CTS group together, or a CTS group whole) instead of a read per
    // header and per payload.
    std::array<uint8_t, 8 * BackHeader::kMaxBytes> back_{};
    size_t back_lo_ = 0, back_hi_ = 0;
    bool goodbye_seen_ = false;
    // Wait time: CLOCK_REALTIME arrival of the newest back-channel byte read (0: unknown), of
    // the newest ack of this progress(), and the end of the previous progress()
    // (CLOCK_MONOTONIC): nothing read now arrived before it.
    uint64_t back_rx_ns_ = 0;
    uint64_t ack_rx_ns_ = 0;
    // The landed reports' trip back beyond its floor.
    ReturnDelay return_delay_;
    uint64_t last_pass_ns_;
    // Unsent bytes in the streams' socket buffers (SIOCOUTQNSD), read by can_post() at most
    // once between two progress() calls.
    mutable uint64_t unsent_ = 0;
    mutable bool unsent_fresh_ = false;
};

/// Receiving half. Not thread-safe: used under the owning RecvComm's lock.
/// Memory: a staging buffer per stream once it has read, 4 KiB, 64 KiB for a stream of many
/// small frames (kStageBytes; small frames are read in batches and copied, large payloads
/// straight into the user's buffer), and the queued back channel (bounded by the CTS groups
/// outstanding, a few KiB).
class TcpRecvPath final : public RecvPath
{
public:
    TcpRecvPath(std::vector<UniqueFd> fds, PathIdentity id);
    ~TcpRecvPath() override; ///< as ~TcpSendPath

    const PathIdentity &identity() const override { return id_; }
    PathStatus progress(RecvSink &sink) override;
    void advertise(const CtsGroup &g) override;
    /// Flushes the back channel at once: the core acks after progress() returned.
    void ack(uint64_t ack_seq, uint32_t gen) override;
    void request_failover(uint32_t failed_slot) override;
    void heartbeat() override;
    void goodbye() override;
    /// Shuts the streams: this side writes only from progress(), so nothing has landed
    /// unreported and nothing lands after.
    void fence(RecvSink &sink) override;
    void sabotage() override;
    int fd(size_t i) const override { return streams_[i].fd.get(); }
    size_t nfds() const override { return streams_.size(); }

    /// A stream's staging buffer: none until the stream first reads, then kSmallStageBytes
    /// (headers, probes, small frames), kStageBytes once kGrowAfter reads filled it with small
    /// frames (a stream of many small frames, where fewer, larger reads pay; a large frame's
    /// payload is read straight into its buffer). Thousands of connections then hold a few
    /// KiB per stream, not 64 KiB.
    static constexpr size_t kStageBytes = 64 * 1024;
    static constexpr size_t kSmallStageBytes = 4096;
    static constexpr uint32_t kGrowAfter = 16;
    /// Payload remainders at least this large bypass the staging buffer.
    static constexpr size_t kDirectBytes = 4096;
    /// Back-channel bytes queued before the path is declared broken (the sender stopped
    /// reading its acks and CTS groups).
    static constexpr size_t kMaxBackQueue = 64 * 1024;

private:
    struct Stream {
        // kHeader: reading a frame header into the staging buffer; kPayload: moving the
        // payload of the frame in `h` (to `dest`, or nowhere when `discard`).
        enum State { kHeader, kPayload } state = kHeader;
        UniqueFd fd;
        std::unique_ptr<uint8_t[]> stage; // cap bytes (0: none yet)
        size_t cap = 0;
        uint32_t full_reads = 0; // reads that filled it with small frames (kGrowAfter)
        bool filled = false;     // the last header read filled it
        size_t lo = 0, hi = 0;   // unread staged bytes
        FrameHeader h;
        uint8_t *dest = nullptr;  // next payload byte goes here
        bool discard = false;     // payload of a completed message or a stale generation
        uint64_t remaining = 0;
        bool eof = false;         // the peer closed this stream at a frame boundary
        uint64_t rx_ns = 0;       // CLOCK_REALTIME arrival of the newest byte read (0: unknown)
    };

    /// The stream's staging buffer, allocated on first use (see kStageBytes).
    static uint8_t *stage_of(Stream &s);
    /// A read filled the stage with small frames: counts it, and at kGrowAfter grows the
    /// stage to kStageBytes, keeping the unread bytes.
    static void grow_stage(Stream &s);
    /// Moves as much as possible on one stream; returns true when anything moved.
    bool pump(Stream &s, RecvSink &sink, PathStatus *st);
    /// One step of pump(): go on, or stop (the socket is empty, or the path failed).
    enum class Step { kMore, kStop };
    /// kHeader: decodes a staged header and acts on it, or reads more of the stream.
    Step read_header(Stream &s, RecvSink &sink, PathStatus *st, bool *moved);
    /// kPayload: moves the frame's payload on (staged bytes first, then the socket), and ends
    /// the frame when none is left.
    Step read_payload(Stream &s, RecvSink &sink, PathStatus *st, bool *moved);
    /// The frame's payload is all in place (or discarded): reports it, back to kHeader.
    Step end_frame(Stream &s, RecvSink &sink, PathStatus *st, bool *moved);
    /// A failed recv() on a data stream: an empty socket stops pump(), EINTR retries,
    /// anything else loses the stream.
    static Step after_recv_error(PathStatus *st, int err);
    /// recv() on `s` that notes when the newest byte read arrived (Stream::rx_ns).
    ssize_t recv_stream(Stream &s, uint8_t *to, size_t n);
    /// Handles a decoded header on `s`: control frames at once, data frames by locating them.
    bool on_header(Stream &s, RecvSink &sink, PathStatus *st);
    void queue_back(const BackHeader &h, const uint8_t *payload, size_t n);
    void flush_back(PathStatus *st);
    /// `len` counted bytes of message `seq` (generation `gen`) landed on this path, the newest
    /// of them having reached this host at `rx_ns` (the kernel's CLOCK_REALTIME receive
    /// stamp, 0: unknown): reported to the sender with the next flush_back(), coalesced per
    /// message.
    void note_landed(uint64_t seq, uint32_t len, uint32_t gen, uint64_t rx_ns);
    /// Queues the landings noted so far as one kLanded message, stamped with when their
    /// newest byte reached this host.
    void queue_landed();

    std::vector<Stream> streams_;
    PathIdentity id_;
    uint64_t pending_ack_ = 0, sent_ack_ = 0;
    uint32_t ack_gen_ = 0;
    // Wait time: CLOCK_REALTIME arrival of the newest payload landed since the last ack, and the
    // end of the previous progress() (CLOCK_MONOTONIC).
    uint64_t newest_rx_ns_ = 0;
    // The kernel's receive stamp (CLOCK_REALTIME) of the newest byte of the landings noted
    // since the last report; 0: none, or unknown.
    uint64_t landed_rx_ns_ = 0;
    uint64_t last_pass_ns_;   // when the last progress() ended
    uint64_t prev_pass_ns_;   // ... and the one before it: bounds an ack's delay (flush_back)
    bool heartbeat_pending_ = false;
    bool goodbye_seen_ = false;
    // Landings counted since the last report (BackHeader::kLanded), sent with the acks.
    std::array<Landed, BackHeader::kMaxLanded> landed_{};
    size_t nlanded_ = 0;
    std::vector<uint8_t> out_; // queued back-channel bytes, [out_off_, size) unwritten
    size_t out_off_ = 0;
    bool out_overflow_ = false;
};

} // namespace vigil::net::tcp
