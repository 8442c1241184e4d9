// SPDX-License-Identifier: Apache-2.0
// TCP path data movement: chunking over streams, control frames, direct placement, the back
// channel (acks, CTS groups, failover requests, goodbye).
#include "tcp_path.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "clock.h"

namespace vigil::net::tcp {
namespace {

constexpr int kMaxIov = 64;                 // iovecs per sendmsg (32 frames)
constexpr size_t kGatherBytes = 256 * 1024; // stop gathering small frames beyond this

std::string errno_detail(const char *what, int err)
{
    return std::string(what) + ": " + strerror(err);
}

void fail(PathStatus *st, int err, std::string detail, bool fatal = false)
{
    st->error = err;
    st->fatal = fatal;
    st->detail = std::move(detail);
}

// A receive on a data stream failed with `err`. ECONNRESET is the peer's socket closing with
// data of ours still unread, which a process killed mid-run does as often as it ends the
// stream: both are its end gone without a goodbye (PathStatus::peer_eof), so the receiving
// comm fails at once when every path ends so, instead of after the fatal timeout.
void lost_stream(PathStatus *st, int err)
{
    fail(st, -err, errno_detail("stream receive failed", err));
    st->peer_eof = err == ECONNRESET;
}

// Asks the kernel to timestamp what `fd` receives (SO_TIMESTAMPNS, CLOCK_REALTIME; TCP
// reports the newest segment a read consumed). Without it wait time is just not measured.
void want_rx_timestamps(int fd)
{
    const int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
}

// recv() that also raises *rx_ns to the arrival time of the newest byte it read (CLOCK_REALTIME
// ns) when the kernel tells it. The same one system call as recv().
ssize_t recv_stamped(int fd, uint8_t *to, size_t n, uint64_t *rx_ns)
{
    iovec iov{to, n};
    alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(timespec))];
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof(ctl);
    const ssize_t r = recvmsg(fd, &m, MSG_DONTWAIT);
    if (r <= 0) return r;
    for (cmsghdr *c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS ||
            c->cmsg_len < CMSG_LEN(sizeof(timespec)))
            continue;
        timespec ts;
        std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
        if (ts.tv_sec > 0)
            *rx_ns = std::max<uint64_t>(*rx_ns, static_cast<uint64_t>(ts.tv_sec) * 1000000000ull +
                                          static_cast<uint64_t>(ts.tv_nsec));
    }
    return r;
}

// How long data that arrived at `rx_ns` (CLOCK_REALTIME, 0: unknown) has waited by now, ns.
// At most `bound`: nothing read now arrived before the previous progress() emptied the socket,
// whatever the wall clock did meanwhile (a step makes the difference meaningless, not large).
uint64_t waited_ns(uint64_t rx_ns, uint64_t bound)
{
    if (rx_ns == 0) return 0;
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const uint64_t now =
        static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
    return now > rx_ns ? std::min(now - rx_ns, bound) : 0;
}

uint64_t elapsed_since(uint64_t t)
{
    const uint64_t now = now_ns();
    return now > t ? now - t : 0;
}

} // namespace

// ---- send -------------------------------------------------------------------------------

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
        if (seek(s.index, &c)) oldest = std::min(oldest, fifo_[c.idx % kFifo].m.seq);
    }
    return oldest;
}

bool TcpSendPath::can_post() const
{
    uint64_t lowest = end_idx_;
    for (const Stream &s : streams_) {
        Cursor c = s.cur;
        lowest = std::min(lowest, seek(s.index, &c) ? c.idx : end_idx_);
    }
    return end_idx_ - lowest < kFifo;
}

uint64_t TcpSendPath::backlog() const
{
    // Payload of the chunks no stream has started, over the pieces some stream still sends:
    // few, as the core posts pieces only while this stays small.
    uint64_t lowest = end_idx_;
    for (const Stream &s : streams_) {
        Cursor c = s.cur;
        if (seek(s.index, &c)) lowest = std::min(lowest, c.idx);
    }
    uint64_t bytes = 0;
    for (uint64_t i = lowest; i < end_idx_; ++i) bytes += fifo_[i % kFifo].m.length;
    return bytes;
}

uint64_t TcpSendPath::unsent() const
{
    uint64_t bytes = 0;
    for (const Stream &s : streams_) {
        int n = 0;
        if (ioctl(s.fd.get(), SIOCOUTQNSD, &n) == 0 && n > 0) bytes += static_cast<uint64_t>(n);
    }
    return bytes;
}

void TcpSendPath::skip_to(uint64_t seq)
{
    for (Stream &s : streams_) {
        if (s.cur.written != 0) continue;
        while (s.cur.idx < end_idx_ && fifo_[s.cur.idx % kFifo].m.seq < seq) {
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

void TcpSendPath::post(const OutMessage &m)
{
    Msg &d = fifo_[end_idx_ % kFifo];
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
        const Msg &d = fifo_[c->idx % kFifo];
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
    const Msg &d = fifo_[c.idx % kFifo];
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
    for (Stream &s : streams_)
        if (pump(s, &st) != 0) return st;
    ack_rx_ns_ = 0;
    read_back(sink, &st);
    if (ack_rx_ns_ != 0) st.wait_ns += waited_ns(ack_rx_ns_, elapsed_since(last_pass_ns_));
    last_pass_ns_ = now_ns();
    return st;
}

// ---- receive ----------------------------------------------------------------------------

TcpRecvPath::TcpRecvPath(std::vector<UniqueFd> fds, PathIdentity id)
    : id_(std::move(id)), last_pass_ns_(now_ns()), prev_pass_ns_(last_pass_ns_)
{
    streams_.resize(fds.size());
    for (size_t i = 0; i < fds.size(); ++i) {
        streams_[i].fd = std::move(fds[i]);
        streams_[i].stage = std::make_unique<uint8_t[]>(kStageBytes);
        want_rx_timestamps(streams_[i].fd.get());
    }
    out_.reserve(4096);
}

ssize_t TcpRecvPath::recv_stream(Stream &s, uint8_t *to, size_t n)
{
    return recv_stamped(s.fd.get(), to, n, &s.rx_ns);
}

TcpRecvPath::~TcpRecvPath()
{
    for (Stream &s : streams_) s.fd.close_orderly();
}

bool TcpRecvPath::on_header(Stream &s, RecvSink &sink, PathStatus *st)
{
    switch (s.h.kind) {
    case FrameHeader::kProbe:
        return true;
    case FrameHeader::kGoodbye:
        goodbye_seen_ = true;
        return true;
    case FrameHeader::kGeneration:
        // TCP needs no answer: this path discards whatever the receiver already holds.
        (void)sink.generation(s.h.gen, s.h.seq, s.h.entry == FrameHeader::kNoSlot ? -1 : s.h.entry, s.h.path);
        return true;
    default:
        break;
    }
    const Placement p = sink.locate(s.h.gen, s.h.seq, s.h.tag, s.h.size, s.h.entry);
    if (p.kind == Placement::kError) {
        fail(st, p.error,
             "frame seq " + std::to_string(s.h.seq) + " tag " + std::to_string(s.h.tag) + " size " +
                 std::to_string(s.h.size) + " for buffer " + std::to_string(s.h.entry) +
                 (p.error == -EMSGSIZE ? " larger than the posted receive buffer"
                                       : " matches no advertised receive"),
             true);
        return false;
    }
    s.discard = p.kind == Placement::kDiscard;
    s.dest = s.discard || p.dest == nullptr ? nullptr : p.dest + s.h.offset;
    s.remaining = s.h.len;
    s.state = Stream::kPayload;
    return true;
}

bool TcpRecvPath::pump(Stream &s, RecvSink &sink, PathStatus *st)
{
    bool moved = false;
    for (;;) {
        const Step r = s.state == Stream::kHeader ? read_header(s, sink, st, &moved)
                                                  : read_payload(s, sink, st, &moved);
        if (r == Step::kStop) return moved;
    }
}

TcpRecvPath::Step TcpRecvPath::after_recv_error(PathStatus *st, int err)
{
    if (err == EAGAIN || err == EWOULDBLOCK) return Step::kStop;
    if (err == EINTR) return Step::kMore;
    lost_stream(st, err);
    return Step::kStop;
}

TcpRecvPath::Step TcpRecvPath::read_header(Stream &s, RecvSink &sink, PathStatus *st, bool *moved)
{
    if (s.hi - s.lo >= FrameHeader::kSize) {
        if (const char *bad = s.h.decode(s.stage.get() + s.lo, kMaxMessageBytes)) {
            fail(st, -EPROTO, bad, true);
            return Step::kStop;
        }
        s.lo += FrameHeader::kSize;
        *moved = true;
        return on_header(s, sink, st) ? Step::kMore : Step::kStop;
    }
    if (s.eof) {
        if (s.hi != s.lo) fail(st, -ECONNRESET, "connection closed inside a frame header");
        return Step::kStop;
    }
    if (s.lo > 0) {
        std::memmove(s.stage.get(), s.stage.get() + s.lo, s.hi - s.lo);
        s.hi -= s.lo;
        s.lo = 0;
    }
    const ssize_t n = recv_stream(s, s.stage.get() + s.hi, kStageBytes - s.hi);
    if (n > 0) {
        s.hi += static_cast<size_t>(n);
        *moved = true;
        st->heard = true;
        return Step::kMore;
    }
    if (n == 0) {
        s.eof = true;
        return Step::kMore;
    }
    return after_recv_error(st, errno);
}

TcpRecvPath::Step TcpRecvPath::read_payload(Stream &s, RecvSink &sink, PathStatus *st, bool *moved)
{
    if (s.remaining == 0) return end_frame(s, sink, st, moved);
    // Ask before every write: a newer generation or a completed message turns the rest of
    // the frame into a discard (invariant 2).
    if (!s.discard && !sink.still_wanted(s.h.gen, s.h.seq)) s.discard = true;
    if (s.hi > s.lo) {
        const size_t k = static_cast<size_t>(std::min<uint64_t>(s.hi - s.lo, s.remaining));
        if (!s.discard) {
            std::memcpy(s.dest, s.stage.get() + s.lo, k);
            s.dest += k;
        }
        s.lo += k;
        s.remaining -= k;
        *moved = true;
        return Step::kMore;
    }
    if (s.eof) {
        fail(st, -ECONNRESET, "connection closed inside a frame payload");
        return Step::kStop;
    }
    // Large remainders go straight into the receive buffer; small ones (and discards) through
    // the staging buffer, which may also take the next headers.
    s.lo = s.hi = 0;
    const bool direct = !s.discard && s.remaining >= kDirectBytes;
    uint8_t *to = direct ? s.dest : s.stage.get();
    const size_t want = direct ? static_cast<size_t>(s.remaining) : kStageBytes;
    const ssize_t n = recv_stream(s, to, want);
    if (n > 0) {
        *moved = true;
        st->heard = true;
        if (direct) {
            s.dest += n;
            s.remaining -= static_cast<uint64_t>(n);
        } else {
            s.hi = static_cast<size_t>(n);
        }
        return Step::kMore;
    }
    if (n == 0) {
        s.eof = true;
        return Step::kMore;
    }
    return after_recv_error(st, errno);
}

TcpRecvPath::Step TcpRecvPath::end_frame(Stream &s, RecvSink &sink, PathStatus *st, bool *moved)
{
    s.state = Stream::kHeader;
    *moved = true;
    if (s.discard) return Step::kMore;
    // Only payload that lands dates the ack delay (not probes, not discards): at most this
    // stream's newest read, which can only make the delay shorter.
    newest_rx_ns_ = std::max(newest_rx_ns_, s.rx_ns);
    if (int rc = sink.landed(s.h.seq, s.h.len, s.h.gen); rc != 0) {
        fail(st, rc, "frame seq " + std::to_string(s.h.seq) + " carries more bytes than its message", true);
        return Step::kStop;
    }
    return Step::kMore;
}

void TcpRecvPath::queue_back(const BackHeader &h, const uint8_t *payload, size_t n)
{
    if (out_.size() - out_off_ + BackHeader::kSize + n > kMaxBackQueue) {
        out_overflow_ = true;
        return;
    }
    const size_t at = out_.size();
    out_.resize(at + BackHeader::kSize + n);
    h.encode(out_.data() + at);
    if (n > 0) std::memcpy(out_.data() + at + BackHeader::kSize, payload, n);
}

void TcpRecvPath::advertise(const CtsGroup &g)
{
    std::array<uint8_t, BackHeader::kMaxBytes - BackHeader::kSize> p;
    BackHeader h;
    encode_cts(g, &h, p.data());
    queue_back(h, p.data(), h.payload());
    PathStatus ignored; // errors show on the next progress()
    flush_back(&ignored);
}

void TcpRecvPath::ack(uint64_t ack_seq, uint32_t gen)
{
    pending_ack_ = ack_seq;
    ack_gen_ = gen;
    PathStatus ignored; // errors show on the next progress()
    flush_back(&ignored);
}

void TcpRecvPath::request_failover(uint32_t failed_slot)
{
    BackHeader h;
    h.kind = BackHeader::kFailoverRequest;
    h.arg = failed_slot;
    queue_back(h, nullptr, 0);
    PathStatus ignored;
    flush_back(&ignored);
}

void TcpRecvPath::goodbye()
{
    BackHeader h;
    h.kind = BackHeader::kGoodbye;
    queue_back(h, nullptr, 0);
    PathStatus ignored; // best effort: the streams close right after
    flush_back(&ignored);
}

void TcpRecvPath::fence(RecvSink & /*sink*/)
{
    for (Stream &s : streams_) shutdown(s.fd.get(), SHUT_RDWR);
}

void TcpRecvPath::sabotage()
{
    for (Stream &s : streams_) shutdown(s.fd.get(), SHUT_RDWR);
}

void TcpRecvPath::flush_back(PathStatus *st)
{
    if (out_overflow_) {
        fail(st, -ENOBUFS, "the sender stopped reading the back channel");
        return;
    }
    if (pending_ack_ != sent_ack_ || heartbeat_pending_) {
        BackHeader h;
        h.kind = BackHeader::kAck;
        h.arg = ack_gen_;
        h.value = pending_ack_;
        if (pending_ack_ != sent_ack_) {
            // The ack delay: how long the newest bytes read since the last ack waited for us.
            // Bounded by the pass before the one that read the bytes: the ack goes out after
            // that pass ended (RecvComm acks once progress() returned).
            const uint64_t waited = waited_ns(newest_rx_ns_, elapsed_since(prev_pass_ns_));
            h.delay_us = static_cast<uint32_t>(std::min<uint64_t>(waited / 1000, UINT32_MAX));
            newest_rx_ns_ = 0;
        }
        queue_back(h, nullptr, 0);
        sent_ack_ = pending_ack_;
        heartbeat_pending_ = false;
    }
    while (out_off_ < out_.size()) {
        ssize_t n = send(streams_[0].fd.get(), out_.data() + out_off_, out_.size() - out_off_,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            out_off_ += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n < 0 && errno == EINTR) continue;
        fail(st, n < 0 ? -errno : -ECONNRESET, errno_detail("back channel send failed", n < 0 ? errno : ECONNRESET));
        return;
    }
    out_.clear();
    out_off_ = 0;
}

PathStatus TcpRecvPath::progress(RecvSink &sink)
{
    PathStatus st;
    // Sweep until a full pass moves nothing: a frame on one stream may be waiting on the
    // sink's state that a frame on another stream changes (a newer generation).
    for (bool moved = true; moved && st.error == 0;) {
        moved = false;
        for (Stream &s : streams_) {
            moved |= pump(s, sink, &st);
            if (st.error != 0) break;
        }
    }
    if (st.error == 0) flush_back(&st);
    prev_pass_ns_ = last_pass_ns_;
    last_pass_ns_ = now_ns();
    if (st.error != 0) return st;
    // Stream 0 carries the goodbye: at its end without one, the peer vanished; with one, the
    // path ends in order once every stream has ended.
    if (streams_[0].eof && streams_[0].hi == streams_[0].lo && streams_[0].state == Stream::kHeader) {
        if (!goodbye_seen_) {
            fail(&st, -ECONNRESET, "the sender closed the path without a goodbye");
            st.peer_eof = true;
            return st;
        }
        bool all = true;
        for (const Stream &s : streams_) all = all && s.eof;
        st.peer_closed = all;
    }
    return st;
}

} // namespace vigil::net::tcp
