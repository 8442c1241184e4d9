// SPDX-License-Identifier: Apache-2.0
// Requests, sequencing, ack window and multi-recv matching of one connection.
#include "comm.h"

#include <cerrno>
#include <cstring>

#include "log.h"

namespace vigil::net {

// ---- Comm -------------------------------------------------------------------------------

int Comm::test(Request *r, int *done, int *sizes) noexcept
{
    *done = 0;
    if (r->state.load(std::memory_order_acquire) != Request::kDone) {
        // Progress inline when nobody else is (cuts a thread hand-off from latency); the
        // engine thread covers the case where NCCL polls slowly or not at all.
        if (mu_.try_lock()) {
            progress_locked();
            mu_.unlock();
        }
        if (r->state.load(std::memory_order_acquire) != Request::kDone)
            return error_.load(std::memory_order_acquire);
    }
    if (sizes != nullptr) {
        if (r->is_send) sizes[0] = static_cast<int>(r->size);
        else
            for (int i = 0; i < r->n; ++i) sizes[i] = static_cast<int>(r->msg_size[i]);
    }
    *done = 1;
    r->state.store(Request::kFree, std::memory_order_release);
    return 0;
}

int Comm::attach() noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    for (size_t i = 0; i < nfds(); ++i) {
        int rc = ProgressEngine::instance().add(fd(i), this);
        if (rc != 0) {
            for (size_t k = 0; k < i; ++k) ProgressEngine::instance().remove(fd(k));
            return rc;
        }
    }
    return 0;
}

void Comm::detach() noexcept
{
    {
        std::lock_guard<std::mutex> g(mu_);
        detached_ = true;
        for (size_t i = 0; i < nfds(); ++i) ProgressEngine::instance().remove(fd(i));
    }
    ProgressEngine::instance().quiesce();
}

void Comm::on_ready() noexcept
{
    std::lock_guard<std::mutex> g(mu_);
    if (!detached_) progress_locked();
}

void Comm::fail_locked(int err, const std::string &what) noexcept
{
    if (error_.load(std::memory_order_relaxed) != 0) return;
    error_.store(err, std::memory_order_release);
    VLOG_WARN("connection failed, no path left: %s (%s); pending requests fail", what.c_str(),
              strerror(-err));
}

// ---- SendComm ---------------------------------------------------------------------------

SendComm::SendComm(std::unique_ptr<SendPath> path) : path_(std::move(path)) {}

int SendComm::isend(const void *data, size_t size, int tag, Request **out) noexcept
{
    *out = nullptr;
    std::lock_guard<std::mutex> g(mu_);
    if (int e = error_.load(std::memory_order_relaxed)) return e;
    if (peer_closed_) {
        fail_locked(-ECONNRESET, path_->describe() + ": isend after the peer closed the connection");
        return error_.load(std::memory_order_relaxed);
    }
    if (size > kMaxMessageBytes) {
        VLOG_WARN("isend of %zu bytes exceeds the %llu-byte message limit (%s)", size,
                  static_cast<unsigned long long>(kMaxMessageBytes), path_->describe().c_str());
        return -EMSGSIZE;
    }
    if (next_seq_ - acked_ >= kMaxInflight) return 0;
    Request &r = reqs_[next_seq_ % kMaxInflight];
    if (r.state.load(std::memory_order_acquire) != Request::kFree) return 0; // not tested yet
    r.is_send = true;
    r.comm = this;
    r.seq = next_seq_;
    r.size = size;
    r.state.store(Request::kPending, std::memory_order_relaxed);
    path_->post(OutMessage{next_seq_, tag, static_cast<const uint8_t *>(data), size});
    ++next_seq_;
    progress_locked();
    *out = &r;
    return 0;
}

void SendComm::progress_locked() noexcept
{
    uint64_t ack = acked_;
    PathStatus st = path_->progress(&ack);
    if (ack > next_seq_) {
        fail_locked(-EPROTO, path_->describe() + ": ack for seq " + std::to_string(ack) +
                                 " beyond the last sent " + std::to_string(next_seq_));
        return;
    }
    for (uint64_t s = acked_; s < ack; ++s)
        reqs_[s % kMaxInflight].state.store(Request::kDone, std::memory_order_release);
    acked_ = ack;
    if (st.error != 0) {
        fail_locked(st.error, path_->describe() + ": " + st.detail);
    } else if (st.peer_closed && !peer_closed_) {
        // An orderly close with nothing outstanding is the peer's closeRecv; it only becomes an
        // error if we still owe or later post a send.
        peer_closed_ = true;
        if (acked_ < next_seq_)
            fail_locked(-ECONNRESET, path_->describe() + ": peer closed the connection with " +
                                         std::to_string(next_seq_ - acked_) +
                                         " sends unacknowledged");
    }
}

// ---- RecvComm ---------------------------------------------------------------------------

RecvComm::RecvComm(std::unique_ptr<RecvPath> path) : path_(std::move(path)) {}

int RecvComm::irecv(int n, void *const *data, const size_t *sizes, const int *tags,
                    Request **out) noexcept
{
    *out = nullptr;
    if (n < 1 || n > kMaxRecvs) {
        VLOG_WARN("irecv with %d buffers; 1..%d supported", n, kMaxRecvs);
        return -EINVAL;
    }
    std::lock_guard<std::mutex> g(mu_);
    if (int e = error_.load(std::memory_order_relaxed)) return e;
    if (peer_closed_) {
        fail_locked(-ECONNRESET, path_->describe() + ": irecv after the peer closed the connection");
        return error_.load(std::memory_order_relaxed);
    }
    if (next_post_seq_ + static_cast<uint64_t>(n) - floor_ > kMaxInflight) return 0;
    Request *r = nullptr;
    for (Request &c : reqs_) {
        if (c.state.load(std::memory_order_acquire) == Request::kFree) {
            r = &c;
            break;
        }
    }
    if (r == nullptr) return 0;
    r->is_send = false;
    r->comm = this;
    r->seq = next_post_seq_;
    r->n = n;
    r->remaining = n;
    for (int i = 0; i < n; ++i) {
        r->data[i] = static_cast<uint8_t *>(data[i]);
        r->capacity[i] = sizes[i];
        r->tags[i] = tags[i];
        r->msg_size[i] = 0;
        r->bound[i] = false;
        slots_[(next_post_seq_ + static_cast<uint64_t>(i)) % kMaxInflight] = Slot{r, -1, 0, false};
    }
    next_post_seq_ += static_cast<uint64_t>(n);
    r->state.store(Request::kPending, std::memory_order_relaxed);
    progress_locked();
    *out = r;
    return 0;
}

void RecvComm::progress_locked() noexcept
{
    PathStatus st = path_->progress(*this);
    if (st.error != 0) {
        fail_locked(st.error, path_->describe() + ": " + st.detail);
    } else if (st.peer_closed && !peer_closed_) {
        peer_closed_ = true;
        if (next_post_seq_ > floor_)
            fail_locked(-ECONNRESET, path_->describe() + ": peer closed the connection with " +
                                         std::to_string(next_post_seq_ - floor_) +
                                         " receives outstanding");
    }
}

Placement RecvComm::locate(uint32_t /*gen*/, uint64_t seq, int32_t tag, uint64_t size)
{
    Placement p;
    if (seq < floor_) return p.kind = Placement::kDiscard, p; // replay of a completed message
    if (seq - floor_ >= kMaxInflight) {
        p.kind = Placement::kError;
        p.error = -EPROTO;
        return p;
    }
    if (seq >= next_post_seq_) return p; // kNotPosted
    Slot &s = slots_[seq % kMaxInflight];
    if (s.complete) return p.kind = Placement::kDiscard, p;
    Request *r = s.req;
    if (s.buf < 0) {
        // Bind in sequence order: every earlier message of this irecv must be bound first.
        int nbound = 0;
        for (int i = 0; i < r->n; ++i) nbound += r->bound[i] ? 1 : 0;
        if (seq - r->seq != static_cast<uint64_t>(nbound)) return p; // wait (kNotPosted)
        int pick = -1;
        for (int i = 0; i < r->n && pick < 0; ++i)
            if (!r->bound[i] && r->tags[i] == tag) pick = i;
        if (pick < 0) {
            p.kind = Placement::kError;
            p.error = -EPROTO;
            return p;
        }
        if (size > r->capacity[pick]) {
            p.kind = Placement::kError;
            p.error = -EMSGSIZE;
            return p;
        }
        r->bound[pick] = true;
        r->msg_size[pick] = size;
        s.buf = pick;
    } else if (r->tags[s.buf] != tag || r->msg_size[s.buf] != size) {
        p.kind = Placement::kError;
        p.error = -EPROTO;
        return p;
    }
    p.kind = Placement::kPlace;
    p.dest = r->data[s.buf];
    return p;
}

int RecvComm::landed(uint64_t seq, uint64_t len)
{
    Slot &s = slots_[seq % kMaxInflight];
    Request *r = s.req;
    s.got += len;
    if (s.got > r->msg_size[s.buf]) return -EPROTO;
    if (s.got < r->msg_size[s.buf]) return 0;
    s.complete = true;
    if (--r->remaining == 0) r->state.store(Request::kDone, std::memory_order_release);
    const uint64_t old = floor_;
    while (floor_ < next_post_seq_ && slots_[floor_ % kMaxInflight].complete)
        slots_[floor_++ % kMaxInflight] = Slot{};
    if (floor_ != old) path_->ack(floor_);
    return 0;
}

} // namespace vigil::net
