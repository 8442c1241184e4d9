// SPDX-License-Identifier: Apache-2.0
// TCP path data movement: chunking over streams, direct placement, cumulative acks.
#include "tcp_path.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/socket.h>
#include <sys/uio.h>

namespace vigil::net::tcp {
namespace {

constexpr int kMaxIov = 64;     // iovecs per sendmsg (32 frames)
constexpr size_t kGatherBytes = 256 * 1024; // stop gathering small frames beyond this

std::string errno_detail(const char *what, int err)
{
    return std::string(what) + ": " + strerror(err);
}

} // namespace

// ---- send -------------------------------------------------------------------------------

TcpSendPath::TcpSendPath(std::vector<UniqueFd> fds, int local_dev, uint32_t gen,
                         size_t chunk_bytes, std::string desc)
    : local_dev_(local_dev), gen_(gen), chunk_(chunk_bytes), desc_(std::move(desc))
{
    streams_.resize(fds.size());
    for (size_t i = 0; i < fds.size(); ++i) {
        streams_[i].fd = std::move(fds[i]);
        streams_[i].index = static_cast<uint32_t>(i);
    }
}

void TcpSendPath::begin(uint64_t first_seq, uint32_t gen)
{
    end_seq_ = first_seq;
    next_first_ = 0;
    gen_ = gen;
    for (Stream &s : streams_) s.cur = Cursor{first_seq, 0, false, 0};
}

bool TcpSendPath::idle() const
{
    if (probe_off_ != FrameHeader::kSize) return false;
    for (const Stream &s : streams_) {
        Cursor c = s.cur;
        if (seek(s.index, &c)) return false;
    }
    return true;
}

uint64_t TcpSendPath::oldest_referenced() const
{
    uint64_t oldest = ~0ull;
    for (const Stream &s : streams_) {
        Cursor c = s.cur;
        if (seek(s.index, &c)) oldest = std::min(oldest, c.seq);
    }
    return oldest;
}

void TcpSendPath::skip_to(uint64_t seq)
{
    for (Stream &s : streams_)
        if (s.cur.written == 0 && s.cur.seq < seq) s.cur = Cursor{std::min(seq, end_seq_), 0, false, 0};
}

void TcpSendPath::probe()
{
    if (!idle()) return;
    FrameHeader h;
    h.gen = gen_;
    h.seq = kProbeSeq;
    h.encode(probe_.data());
    probe_off_ = 0;
    PathStatus ignored;
    pump(streams_[0], &ignored); // errors show on the next progress()
}

TcpSendPath::~TcpSendPath()
{
    for (Stream &s : streams_) s.fd.close_orderly();
}

void TcpSendPath::sabotage()
{
    for (Stream &s : streams_) shutdown(s.fd.get(), SHUT_RDWR);
}

void TcpSendPath::post(const OutMessage &m)
{
    Msg &d = ring_[m.seq % kMaxInflight];
    d.m = m;
    d.nchunks = m.size == 0 ? 1 : (m.size + chunk_ - 1) / chunk_;
    d.first_stream = next_first_;
    // Continue the deal where this message stops, so small messages spread over streams.
    next_first_ = static_cast<uint32_t>((next_first_ + d.nchunks) % streams_.size());
    end_seq_ = m.seq + 1;
}

bool TcpSendPath::seek(uint32_t stream, Cursor *c) const
{
    const uint64_t n = streams_.size();
    while (c->seq < end_seq_) {
        const Msg &d = ring_[c->seq % kMaxInflight];
        if (!c->chunk_set) {
            c->chunk = (stream + n - d.first_stream) % n;
            c->chunk_set = true;
            c->written = 0;
        }
        if (c->chunk < d.nchunks) return true;
        ++c->seq;
        c->chunk_set = false;
    }
    return false;
}

void TcpSendPath::frame(const Cursor &c, FrameHeader *h, const uint8_t **payload) const
{
    const Msg &d = ring_[c.seq % kMaxInflight];
    h->gen = gen_;
    h->seq = d.m.seq;
    h->size = d.m.size;
    h->offset = c.chunk * chunk_;
    h->len = static_cast<uint32_t>(std::min<uint64_t>(chunk_, d.m.size - h->offset));
    h->tag = d.m.tag;
    *payload = d.m.data + h->offset;
}

int TcpSendPath::pump(Stream &s, PathStatus *st)
{
    const uint32_t nstreams = static_cast<uint32_t>(streams_.size());
    // A probe is only started between frames, so it finishes before stream 0 carries more.
    while (s.index == 0 && probe_off_ < FrameHeader::kSize) {
        ssize_t n = send(s.fd.get(), probe_.data() + probe_off_, FrameHeader::kSize - probe_off_,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            probe_off_ += static_cast<size_t>(n);
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else if (n < 0 && errno != EINTR) {
            st->error = -errno;
            st->detail = errno_detail("probe send failed", errno);
            return st->error;
        }
    }
    for (;;) {
        if (!seek(s.index, &s.cur)) return 0;
        // Gather the current frame (from where it stopped) and following small frames.
        iovec iov[kMaxIov];
        uint8_t hdrs[kMaxIov / 2][FrameHeader::kSize];
        int niov = 0;
        size_t total = 0;
        Cursor c = s.cur;
        // At most kMaxIov / 2 frames: one header each (an empty frame needs one iovec only).
        for (int f = 0; f < kMaxIov / 2 && niov + 2 <= kMaxIov && total < kGatherBytes; ++f) {
            if (f > 0 && !seek(s.index, &c)) break;
            FrameHeader h;
            const uint8_t *payload = nullptr;
            frame(c, &h, &payload);
            h.encode(hdrs[f]);
            size_t skip = c.written;
            if (skip < FrameHeader::kSize) {
                iov[niov++] = {hdrs[f] + skip, FrameHeader::kSize - skip};
                total += FrameHeader::kSize - skip;
                skip = 0;
            } else {
                skip -= FrameHeader::kSize;
            }
            if (h.len > skip) {
                iov[niov++] = {const_cast<uint8_t *>(payload) + skip, h.len - skip};
                total += h.len - skip;
            }
            c.chunk += nstreams;
            c.written = 0;
        }
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = static_cast<size_t>(niov);
        ssize_t n = sendmsg(s.fd.get(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            if (errno == EINTR) continue;
            st->error = -errno;
            st->detail = errno_detail("stream send failed", errno);
            return st->error;
        }
        // Advance the real cursor by n bytes across the gathered frames.
        size_t left = static_cast<size_t>(n);
        while (left > 0) {
            FrameHeader h;
            const uint8_t *payload = nullptr;
            frame(s.cur, &h, &payload);
            const size_t frame_left = FrameHeader::kSize + h.len - s.cur.written;
            if (left < frame_left) {
                s.cur.written += left;
                left = 0;
                break;
            }
            left -= frame_left;
            s.cur.chunk += nstreams;
            s.cur.written = 0;
            seek(s.index, &s.cur);
        }
        if (static_cast<size_t>(n) < total) return 0; // socket buffer full
        // A zero-length frame with nothing else gathered still advanced above; loop on.
    }
}

int TcpSendPath::read_acks(uint64_t *acked_seq, PathStatus *st)
{
    const int fd = streams_[0].fd.get();
    for (;;) {
        ssize_t n = recv(fd, ackbuf_.data() + ack_got_, ackbuf_.size() - ack_got_, MSG_DONTWAIT);
        if (n > 0) {
            ack_got_ += static_cast<size_t>(n);
            if (ack_got_ < ackbuf_.size()) continue;
            ack_got_ = 0;
            st->heard = true;
            if (get_le(ackbuf_.data(), 4) == FailoverRequest::kMagic) {
                st->failover_requested = true;
                st->failed_slot = static_cast<uint32_t>(get_le(ackbuf_.data() + 4, 4));
                continue;
            }
            // Acks of any generation are true statements about what the receiver holds.
            AckFrame a;
            if (!a.decode(ackbuf_.data())) {
                st->error = -EPROTO;
                st->detail = "malformed ack from the receiver";
                return st->error;
            }
            st->receiver_bound = (a.gen & AckFrame::kAppBound) != 0 ? 1 : 0;
            *acked_seq = std::max(*acked_seq, a.ack_seq);
            continue;
        }
        if (n == 0) {
            st->peer_closed = true;
            return 0;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        if (errno == EINTR) continue;
        st->error = -errno;
        st->detail = errno_detail("ack stream receive failed", errno);
        return st->error;
    }
}

PathStatus TcpSendPath::progress(uint64_t *acked_seq)
{
    PathStatus st;
    for (Stream &s : streams_)
        if (pump(s, &st) != 0) return st;
    read_acks(acked_seq, &st);
    return st;
}

// ---- receive ----------------------------------------------------------------------------

TcpRecvPath::TcpRecvPath(std::vector<UniqueFd> fds, int local_dev, std::string desc)
    : local_dev_(local_dev), desc_(std::move(desc))
{
    streams_.resize(fds.size());
    for (size_t i = 0; i < fds.size(); ++i) {
        streams_[i].fd = std::move(fds[i]);
        streams_[i].stage = std::make_unique<uint8_t[]>(kStageBytes);
    }
}

bool TcpRecvPath::pump(Stream &s, RecvSink &sink, PathStatus *st)
{
    bool moved = false;
    auto fail = [&](int err, std::string detail) {
        st->error = err;
        st->detail = std::move(detail);
        return moved;
    };
    for (;;) {
        if (s.state == Stream::kHeader) {
            if (s.hi - s.lo >= FrameHeader::kSize) {
                if (!s.have_header) {
                    const char *bad = s.h.decode(s.stage.get() + s.lo, kMaxMessageBytes);
                    if (bad != nullptr) return fail(-EPROTO, bad);
                    if (s.h.seq == kProbeSeq) {
                        if (s.h.size != 0) return fail(-EPROTO, "probe frame with a payload");
                        s.lo += FrameHeader::kSize;
                        moved = true;
                        continue;
                    }
                    s.have_header = true;
                }
                Placement p = sink.locate(s.h.gen, s.h.seq, s.h.tag, s.h.size);
                if (p.kind == Placement::kNotPosted) return moved;
                if (p.kind == Placement::kError)
                    return fail(p.error, "frame seq " + std::to_string(s.h.seq) + " tag " +
                                             std::to_string(s.h.tag) + " size " +
                                             std::to_string(s.h.size) +
                                             (p.error == -EMSGSIZE
                                                  ? " larger than the posted receive buffer"
                                                  : " matches no posted receive"));
                s.discard = p.kind == Placement::kDiscard;
                s.dest = s.discard || p.dest == nullptr ? nullptr : p.dest + s.h.offset;
                s.remaining = s.h.len;
                s.lo += FrameHeader::kSize;
                s.have_header = false;
                s.state = Stream::kPayload;
                moved = true;
            } else {
                if (s.eof) {
                    if (s.hi == s.lo) st->peer_closed = true;
                    else return fail(-ECONNRESET, "connection closed inside a frame header");
                    return moved;
                }
                if (s.lo > 0) {
                    std::memmove(s.stage.get(), s.stage.get() + s.lo, s.hi - s.lo);
                    s.hi -= s.lo;
                    s.lo = 0;
                }
                ssize_t n = recv(s.fd.get(), s.stage.get() + s.hi, kStageBytes - s.hi, MSG_DONTWAIT);
                if (n > 0) {
                    s.hi += static_cast<size_t>(n);
                    moved = true;
                    st->heard = true;
                    continue;
                }
                if (n == 0) {
                    s.eof = true;
                    continue;
                }
                if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
                if (errno == EINTR) continue;
                return fail(-errno, errno_detail("stream receive failed", errno));
            }
        }
        // kPayload
        if (s.remaining > 0 && !s.discard && !sink.still_wanted(s.h.gen, s.h.seq)) s.discard = true;
        if (s.remaining > 0) {
            if (s.hi > s.lo) {
                const size_t k = static_cast<size_t>(std::min<uint64_t>(s.hi - s.lo, s.remaining));
                if (!s.discard) {
                    std::memcpy(s.dest, s.stage.get() + s.lo, k);
                    s.dest += k;
                }
                s.lo += k;
                s.remaining -= k;
                moved = true;
            } else {
                if (s.eof) return fail(-ECONNRESET, "connection closed inside a frame payload");
                uint8_t *to;
                size_t want;
                s.lo = s.hi = 0;
                if (!s.discard && s.remaining >= kDirectBytes) {
                    to = s.dest;
                    want = static_cast<size_t>(s.remaining);
                } else {
                    to = s.stage.get();
                    want = kStageBytes;
                }
                ssize_t n = recv(s.fd.get(), to, want, MSG_DONTWAIT);
                if (n > 0) {
                    moved = true;
                    st->heard = true;
                    if (to == s.dest) {
                        s.dest += n;
                        s.remaining -= static_cast<uint64_t>(n);
                    } else {
                        s.hi = static_cast<size_t>(n);
                    }
                    if (s.remaining > 0) continue;
                } else if (n == 0) {
                    s.eof = true;
                    continue;
                } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
                    return moved;
                } else if (errno == EINTR) {
                    continue;
                } else {
                    return fail(-errno, errno_detail("stream receive failed", errno));
                }
            }
        }
        if (s.remaining == 0) {
            s.state = Stream::kHeader;
            moved = true;
            if (!s.discard) {
                if (int rc = sink.landed(s.h.seq, s.h.len, s.h.gen); rc != 0)
                    return fail(rc, "frame seq " + std::to_string(s.h.seq) +
                                        " carries more bytes than its message");
            }
        }
    }
}

void TcpRecvPath::set_app_bound(bool bound)
{
    if (bound == app_bound_) return;
    app_bound_ = bound;
    heartbeat_pending_ = true;
    PathStatus ignored; // errors show on the next progress()
    flush_ack(&ignored);
}

TcpRecvPath::~TcpRecvPath()
{
    for (Stream &s : streams_) s.fd.close_orderly();
}

void TcpRecvPath::sabotage()
{
    for (Stream &s : streams_) shutdown(s.fd.get(), SHUT_RDWR);
}

void TcpRecvPath::flush_ack(PathStatus *st)
{
    for (;;) {
        if (ackout_off_ == AckFrame::kSize) {
            if (failover_pending_) {
                put_le(ackout_.data(), FailoverRequest::kMagic, 4);
                put_le(ackout_.data() + 4, failover_slot_, 4);
                put_le(ackout_.data() + 8, sent_ack_, 8);
                failover_pending_ = false;
            } else if (pending_ack_ != sent_ack_ || heartbeat_pending_) {
                AckFrame{ack_gen_ | (app_bound_ ? AckFrame::kAppBound : 0u), pending_ack_}.encode(ackout_.data());
                sent_ack_ = pending_ack_;
                heartbeat_pending_ = false;
            } else {
                return;
            }
            ackout_off_ = 0;
        }
        ssize_t n = send(streams_[0].fd.get(), ackout_.data() + ackout_off_,
                         AckFrame::kSize - ackout_off_, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            ackout_off_ += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n < 0 && errno == EINTR) continue;
        st->error = n < 0 ? -errno : -ECONNRESET;
        st->detail = errno_detail("ack send failed", n < 0 ? errno : ECONNRESET);
        return;
    }
}

PathStatus TcpRecvPath::progress(RecvSink &sink)
{
    PathStatus st;
    // A stream can wait on a message whose binding depends on a frame of another stream
    // (multi-recv binds in sequence order), so sweep until a full pass moves nothing.
    for (bool moved = true; moved && st.error == 0;) {
        moved = false;
        for (Stream &s : streams_) {
            moved |= pump(s, sink, &st);
            if (st.error != 0) break;
        }
    }
    if (st.error == 0) flush_ack(&st);
    // peer_closed only counts when every stream has reached a frame boundary at EOF.
    if (st.peer_closed)
        for (const Stream &s : streams_)
            st.peer_closed = st.peer_closed && s.eof;
    return st;
}

} // namespace vigil::net::tcp
