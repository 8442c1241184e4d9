// SPDX-License-Identifier: Apache-2.0
// The sending half of a TCP path: pieces cut into chunks dealt over the streams, each behind a
// FrameHeader; control frames on stream 0; the back channel (acks, CTS groups, failover
// requests, goodbye) read from stream 0.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "clock.h"
#include "stream_io.h"
#include "tcp_path.h"

namespace vigil::net::tcp {
namespace {

constexpr int kMaxIov = 64;                 // iovecs per sendmsg (32 frames)
constexpr size_t kGatherBytes = 256 * 1024; // stop gathering small frames beyond this

} // namespace

TcpSendPath::TcpSendPath(std::vector<UniqueFd> fds, PathIdentity id, size_t chunk_bytes)
    : id_(std::move(id)), chunk_(chunk_bytes), last_pass_ns_(now_ns())
{
    streams_.resize(fds.size());
    for (size_t i = 0; i < fds.size(); ++i) {
        streams_[i].fd = std::move(fds[i]);
        streams_[i].index = static_cast<uint32_t>(i);
    }
    want_rx_timestamps(streams_[0].fd.get()); // the back channel: when acks arrived
}

TcpSendPath::~TcpSendPath()
{
    for (Stream &s : streams_) s.fd.close_orderly();
}

void TcpSendPath::control(FrameHeader::Kind kind, uint64_t seq, uint8_t entry, uint64_t path)
{
    // Written only between frames of stream 0 (pump_control), so the stream stays a sequence
    // of whole frames.
    if (ctl_len_ + FrameHeader::kSize > ctl_.size()) return;
    FrameHeader h;
    h.kind = kind;
    h.gen = gen_;
    h.seq = seq;
    h.entry = entry;
    h.path = path;
    h.encode(ctl_.data() + ctl_len_);
    ctl_len_ += FrameHeader::kSize;
}

void TcpSendPath::begin(uint64_t first_seq, uint32_t gen, int abandoned, uint64_t abandoned_id)
{
    // A stream in the middle of a frame finishes it (its tail), so the stream stays a sequence
    // of whole frames; everything else posted before is the old generation's and is dropped.
    for (Stream &s : streams_) {
        if (s.cur.written != 0 && seek(s.index, &s.cur)) {
            FrameHeader h;
            const uint8_t *payload = nullptr;
            frame(s.cur, &h, &payload);
            h.encode(s.tail.hdr.data());
            s.tail.payload = payload;
            s.tail.len = h.len;
            s.tail.written = s.cur.written;
            s.tail.seq = h.seq;
            s.tail.active = true;
        }
        s.cur = Cursor{end_idx_, 0, false, 0};
    }
    next_first_ = 0;
    gen_ = gen;
    control(FrameHeader::kGeneration, first_seq,
            abandoned >= 0 ? static_cast<uint8_t>(abandoned) : FrameHeader::kNoSlot, abandoned_id);
    PathStatus ignored; // errors show on the next progress()
    pump(streams_[0], &ignored);
}

bool TcpSendPath::idle() const
{
    if (ctl_off_ != ctl_len_) return false;
    for (const Stream &s : streams_) {
        Cursor c = s.cur;
        if (s.tail.active || seek(s.index, &c)) return false;
    }
    return true;
}

uint64_t TcpSendPath::oldest_referenced() const
{
    uint64_t oldest = ~0ull;
    for (const Stream &s : streams_) {
        if (s.tail.active) oldest = std::min(oldest, s.tail.seq);
        Cursor c = s.cur;
        if (seek(s.index, &c)) oldest = std::min(oldest, at(c.idx).m.seq);
    }
    return oldest;
}

bool TcpSendPath::can_post(uint64_t limit) const
{
    uint64_t lowest = end_idx_;
    for (const Stream &s : streams_) {
        Cursor c = s.cur;
        lowest = std::min(lowest, seek(s.index, &c) ? c.idx : end_idx_);
    }
    if (end_idx_ - lowest >= kFifo) return false;
    // Few pieces: the core posts only while this stays small.
    uint64_t queued = 0;
    for (uint64_t i = lowest; i < end_idx_; ++i) queued += at(i).m.length;
    if (queued >= limit) return false;
    if (!unsent_fresh_) { // what the sockets hold unsent: one system call a stream, once a pass
        unsent_ = 0;
        for (const Stream &s : streams_) {
            int n = 0;
            if (ioctl(s.fd.get(), SIOCOUTQNSD, &n) == 0 && n > 0) unsent_ += static_cast<uint64_t>(n);
        }
        unsent_fresh_ = true;
    }
    return queued + unsent_ < limit;
}

void TcpSendPath::skip_to(uint64_t seq)
{
    for (Stream &s : streams_) {
        if (s.cur.written != 0) continue;
        while (s.cur.idx < end_idx_ && at(s.cur.idx).m.seq < seq) {
            ++s.cur.idx;
            s.cur.chunk_set = false;
        }
    }
}

void TcpSendPath::probe()
{
    if (!idle()) return;
    control(FrameHeader::kProbe, 0, 0);
    PathStatus ignored; // errors show on the next progress()
    pump(streams_[0], &ignored);
}

void TcpSendPath::goodbye()
{
    control(FrameHeader::kGoodbye, 0, 0);
    PathStatus ignored; // best effort: the streams close right after
    pump(streams_[0], &ignored);
}

void TcpSendPath::sabotage()
{
    for (Stream &s : streams_) shutdown(s.fd.get(), SHUT_RDWR);
}

bool TcpSendPath::make_room()
{
    uint64_t lowest = end_idx_;
    for (const Stream &s : streams_) lowest = std::min(lowest, s.cur.idx);
    if (end_idx_ - lowest < fifo_.size()) return true;
    // Each stream's cursor moves past what it sent (as its next pump would), so none refers
    // to a piece below `lowest`, which stays behind.
    lowest = end_idx_;
    for (Stream &s : streams_) {
        seek(s.index, &s.cur);
        lowest = std::min(lowest, s.cur.idx);
    }
    return end_idx_ - lowest < fifo_.size() || fifo_.grow(lowest, end_idx_, kMaxFifo);
}

void TcpSendPath::post(const OutMessage &m)
{
    if (post_error_ != 0) return; // the path has failed: progress() says so
    if (!make_room()) {
        // Never reached by what the core posts (kMaxFifo); out of memory, the path fails and
        // the connection replays what it carried on another.
        post_error_ = -ENOMEM;
        return;
    }
    Msg &d = at(end_idx_);
    d.m = m;
    d.nchunks = m.length == 0 ? 1 : (m.length + chunk_ - 1) / chunk_;
    d.first_stream = next_first_;
    // Continue the deal where this piece stops, so small messages spread over streams.
    next_first_ = static_cast<uint32_t>((next_first_ + d.nchunks) % streams_.size());
    ++end_idx_;
}

bool TcpSendPath::seek(uint32_t stream, Cursor *c) const
{
    const uint64_t n = streams_.size();
    while (c->idx < end_idx_) {
        const Msg &d = at(c->idx);
        if (!c->chunk_set) {
            c->chunk = (stream + n - d.first_stream) % n;
            c->chunk_set = true;
            c->written = 0;
        }
        if (c->chunk < d.nchunks) return true;
        ++c->idx;
        c->chunk_set = false;
    }
    return false;
}

void TcpSendPath::frame(const Cursor &c, FrameHeader *h, const uint8_t **payload) const
{
    const Msg &d = at(c.idx);
    const uint64_t at = c.chunk * chunk_; // within the piece
    h->kind = FrameHeader::kData;
    h->entry = static_cast<uint8_t>(d.m.entry);
    h->gen = gen_;
    h->seq = d.m.seq;
    h->size = static_cast<uint32_t>(d.m.size);
    h->offset = static_cast<uint32_t>(d.m.offset + at);
    h->len = static_cast<uint32_t>(std::min<uint64_t>(chunk_, d.m.length - at));
    h->tag = d.m.tag;
    *payload = d.m.data + h->offset;
}

int TcpSendPath::pump_tail(Stream &s, PathStatus *st)
{
    Tail &t = s.tail;
    while (t.active) {
        iovec iov[2];
        int niov = 0;
        size_t skip = t.written;
        if (skip < FrameHeader::kSize) {
            iov[niov++] = {t.hdr.data() + skip, FrameHeader::kSize - skip};
            skip = 0;
        } else {
            skip -= FrameHeader::kSize;
        }
        if (t.len > skip) iov[niov++] = {const_cast<uint8_t *>(t.payload) + skip, t.len - skip};
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = static_cast<size_t>(niov);
        const ssize_t n = sendmsg(s.fd.get(), &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
            if (errno == EINTR) continue;
            fail(st, -errno, errno_detail("stream send failed", errno));
            return st->error;
        }
        t.written += static_cast<size_t>(n);
        if (t.written == FrameHeader::kSize + t.len) t.active = false;
    }
    return 0;
}

int TcpSendPath::pump_control(Stream &s, PathStatus *st)
{
    while (s.index == 0 && !s.tail.active && s.cur.written == 0 && ctl_off_ < ctl_len_) {
        ssize_t n = send(s.fd.get(), ctl_.data() + ctl_off_, ctl_len_ - ctl_off_, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            ctl_off_ += static_cast<size_t>(n);
            if (ctl_off_ == ctl_len_) ctl_off_ = ctl_len_ = 0;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return 0;
        } else if (n < 0 && errno != EINTR) {
            fail(st, -errno, errno_detail("control frame send failed", errno));
            return st->error;
        }
    }
    return 0;
}

int TcpSendPath::pump(Stream &s, PathStatus *st)
{
    const uint32_t nstreams = static_cast<uint32_t>(streams_.size());
    if (int e = pump_tail(s, st)) return e;
    if (s.tail.active) return 0; // socket full
    for (;;) {
        // Control frames go out between data frames of stream 0, before the next one.
        if (int e = pump_control(s, st)) return e;
        if (s.index == 0 && ctl_off_ < ctl_len_ && s.cur.written == 0) return 0; // socket full
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
            fail(st, -errno, errno_detail("stream send failed", errno));
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

ssize_t TcpSendPath::recv_back(uint8_t *to, size_t n)
{
    return recv_stamped(streams_[0].fd.get(), to, n, &back_rx_ns_);
}

void TcpSendPath::read_back(SendSink &sink, PathStatus *st)
{
    for (;;) {
        BackHeader h;
        const size_t have = back_hi_ - back_lo_;
        size_t want = BackHeader::kSize; // the header, then the whole message it announces
        if (have >= want) {
            if (const char *bad = h.decode(back_.data() + back_lo_)) {
                fail(st, -EPROTO, std::string("back channel from the receiver: ") + bad, true);
                return;
            }
            want += h.payload();
        }
        if (have < want) {
            if (back_lo_ > 0) {
                std::memmove(back_.data(), back_.data() + back_lo_, have);
                back_lo_ = 0;
                back_hi_ = have;
            }
            ssize_t n = recv_back(back_.data() + back_hi_, back_.size() - back_hi_);
            if (n > 0) {
                back_hi_ += static_cast<size_t>(n);
                continue;
            }
            if (n == 0) {
                if (!goodbye_seen_)
                    fail(st, -ECONNRESET, "the receiver closed the path without a goodbye");
                st->peer_eof = !goodbye_seen_;
                return;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            if (errno == EINTR) continue;
            fail(st, -errno, errno_detail("back channel receive failed", errno));
            return;
        }
        // One whole message at back_lo_.
        const uint8_t *msg = back_.data() + back_lo_;
        back_lo_ += want;
        if (back_lo_ == back_hi_) back_lo_ = back_hi_ = 0;
        st->heard = true;
        if (!on_back(h, msg, sink, st)) return;
    }
}

bool TcpSendPath::on_back(const BackHeader &h, const uint8_t *msg, SendSink &sink, PathStatus *st)
{
    switch (h.kind) {
    case BackHeader::kAck:
        sink.acked(h.value); // acks of any generation are true statements
        // Wait time of the newest ack: the receiver's ack delay, plus how long the ack has sat
        // unread here (measured once, in progress()). A heartbeat repeats an ack without its
        // delay: the first copy read dates it, the largest delay counts.
        if (h.value != st->wait_ack || ack_rx_ns_ == 0) {
            st->wait_ack = h.value;
            st->wait_ns = 0;
            ack_rx_ns_ = back_rx_ns_;
        }
        st->wait_ns = std::max<uint64_t>(st->wait_ns, static_cast<uint64_t>(h.delay_us) * 1000);
        st->wait_stalled_ns = st->wait_ns;
        return true;
    case BackHeader::kLanded: {
        // How much longer than its floor the report took on the way back (the receiver's own
        // outgoing data queued ahead of it): its landings happened that much earlier.
        const uint64_t late =
            h.value == 0 ? 0
                         : return_delay_.sample(h.value, back_rx_ns_ != 0 ? back_rx_ns_ : realtime_ns(), now_ns());
        for (size_t k = 0; k < h.count; ++k) {
            const Landed l = decode_landed(msg + BackHeader::kSize, k);
            sink.landed(l.seq, l.bytes, l.gen, late);
        }
        return true;
    }
    case BackHeader::kFailoverRequest:
        st->failover_requested = true;
        st->failed_slot = h.arg;
        return true;
    case BackHeader::kGoodbye:
        goodbye_seen_ = true;
        st->peer_closed = true;
        return false;
    case BackHeader::kCts: {
        CtsGroup g;
        if (const char *bad = decode_cts(h, msg + BackHeader::kSize, &g)) {
            fail(st, -EPROTO, std::string("the receiver's CTS: ") + bad, true);
            return false;
        }
        if (sink.cts(g) != 0) {
            fail(st, -EPROTO, "the receiver's CTS group " + std::to_string(g.index) +
                                  " contradicts the protocol", true);
            return false;
        }
        return true;
    }
    default:
        return true; // decode() admits no other kind
    }
}

PathStatus TcpSendPath::progress(SendSink &sink)
{
    PathStatus st;
    if (post_error_ != 0) {
        st.error = post_error_;
        st.detail = "could not queue a piece: the FIFO is full at " +
                    std::to_string(fifo_.size()) + " pieces, or memory ran out";
        return st;
    }
    unsent_fresh_ = false; // the sockets' queues move now
    for (Stream &s : streams_)
        if (pump(s, &st) != 0) return st;
    ack_rx_ns_ = 0;
    read_back(sink, &st);
    if (ack_rx_ns_ != 0) st.wait_ns += waited_ns(ack_rx_ns_, since(now_ns(), last_pass_ns_));
    last_pass_ns_ = now_ns();
    return st;
}
} // namespace vigil::net::tcp
