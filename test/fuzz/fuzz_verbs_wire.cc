// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the verbs fabric's wire formats (net_plugin/verbs/verbs_wire.h): the set-up
// Hello and Answer with their PathEnd, the control message header Ctl, the message Record
// written into the receiver's record ring, and the immediates of a short message (ShortImm),
// of a striped message's piece (PieceImm) and of a control message or credit (CtlImm). The
// header makes no libibverbs calls, so this target builds with or without rdma-core.
//
// Input: up to kCtlBytes (256) bytes. Its first Hello::kSize (160) bytes, zero-padded, are
// decoded as a Hello, an Answer, a PathEnd and a Record (bytes [40,44) give the immediate,
// which is also decoded as a short message's, a piece's, a control message's or a credit's
// when its top bits say so); the whole input as a Ctl of the input's own length, as a control
// ring slot holds it.
// Properties: what decodes re-encodes to the same bytes (Answer: its status, and its end when
// the status is 0; Ctl: its 24-byte header, and a CTS group's entries or a holding answer's
// bitmap, with the header fields they use, through decode_cts/decode_holding and back), and what the verbs path then trusts is bounded
// (QP count 1..16 with every used QP number non-zero and 24-bit, MTU 1..5, a CTS group of
// 1..8 entries of exactly the bytes received, an entry index < 8, a record's size within
// the limit, its last piece's offset inside it and its sequence number matching the
// immediate; a short or piece immediate's fields in range and re-encoding to the same 32
// bits, a piece's generation unwrapped at or below the path's; exactly one kind per
// immediate; a credit's count unwrapped at or below what was written and within 2^28 of it).
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "fuzz_util.h"
#include "verbs/verbs_wire.h"

namespace vw = vigil::net::verbs_fabric;

namespace {

constexpr uint64_t kMaxMessage = 0x7fffffff; // fabric.h kMaxMessageBytes

void check_end(const vw::PathEnd &e)
{
    FUZZ_CHECK(e.nqps >= 1 && e.nqps <= vw::kMaxQps);
    FUZZ_CHECK(e.mtu >= 1 && e.mtu <= 5);
    FUZZ_CHECK(e.psn <= 0xffffff);
    for (uint32_t i = 0; i < vw::kMaxQps; ++i)
        FUZZ_CHECK(i < e.nqps ? e.qpn[i] != 0 && e.qpn[i] <= 0xffffff : e.qpn[i] == 0);
    FUZZ_CHECK(e.ctl_addr != 0 && e.rkey != 0);
}

// Decodes `p` as T (a fixed-size format with decode(p)/encode(p)) and checks the round trip
// of its first `n` bytes; returns whether it decoded.
template <class T> bool round_trip(const uint8_t *p, size_t n, T *t)
{
    if (t->decode(p) != nullptr) return false;
    std::array<uint8_t, T::kSize> again{};
    t->encode(again.data());
    FUZZ_CHECK(std::memcmp(again.data(), p, n) == 0);
    return true;
}

void hello(const uint8_t *p)
{
    vw::Hello h;
    if (!round_trip(p, vw::Hello::kSize, &h)) return;
    FUZZ_CHECK(h.slot <= 1 && h.npaths >= 1 && h.npaths <= 2 && h.rebuild <= 1);
    FUZZ_CHECK(h.conn_id != 0 && h.path_id != 0);
    FUZZ_CHECK(h.other_dev == vw::Hello::kNoDev || h.other_dev != h.peer_dev);
    check_end(h.end);
}

void answer(const uint8_t *p)
{
    vw::Answer a;
    if (a.decode(p) != nullptr) return;
    if (a.status != 0) return; // a refusal: the end is not read
    FUZZ_CHECK(round_trip(p, vw::Answer::kSize, &a));
    check_end(a.end);
}

void path_end(const uint8_t *p)
{
    vw::PathEnd e;
    if (round_trip(p, vw::PathEnd::kSize, &e)) check_end(e);
}

void ctl(const uint8_t *p, size_t len)
{
    vw::Ctl c;
    if (c.decode(p, len) != nullptr) return;
    FUZZ_CHECK(len >= vw::Ctl::kSize && len <= vw::kCtlBytes);
    FUZZ_CHECK(c.kind >= vw::Ctl::kCts && c.kind <= vw::Ctl::kGoodbye);
    if (c.kind == vw::Ctl::kCts) {
        FUZZ_CHECK(c.count >= 1 && c.count <= vw::Ctl::kMaxEntries);
        FUZZ_CHECK(len == vw::Ctl::kSize + c.count * vw::Ctl::kEntrySize);
    } else if (c.kind == vw::Ctl::kHolding) {
        FUZZ_CHECK(len == vw::Ctl::kSize + vw::Ctl::kBitmapBytes);
    } else {
        FUZZ_CHECK(len == vw::Ctl::kSize);
        if (c.kind == vw::Ctl::kGeneration) FUZZ_CHECK(c.count <= 2);
    }
    std::array<uint8_t, vw::Ctl::kSize> again{};
    c.encode(again.data());
    FUZZ_CHECK(std::memcmp(again.data(), p, again.size()) == 0);
    // The payload, through the structure the path hands the core and back.
    // (Only the header fields each message uses: a CTS carries no generation.)
    std::array<uint8_t, vw::kCtlBytes> body{};
    vw::Ctl h;
    size_t n = 0;
    if (c.kind == vw::Ctl::kCts) {
        const vigil::net::CtsGroup g = vw::decode_cts(c, p + vw::Ctl::kSize);
        FUZZ_CHECK(g.n == c.count && g.index == c.a && g.first_seq == c.b);
        n = vw::encode_cts(g, &h, body.data());
        FUZZ_CHECK(h.kind == c.kind && h.count == c.count && h.a == c.a && h.b == c.b);
    } else if (c.kind == vw::Ctl::kHolding) {
        n = vw::encode_holding(vw::decode_holding(c, p + vw::Ctl::kSize), c.gen, &h, body.data());
        FUZZ_CHECK(h.kind == c.kind && h.gen == c.gen && h.a == c.a);
    } else {
        return;
    }
    FUZZ_CHECK(vw::Ctl::kSize + n == len);
    FUZZ_CHECK(std::memcmp(body.data(), p + vw::Ctl::kSize, n) == 0);
}

void record(const uint8_t *p, uint32_t imm)
{
    vw::Record r;
    if (r.decode(p, imm, kMaxMessage) != nullptr) return;
    FUZZ_CHECK((r.seq & vw::Record::kImmSeqMask) == imm && vw::Record::is_record(imm));
    FUZZ_CHECK(!vw::ShortImm::is_short(imm) && !vw::PieceImm::is_piece(imm));
    FUZZ_CHECK(r.size <= kMaxMessage && r.entry < vw::Ctl::kMaxEntries);
    FUZZ_CHECK(r.offset == 0 || r.offset < r.size);
    std::array<uint8_t, vw::kRecordBytes> again{};
    r.encode(again.data());
    FUZZ_CHECK(std::memcmp(again.data(), p, again.size()) == 0);
}

void short_imm(uint32_t imm)
{
    if (!vw::ShortImm::is_short(imm)) return;
    const vw::ShortImm s = vw::ShortImm::decode(imm);
    FUZZ_CHECK(s.entry < vw::Ctl::kMaxEntries && s.seq_low < (1u << vw::ShortImm::kSeqBits));
    FUZZ_CHECK(vw::ShortImm::encode(s.seq_low, s.entry) == imm);
}

void piece_imm(uint32_t imm, uint32_t latest)
{
    if (!vw::PieceImm::is_piece(imm)) return;
    const vw::PieceImm s = vw::PieceImm::decode(imm);
    FUZZ_CHECK(s.entry < vw::Ctl::kMaxEntries && s.seq_low < (1u << vw::PieceImm::kSeqBits));
    FUZZ_CHECK(s.gen_low < (1u << vw::PieceImm::kGenBits));
    FUZZ_CHECK(vw::PieceImm::encode(s.seq_low, s.gen_low, s.entry) == imm);
    const uint32_t g = s.generation(latest);
    FUZZ_CHECK(g <= latest && (g == 0 || (g & ((1u << vw::PieceImm::kGenBits) - 1)) == s.gen_low));
    FUZZ_CHECK(g == 0 || latest - g < (1u << vw::PieceImm::kGenBits));
}

// Every immediate is exactly one of: short, piece, control, credit, record.
void imm_kind(uint32_t imm, uint64_t written)
{
    const int kinds = int{vw::ShortImm::is_short(imm)} + int{vw::PieceImm::is_piece(imm)} +
                      int{vw::CtlImm::is_control(imm)} + int{vw::CtlImm::is_credit(imm)} +
                      int{vw::Record::is_record(imm)};
    FUZZ_CHECK(kinds == 1);
    if (!vw::CtlImm::is_control(imm) && !vw::CtlImm::is_credit(imm)) return;
    const uint32_t low = vw::CtlImm::count(imm);
    FUZZ_CHECK((vw::CtlImm::is_control(imm) ? vw::CtlImm::control(low) : vw::CtlImm::credit(low)) == imm);
    const uint64_t n = vw::CtlImm::unwrap(low, written);
    FUZZ_CHECK((n & vw::CtlImm::kMask) == low);
    FUZZ_CHECK(written - n <= vw::CtlImm::kMask); // within 2^28 at or below what was written
}

// An exact-size heap copy of the first `n` bytes: ASan sees any read past them.
struct Copy {
    uint8_t *p;
    Copy(const uint8_t *from, size_t n) : p(new uint8_t[n == 0 ? 1 : n])
    {
        std::memcpy(p, from, n);
    }
    ~Copy() { delete[] p; }
    Copy(const Copy &) = delete;
    Copy &operator=(const Copy &) = delete;
};

} // namespace

extern "C" int LLVMFuzzerInitialize(int * /*argc*/, char *** /*argv*/)
{
    vigil::fuzz::init();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    constexpr size_t kIn = vw::Hello::kSize;
    static_assert(kIn <= vw::kCtlBytes && vw::Answer::kSize <= kIn);
    uint8_t buf[kIn] = {};
    std::memcpy(buf, data, std::min(size, kIn));

    hello(Copy(buf, vw::Hello::kSize).p);
    answer(Copy(buf, vw::Answer::kSize).p);
    path_end(Copy(buf, vw::PathEnd::kSize).p);
    static_assert(vw::kRecordBytes + 16 <= kIn);
    const auto imm = static_cast<uint32_t>(vw::get_le(buf + vw::kRecordBytes, 4));
    record(Copy(buf, vw::kRecordBytes).p, imm);
    short_imm(imm);
    piece_imm(imm, static_cast<uint32_t>(vw::get_le(buf + vw::kRecordBytes + 4, 4)));
    imm_kind(imm, vw::get_le(buf + vw::kRecordBytes + 8, 8));
    // A control ring slot holds kCtlBytes; the message is its first `len` bytes, and a read
    // past them would take stale bytes of an earlier message: the copy ends there.
    const size_t len = std::min(size, static_cast<size_t>(vw::kCtlBytes));
    ctl(Copy(data, len).p, len);
    return 0;
}
