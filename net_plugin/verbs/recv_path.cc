// SPDX-License-Identifier: Apache-2.0
// The receiving half of a verbs path: CTS groups out, records, short messages and pieces in,
// the holding answer to a generation notice.
#include "verbs_path.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <cstring>

#include "log.h"

namespace vigil::net::verbs_fabric {

VerbsRecvPath::VerbsRecvPath(std::unique_ptr<QpSet> qps, PathIdentity id)
    : eng_(std::move(qps), std::move(id)), qps_fd_(eng_.qps().fd())
{
    eng_.qps().rearm(true);
}

VerbsRecvPath::~VerbsRecvPath() = default;

void VerbsRecvPath::advertise(const CtsGroup &g)
{
    std::array<uint8_t, Ctl::kMaxEntries * Ctl::kEntrySize> p;
    Ctl h;
    const size_t n = encode_cts(g, &h, p.data());
    eng_.control(h, p.data(), n);
}

void VerbsRecvPath::answer(uint32_t gen, const Holding &h)
{
    std::array<uint8_t, Ctl::kBitmapBytes> bits;
    Ctl a;
    const size_t n = encode_holding(h, gen, &a, bits.data());
    eng_.control(a, bits.data(), n);
}

void VerbsRecvPath::request_failover(uint32_t failed_slot)
{
    Ctl h;
    h.kind = Ctl::kFailoverRequest;
    h.a = failed_slot;
    eng_.control(h);
}

void VerbsRecvPath::heartbeat()
{
    if (eng_.ctl_pending()) return; // something is on its way already
    Ctl h;
    h.kind = Ctl::kHeartbeat;
    eng_.control(h);
}

void VerbsRecvPath::goodbye()
{
    Ctl h;
    h.kind = Ctl::kGoodbye;
    eng_.control(h);
}

void VerbsRecvPath::drain(RecvSink &sink)
{
    eng_.drain(
        [&](const ibv_wc &w, int) {
            if (WrId::kind(w.wr_id) != WrId::kRecv) return true;
            PathStatus later; // a bad record fails the path: the next progress() says so
            on_write(w, sink, &later);
            return true;
        },
        [&](const uint8_t *m, size_t len) {
            // A control message may need a reply: it waits for progress(), in order.
            deferred_ctl_.emplace_back(m, m + len);
            return true;
        });
}

void VerbsRecvPath::fence(RecvSink &sink)
{
    // No write of this path lands after this: its QPs drop whatever still arrives. What
    // landed before is in the CQ: it counts.
    eng_.qps().to_error();
    drain(sink);
}

void VerbsRecvPath::sabotage()
{
    eng_.qps().to_error();
}

void VerbsRecvPath::on_write(const ibv_wc &w, RecvSink &sink, PathStatus *st)
{
    if (w.opcode != IBV_WC_RECV_RDMA_WITH_IMM) {
        eng_.fail(st, -EPROTO, "a receive consumed by a SEND: the sender speaks another protocol", true);
        return;
    }
    const uint32_t imm = ntohl(w.imm_data);
    if (ShortImm::is_short(imm))
        on_short(imm, w.byte_len, sink, st);
    else if (PieceImm::is_piece(imm))
        on_piece(imm, w.byte_len, sink, st);
    else
        on_record(imm, sink, st);
}

void VerbsRecvPath::on_record(uint32_t imm, RecvSink &sink, PathStatus *st)
{
    Record rec;
    if (const char *bad = rec.decode(eng_.qps().in_record(imm), imm, kMaxMessageBytes)) {
        eng_.fail(st, -EPROTO, std::string("message record from the sender: ") + bad, true);
        return;
    }
    // The payload writes came before the record on its QP: the whole message (a striped
    // message's last piece) is in place.
    const int rc = rec.offset == 0 ? sink.whole(rec.gen, rec.seq, rec.tag, rec.size, rec.entry)
                                   : sink.piece_last(rec.gen, rec.seq, rec.tag, rec.size, rec.entry,
                                                     rec.size - rec.offset);
    if (rc != 0)
        refused(st, rc,
                "message seq " + std::to_string(rec.seq) + " tag " + std::to_string(rec.tag) +
                    " size " + std::to_string(rec.size) + " (from offset " +
                    std::to_string(rec.offset) + ") for buffer " + std::to_string(rec.entry));
}

void VerbsRecvPath::refused(PathStatus *st, int rc, const std::string &what)
{
    eng_.fail(st, rc,
              what + (rc == -EMSGSIZE ? " larger than the posted receive buffer" : " matches no advertised receive"),
              true);
}

void VerbsRecvPath::on_short(uint32_t imm, uint32_t byte_len, RecvSink &sink, PathStatus *st)
{
    const ShortImm s = ShortImm::decode(imm);
    if (!ShortImm::fits(byte_len)) {
        eng_.fail(st, -EPROTO, "a short message's write of " + std::to_string(byte_len) + " bytes", true);
        return;
    }
    if (int rc = sink.whole_short(gen_, s.seq_low, ShortImm::kSeqBits, byte_len, s.entry); rc != 0)
        refused(st, rc,
                "short message seq " + std::to_string(s.seq_low) + " (mod 2^" + std::to_string(ShortImm::kSeqBits) +
                    ") size " + std::to_string(byte_len) + " for buffer " + std::to_string(s.entry));
}

void VerbsRecvPath::on_piece(uint32_t imm, uint32_t byte_len, RecvSink &sink, PathStatus *st)
{
    const PieceImm p = PieceImm::decode(imm);
    // Its generation is at or below this path's latest notice: a path carries nothing of a
    // generation before its notice.
    if (int rc = sink.piece(p.generation(gen_), p.seq_low, PieceImm::kSeqBits, byte_len, p.entry);
        rc != 0)
        refused(st, rc,
                "piece of seq " + std::to_string(p.seq_low) + " (mod 2^" +
                    std::to_string(PieceImm::kSeqBits) + ") of " + std::to_string(byte_len) +
                    " bytes for buffer " + std::to_string(p.entry));
}

void VerbsRecvPath::on_control(const uint8_t *m, size_t len, RecvSink &sink, PathStatus *st)
{
    Ctl h;
    if (const char *bad = h.decode(m, len)) {
        eng_.fail(st, -EPROTO, std::string("control message from the sender: ") + bad, true);
        return;
    }
    switch (h.kind) {
    case Ctl::kGeneration:
        // The core answers (answer()) once this progress() returned.
        gen_ = std::max(gen_, h.gen);
        sink.generation(h.gen, h.a, static_cast<int>(h.count) - 1, h.b);
        return;
    case Ctl::kProbe:
        return;
    case Ctl::kGoodbye:
        goodbye_seen_ = true;
        return;
    default:
        eng_.fail(st, -EPROTO, "unexpected control message from the sender", true);
        return;
    }
}

PathStatus VerbsRecvPath::progress(RecvSink &sink)
{
    PathStatus st;
    // What drain() met first, in the order it arrived.
    while (!deferred_ctl_.empty() && !eng_.failed()) {
        const std::vector<uint8_t> m = std::move(deferred_ctl_.front());
        deferred_ctl_.pop_front();
        st.heard = true;
        on_control(m.data(), m.size(), sink, &st);
    }
    auto on = [&](const ibv_wc &w, int) {
        if (WrId::kind(w.wr_id) != WrId::kRecv) return true;
        on_write(w, sink, &st);
        return !eng_.failed();
    };
    auto on_ctl = [&](const uint8_t *m, size_t len) {
        on_control(m, len, sink, &st);
        return !eng_.failed();
    };
    if (!eng_.poll(&st, on, on_ctl)) return st;
    if (!eng_.flush_control(&st)) return st;
    if (!eng_.poll(&st, on, on_ctl)) return st;
    if (goodbye_seen_) st.peer_closed = true;
    return st;
}

} // namespace vigil::net::verbs_fabric
