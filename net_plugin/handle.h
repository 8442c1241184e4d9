// SPDX-License-Identifier: Apache-2.0
// The 128-byte listen handle NCCL carries from listen() on one rank to connect() on another,
// and the socket endpoint type it holds. The handle's bytes come from another process, so
// decoding treats them as hostile: every field is checked before use.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <sys/socket.h>

namespace vigil::net {

/// An IPv4 or IPv6 address with a port. Plain value type.
struct Endpoint {
    int family = 0;                  ///< AF_INET or AF_INET6
    uint16_t port = 0;               ///< host byte order
    std::array<uint8_t, 16> addr{};  ///< IPv4 in the first 4 bytes
    uint32_t scope_id = 0;           ///< IPv6 link-local scope (not carried in the handle)

    /// Fills a sockaddr_in/sockaddr_in6; returns its length.
    socklen_t to_sockaddr(sockaddr_storage *ss) const;
    /// Reads a sockaddr_in/_in6; false for any other family.
    static bool from_sockaddr(const sockaddr *sa, Endpoint *out);
    /// "10.0.0.1:4242" or "[fe80::1]:4242".
    std::string to_string() const;
    /// The address alone: "10.0.0.1" or "fe80::1".
    std::string address() const;
    bool operator==(const Endpoint &) const = default;
};

/// Decoded listen handle. Layout (little-endian), 128 bytes:
///   [0,4) magic "VGLH"  [4] version  [5] address count (1..kMaxAddrs)  [6,8) listener device
///   [8,24) nonce  [24,104) kMaxAddrs entries of 20 bytes: family code (4|6), the listener's
///   device index of that address, port (BE), 16 address bytes; unused entries zero
///   [104,108) FNV-1a of [0,104)
///   [108,128) scratch owned by the connecting side (connect()'s retry state); not checked.
struct ListenHandle {
    static constexpr uint32_t kMagic = 0x484c4756; // "VGLH"
    static constexpr uint8_t kVersion = 1;
    static constexpr size_t kSize = 128;
    static constexpr size_t kMaxAddrs = 4;
    static constexpr size_t kScratchOffset = 108;
    static constexpr size_t kScratchSize = kSize - kScratchOffset;

    uint8_t version = kVersion;
    uint16_t dev = 0;
    std::array<uint8_t, 16> nonce{};
    std::vector<Endpoint> addrs; ///< [0] is the listener's device; the rest are its other devices
    std::vector<uint8_t> addr_devs; ///< listener's device index of each address (same length,
                                    ///< or empty when encoding: then 0, 1, 2, ...)

    /// Writes the handle into `out` (kSize bytes; scratch zeroed). Returns 0, or -EINVAL
    /// when addrs is empty or longer than kMaxAddrs.
    int encode(uint8_t *out) const;
    /// Parses `in` (kSize bytes). Returns 0, or -EBADMSG with `*why` naming the first bad
    /// field (magic, version, count, family, port, padding, checksum).
    static int decode(const uint8_t *in, ListenHandle *out, std::string *why);
};

/// 32-bit FNV-1a, used as the handle's corruption check (not a MAC: the nonce is the secret).
uint32_t fnv1a32(const uint8_t *p, size_t n);

/// Constant-time comparison of two nonces.
bool nonce_equal(const std::array<uint8_t, 16> &a, const std::array<uint8_t, 16> &b);

/// Fills `n` bytes from the kernel CSPRNG (getrandom). Returns 0 or -errno.
int random_bytes(void *buf, size_t n);

} // namespace vigil::net
