// SPDX-License-Identifier: Apache-2.0
// The verbs fabric's wire formats:
//   - connection set-up over a TCP socket per path: the connector's hello (its QPs, GID,
//     nonce, connection and path ids, the address of its control ring), the listener's answer
//     (its QPs and the addresses of its record and control rings), the connector's ready word
//     once its QPs are ready to receive;
//   - control messages (both directions): CTS groups, generation notices (kGeneration) and the
//     receiver's holding answer, probes, heartbeats, failover requests, goodbyes. Each is one
//     RDMA WRITE with immediate (CtlImm) into the next slot of the peer's control ring
//     (kCtlSlots slots of kCtlBytes); the peer hands the slots back in credits (CreditImm, a
//     write with immediate and no payload). No receive carries a buffer;
//   - the message record the sender RDMA-writes (with immediate) into the receiver's record
//     ring after a message's payload, and the immediates that stand in for a record: a short
//     message's (ShortImm) and a striped message's pieces (PieceImm).
// The top bits of an immediate say which: 1 short, 01 piece, 0010 control, 0011 credit,
// 000 record.
// Little-endian, fixed sizes, each with a magic; every field read is checked here or by the
// caller before use.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

#include "../fabric.h"
#include "../hello_wire.h"

namespace vigil::net::verbs_fabric {

using vigil::net::get_le;
using vigil::net::put_le;

/// Hard bounds, independent of configuration.
inline constexpr uint32_t kMaxQps = 16;       ///< QPs per path (VIGIL_IB_QPS_PER_CONN)
inline constexpr uint32_t kRecordBytes = 40;  ///< one message record
inline constexpr uint32_t kCtlBytes = 256;    ///< one control message, at most
/// Slots of a control ring: the control messages one end may have written that the other has
/// not handed back (a power of two). The receiving end hands them back in credits, one for
/// every kCtlSlots / 2 it consumed, so a sender never waits for more than one credit.
inline constexpr uint32_t kCtlSlots = 32;
static_assert((kCtlSlots & (kCtlSlots - 1)) == 0, "the ring index is the count modulo kCtlSlots");

/// One end of a path as the other needs it to drive its QPs to RTR and write into its rings.
/// Layout, 112 bytes:
///   [0] nqps  [1] mtu  [2,4) lid  [4,8) psn  [8,24) gid  [24,88) qpn[16]  [88,96) ring_addr
///   [96,104) ctl_addr  [104,108) rkey  [108,112) zero
struct PathEnd {
    uint8_t nqps = 0;
    uint8_t mtu = 0;     ///< enum ibv_mtu of the port
    uint16_t lid = 0;    ///< InfiniBand LID, 0 on RoCE
    uint32_t psn = 0;    ///< 24 bits: the first PSN this end sends
    std::array<uint8_t, 16> gid{};
    std::array<uint32_t, kMaxQps> qpn{}; ///< 24 bits each
    uint64_t ring_addr = 0;              ///< its record ring (kMaxInflight records), 0 on the sender
    uint64_t ctl_addr = 0;               ///< its control ring (kCtlSlots slots of kCtlBytes)
    uint32_t rkey = 0;                   ///< the remote key of both rings

    static constexpr size_t kSize = 1 + 1 + 2 + 4 + 16 + 4 * kMaxQps + 8 + 8 + 4 + 4; // 112
    void encode(uint8_t *p) const
    {
        p[0] = nqps;
        p[1] = mtu;
        put_le(p + 2, lid, 2);
        put_le(p + 4, psn, 4);
        std::memcpy(p + 8, gid.data(), 16);
        for (uint32_t i = 0; i < kMaxQps; ++i) put_le(p + 24 + 4 * i, qpn[i], 4);
        put_le(p + 88, ring_addr, 8);
        put_le(p + 96, ctl_addr, 8);
        put_le(p + 104, rkey, 4);
        put_le(p + 108, 0, 4);
    }
    const char *decode(const uint8_t *p)
    {
        nqps = p[0];
        mtu = p[1];
        lid = static_cast<uint16_t>(get_le(p + 2, 2));
        psn = static_cast<uint32_t>(get_le(p + 4, 4));
        std::memcpy(gid.data(), p + 8, 16);
        for (uint32_t i = 0; i < kMaxQps; ++i) qpn[i] = static_cast<uint32_t>(get_le(p + 24 + 4 * i, 4));
        ring_addr = get_le(p + 88, 8);
        ctl_addr = get_le(p + 96, 8);
        rkey = static_cast<uint32_t>(get_le(p + 104, 4));
        if (nqps < 1 || nqps > kMaxQps) return "QP count out of range";
        if (mtu < 1 || mtu > 5) return "bad MTU";
        if (psn > 0xffffff) return "PSN beyond 24 bits";
        for (uint32_t i = 0; i < kMaxQps; ++i) {
            if (i < nqps && (qpn[i] == 0 || qpn[i] > 0xffffff)) return "bad QP number";
            if (i >= nqps && qpn[i] != 0) return "QP number past the QP count";
        }
        if (ctl_addr == 0 || rkey == 0) return "no control ring";
        if (get_le(p + 108, 4) != 0) return "non-zero reserved field";
        return nullptr;
    }
};

/// Connector -> listener, first bytes on the set-up socket of one path: the hello's head
/// (hello_wire.h) with the path's slot, count and rebuild flag, then the listener devices
/// it is for and the connector's end of the path.
struct Hello : HelloHead {
    static constexpr uint32_t kMagic = 0x48564c56; // "VLVH"
    /// 2: short messages (ShortImm); 3: pieces (PieceImm); 4: control messages written into a
    /// control ring (CtlImm, CreditImm), PathEnd::ctl_addr.
    static constexpr uint8_t kVersion = 4;
    static constexpr size_t kSize = HelloHead::kSize + 8 + PathEnd::kSize;
    uint8_t slot = 0;    ///< path slot: 0 primary, 1 backup
    uint8_t npaths = 1;  ///< paths the connection opens at connect (1 or 2)
    uint8_t rebuild = 0; ///< 1: rebuilds a path of a connection the listener served
    uint32_t peer_dev = 0;  ///< the listener's device this path is for
    uint32_t other_dev = kNoDev; ///< the listener's device of the connection's other path
                                 ///< (registrations must cover it even before it is up)
    static constexpr uint32_t kNoDev = 0xffffffffu;
    PathEnd end;

    Hello() { version = kVersion; }
    void encode(uint8_t *p) const
    {
        encode_head(p, kMagic, {slot, npaths, rebuild});
        put_le(p + 40, peer_dev, 4);
        put_le(p + 44, other_dev, 4);
        end.encode(p + 48);
    }
    /// Returns nullptr when valid, else the first bad field. The nonce is compared by the
    /// caller.
    const char *decode(const uint8_t *p)
    {
        std::array<uint8_t, 3> own{};
        const char *bad = decode_head(p, kMagic, kVersion, &own);
        slot = own[0];
        npaths = own[1];
        rebuild = own[2];
        peer_dev = static_cast<uint32_t>(get_le(p + 40, 4));
        other_dev = static_cast<uint32_t>(get_le(p + 44, 4));
        if (bad != nullptr) return bad;
        if (slot > 1) return "bad path slot";
        if (npaths < 1 || npaths > 2) return "bad path count";
        if (rebuild > 1) return "bad rebuild flag";
        if (other_dev != kNoDev && other_dev == peer_dev) return "both paths on one device";
        return end.decode(p + 48);
    }
};

/// Listener -> connector: the listener's end of the path, or a refusal (status != 0).
struct Answer {
    static constexpr uint32_t kMagic = 0x41564c56; // "VLVA"
    static constexpr size_t kSize = 8 + PathEnd::kSize;
    uint32_t status = 0; ///< 0 ok; else -errno of the listener's failure
    PathEnd end;
    void encode(uint8_t *p) const
    {
        put_le(p, kMagic, 4);
        put_le(p + 4, status, 4);
        end.encode(p + 8);
    }
    const char *decode(const uint8_t *p)
    {
        if (get_le(p, 4) != kMagic) return "bad answer magic";
        status = static_cast<uint32_t>(get_le(p + 4, 4));
        if (status != 0) return nullptr; // a refusal carries no end
        return end.decode(p + 8);
    }
};

/// Connector -> listener once its QPs are ready to receive: the path may carry traffic.
inline constexpr uint32_t kReadyMagic = 0x52564c56; // "VLVR"

/// A control message's header: the first bytes of its control ring slot (CtlImm). Layout,
/// 24 bytes:
///   [0] kind  [1] count  [2,4) zero  [4,8) generation  [8,16) a  [16,24) b
/// kCts: a = group index, b = first seq, count = entries; then per entry 24 bytes:
///       [0,8) address  [8,12) capacity  [12,16) tag  [16,20) rkey slot 0  [20,24) rkey slot 1
/// kGeneration (the generation notice; TCP's FrameHeader::kGeneration): a = first seq,
///       b = abandoned path id, count = abandoned slot + 1 (0: none)
/// kHolding: gen = the generation answered, a = floor; then 32 bytes: the completion bitmap
/// kFailoverRequest: a = the failed slot. kProbe, kHeartbeat, kGoodbye: nothing more.
struct Ctl {
    enum Kind : uint8_t {
        kCts = 1, kGeneration = 2, kHolding = 3, kProbe = 4, kHeartbeat = 5, kFailoverRequest = 6, kGoodbye = 7
    };
    static constexpr size_t kSize = 24;
    static constexpr size_t kEntrySize = 24;
    static constexpr size_t kMaxEntries = 8;
    static constexpr size_t kBitmapBytes = 32;
    static_assert(kSize + kMaxEntries * kEntrySize <= kCtlBytes);
    uint8_t kind = 0;
    uint8_t count = 0;
    uint32_t gen = 0;
    uint64_t a = 0, b = 0;

    void encode(uint8_t *p) const
    {
        p[0] = kind;
        p[1] = count;
        put_le(p + 2, 0, 2);
        put_le(p + 4, gen, 4);
        put_le(p + 8, a, 8);
        put_le(p + 16, b, 8);
    }
    /// Decodes the `len` bytes that arrived; nullptr when valid.
    const char *decode(const uint8_t *p, size_t len)
    {
        if (len < kSize) return "control message shorter than its header";
        kind = p[0];
        count = p[1];
        gen = static_cast<uint32_t>(get_le(p + 4, 4));
        a = get_le(p + 8, 8);
        b = get_le(p + 16, 8);
        if (get_le(p + 2, 2) != 0) return "non-zero reserved field";
        if (kind < kCts || kind > kGoodbye) return "unknown control kind";
        if (kind == kCts) {
            if (count < 1 || count > kMaxEntries) return "bad CTS entry count";
            if (len != kSize + count * kEntrySize) return "CTS length disagrees with its count";
        } else if (kind == kHolding) {
            if (len != kSize + kBitmapBytes) return "holding answer of the wrong length";
        } else if (kind == kGeneration) {
            if (count > 2) return "bad abandoned slot";
            if (len != kSize) return "control message of the wrong length";
        } else if (count != 0 || len != kSize) {
            return "control message of the wrong length";
        }
        return nullptr;
    }
};

static_assert(Ctl::kMaxEntries == kMaxRecvs, "a CTS group is one grouped irecv");
static_assert(Ctl::kBitmapBytes == sizeof(Holding::complete), "the holding bitmap, whole");

/// A CTS group as a kCts control message: fills `h` and writes the entries (g.n * kEntrySize
/// bytes, returned) to `p`. `g.n` must be 1..kMaxEntries and each capacity at most
/// kMaxMessageBytes (it travels in 32 bits).
inline size_t encode_cts(const CtsGroup &g, Ctl *h, uint8_t *p)
{
    *h = Ctl{};
    h->kind = Ctl::kCts;
    h->count = static_cast<uint8_t>(g.n);
    h->a = g.index;
    h->b = g.first_seq;
    for (int k = 0; k < g.n; ++k) {
        uint8_t *e = p + static_cast<size_t>(k) * Ctl::kEntrySize;
        const CtsEntry &ce = g.entries[static_cast<size_t>(k)];
        put_le(e, ce.addr, 8);
        put_le(e + 8, ce.size, 4);
        put_le(e + 12, static_cast<uint32_t>(ce.tag), 4);
        put_le(e + 16, ce.rkey[0], 4);
        put_le(e + 20, ce.rkey[1], 4);
    }
    return static_cast<size_t>(g.n) * Ctl::kEntrySize;
}

/// The CTS group of a kCts message `h` that Ctl::decode accepted; `p` is its h.count entries.
/// Addresses and keys are taken as sent: a wrong one fails the RDMA write on the sender's QP
/// (a protection error), never memory outside the receiver's registered buffers.
inline CtsGroup decode_cts(const Ctl &h, const uint8_t *p)
{
    CtsGroup g;
    g.index = h.a;
    g.first_seq = h.b;
    g.n = h.count;
    for (int k = 0; k < g.n; ++k) {
        const uint8_t *e = p + static_cast<size_t>(k) * Ctl::kEntrySize;
        CtsEntry &ce = g.entries[static_cast<size_t>(k)];
        ce.addr = get_le(e, 8);
        ce.size = get_le(e + 8, 4);
        ce.tag = static_cast<int32_t>(get_le(e + 12, 4));
        ce.rkey[0] = static_cast<uint32_t>(get_le(e + 16, 4));
        ce.rkey[1] = static_cast<uint32_t>(get_le(e + 20, 4));
    }
    return g;
}

/// The receiver's answer to generation `gen`'s notice as a kHolding message: fills `h` and
/// writes the completion bitmap (kBitmapBytes, returned) to `p`.
inline size_t encode_holding(const Holding &hold, uint32_t gen, Ctl *h, uint8_t *p)
{
    *h = Ctl{};
    h->kind = Ctl::kHolding;
    h->gen = gen;
    h->a = hold.floor;
    for (size_t w = 0; w < hold.complete.size(); ++w) put_le(p + 8 * w, hold.complete[w], 8);
    return Ctl::kBitmapBytes;
}

/// What a kHolding message `h` that Ctl::decode accepted says; `p` is its kBitmapBytes.
inline Holding decode_holding(const Ctl &h, const uint8_t *p)
{
    Holding hold;
    hold.floor = h.a;
    for (size_t w = 0; w < hold.complete.size(); ++w) hold.complete[w] = get_le(p + 8 * w, 8);
    return hold;
}

/// The record of one message, written into slot seq % ring of the receiver's record ring
/// with RDMA WRITE with immediate (immediate = the low 29 bits of seq, top three bits clear:
/// see ShortImm, PieceImm and CtlImm) after the payload on the same QP, so its completion proves the
/// payload is in place. Messages of ShortImm::kMaxSize bytes or less need no record. A
/// message striped over the paths (multipath) has a record only after its last piece, which
/// says the piece's offset; its other pieces are one write each (PieceImm). Each message has
/// at most one record per generation, so a ring slot is rewritten only by the message
/// kMaxInflight later (which its CTS waits for) or by a replay (which waits for the
/// receiver's holding answer, sent after every record of the older generation was read).
/// Layout, 40 bytes:
///   [0,8) seq  [8,12) generation  [12,16) size  [16,20) tag  [20] entry  [21,24) zero
///   [24,28) offset  [28,32) zero  [32,40) check: seq ^ size ^ (generation << 32) ^
///   (offset << 16) ^ kMagic
/// offset is 0 for a whole message, else that of the last piece (< size).
struct Record {
    static constexpr uint64_t kMagic = 0x56494749'4c524543ull; // "VIGILREC"
    uint64_t seq = 0;
    uint32_t gen = 0;
    uint32_t size = 0;
    int32_t tag = 0;
    uint8_t entry = 0;
    uint32_t offset = 0;
    /// The immediate of a record's write: the low 29 bits of seq (the slot is seq modulo
    /// kMaxInflight, the record itself says the rest).
    static constexpr uint32_t kImmSeqMask = 0x1fffffffu;
    static bool is_record(uint32_t imm) { return (imm >> 29) == 0; }
    uint64_t check() const
    {
        return seq ^ size ^ (static_cast<uint64_t>(gen) << 32) ^
               (static_cast<uint64_t>(offset) << 16) ^ kMagic;
    }
    void encode(uint8_t *p) const
    {
        put_le(p, seq, 8);
        put_le(p + 8, gen, 4);
        put_le(p + 12, size, 4);
        put_le(p + 16, static_cast<uint32_t>(tag), 4);
        p[20] = entry;
        put_le(p + 21, 0, 3);
        put_le(p + 24, offset, 4);
        put_le(p + 28, 0, 4);
        put_le(p + 32, check(), 8);
    }
    const char *decode(const uint8_t *p, uint32_t imm, uint64_t max_message)
    {
        seq = get_le(p, 8);
        gen = static_cast<uint32_t>(get_le(p + 8, 4));
        size = static_cast<uint32_t>(get_le(p + 12, 4));
        tag = static_cast<int32_t>(get_le(p + 16, 4));
        entry = p[20];
        offset = static_cast<uint32_t>(get_le(p + 24, 4));
        if (get_le(p + 32, 8) != check()) return "record check mismatch";
        if ((seq & kImmSeqMask) != imm) return "record for another sequence number";
        if (get_le(p + 21, 3) != 0 || get_le(p + 28, 4) != 0) return "non-zero reserved field";
        if (size > max_message) return "message size beyond the limit";
        if (entry >= Ctl::kMaxEntries) return "entry index out of range";
        if (offset != 0 && offset >= size) return "last piece's offset beyond the message";
        return nullptr;
    }
};

/// A piece of a striped message other than its last (multipath): one RDMA WRITE with
/// immediate of the piece's bytes straight into the advertised buffer at the piece's offset.
/// Its length is the write's (the receive completion's byte_len), the tag is the entry's, the
/// message's size comes with its last piece's Record; the sequence number is given modulo
/// 2^kSeqBits and unwrapped around the receiver's window as ShortImm's, the generation modulo
/// 2^kGenBits and unwrapped at or below the path's latest notice (a path carries no piece of
/// a generation before its notice). Layout of the 32-bit immediate (host order):
///   [31:30] 01  [29:27] entry  [26:14] generation mod 2^13  [13:0] seq mod 2^14
struct PieceImm {
    static constexpr int kSeqBits = 14;
    static constexpr int kGenBits = 13;
    uint32_t seq_low = 0; ///< seq mod 2^kSeqBits
    uint32_t gen_low = 0; ///< generation mod 2^kGenBits
    uint8_t entry = 0;

    static bool is_piece(uint32_t imm) { return (imm >> 30) == 1; }
    static uint32_t encode(uint64_t seq, uint32_t gen, int entry)
    {
        return 1u << 30 | static_cast<uint32_t>(entry & 7) << 27 |
               (gen & ((1u << kGenBits) - 1)) << kSeqBits |
               static_cast<uint32_t>(seq & ((1u << kSeqBits) - 1));
    }
    /// Decodes an immediate whose top bits are 01. Every field is in range by construction.
    static PieceImm decode(uint32_t imm)
    {
        PieceImm p;
        p.entry = static_cast<uint8_t>(imm >> 27 & 7);
        p.gen_low = imm >> kSeqBits & ((1u << kGenBits) - 1);
        p.seq_low = imm & ((1u << kSeqBits) - 1);
        return p;
    }
    /// The generation with residue gen_low at or below `latest` (and within 2^kGenBits of
    /// it); 0, older than any, when there is none.
    uint32_t generation(uint32_t latest) const
    {
        const uint32_t back = (latest - gen_low) & ((1u << kGenBits) - 1);
        return back > latest ? 0 : latest - back;
    }
};

/// A message small enough to need no record: its payload goes in one RDMA WRITE with
/// immediate straight into the advertised buffer, and the immediate says the rest (one work
/// request and one completion per message instead of two). The size is the write's length
/// (the receive completion's byte_len: a message is never split across QPs), the tag is the
/// entry's (the sender bound the message to that entry by its tag), the generation the
/// path's latest notice, and the sequence number is given modulo 2^kSeqBits: the receiver
/// unwraps it around its window (kMaxInflight wide, 256), so a late write of a message up to
/// 2^(kSeqBits-1) behind the window is still recognised as a replay. kMaxSize keeps NCCL's
/// 128 KiB p2p chunks on this path and its larger collective steps on the record path.
/// Layout of the 32-bit immediate (host order):
///   [31] 1  [30:28] entry  [27:0] seq mod 2^28
struct ShortImm {
    static constexpr int kSeqBits = 28;
    static constexpr uint64_t kMaxSize = 256 << 10; ///< bytes, inclusive
    static_assert(Ctl::kMaxEntries <= 8);
    uint32_t seq_low = 0; ///< seq mod 2^kSeqBits
    uint8_t entry = 0;

    static bool is_short(uint32_t imm) { return (imm >> 31) != 0; }
    static bool fits(uint64_t size) { return size <= kMaxSize; }
    /// The immediate of message `seq` for CTS entry `entry` (< 8).
    static uint32_t encode(uint64_t seq, int entry)
    {
        return 1u << 31 | static_cast<uint32_t>(entry & 7) << 28 | static_cast<uint32_t>(seq & ((1u << kSeqBits) - 1));
    }
    /// Decodes an immediate with the top bit set. Every field is in range by construction.
    static ShortImm decode(uint32_t imm)
    {
        ShortImm s;
        s.entry = static_cast<uint8_t>(imm >> 28 & 7);
        s.seq_low = imm & ((1u << kSeqBits) - 1);
        return s;
    }
};

/// The immediate of a control message's write into the peer's control ring: the message is
/// the write's bytes (the receive completion's byte_len, Ctl::kSize..kCtlBytes) at slot
/// n % kCtlSlots, n the writer's count of control messages on this path, of which the
/// immediate carries n mod 2^kCountBits (QP 0 carries every control message, in order, so the
/// reader checks it against its own count). Layout (host order):  [31:28] 0010  [27:0] n
///
/// A credit (CreditImm) is a write with immediate and no payload that hands slots back: the
/// immediate carries the count of the peer's control messages this end has consumed, mod
/// 2^kCountBits: [31:28] 0011  [27:0] consumed. The writer of control messages may have at
/// most kCtlSlots written that no credit has handed back.
struct CtlImm {
    static constexpr int kCountBits = 28;
    static constexpr uint32_t kMask = (1u << kCountBits) - 1;
    static bool is_control(uint32_t imm) { return (imm >> kCountBits) == 2; }
    static bool is_credit(uint32_t imm) { return (imm >> kCountBits) == 3; }
    static uint32_t control(uint64_t n) { return 2u << kCountBits | static_cast<uint32_t>(n & kMask); }
    static uint32_t credit(uint64_t consumed) { return 3u << kCountBits | static_cast<uint32_t>(consumed & kMask); }
    static uint32_t count(uint32_t imm) { return imm & kMask; }
    /// The full count whose residue is `low` at or below `latest` and within 2^kCountBits of it.
    static uint64_t unwrap(uint32_t low, uint64_t latest)
    {
        return latest - ((static_cast<uint32_t>(latest) - low) & kMask);
    }
};
static_assert(kCtlSlots < (1u << CtlImm::kCountBits));

} // namespace vigil::net::verbs_fabric
