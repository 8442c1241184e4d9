// SPDX-License-Identifier: Apache-2.0
// What both fabrics' connection set-up put on the wire the same way: little-endian fields and
// the 40-byte head of a path's hello (tcp/wire.h and verbs/verbs_wire.h each add their own
// magic, version, three bytes of their own and, for verbs, the QP end after it). Every field
// read from the wire is checked here or by the fabric's decode before use.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace vigil::net {

/// Writes the low `n` bytes of `v` at `p`, little-endian (n <= 8).
inline void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
/// Reads `n` little-endian bytes at `p` (n <= 8).
inline uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
}

/// The first HelloHead::kSize bytes of every hello, connector -> listener, on both fabrics:
///   [0,4) the fabric's magic  [4] version  [5,8) the fabric's own three bytes
///   [8,24) the listener's nonce (from the listen handle)  [24,32) connection id
///   [32,40) path id
/// The listener accepts only its own version, so both ends of a path speak the same one.
struct HelloHead {
    static constexpr size_t kSize = 40;
    uint8_t version = 0;
    std::array<uint8_t, 16> nonce{};
    uint64_t conn_id = 0; ///< random per connection, non-zero; groups the paths of one
    uint64_t path_id = 0; ///< random per path, non-zero

    /// Writes the head at `p` with `magic` and the fabric's bytes `own` at [5,8).
    void encode_head(uint8_t *p, uint32_t magic, const std::array<uint8_t, 3> &own) const
    {
        put_le(p, magic, 4);
        p[4] = version;
        std::memcpy(p + 5, own.data(), own.size());
        std::memcpy(p + 8, nonce.data(), nonce.size());
        put_le(p + 24, conn_id, 8);
        put_le(p + 32, path_id, 8);
    }
    /// Reads the head at `p` (HelloHead::kSize bytes, hostile) into this and *own. Returns
    /// nullptr when the magic is `magic`, the version `want_version` and both ids non-zero;
    /// else the name of the first bad field. The nonce is compared by the caller.
    const char *decode_head(const uint8_t *p, uint32_t magic, uint8_t want_version,
                            std::array<uint8_t, 3> *own)
    {
        if (get_le(p, 4) != magic) return "bad magic";
        version = p[4];
        std::memcpy(own->data(), p + 5, own->size());
        std::memcpy(nonce.data(), p + 8, nonce.size());
        conn_id = get_le(p + 24, 8);
        path_id = get_le(p + 32, 8);
        if (version != want_version) return "unsupported version";
        if (conn_id == 0) return "zero connection id";
        if (path_id == 0) return "zero path id";
        return nullptr;
    }
};

} // namespace vigil::net
