// SPDX-License-Identifier: Apache-2.0
// GID choice.
#include "gid.h"

#include <arpa/inet.h>
#include <cstring>
#include <netinet/in.h>

#include "names.h"

namespace vigil::net::ib {
namespace {

uint32_t word(const uint8_t raw[16], int i)
{
    return (uint32_t{raw[4 * i]} << 24) | (uint32_t{raw[4 * i + 1]} << 16) |
           (uint32_t{raw[4 * i + 2]} << 8) | uint32_t{raw[4 * i + 3]};
}

bool link_local(const uint8_t raw[16])
{
    return word(raw, 0) == 0xfe800000u && word(raw, 1) == 0;
}

// Configured: not all zero, and not the bare fe80:: prefix with nothing after it.
bool configured(const uint8_t raw[16])
{
    const uint32_t tail = word(raw, 1) | word(raw, 2) | word(raw, 3);
    return !((word(raw, 0) | tail) == 0 || (word(raw, 0) == 0xfe800000u && tail == 0));
}

bool valid(const uint8_t raw[16])
{
    return configured(raw) && !link_local(raw);
}

int family_of(const uint8_t raw[16])
{
    return gid_is_ipv4(raw) ? AF_INET : AF_INET6;
}

int version_of(const verbs::GidEntry &e)
{
    return e.type == IBV_GID_TYPE_ROCE_V2 ? 2 : 1;
}

bool in_range(const GidPolicy &p, const uint8_t raw[16])
{
    if (!p.has_range) return true;
    if (p.family == AF_INET) {
        const uint32_t mask = p.range_bits == 0 ? 0 : ~uint32_t{0} << (32 - p.range_bits);
        return (word(raw, 3) & mask) == (word(p.range, 3) & mask);
    }
    int bits = p.range_bits;
    for (int i = 0; i < 16 && bits > 0; ++i, bits -= 8) {
        const uint8_t mask = bits >= 8 ? 0xff : static_cast<uint8_t>(0xff << (8 - bits));
        if ((raw[i] & mask) != (p.range[i] & mask)) return false;
    }
    return true;
}

} // namespace

bool gid_is_ipv4(const uint8_t raw[16]) noexcept
{
    const bool mapped = word(raw, 0) == 0 && word(raw, 1) == 0 && word(raw, 2) == 0x0000ffffu;
    const bool mapped_mc =
        word(raw, 0) == 0xff0e0000u && word(raw, 1) == 0 && word(raw, 2) == 0x0000ffffu;
    return mapped || mapped_mc;
}

bool GidPolicy::parse(int gid_index, std::string_view family, std::string_view range,
                      int roce_version, GidPolicy *out, std::string *why)
{
    GidPolicy p;
    p.forced_index = gid_index;
    if (family.empty() || family == "AF_INET")
        p.family = AF_INET;
    else if (family == "AF_INET6")
        p.family = AF_INET6;
    else {
        if (why) *why = "VIGIL_IB_ADDR_FAMILY must be AF_INET or AF_INET6";
        return false;
    }
    if (roce_version != 1 && roce_version != 2) {
        if (why) *why = "VIGIL_IB_ROCE_VERSION_NUM must be 1 or 2";
        return false;
    }
    p.roce_version = roce_version;
    if (!range.empty()) {
        const size_t slash = range.find('/');
        const std::string addr(range.substr(0, slash));
        const std::string_view bits =
            slash == std::string_view::npos ? std::string_view{} : range.substr(slash + 1);
        int n = 0;
        bool ok = !bits.empty() && bits.size() <= 3;
        for (char c : bits) {
            ok = ok && c >= '0' && c <= '9';
            if (!ok) break; // a long non-number would overflow `n`
            n = n * 10 + (c - '0');
        }
        const int max = p.family == AF_INET ? 32 : 128;
        if (!ok || n > max) {
            if (why)
                *why = "VIGIL_IB_ADDR_RANGE must be ADDRESS/BITS with BITS at most " +
                       std::to_string(max);
            return false;
        }
        if (p.family == AF_INET) {
            in_addr a{};
            ok = inet_pton(AF_INET, addr.c_str(), &a) == 1;
            p.range[10] = p.range[11] = 0xff;
            std::memcpy(p.range + 12, &a, 4);
        } else {
            ok = inet_pton(AF_INET6, addr.c_str(), p.range) == 1;
        }
        if (!ok) {
            if (why) *why = "VIGIL_IB_ADDR_RANGE: `" + addr + "` is not an address of the family";
            return false;
        }
        p.has_range = true;
        p.range_bits = n;
    }
    *out = p;
    return true;
}

GidChoice choose_gid(const std::vector<verbs::GidEntry> &table, bool infiniband,
                     const GidPolicy &policy)
{
    GidChoice c;
    auto at = [&](int index) -> const verbs::GidEntry * {
        for (const verbs::GidEntry &e : table)
            if (static_cast<int>(e.index) == index) return &e;
        return nullptr;
    };
    if (infiniband) {
        // A routable FLID sits in bytes 4..5 of the GID (global subnet prefix).
        const verbs::GidEntry *one = at(1);
        if (one != nullptr && (one->raw[4] != 0 || one->raw[5] != 0)) {
            c.index = 1;
            c.reason = "infiniband, routable FLID at index 1";
        } else {
            c.index = at(0) != nullptr ? 0 : -1;
            c.reason = c.index == 0 ? "infiniband, index 0" : "infiniband port has no GID 0";
        }
        c.preferred = c.index >= 0;
        return c;
    }
    if (policy.forced_index >= 0) {
        const verbs::GidEntry *e = at(policy.forced_index);
        c.index = e != nullptr ? policy.forced_index : -1;
        c.preferred = e != nullptr;
        c.reason = e != nullptr ? "VIGIL_IB_GID_INDEX"
                                : "VIGIL_IB_GID_INDEX " + std::to_string(policy.forced_index) +
                                      " is not in the port's GID table";
        return c;
    }
    // The walk starts at index 0 whether or not it holds a GID (an empty slot counts as the
    // all-zero GID: IPv6 family, invalid), exactly as NCCL's does.
    const verbs::GidEntry *cur = at(0);
    for (const verbs::GidEntry &e : table) {
        if (e.index == 0) continue;
        const int fam = family_of(e.raw);
        const int cur_fam = cur != nullptr ? family_of(cur->raw) : AF_INET6;
        const bool range_ok = in_range(policy, e.raw);
        if (fam != cur_fam && fam == policy.family && range_ok) {
            cur = &e;
            continue;
        }
        if (fam != policy.family || !valid(e.raw) || !range_ok) continue;
        const bool cur_valid = cur != nullptr && valid(cur->raw);
        const int cur_version = cur != nullptr ? version_of(*cur) : 0;
        if ((cur_version != version_of(e) || !cur_valid) && version_of(e) == policy.roce_version)
            cur = &e;
    }
    if (cur == nullptr) {
        c.reason = "the port has no GID";
        return c;
    }
    c.index = static_cast<int>(cur->index);
    c.preferred = valid(cur->raw) && family_of(cur->raw) == policy.family &&
                  version_of(*cur) == policy.roce_version && in_range(policy, cur->raw);
    c.reason = std::string(family_of(cur->raw) == AF_INET ? "IPv4" : "IPv6") + " RoCE v" +
               std::to_string(version_of(*cur)) + " " + verbs::gid_to_string(cur->raw) +
               (c.preferred ? "" : " (fallback: nothing matches the family and RoCE version)");
    return c;
}

} // namespace vigil::net::ib
