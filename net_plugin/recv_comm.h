// SPDX-License-Identifier: Apache-2.0
// NCCL's recvComm: advertises every irecv to the sender as a CTS group, places the frames
// its paths receive, completes requests and acknowledges them. The receiving side of the
// failover protocol: it adopts the sender's newer generations, fences the path the sender
// left after a failure, asks the sender to leave a path whose local port failed, and takes
// the paths the sender rebuilt.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "comm.h"

namespace vigil::net {

/* Receiving side, per path slot: alive (reading, acking, advertising on it) or dead.
 * Messages of generation g < gen_ are discarded; the first sign of a newer generation (the
 * sender's notice, or a frame) resets the partial progress of every incomplete message (the
 * sender replays them whole) and bytes of completed messages are never written again
 * (invariant 2). Every CTS group goes out on every live path, and a path the sender rebuilt
 * first gets every group still outstanding, so whichever path survives, the sender has every
 * group; it drops the repeats by index.
 */
class RecvComm final : public Comm
{
public:
    /// `paths.acceptor` (may be null) hands over paths the sender rebuilt. `devs`: the local
    /// device of each slot (-1: none).
    RecvComm(RecvPaths paths, const std::array<int, kMaxPaths> &devs, const FailoverConfig &cfg,
             const TelemetryConfig &tcfg);
    ~RecvComm() override;

    /// NCCL's irecv() with n (1..kMaxRecvs) buffers; `mrs` (NCCL's mhandles, may be null or
    /// hold nulls) gain a reference each until the request completes. The group is advertised
    /// to the sender at once. *out = NULL when all kMaxRequests requests or the sequence
    /// window are in use (NCCL retries). Returns 0, -EINVAL for a bad n or a size beyond
    /// kMaxMessageBytes, or the connection's error.
    int irecv(int n, void *const *data, const size_t *sizes, const int *tags,
              MemRegion *const *mrs, Request **out) noexcept;

    /// NCCL's iflush() of a completed receive of n buffers: when the last buffer holding data
    /// is GPU memory written by a device that needs it (a Flusher from the fabric), an RDMA
    /// READ of it on every such device of this comm; *out is the request to test, or NULL
    /// when there is nothing to wait for (host memory, no GPUDirect). Returns 0, or the
    /// connection's error. Never blocks.
    int iflush(int n, void *const *data, const int *sizes, MemRegion *const *mrs,
               Request **out) noexcept;

    /// The local port of path `slot` failed: ask the sender to leave it (through another
    /// live path) and stop using it. Thread-safe.
    void fail_path(int slot, const std::string &cause) noexcept;
    /// A local port went down: fail_path() for every path on `dev`. Thread-safe.
    void port_down(int dev, const std::string &cause) noexcept;

    std::string describe() const;
    /// Every path, for the connect/accept log line: "primary ..., backup ..." (or "no backup").
    std::string describe_paths() const;
    uint32_t generation() noexcept;

private:
    /// Per-slot adapter: what a path reports in progress() lands in the comm with its slot.
    struct SlotSink final : RecvSink {
        RecvComm *comm = nullptr;
        int slot = 0;
        Placement locate(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry) override;
        bool still_wanted(uint32_t gen, uint64_t seq) override;
        int landed(uint64_t seq, uint64_t len, uint32_t gen) override;
        Holding generation(uint32_t gen, uint64_t first_seq, int abandoned, uint64_t abandoned_id) override;
        int whole(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry) override;
        int whole_short(uint32_t gen, uint64_t seq_residue, int bits, uint64_t size, int entry) override;
    };
    struct PathSlot {
        std::unique_ptr<RecvPath> path;
        std::unique_ptr<PathTelemetry> tm; // null with telemetry off
        bool alive = false;
        bool orderly = false; // ended by the peer's goodbye, not by a failure
        bool eof = false;     // ended by the peer closing it without a goodbye
        uint64_t last_heard_ns = 0;
        uint64_t last_beat_ns = 0;
        std::string desc;
        SlotSink sink;
    };
    /// One message of a posted group: ring slot seq % kMaxInflight.
    struct MsgSlot {
        Request *req = nullptr; // the irecv covering this seq
        int buf = -1;           // its buffer, once bound by the sender's first frame
        uint64_t got = 0;
        bool complete = false;
    };

    void progress_locked() noexcept override;
    void rearm_locked(bool arm) noexcept override;
    void goodbye_locked() noexcept override;
    size_t nfds() const noexcept override;
    int fd(size_t i) const noexcept override;

    Placement locate(int slot, uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry);
    /// Binds message `seq` to buffer `entry` on its first frame, or checks a later frame
    /// against that binding. 0, or -EPROTO / -EMSGSIZE.
    int bind_locked(uint64_t seq, int32_t tag, uint64_t size, int entry) noexcept;
    bool still_wanted(uint32_t gen, uint64_t seq) const;
    int landed(int slot, uint64_t seq, uint64_t len, uint32_t gen);
    /// `len` more bytes of message `seq` are in place (through path `slot`); completes it and
    /// its request when all are, and acknowledges. 0 or -EPROTO.
    int add_bytes_locked(int slot, uint64_t seq, uint64_t len) noexcept;
    int whole(int slot, uint32_t gen, uint64_t seq, int32_t tag, uint64_t size, int entry);
    int whole_short(int slot, uint32_t gen, uint64_t seq_residue, int bits, uint64_t size, int entry);
    /// Drains every live path but `except` (RecvPath::drain).
    void drain_others_locked(int except) noexcept;
    void adopt_generation_locked(int slot, uint32_t gen) noexcept;
    void notice_locked(int slot, uint32_t gen, int abandoned, uint64_t abandoned_id) noexcept;
    Holding holding_locked() const noexcept;
    void lose_path_locked(int i, const std::string &why, bool orderly, bool eof) noexcept;
    void accept_rebuilt_locked(uint64_t now) noexcept;
    /// Advertises every group not yet complete on path `i`, oldest first.
    void readvertise_locked(int i) noexcept;
    void complete_locked(Request *r) noexcept;
    /// A free request of the pool, or nullptr.
    Request *free_request() noexcept;
    /// Completes the flush requests whose reads completed.
    void progress_flushes_locked() noexcept;

    std::array<PathSlot, kMaxPaths> paths_;
    FailoverConfig cfg_;
    TelemetryConfig tcfg_;
    std::unique_ptr<PathAcceptor> acceptor_;
    std::array<std::unique_ptr<Flusher>, kMaxPaths> flushers_; // per slot's device; may be null
    int flushes_pending_ = 0;
    uint64_t next_accept_poll_ns_ = 0;
    std::array<Request, kMaxRequests> reqs_;
    std::array<MsgSlot, kMaxInflight> msgs_;
    uint32_t gen_ = 1;
    int active_path_ = kPrimary; // where the newest generation arrives (telemetry)
    uint64_t next_group_ = 0;    // index of the next irecv's CTS group
    uint64_t next_post_seq_ = 0; // seq the next irecv's first buffer covers
    uint64_t floor_ = 0;         // every seq below is complete
    bool peer_closed_ = false;
    uint64_t no_path_since_ns_ = 0;
};

} // namespace vigil::net
