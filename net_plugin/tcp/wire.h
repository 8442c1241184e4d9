// SPDX-License-Identifier: Apache-2.0
// The TCP fabric's wire formats: the per-stream hello and the listener's accept answer
// (connection setup), the frame header (sender -> receiver, every stream: data chunks and
// control frames) and the back channel (receiver -> sender, stream 0: acks, CTS groups,
// failover requests, goodbye). Little-endian, each with a magic. Every field read from the
// wire is checked here or by the caller before use.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

#include "../fabric.h"
#include "../hello_wire.h"

namespace vigil::net::tcp {

/// Hard bounds on wire values, independent of configuration.
inline constexpr uint32_t kMaxStreams = 16;
inline constexpr uint32_t kMaxFrameBytes = 64u << 20; // VIGIL_CHUNK_BYTES upper bound

using vigil::net::get_le;
using vigil::net::put_le;

/// First bytes on every stream, connector -> listener: the hello's head (hello_wire.h) with
/// the stream's own three bytes. Version 3 (from version 2): acks carry the receiver's ack
/// delay (BackHeader). Version 4: the back channel reports what each path landed
/// (BackHeader::kLanded).
struct Hello : HelloHead {
    static constexpr uint32_t kMagic = 0x43474c56; // "VLGC"
    static constexpr uint8_t kVersion = 4;
    static constexpr size_t kSize = HelloHead::kSize;
    uint8_t nstreams = 0;
    uint8_t stream = 0;
    /// Bits 0-2: path kind (0 primary, 1 backup). Bit 3: this path rebuilds a path of an
    /// existing connection. Bits 4-7: paths the connection opens at connect, minus one.
    uint8_t path_kind = 0;

    Hello() { version = kVersion; }
    void encode(uint8_t *p) const { encode_head(p, kMagic, {nstreams, stream, path_kind}); }
    /// Returns nullptr when valid, else the name of the first bad field. The nonce is
    /// compared by the caller.
    const char *decode(const uint8_t *p)
    {
        std::array<uint8_t, 3> own{};
        const char *bad = decode_head(p, kMagic, kVersion, &own);
        nstreams = own[0];
        stream = own[1];
        path_kind = own[2];
        if (bad != nullptr) return bad;
        if (nstreams < 1 || nstreams > kMaxStreams) return "stream count out of range";
        if (stream >= nstreams) return "stream index out of range";
        if ((path_kind & 0x7) > 1) return "bad path kind";
        if ((path_kind >> 4) > 1) return "bad path count";
        return nullptr;
    }
};

/// Listener -> connector on stream 0 once every stream of the path said hello.
struct AcceptAnswer {
    static constexpr uint32_t kMagic = 0x41474c56; // "VLGA"
    static constexpr size_t kSize = 8;
    static void encode(uint8_t *p, uint32_t status)
    {
        put_le(p, kMagic, 4);
        put_le(p + 4, status, 4);
    }
};

/// Sender -> receiver, on any stream: precedes every chunk of a message (kData), or stands
/// alone (control kinds, no payload; written on stream 0 between frames). Layout, 40 bytes:
///   [0,4) magic "VLGD"  [4] kind  [5] entry (kData: the CTS entry the message is bound to;
///   kGeneration: the abandoned path slot, 0xff for none)  [6,8) zero  [8,12) generation
///   [12,16) tag  [16,24) seq (kGeneration: the first seq of the generation)
///   [24,28) message size  [28,32) chunk offset (kGeneration: [24,32) the abandoned path's
///   id, 0 for none)  [32,36) chunk length  [36,40) zero
struct FrameHeader {
    static constexpr uint32_t kMagic = 0x44474c56; // "VLGD"
    static constexpr size_t kSize = 40;
    enum Kind : uint8_t { kData = 0, kProbe = 1, kGeneration = 2, kGoodbye = 3 };
    static constexpr uint8_t kNoSlot = 0xff;
    uint8_t kind = kData;
    uint8_t entry = 0;
    uint32_t gen = 0;   ///< path generation
    int32_t tag = 0;
    uint64_t seq = 0;   ///< message sequence number
    uint32_t size = 0;  ///< whole message, bytes
    uint32_t offset = 0;///< of this chunk in the message
    uint32_t len = 0;   ///< chunk payload bytes following the header
    uint64_t path = 0;  ///< kGeneration: the abandoned path's id (in place of size, offset)

    void encode(uint8_t *p) const
    {
        put_le(p, kMagic, 4);
        p[4] = kind;
        p[5] = entry;
        put_le(p + 6, 0, 2);
        put_le(p + 8, gen, 4);
        put_le(p + 12, static_cast<uint32_t>(tag), 4);
        put_le(p + 16, seq, 8);
        if (kind == kGeneration) {
            put_le(p + 24, path, 8);
        } else {
            put_le(p + 24, size, 4);
            put_le(p + 28, offset, 4);
        }
        put_le(p + 32, len, 4);
        put_le(p + 36, 0, 4);
    }
    /// Returns nullptr when the header is self-consistent and within the hard bounds, else
    /// what is wrong with it.
    const char *decode(const uint8_t *p, uint64_t max_message)
    {
        if (get_le(p, 4) != kMagic) return "bad frame magic";
        kind = p[4];
        entry = p[5];
        gen = static_cast<uint32_t>(get_le(p + 8, 4));
        tag = static_cast<int32_t>(get_le(p + 12, 4));
        seq = get_le(p + 16, 8);
        size = static_cast<uint32_t>(get_le(p + 24, 4));
        offset = static_cast<uint32_t>(get_le(p + 28, 4));
        len = static_cast<uint32_t>(get_le(p + 32, 4));
        if (get_le(p + 6, 2) != 0 || get_le(p + 36, 4) != 0) return "non-zero reserved field";
        if (kind > kGoodbye) return "unknown frame kind";
        if (kind == kGeneration) {
            path = get_le(p + 24, 8);
            size = offset = 0;
        }
        if (kind != kData) {
            if (size != 0 || offset != 0 || len != 0) return "control frame with a payload";
            if (kind == kGeneration && entry != kNoSlot && entry >= kMaxSlots) return "bad abandoned slot";
            return nullptr;
        }
        if (entry >= kMaxEntries) return "CTS entry index out of range";
        if (size > max_message) return "message size beyond the limit";
        if (len > kMaxFrameBytes) return "chunk length beyond the limit";
        if (offset > size || len > size - offset) return "chunk outside its message";
        return nullptr;
    }
    static constexpr uint8_t kMaxSlots = 2;   ///< path slots a notice may name
    static constexpr uint8_t kMaxEntries = 8; ///< entries of one CTS group
};

/// Receiver -> sender, on stream 0 only (the back channel). Header, 24 bytes:
///   [0,4) magic "VLGB"  [4] kind  [5] count (kCts: entries 1..8; kLanded: entries
///   1..kMaxLanded; else 0)  [6,8) zero
///   [8,12) kAck: generation; kFailoverRequest: the failed path slot
///   [12,16) kAck: ack delay, us (below); other kinds: zero
///   [16,24) kAck: cumulative ack seq; kCts: the group index
/// Ack delay (since version 3, as QUIC's ACK Delay, RFC 9000 19.3): how long the newest
/// payload byte this path read before the ack was queued had waited in the receiver's socket
/// before the receiver read it (kernel receive timestamp to read), in us; 0 when the ack
/// acknowledges nothing new on this path or the kernel gave no timestamp. It tells the sender
/// how much of a transfer's time the data waited for the receiver, not for the path. Any
/// 32-bit value decodes; the sender bounds it by what it can have been (comm_telemetry.cc).
/// A kCts header is followed by the group: [0,8) first seq, then per entry 16 bytes:
///   [0,8) capacity  [8,12) tag  [12,16) zero.
/// A kLanded header (since version 4) is followed by `count` entries of 16 bytes, each payload
/// bytes this path placed and counted for a message since the previous report:
///   [0,8) seq  [8,12) bytes  [12,16) the generation of the frames that brought them.
/// Its `value` is the receiver's CLOCK_REALTIME (ns) when the newest byte the report covers
/// reached the receiving host (the kernel's SO_TIMESTAMPNS receive stamp; when the kernel gave
/// none, when the receiver queued the report), so the sender can tell how long after landing
/// the report came back (ReturnDelay): the receiving process's own delay in reading it and the
/// way back. 0: not stamped (a receiver before this field, which it ignores), the report is
/// dated by its arrival.
/// A cumulative ack says what the receiver holds whichever path brought it; a landed report
/// says what came over this path, so the sender can end a path's share of a message when its
/// own pieces land (a fast path striping beside a slow one is not charged the slow one's
/// time) and knows what each path still has on the way. Sent with the acks, batched.
struct BackHeader {
    static constexpr uint32_t kMagic = 0x42474c56; // "VLGB"
    static constexpr size_t kSize = 24;
    static constexpr size_t kEntrySize = 16;
    static constexpr size_t kMaxEntries = 8;
    static constexpr size_t kLandedSize = 16;
    static constexpr size_t kMaxLanded = 16;
    /// Largest back-channel message: a report of kMaxLanded landings (a CTS group of
    /// kMaxEntries is smaller).
    static constexpr size_t kMaxBytes = kSize + kMaxLanded * kLandedSize;
    enum Kind : uint8_t { kAck = 0, kFailoverRequest = 1, kCts = 2, kGoodbye = 3, kLanded = 4 };
    uint8_t kind = kAck;
    uint8_t count = 0;
    uint32_t arg = 0;
    uint32_t delay_us = 0; ///< kAck: ack delay (above); written as zero for other kinds
    uint64_t value = 0;

    void encode(uint8_t *p) const
    {
        put_le(p, kMagic, 4);
        p[4] = kind;
        p[5] = count;
        put_le(p + 6, 0, 2);
        put_le(p + 8, arg, 4);
        put_le(p + 12, kind == kAck ? delay_us : 0, 4);
        put_le(p + 16, value, 8);
    }
    /// Returns nullptr when valid, else what is wrong.
    const char *decode(const uint8_t *p)
    {
        if (get_le(p, 4) != kMagic) return "bad back-channel magic";
        kind = p[4];
        count = p[5];
        arg = static_cast<uint32_t>(get_le(p + 8, 4));
        delay_us = static_cast<uint32_t>(get_le(p + 12, 4));
        value = get_le(p + 16, 8);
        if (get_le(p + 6, 2) != 0 || (kind != kAck && delay_us != 0))
            return "non-zero reserved field";
        if (kind > kLanded) return "unknown back-channel kind";
        const size_t most = kind == kCts ? kMaxEntries : kind == kLanded ? kMaxLanded : 0;
        if (most == 0 ? count != 0 : (count < 1 || count > most)) return "bad entry count";
        return nullptr;
    }
    /// Bytes following the header.
    size_t payload() const
    {
        if (kind == kCts) return 8 + count * kEntrySize;
        return kind == kLanded ? count * kLandedSize : 0;
    }
};
static_assert(BackHeader::kMaxEntries == kMaxRecvs, "a CTS group is one grouped irecv");
static_assert(BackHeader::kSize + 8 + BackHeader::kMaxEntries * BackHeader::kEntrySize <= BackHeader::kMaxBytes,
              "kMaxBytes covers a whole CTS group");

/// One entry of a kLanded report: `bytes` of message `seq`, from frames of generation `gen`,
/// were placed and counted by the receiver.
struct Landed {
    uint64_t seq = 0;
    uint32_t bytes = 0;
    uint32_t gen = 0;
};

/// A landed report as a back-channel message: fills `h` and writes the n (1..kMaxLanded)
/// entries to `p` (h->payload() bytes). `stamp_ns`: the receiver's CLOCK_REALTIME now (0:
/// none).
inline void encode_landed(const Landed *e, size_t n, uint64_t stamp_ns, BackHeader *h, uint8_t *p)
{
    *h = BackHeader{};
    h->kind = BackHeader::kLanded;
    h->count = static_cast<uint8_t>(n);
    h->value = stamp_ns;
    for (size_t k = 0; k < n; ++k, p += BackHeader::kLandedSize) {
        put_le(p, e[k].seq, 8);
        put_le(p + 8, e[k].bytes, 4);
        put_le(p + 12, e[k].gen, 4);
    }
}

/// Entry `k` (< h.count) of the decoded kLanded report whose payload is `p`. Any value
/// decodes: the sender ignores entries for messages it does not have in flight, and counts a
/// message's bytes only up to its size.
inline Landed decode_landed(const uint8_t *p, size_t k)
{
    p += k * BackHeader::kLandedSize;
    return Landed{get_le(p, 8), static_cast<uint32_t>(get_le(p + 8, 4)), static_cast<uint32_t>(get_le(p + 12, 4))};
}

/// A CTS group as a back-channel message: fills `h` (kind, count, group index) and writes the
/// group's payload (h->payload() bytes, at most BackHeader::kMaxBytes - kSize) to `p`.
/// `g.n` must be 1..kMaxEntries; the entries' addresses and keys are not sent (TCP has none).
inline void encode_cts(const CtsGroup &g, BackHeader *h, uint8_t *p)
{
    *h = BackHeader{};
    h->kind = BackHeader::kCts;
    h->count = static_cast<uint8_t>(g.n);
    h->value = g.index;
    put_le(p, g.first_seq, 8);
    for (int k = 0; k < g.n; ++k) {
        uint8_t *e = p + 8 + static_cast<size_t>(k) * BackHeader::kEntrySize;
        const CtsEntry &ce = g.entries[static_cast<size_t>(k)];
        put_le(e, ce.size, 8);
        put_le(e + 8, static_cast<uint32_t>(ce.tag), 4);
        put_le(e + 12, 0, 4);
    }
}

/// The CTS group of a decoded kCts header `h` whose payload (h.payload() bytes) is `p`.
/// Returns nullptr when valid, else what is wrong (`*g` is then partly filled). Capacities are
/// taken as sent: the sender checks each message against its entry.
inline const char *decode_cts(const BackHeader &h, const uint8_t *p, CtsGroup *g)
{
    if (h.kind != BackHeader::kCts) return "not a CTS message";
    *g = CtsGroup{};
    g->index = h.value;
    g->first_seq = get_le(p, 8);
    g->n = h.count;
    for (int k = 0; k < g->n; ++k) {
        const uint8_t *e = p + 8 + static_cast<size_t>(k) * BackHeader::kEntrySize;
        CtsEntry &ce = g->entries[static_cast<size_t>(k)];
        ce.size = get_le(e, 8);
        ce.tag = static_cast<int32_t>(get_le(e + 8, 4));
        if (get_le(e + 12, 4) != 0) return "CTS entry with a non-zero reserved field";
    }
    return nullptr;
}

/// Hello path_kind accessors.
inline uint8_t make_path_kind(int kind, int npaths, bool rebuild)
{
    return static_cast<uint8_t>((kind & 0x7) | (rebuild ? 0x8 : 0) | ((npaths - 1) << 4));
}
inline int hello_kind(uint8_t pk) { return pk & 0x7; }
inline int hello_npaths(uint8_t pk) { return (pk >> 4) + 1; }
inline bool hello_rebuild(uint8_t pk) { return (pk & 0x8) != 0; }

} // namespace vigil::net::tcp
