// SPDX-License-Identifier: Apache-2.0
// Which GID a port's QPs use: chosen from the port's GID table as NCCL's IB transport does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "device.h" // vigil::verbs::GidEntry

namespace vigil::net::ib {

/// What the user asked for (VIGIL_IB_GID_INDEX, VIGIL_IB_ADDR_FAMILY, VIGIL_IB_ADDR_RANGE,
/// VIGIL_IB_ROCE_VERSION_NUM; NCCL's NCCL_IB_* of the same names). Plain value type.
struct GidPolicy {
    int forced_index = -1; ///< >= 0: use exactly this index on RoCE ports
    int family = 2;        ///< AF_INET (2) or AF_INET6 (10)
    int roce_version = 2;  ///< 1 or 2
    bool has_range = false;
    uint8_t range[16] = {}; ///< the range's address as a GID (IPv4 as ::ffff:a.b.c.d)
    int range_bits = 0;     ///< prefix length within the family (0..32 or 0..128)

    /// Builds a policy from the variables' text; family "" means AF_INET, range "" none.
    /// False with *why on a bad value (NCCL ignores bad values silently; we do not).
    static bool parse(int gid_index, std::string_view family, std::string_view range,
                      int roce_version, GidPolicy *out, std::string *why);
};

/// The choice for one port. Plain data.
struct GidChoice {
    int index = -1;         ///< -1: the port has no usable GID
    bool preferred = false; ///< it has the family and RoCE version asked for (else a fallback)
    std::string reason;     ///< one line for logs: why this entry, or why none
};

/// True when the GID is IPv4-mapped (::ffff:a.b.c.d, or its ff0e:: multicast form).
bool gid_is_ipv4(const uint8_t raw[16]) noexcept;

/// Chooses the port's GID from its table (entries lowest index first; absent indexes are
/// empty slots). RoCE (`infiniband` false): `forced_index` when set and present; else, like
/// NCCL (net_ib connect.cc ncclIbGetGidIndex/ncclUpdateGidIndex), walking the table from
/// index 0: an entry of the wanted family (inside the range, if any) replaces one of
/// another family; among entries of the wanted family a valid one (configured, not
/// link-local) of the wanted RoCE version replaces one of another version or an invalid one.
/// So an IPv4-mapped RoCE v2 GID wins by default, and a port with only its link-local GID
/// falls back to that (preferred = false). InfiniBand: index 0, or index 1 when it carries a
/// routable FLID (NCCL_IB_ROUTABLE_FLID_GID_INDEX's default). Pure; thread-safe.
GidChoice choose_gid(const std::vector<verbs::GidEntry> &table, bool infiniband,
                     const GidPolicy &policy);

} // namespace vigil::net::ib
