// SPDX-License-Identifier: Apache-2.0
// The TCP fabric's wire formats: the per-stream hello and the listener's accept answer
// (connection setup), the data frame header (sender -> receiver, every stream) and the ack
// (receiver -> sender, stream 0). Fixed-size, little-endian, each with a magic. Every field
// read from the wire is checked here or by the caller before use.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

namespace vigil::net::tcp {

/// Hard bounds on wire values, independent of configuration.
inline constexpr uint32_t kMaxStreams = 16;
inline constexpr uint32_t kMaxFrameBytes = 64u << 20; // VIGIL_CHUNK_BYTES upper bound

inline void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
}

/// First bytes on every stream, connector -> listener.
struct Hello {
    static constexpr uint32_t kMagic = 0x43474c56; // "VLGC"
    static constexpr uint8_t kVersion = 1;
    static constexpr size_t kSize = 40;
    uint8_t version = kVersion;
    uint8_t nstreams = 0;
    uint8_t stream = 0;
    /// Bits 0-2: path kind (0 primary, 1 backup). Bit 3: this path rebuilds a path of an
    /// existing connection. Bits 4-7: paths the connection opens at connect, minus one.
    uint8_t path_kind = 0;
    std::array<uint8_t, 16> nonce{};
    uint64_t conn_id = 0; ///< random per connection; groups the streams of one path
    uint64_t reserved = 0;

    void encode(uint8_t *p) const
    {
        put_le(p, kMagic, 4);
        p[4] = version;
        p[5] = nstreams;
        p[6] = stream;
        p[7] = path_kind;
        std::memcpy(p + 8, nonce.data(), 16);
        put_le(p + 24, conn_id, 8);
        put_le(p + 32, reserved, 8);
    }
    /// Returns nullptr when valid, else the name of the first bad field. The nonce is
    /// compared by the caller.
    const char *decode(const uint8_t *p)
    {
        if (get_le(p, 4) != kMagic) return "bad magic";
        version = p[4];
        nstreams = p[5];
        stream = p[6];
        path_kind = p[7];
        std::memcpy(nonce.data(), p + 8, 16);
        conn_id = get_le(p + 24, 8);
        reserved = get_le(p + 32, 8);
        if (version != kVersion) return "unsupported version";
        if (nstreams < 1 || nstreams > kMaxStreams) return "stream count out of range";
        if (stream >= nstreams) return "stream index out of range";
        if ((path_kind & 0x7) > 1) return "bad path kind";
        if ((path_kind >> 4) > 1) return "bad path count";
        if (conn_id == 0) return "zero connection id";
        if (reserved != 0) return "non-zero reserved field";
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

/// Precedes every chunk of a message on a stream.
struct FrameHeader {
    static constexpr uint32_t kMagic = 0x44474c56; // "VLGD"
    static constexpr size_t kSize = 40;
    uint32_t gen = 0;   ///< path generation
    uint64_t seq = 0;   ///< message sequence number
    uint64_t size = 0;  ///< whole message, bytes
    uint64_t offset = 0;///< of this chunk in the message
    uint32_t len = 0;   ///< chunk payload bytes following the header
    int32_t tag = 0;

    void encode(uint8_t *p) const
    {
        put_le(p, kMagic, 4);
        put_le(p + 4, gen, 4);
        put_le(p + 8, seq, 8);
        put_le(p + 16, size, 8);
        put_le(p + 24, offset, 8);
        put_le(p + 32, len, 4);
        put_le(p + 36, static_cast<uint32_t>(tag), 4);
    }
    /// Returns nullptr when the header is self-consistent and within the hard bounds.
    const char *decode(const uint8_t *p, uint64_t max_message)
    {
        if (get_le(p, 4) != kMagic) return "bad frame magic";
        gen = static_cast<uint32_t>(get_le(p + 4, 4));
        seq = get_le(p + 8, 8);
        size = get_le(p + 16, 8);
        offset = get_le(p + 24, 8);
        len = static_cast<uint32_t>(get_le(p + 32, 4));
        tag = static_cast<int32_t>(get_le(p + 36, 4));
        if (size > max_message) return "message size beyond the limit";
        if (len > kMaxFrameBytes) return "chunk length beyond the limit";
        if (offset > size || len > size - offset) return "chunk outside its message";
        return nullptr;
    }
};

/// Receiver -> sender on stream 0: every seq below `ack_seq` is held. Bit 31 of `gen`
/// (kAppBound) says data is waiting for a receive the application has not posted.
struct AckFrame {
    static constexpr uint32_t kMagic = 0x4b474c56; // "VLGK"
    static constexpr size_t kSize = 16;
    static constexpr uint32_t kAppBound = 0x80000000u;
    uint32_t gen = 0;
    uint64_t ack_seq = 0;
    void encode(uint8_t *p) const
    {
        put_le(p, kMagic, 4);
        put_le(p + 4, gen, 4);
        put_le(p + 8, ack_seq, 8);
    }
    bool decode(const uint8_t *p)
    {
        if (get_le(p, 4) != kMagic) return false;
        gen = static_cast<uint32_t>(get_le(p + 4, 4));
        ack_seq = get_le(p + 8, 8);
        return true;
    }
};

/// Hello path_kind accessors.
inline uint8_t make_path_kind(int kind, int npaths, bool rebuild)
{
    return static_cast<uint8_t>((kind & 0x7) | (rebuild ? 0x8 : 0) | ((npaths - 1) << 4));
}
inline int hello_kind(uint8_t pk) { return pk & 0x7; }
inline int hello_npaths(uint8_t pk) { return (pk >> 4) + 1; }
inline bool hello_rebuild(uint8_t pk) { return (pk & 0x8) != 0; }

/// Sequence number of a probe frame: a header with no payload that only proves the path
/// carries bytes; the receiver consumes it without asking the core.
inline constexpr uint64_t kProbeSeq = ~0ull;

/// Receiver -> sender, like an ack (same size and position), asking the sender to leave path
/// slot N (bytes [4,8)) because the receiver saw that path's port fail.
struct FailoverRequest {
    static constexpr uint32_t kMagic = 0x46474c56; // "VLGF"
};

} // namespace vigil::net::tcp
