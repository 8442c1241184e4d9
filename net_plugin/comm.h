// SPDX-License-Identifier: Apache-2.0
// The transport-agnostic core of a connection: NCCL requests, message sequencing, the ack
// window (a send completes only when the receiver holds the whole message), multi-recv tag
// matching. It drives one path through the fabric interface; the failover engine will give it
// several without changing this shape.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "fabric.h"
#include "progress.h"

namespace vigil::net {

/// Most receives one irecv may group (NCCL's maxRecvs upper bound we report).
inline constexpr int kMaxRecvs = 8;
/// Outstanding requests per comm object (NCCL_NET_MAX_REQUESTS).
inline constexpr int kMaxRequests = 32;
/// Messages in flight per connection: NCCL_NET_MAX_REQUESTS x maxRecvs sends (reference 1.7,
/// multi-recv). Also the size of the receiver's sequence window.
inline constexpr int kMaxInflight = kMaxRequests * kMaxRecvs;
/// Largest message: test() reports sizes as int.
inline constexpr uint64_t kMaxMessageBytes = 0x7fffffff;

class Comm;

/// One NCCL request (`void* request`). Lives in its comm's fixed pool; never allocated on the
/// data path. `state` is the only field another thread reads without the comm lock.
struct Request {
    enum : uint8_t { kFree = 0, kPending = 1, kDone = 2 };
    std::atomic<uint8_t> state{kFree};
    bool is_send = false;
    Comm *comm = nullptr;
    // send
    uint64_t seq = 0;
    size_t size = 0;
    // recv: n buffers; msg_size[i] is the size of the message bound to buffer i
    int n = 0;
    int remaining = 0;
    std::array<uint8_t *, kMaxRecvs> data{};
    std::array<uint64_t, kMaxRecvs> capacity{};
    std::array<int32_t, kMaxRecvs> tags{};
    std::array<uint64_t, kMaxRecvs> msg_size{};
    std::array<bool, kMaxRecvs> bound{};
};

/// Common part of a send or receive comm: the lock, the sticky error and test().
/// Thread-safety: isend/irecv/test/close may come from NCCL's proxy thread while the
/// progress engine thread runs on_ready(); all state is under `mu_` except Request::state
/// and `error_`.
class Comm : public ProgressClient
{
public:
    virtual ~Comm() = default;

    /// NCCL's test(): *done = 1 once `r` completed (sizes[0..n) filled for receives, sizes may
    /// be NULL), after which `r` is recycled. Returns 0, or -errno once the connection has no
    /// path left (the request is then dead too).
    int test(Request *r, int *done, int *sizes) noexcept;

    /// Stops the engine from calling this comm and waits until it no longer does. Called
    /// once, by the close entry point, before delete.
    void detach() noexcept;

    void on_ready() noexcept override;

    /// Registers the path's fds with the progress engine. Returns 0 or -errno.
    int attach() noexcept;

protected:
    /// Progress every path; called with mu_ held.
    virtual void progress_locked() noexcept = 0;
    virtual size_t nfds() const noexcept = 0;
    virtual int fd(size_t i) const noexcept = 0;
    /// Records the first fatal error (no path left) and logs it once.
    void fail_locked(int err, const std::string &what) noexcept;

    std::mutex mu_;
    std::atomic<int> error_{0};
    bool detached_ = false;
};

/// NCCL's sendComm. Owns its path. Sends complete in sequence order as acks arrive.
class SendComm final : public Comm
{
public:
    explicit SendComm(std::unique_ptr<SendPath> path);

    /// NCCL's isend(). *out = NULL when kMaxInflight sends are outstanding (NCCL retries).
    /// Returns 0, -EMSGSIZE for size > kMaxMessageBytes, or the connection's error.
    int isend(const void *data, size_t size, int tag, Request **out) noexcept;

    std::string describe() const { return path_->describe(); }

private:
    void progress_locked() noexcept override;
    size_t nfds() const noexcept override { return path_->nfds(); }
    int fd(size_t i) const noexcept override { return path_->fd(i); }

    std::unique_ptr<SendPath> path_;
    std::array<Request, kMaxInflight> reqs_; // slot seq % kMaxInflight
    uint64_t next_seq_ = 0;
    uint64_t acked_ = 0; // every seq below is held by the receiver
    bool peer_closed_ = false;
};

/// NCCL's recvComm. Owns its path; implements the sink the path places frames through.
class RecvComm final : public Comm, private RecvSink
{
public:
    explicit RecvComm(std::unique_ptr<RecvPath> path);

    /// NCCL's irecv() with n (1..kMaxRecvs) buffers. *out = NULL when all kMaxRequests
    /// requests or the sequence window are in use (NCCL retries). Returns 0, -EINVAL for a
    /// bad n or size, or the connection's error.
    int irecv(int n, void *const *data, const size_t *sizes, const int *tags,
              Request **out) noexcept;

    std::string describe() const { return path_->describe(); }

private:
    struct Slot {
        Request *req = nullptr; // the irecv covering this seq
        int buf = -1;           // buffer index once bound by the first frame's tag
        uint64_t got = 0;
        bool complete = false;
    };

    void progress_locked() noexcept override;
    size_t nfds() const noexcept override { return path_->nfds(); }
    int fd(size_t i) const noexcept override { return path_->fd(i); }
    Placement locate(uint32_t gen, uint64_t seq, int32_t tag, uint64_t size) override;
    int landed(uint64_t seq, uint64_t len) override;

    std::unique_ptr<RecvPath> path_;
    std::array<Request, kMaxRequests> reqs_;
    std::array<Slot, kMaxInflight> slots_; // slot seq % kMaxInflight
    uint64_t next_post_seq_ = 0;           // seq the next irecv's first buffer covers
    uint64_t floor_ = 0;                   // every seq below is complete
    bool peer_closed_ = false;
};

} // namespace vigil::net
