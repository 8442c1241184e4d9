// SPDX-License-Identifier: Apache-2.0
// The receiving half of a TCP path: frame headers and payloads read from every stream and
// placed straight into the posted buffers; the back channel (acks, CTS groups, failover
// requests, goodbye) written on stream 0.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/socket.h>

#include "clock.h"
#include "stream_io.h"
#include "tcp_path.h"

namespace vigil::net::tcp {

TcpRecvPath::TcpRecvPath(std::vector<UniqueFd> fds, PathIdentity id)
    : id_(std::move(id)), last_pass_ns_(now_ns()), prev_pass_ns_(last_pass_ns_)
{
    streams_.resize(fds.size());
    for (size_t i = 0; i < fds.size(); ++i) {
        streams_[i].fd = std::move(fds[i]);
        want_rx_timestamps(streams_[i].fd.get());
    }
    out_.reserve(4096);
}

uint8_t *TcpRecvPath::stage_of(Stream &s)
{
    if (s.cap == 0) {
        s.stage = std::make_unique<uint8_t[]>(kSmallStageBytes);
        s.cap = kSmallStageBytes;
    }
    return s.stage.get();
}

void TcpRecvPath::grow_stage(Stream &s)
{
    if (s.cap >= kStageBytes || ++s.full_reads < kGrowAfter) return;
    auto big = std::make_unique<uint8_t[]>(kStageBytes);
    std::memcpy(big.get(), s.stage.get() + s.lo, s.hi - s.lo);
    s.hi -= s.lo;
    s.lo = 0;
    s.stage = std::move(big);
    s.cap = kStageBytes;
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
        // A read that filled the stage and began with a small frame: small frames stream
        // here, and a larger stage saves reads (a large frame's payload goes direct anyway).
        if (s.filled && s.h.len < kDirectBytes) grow_stage(s);
        s.filled = false;
        *moved = true;
        return on_header(s, sink, st) ? Step::kMore : Step::kStop;
    }
    if (s.eof) {
        if (s.hi != s.lo) fail(st, -ECONNRESET, "connection closed inside a frame header");
        return Step::kStop;
    }
    uint8_t *stage = stage_of(s);
    if (s.lo > 0) {
        std::memmove(stage, stage + s.lo, s.hi - s.lo);
        s.hi -= s.lo;
        s.lo = 0;
    }
    const size_t want = s.cap - s.hi;
    const ssize_t n = recv_stream(s, stage + s.hi, want);
    if (n > 0) {
        s.hi += static_cast<size_t>(n);
        s.filled = static_cast<size_t>(n) == want;
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
    uint8_t *to = direct ? s.dest : stage_of(s);
    const size_t want = direct ? static_cast<size_t>(s.remaining) : s.cap;
    const ssize_t n = recv_stream(s, to, want);
    if (n > 0) {
        *moved = true;
        st->heard = true;
        if (direct) {
            s.dest += n;
            s.remaining -= static_cast<uint64_t>(n);
        } else {
            s.hi = static_cast<size_t>(n);
            // A small remainder whose read filled the stage: small frames follow it.
            if (static_cast<size_t>(n) == want) grow_stage(s);
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
    const int rc = sink.landed(s.h.seq, s.h.len, s.h.gen);
    if (rc < 0) {
        fail(st, rc, "frame seq " + std::to_string(s.h.seq) + " carries more bytes than its message", true);
        return Step::kStop;
    }
    if (rc > 0 && s.h.len > 0) note_landed(s.h.seq, s.h.len, s.h.gen, s.rx_ns);
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

void TcpRecvPath::note_landed(uint64_t seq, uint32_t len, uint32_t gen, uint64_t rx_ns)
{
    if (nlanded_ > 0) { // the frames of one message mostly land one after another
        Landed &last = landed_[nlanded_ - 1];
        if (last.seq == seq && last.gen == gen && last.bytes <= UINT32_MAX - len) {
            last.bytes += len;
            landed_rx_ns_ = std::max(landed_rx_ns_, rx_ns);
            return;
        }
    }
    if (nlanded_ == landed_.size()) queue_landed();
    landed_[nlanded_++] = Landed{seq, len, gen};
    landed_rx_ns_ = std::max(landed_rx_ns_, rx_ns);
}

void TcpRecvPath::queue_landed()
{
    if (nlanded_ == 0) return;
    std::array<uint8_t, BackHeader::kMaxBytes - BackHeader::kSize> p;
    BackHeader h;
    // Stamped with when the newest landed byte reached this host, not when this thread got to
    // read it: a receiving process kept off the CPU (a busy host) delays the read, which is
    // not the path's time. The sender counts the stamp's distance to the report's arrival
    // beyond its floor as the report's lateness (ReturnDelay), and dates the landings that
    // much earlier.
    encode_landed(landed_.data(), nlanded_, landed_rx_ns_ != 0 ? landed_rx_ns_ : realtime_ns(), &h, p.data());
    queue_back(h, p.data(), h.payload());
    nlanded_ = 0;
    landed_rx_ns_ = 0;
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

void TcpRecvPath::heartbeat()
{
    // Written now, not at the next progress(): a quiet comm's tick makes no I/O pass, and a
    // claimed heartbeat left pending would leave the port pair silent at the sender.
    heartbeat_pending_ = true;
    PathStatus ignored; // errors show on the next progress()
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
    queue_landed(); // before the ack that may cover the same messages
    if (pending_ack_ != sent_ack_ || heartbeat_pending_) {
        BackHeader h;
        h.kind = BackHeader::kAck;
        h.arg = ack_gen_;
        h.value = pending_ack_;
        if (pending_ack_ != sent_ack_) {
            // The ack delay: how long the newest bytes read since the last ack waited for us.
            // Bounded by the pass before the one that read the bytes: the ack goes out after
            // that pass ended (RecvComm acks once progress() returned).
            const uint64_t waited = waited_ns(newest_rx_ns_, since(now_ns(), prev_pass_ns_));
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
