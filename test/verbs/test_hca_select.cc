// SPDX-License-Identifier: Apache-2.0
// VIGIL_IB_HCA: NCCL_IB_HCA syntax over NCCL's documented examples, and device ordering.
#include <catch2/catch.hpp>

#include <algorithm>

#include "devices.h"
#include "hca_select.h"

using vigil::net::ib::HcaSelector;

namespace {
HcaSelector parse_ok(const char *spec)
{
    HcaSelector s;
    std::string why;
    INFO(spec);
    REQUIRE(HcaSelector::parse(spec, &s, &why));
    CHECK(why.empty());
    return s;
}
} // namespace

TEST_CASE("hca: `mlx5` selects every port of every device starting with mlx5", "[hca]")
{
    const HcaSelector s = parse_ok("mlx5");
    CHECK(s.matches("mlx5_0", 1));
    CHECK(s.matches("mlx5_0", 2));
    CHECK(s.matches("mlx5_11", 1));
    CHECK_FALSE(s.matches("rxe_a0", 1));
    CHECK_FALSE(s.matches("mlx4_0", 1));
}

TEST_CASE("hca: `=mlx5_0:1,mlx5_1:1` selects port 1 of exactly those devices", "[hca]")
{
    const HcaSelector s = parse_ok("=mlx5_0:1,mlx5_1:1");
    CHECK(s.exact);
    CHECK_FALSE(s.exclude);
    REQUIRE(s.entries.size() == 2);
    CHECK(s.entries[0].port == 1);
    CHECK(s.matches("mlx5_0", 1));
    CHECK(s.matches("mlx5_1", 1));
    CHECK_FALSE(s.matches("mlx5_0", 2));
    CHECK_FALSE(s.matches("mlx5_10", 1)); // exact: not a prefix
    CHECK_FALSE(s.matches("mlx5_2", 1));
}

TEST_CASE("hca: `^=mlx5_1,mlx5_4` excludes exactly those devices", "[hca]")
{
    const HcaSelector s = parse_ok("^=mlx5_1,mlx5_4");
    CHECK(s.exclude);
    CHECK(s.exact);
    CHECK_FALSE(s.matches("mlx5_1", 1));
    CHECK_FALSE(s.matches("mlx5_4", 2));
    CHECK(s.matches("mlx5_10", 1)); // exact exclusion leaves mlx5_10 in
    CHECK(s.matches("mlx5_0", 1));
}

TEST_CASE("hca: a prefix without `=` also takes mlx5_10..mlx5_19 (NCCL's warning)", "[hca]")
{
    const HcaSelector s = parse_ok("mlx5_1");
    CHECK(s.matches("mlx5_1", 1));
    CHECK(s.matches("mlx5_10", 1));
    CHECK(s.matches("mlx5_19", 1));
    CHECK_FALSE(s.matches("mlx5_2", 1));
}

TEST_CASE("hca: exclusion by prefix and port", "[hca]")
{
    const HcaSelector s = parse_ok("^mlx5_bond_0:1");
    CHECK_FALSE(s.matches("mlx5_bond_0", 1));
    CHECK(s.matches("mlx5_bond_0", 2));
    CHECK(s.matches("mlx5_0", 1));
}

TEST_CASE("hca: empty selects everything; empty entries are dropped", "[hca]")
{
    CHECK(parse_ok("").matches("anything", 3));
    const HcaSelector s = parse_ok("rxe_a0,,rxe_b1:1,");
    REQUIRE(s.entries.size() == 2);
    CHECK(s.matches("rxe_a0", 1));
    CHECK(s.matches("rxe_b1", 1));
    CHECK_FALSE(s.matches("rxe_b1", 2));
    CHECK_FALSE(s.matches("rxe_a1", 1));
}

TEST_CASE("hca: bad input is an error with a reason, not a silent misreading", "[hca]")
{
    for (const char *bad : {"mlx5_0:", "mlx5_0:0", "mlx5_0:256", "mlx5_0:1x", "mlx5_0:-1", ":1",
                            "=^mlx5", "^", "=", "mlx5 0", "mlx5/0", "mlx5_0:1:2"}) {
        HcaSelector s;
        std::string why;
        INFO(bad);
        CHECK_FALSE(HcaSelector::parse(bad, &s, &why));
        CHECK_FALSE(why.empty());
    }
    std::string many;
    // Appends, not `"d" + to_string`: a bogus GCC 12 -Wrestrict at -O3 (GCC bug 105329).
    for (int i = 0; i < 33; ++i) many.append("d").append(std::to_string(i)).append(",");
    HcaSelector s;
    std::string why;
    CHECK_FALSE(HcaSelector::parse(many, &s, &why));
    CHECK_FALSE(HcaSelector::parse(std::string(64, 'a'), &s, &why));
    CHECK(HcaSelector::parse(std::string(63, 'a'), &s, &why));
}

TEST_CASE("hca: a long port is refused without reading it as a number", "[hca]")
{
    // Found by fuzzing VIGIL_IB_HCA: the digits were still summed into an int after the port
    // was known to be bad, a signed overflow (undefined; UBSan aborts here without the fix).
    for (const char *bad :
         {"mlx5_0:99999999999", "mlx5_0:2147483648", "mlx5_0:25\xca\xf5VIGIL_IB=1"}) {
        HcaSelector s;
        std::string why;
        INFO(bad);
        CHECK_FALSE(HcaSelector::parse(bad, &s, &why));
        CHECK(why.find("bad port") != std::string::npos);
    }
}

TEST_CASE("devices: natural order of device names", "[hca]")
{
    using vigil::net::ib::device_name_less;
    std::vector<std::string> names = {"mlx5_10", "mlx5_2", "rxe_b0", "mlx5_1", "rxe_a1"};
    std::sort(names.begin(), names.end(), device_name_less);
    CHECK(names == std::vector<std::string>{"mlx5_1", "mlx5_2", "mlx5_10", "rxe_a1", "rxe_b0"});
    CHECK_FALSE(device_name_less("a", "a"));
    CHECK(device_name_less("a", "a0"));
}
