// SPDX-License-Identifier: Apache-2.0
// Listen handle encoding and hostile-input decoding.
#include "handle.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <sys/random.h>

namespace vigil::net {
namespace {

constexpr size_t kAddrOffset = 24;
constexpr size_t kAddrEntry = 20;
constexpr size_t kSumOffset = kAddrOffset + ListenHandle::kMaxAddrs * kAddrEntry; // 104
static_assert(kSumOffset + 4 == ListenHandle::kScratchOffset);

void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
    return v;
}

} // namespace

socklen_t Endpoint::to_sockaddr(sockaddr_storage *ss) const
{
    std::memset(ss, 0, sizeof(*ss));
    if (family == AF_INET) {
        auto *in = reinterpret_cast<sockaddr_in *>(ss);
        in->sin_family = AF_INET;
        in->sin_port = htons(port);
        std::memcpy(&in->sin_addr, addr.data(), 4);
        return sizeof(sockaddr_in);
    }
    auto *in6 = reinterpret_cast<sockaddr_in6 *>(ss);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(port);
    in6->sin6_scope_id = scope_id;
    std::memcpy(&in6->sin6_addr, addr.data(), 16);
    return sizeof(sockaddr_in6);
}

bool Endpoint::from_sockaddr(const sockaddr *sa, Endpoint *out)
{
    if (sa == nullptr) return false;
    Endpoint e;
    if (sa->sa_family == AF_INET) {
        const auto *in = reinterpret_cast<const sockaddr_in *>(sa);
        e.family = AF_INET;
        e.port = ntohs(in->sin_port);
        std::memcpy(e.addr.data(), &in->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6) {
        const auto *in6 = reinterpret_cast<const sockaddr_in6 *>(sa);
        e.family = AF_INET6;
        e.port = ntohs(in6->sin6_port);
        e.scope_id = in6->sin6_scope_id;
        std::memcpy(e.addr.data(), &in6->sin6_addr, 16);
    } else {
        return false;
    }
    *out = e;
    return true;
}

std::string Endpoint::address() const
{
    char buf[INET6_ADDRSTRLEN] = "?";
    inet_ntop(family == AF_INET ? AF_INET : AF_INET6, addr.data(), buf, sizeof(buf));
    return buf;
}

std::string Endpoint::to_string() const
{
    // Appends, not `"[" + std::string`: a bogus GCC 12 -Wrestrict at -O3 (GCC bug 105329).
    if (family == AF_INET6)
        return std::string("[").append(address()).append("]:").append(std::to_string(port));
    return address().append(":").append(std::to_string(port));
}

uint32_t fnv1a32(const uint8_t *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 16777619u;
    }
    return h;
}

bool nonce_equal(const std::array<uint8_t, 16> &a, const std::array<uint8_t, 16> &b)
{
    uint8_t diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
    return diff == 0;
}

int random_bytes(void *buf, size_t n)
{
    auto *p = static_cast<uint8_t *>(buf);
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += r;
        n -= static_cast<size_t>(r);
    }
    return 0;
}

int ListenHandle::encode(uint8_t *out) const
{
    if (addrs.empty() || addrs.size() > kMaxAddrs) return -EINVAL;
    std::memset(out, 0, kSize);
    put_u32(out, kMagic);
    out[4] = version;
    out[5] = static_cast<uint8_t>(addrs.size());
    out[6] = static_cast<uint8_t>(dev);
    out[7] = static_cast<uint8_t>(dev >> 8);
    std::memcpy(out + 8, nonce.data(), nonce.size());
    for (size_t i = 0; i < addrs.size(); ++i) {
        const Endpoint &e = addrs[i];
        if (e.family != AF_INET && e.family != AF_INET6) return -EINVAL;
        uint8_t *p = out + kAddrOffset + i * kAddrEntry;
        p[0] = e.family == AF_INET ? 4 : 6;
        p[1] = i < addr_devs.size() ? addr_devs[i] : static_cast<uint8_t>(i);
        p[2] = static_cast<uint8_t>(e.port >> 8);
        p[3] = static_cast<uint8_t>(e.port);
        std::memcpy(p + 4, e.addr.data(), e.family == AF_INET ? 4 : 16);
    }
    put_u32(out + kSumOffset, fnv1a32(out, kSumOffset));
    return 0;
}

int ListenHandle::decode(const uint8_t *in, ListenHandle *out, std::string *why)
{
    auto fail = [&](const char *field) {
        if (why != nullptr) *why = field;
        return -EBADMSG;
    };
    if (get_u32(in) != kMagic) return fail("bad magic");
    if (in[4] != kVersion) return fail("unsupported version");
    const size_t naddr = in[5];
    if (naddr < 1 || naddr > kMaxAddrs) return fail("address count out of range");
    if (get_u32(in + kSumOffset) != fnv1a32(in, kSumOffset)) return fail("bad checksum");
    ListenHandle h;
    h.version = in[4];
    h.dev = static_cast<uint16_t>(in[6] | (in[7] << 8));
    std::memcpy(h.nonce.data(), in + 8, h.nonce.size());
    for (size_t i = 0; i < kMaxAddrs; ++i) {
        const uint8_t *p = in + kAddrOffset + i * kAddrEntry;
        if (i >= naddr) {
            for (size_t k = 0; k < kAddrEntry; ++k)
                if (p[k] != 0) return fail("non-zero unused address entry");
            continue;
        }
        Endpoint e;
        if (p[0] == 4) e.family = AF_INET;
        else if (p[0] == 6) e.family = AF_INET6;
        else return fail("bad address family");
        e.port = static_cast<uint16_t>((p[2] << 8) | p[3]);
        if (e.port == 0) return fail("zero port");
        const size_t alen = e.family == AF_INET ? 4 : 16;
        std::memcpy(e.addr.data(), p + 4, alen);
        for (size_t k = 4 + alen; k < kAddrEntry; ++k)
            if (p[k] != 0) return fail("non-zero address padding");
        h.addrs.push_back(e);
        h.addr_devs.push_back(p[1]);
    }
    *out = std::move(h);
    return 0;
}

} // namespace vigil::net
