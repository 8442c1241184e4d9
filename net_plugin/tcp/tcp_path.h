// SPDX-License-Identifier: Apache-2.0
// The TCP fabric's path: N streams (TCP connections) between two devices. Messages are cut
// into chunks of VIGIL_CHUNK_BYTES, dealt round-robin over the streams, each chunk behind a
// FrameHeader; the receiver writes each chunk straight into the posted buffer and acks
// cumulatively on stream 0.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "../comm.h"
#include "../fabric.h"
#include "socket.h"
#include "wire.h"

namespace vigil::net::tcp {

/// Sending half. Not thread-safe: used under the owning SendComm's lock.
/// Memory: one ring of kMaxInflight message descriptors; no allocation after construction.
class TcpSendPath final : public SendPath
{
public:
    /// Takes ownership of the connected, non-blocking stream sockets (stream i = fds[i])
    /// leaving from NCCL device `local_dev`.
    TcpSendPath(std::vector<UniqueFd> fds, int local_dev, uint32_t gen, size_t chunk_bytes,
                std::string desc);
    /// Closes every stream in order (UniqueFd::close_orderly): the peer sees a close, not a
    /// failure.
    ~TcpSendPath() override;

    void begin(uint64_t first_seq, uint32_t gen) override;
    void post(const OutMessage &m) override;
    bool idle() const override;
    void probe() override;
    void sabotage() override;
    int local_dev() const override { return local_dev_; }
    uint64_t oldest_referenced() const override;
    void skip_to(uint64_t seq) override;
    PathStatus progress(uint64_t *acked_seq) override;
    int fd(size_t i) const override { return streams_[i].fd.get(); }
    size_t nfds() const override { return streams_.size(); }
    std::string describe() const override { return desc_; }

private:
    struct Msg {
        OutMessage m;
        uint32_t first_stream = 0;
        uint64_t nchunks = 0;
    };
    /// A stream's position: the chunk of which message it sends next, and how much of that
    /// frame (header + payload) is already written.
    struct Cursor {
        uint64_t seq = 0;
        uint64_t chunk = 0;
        bool chunk_set = false;
        size_t written = 0;
    };
    struct Stream {
        UniqueFd fd;
        uint32_t index = 0;
        Cursor cur;
    };

    /// Moves `c` to the stream's next frame at or after it; false when none is posted.
    bool seek(uint32_t stream, Cursor *c) const;
    void frame(const Cursor &c, FrameHeader *h, const uint8_t **payload) const;
    int pump(Stream &s, PathStatus *st);
    int read_acks(uint64_t *acked_seq, PathStatus *st);

    std::vector<Stream> streams_;
    std::array<Msg, kMaxInflight> ring_;
    uint64_t end_seq_ = 0; // next seq to be posted
    uint32_t next_first_ = 0;
    int local_dev_;
    uint32_t gen_;
    size_t chunk_;
    std::string desc_;
    std::array<uint8_t, AckFrame::kSize> ackbuf_{};
    size_t ack_got_ = 0;
    std::array<uint8_t, FrameHeader::kSize> probe_{};
    size_t probe_off_ = FrameHeader::kSize; // == kSize: no probe being written
};

/// Receiving half. Not thread-safe: used under the owning RecvComm's lock.
/// Memory: a 64 KiB staging buffer per stream (small frames are read in batches and copied;
/// large payloads are read straight into the user's buffer).
class TcpRecvPath final : public RecvPath
{
public:
    TcpRecvPath(std::vector<UniqueFd> fds, int local_dev, std::string desc);
    ~TcpRecvPath() override; ///< as ~TcpSendPath

    PathStatus progress(RecvSink &sink) override;
    void ack(uint64_t ack_seq, uint32_t gen) override
    {
        pending_ack_ = ack_seq;
        ack_gen_ = gen;
    }
    void request_failover(uint32_t failed_slot) override
    {
        failover_slot_ = failed_slot;
        failover_pending_ = true;
    }
    void heartbeat() override { heartbeat_pending_ = true; }
    void set_app_bound(bool bound) override;
    void sabotage() override;
    int local_dev() const override { return local_dev_; }
    int fd(size_t i) const override { return streams_[i].fd.get(); }
    size_t nfds() const override { return streams_.size(); }
    std::string describe() const override { return desc_; }

    static constexpr size_t kStageBytes = 64 * 1024;
    /// Payload remainders at least this large bypass the staging buffer.
    static constexpr size_t kDirectBytes = 4096;

private:
    struct Stream {
        enum State { kHeader, kPayload } state = kHeader;
        UniqueFd fd;
        std::unique_ptr<uint8_t[]> stage;
        size_t lo = 0, hi = 0;
        FrameHeader h;
        bool have_header = false; // h decoded, waiting for a posted receive
        uint8_t *dest = nullptr;  // next payload byte goes here
        bool discard = false;     // payload of an already completed message (replay)
        uint64_t remaining = 0;
        bool eof = false;
    };

    /// Moves as much as possible on one stream; returns true when anything moved.
    bool pump(Stream &s, RecvSink &sink, PathStatus *st);
    void flush_ack(PathStatus *st);

    std::vector<Stream> streams_;
    int local_dev_;
    std::string desc_;
    uint64_t pending_ack_ = 0, sent_ack_ = 0;
    uint32_t ack_gen_ = 0;
    bool failover_pending_ = false;
    bool heartbeat_pending_ = false;
    bool app_bound_ = false;
    uint32_t failover_slot_ = 0;
    std::array<uint8_t, AckFrame::kSize> ackout_{};
    size_t ackout_off_ = AckFrame::kSize; // == kSize: nothing partially written
};

} // namespace vigil::net::tcp
