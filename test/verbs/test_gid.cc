// SPDX-License-Identifier: Apache-2.0
// GID choice from GID tables as real devices report them (no hardware needed).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <cstring>

#include "gid.h"

using vigil::net::ib::choose_gid;
using vigil::net::ib::GidPolicy;
using vigil::verbs::GidEntry;

namespace {

GidEntry v6(uint32_t index, const char *text, int type)
{
    GidEntry e;
    e.index = index;
    REQUIRE(inet_pton(AF_INET6, text, e.raw) == 1);
    e.type = type;
    return e;
}

GidPolicy policy(int index = -1, const char *family = "", const char *range = "", int version = 2)
{
    GidPolicy p;
    std::string why;
    REQUIRE(GidPolicy::parse(index, family, range, version, &p, &why));
    return p;
}

constexpr int kV1 = IBV_GID_TYPE_ROCE_V1;
constexpr int kV2 = IBV_GID_TYPE_ROCE_V2;

// A ConnectX port with one IPv4 and one global IPv6 address: each address appears as a
// RoCE v1 and a RoCE v2 entry (show_gids).
std::vector<GidEntry> mlx5_table()
{
    return {v6(0, "fe80::ac0:ebff:fe3d:ca54", kV1),
            v6(1, "fe80::ac0:ebff:fe3d:ca54", kV2),
            v6(2, "::ffff:10.110.0.33", kV1),
            v6(3, "::ffff:10.110.0.33", kV2),
            v6(4, "2001:db8::33", kV1),
            v6(5, "2001:db8::33", kV2)};
}

} // namespace

TEST_CASE("gid: rxe's table (link-local v2 at 0, IPv4 v2 at 1) picks index 1", "[gid]")
{
    const std::vector<GidEntry> t = {v6(0, "fe80::e4ab:69ff:fee1:32b1", kV2),
                                     v6(1, "::ffff:10.10.0.1", kV2)};
    const auto c = choose_gid(t, false, policy());
    CHECK(c.index == 1);
    CHECK(c.preferred);
    CHECK(c.reason.find("::ffff:10.10.0.1") != std::string::npos);
}

TEST_CASE("gid: the IPv4-mapped RoCE v2 entry wins on a ConnectX table", "[gid]")
{
    CHECK(choose_gid(mlx5_table(), false, policy()).index == 3);
}

TEST_CASE("gid: IPv6 and RoCE v1 when asked", "[gid]")
{
    CHECK(choose_gid(mlx5_table(), false, policy(-1, "AF_INET6")).index == 5);
    CHECK(choose_gid(mlx5_table(), false, policy(-1, "AF_INET", "", 1)).index == 2);
    CHECK(choose_gid(mlx5_table(), false, policy(-1, "AF_INET6", "", 1)).index == 4);
}

TEST_CASE("gid: the order of v1/v2 entries does not matter", "[gid]")
{
    std::vector<GidEntry> t = {v6(0, "fe80::1", kV1), v6(1, "::ffff:10.0.0.5", kV2),
                               v6(2, "::ffff:10.0.0.5", kV1)};
    CHECK(choose_gid(t, false, policy()).index == 1);
}

TEST_CASE("gid: only RoCE v1 IPv4 present: family beats version, not preferred", "[gid]")
{
    std::vector<GidEntry> t = {v6(0, "fe80::1", kV1), v6(1, "::ffff:10.0.0.5", kV1)};
    const auto c = choose_gid(t, false, policy());
    CHECK(c.index == 1);
    CHECK_FALSE(c.preferred);
}

TEST_CASE("gid: a port with only its link-local GID falls back to index 0", "[gid]")
{
    const auto c = choose_gid({v6(0, "fe80::e4ab:69ff:fee1:32b1", kV2)}, false, policy());
    CHECK(c.index == 0);
    CHECK_FALSE(c.preferred);
    CHECK(c.reason.find("fallback") != std::string::npos);
}

TEST_CASE("gid: an empty table has no usable GID", "[gid]")
{
    const auto c = choose_gid({}, false, policy());
    CHECK(c.index == -1);
    CHECK_FALSE(c.reason.empty());
}

TEST_CASE("gid: empty slots are skipped, the walk still starts at index 0", "[gid]")
{
    std::vector<GidEntry> t = {v6(3, "::ffff:192.168.1.7", kV2), v6(7, "::ffff:192.168.1.7", kV1)};
    CHECK(choose_gid(t, false, policy()).index == 3);
}

TEST_CASE("gid: VIGIL_IB_ADDR_RANGE picks the address inside it", "[gid]")
{
    std::vector<GidEntry> t = {v6(0, "fe80::1", kV2), v6(1, "::ffff:10.10.0.1", kV2),
                               v6(2, "::ffff:192.168.5.1", kV2)};
    CHECK(choose_gid(t, false, policy(-1, "AF_INET", "192.168.0.0/16")).index == 2);
    CHECK(choose_gid(t, false, policy(-1, "AF_INET", "10.10.0.0/24")).index == 1);
    CHECK(choose_gid(t, false, policy(-1, "AF_INET", "0.0.0.0/0")).index == 1);
    std::vector<GidEntry> t6 = {v6(0, "fe80::1", kV2), v6(1, "2001:db8:1::5", kV2),
                                v6(2, "2001:db8:2::5", kV2)};
    CHECK(choose_gid(t6, false, policy(-1, "AF_INET6", "2001:db8:2::/48")).index == 2);
}

TEST_CASE("gid: VIGIL_IB_GID_INDEX overrides, and must exist", "[gid]")
{
    CHECK(choose_gid(mlx5_table(), false, policy(0)).index == 0);
    CHECK(choose_gid(mlx5_table(), false, policy(4)).index == 4);
    const auto c = choose_gid(mlx5_table(), false, policy(9));
    CHECK(c.index == -1);
    CHECK(c.reason.find("not in") != std::string::npos);
}

TEST_CASE("gid: InfiniBand takes index 0, or 1 with a routable FLID", "[gid]")
{
    std::vector<GidEntry> ib = {v6(0, "fe80::248a:703:5d:7f1", IBV_GID_TYPE_IB)};
    CHECK(choose_gid(ib, true, policy(5)).index == 0); // the RoCE override does not apply
    ib.push_back(v6(1, "fe80:0:12::248a:703:5d:7f1", IBV_GID_TYPE_IB));
    CHECK(choose_gid(ib, true, policy()).index == 1);
}

TEST_CASE("gid: bad policy values are errors", "[gid]")
{
    GidPolicy p;
    std::string why;
    CHECK_FALSE(GidPolicy::parse(-1, "AF_UNIX", "", 2, &p, &why));
    CHECK_FALSE(GidPolicy::parse(-1, "", "", 3, &p, &why));
    CHECK_FALSE(GidPolicy::parse(-1, "AF_INET", "10.0.0.0", 2, &p, &why));
    CHECK_FALSE(GidPolicy::parse(-1, "AF_INET", "10.0.0.0/33", 2, &p, &why));
    CHECK_FALSE(GidPolicy::parse(-1, "AF_INET", "2001:db8::/16", 2, &p, &why));
    CHECK_FALSE(GidPolicy::parse(-1, "AF_INET6", "2001:db8::/129", 2, &p, &why));
    CHECK_FALSE(why.empty());
}

TEST_CASE("gid: a long prefix length is refused without reading it as a number", "[gid]")
{
    // Found by fuzzing VIGIL_IB_ADDR_RANGE: the digits were still summed into an int after the
    // length was known to be bad, a signed overflow (undefined; UBSan aborts here without the
    // fix).
    GidPolicy p;
    std::string why;
    CHECK_FALSE(GidPolicy::parse(-1, "AF_INET", "10.0.0.0/99999999999", 2, &p, &why));
    CHECK_FALSE(GidPolicy::parse(-1, "AF_INET6", "fd00::/1x99999999999", 2, &p, &why));
    CHECK(why.find("BITS at most 128") != std::string::npos);
}

TEST_CASE("gid: IPv4-mapped detection", "[gid]")
{
    CHECK(vigil::net::ib::gid_is_ipv4(v6(0, "::ffff:1.2.3.4", kV2).raw));
    CHECK(vigil::net::ib::gid_is_ipv4(v6(0, "ff0e::ffff:239.1.1.1", kV2).raw));
    CHECK_FALSE(vigil::net::ib::gid_is_ipv4(v6(0, "::1.2.3.4", kV2).raw));
    CHECK_FALSE(vigil::net::ib::gid_is_ipv4(v6(0, "fe80::1", kV2).raw));
}
