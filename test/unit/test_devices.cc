// SPDX-License-Identifier: Apache-2.0
// Interface selection in NCCL_SOCKET_IFNAME syntax and device selection on synthetic lists.
#include <catch2/catch.hpp>

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <netinet/in.h>
#include <string>
#include <vector>

#include "sockets/interfaces.h"

using vigil::net::Device;
using vigil::net::IfaceInfo;
using vigil::net::IfaceSelector;

namespace {

IfaceSelector parsed(std::string_view spec)
{
    IfaceSelector sel;
    std::string why;
    INFO("spec \"" << spec << "\"");
    REQUIRE(IfaceSelector::parse(spec, &sel, &why));
    CHECK(why.empty());
    return sel;
}

std::string parse_error(std::string_view spec)
{
    IfaceSelector sel;
    sel.names = {"untouched"};
    std::string why;
    INFO("spec \"" << spec << "\"");
    CHECK_FALSE(IfaceSelector::parse(spec, &sel, &why));
    CHECK(sel.names == std::vector<std::string>{"untouched"});
    return why;
}

IfaceInfo iface(const char *name, const char *addr, bool up = true)
{
    IfaceInfo i;
    i.name = name;
    i.up = up;
    i.loopback = std::string_view(name).substr(0, 2) == "lo";
    const bool six = std::string_view(addr).find(':') != std::string_view::npos;
    i.addr.family = six ? AF_INET6 : AF_INET;
    REQUIRE(inet_pton(i.addr.family, addr, i.addr.addr.data()) == 1);
    return i;
}

std::vector<std::string> names_of(const std::vector<Device> &devs)
{
    std::vector<std::string> n;
    for (const Device &d : devs) n.push_back(d.name);
    return n;
}

std::vector<Device> select(const std::vector<IfaceInfo> &ifaces, std::string_view spec,
                           std::string_view family = "")
{
    std::vector<Device> out;
    std::string why;
    INFO("spec \"" << spec << "\" family \"" << family << "\"");
    REQUIRE(vigil::net::select_devices(ifaces, spec, family, &out, &why) == 0);
    return out;
}

using Names = std::vector<std::string>;

} // namespace

TEST_CASE("IfaceSelector: plain entries are prefixes", "[devices]")
{
    const IfaceSelector sel = parsed("eth");
    CHECK_FALSE(sel.exclude);
    CHECK_FALSE(sel.exact);
    CHECK(sel.names == Names{"eth"});
    CHECK(sel.matches("eth0"));
    CHECK(sel.matches("eth10"));
    CHECK(sel.matches("eth"));
    CHECK_FALSE(sel.matches("ens0"));
    CHECK_FALSE(sel.matches("et"));
    CHECK_FALSE(sel.matches("veth0"));
}

TEST_CASE("IfaceSelector: several prefixes", "[devices]")
{
    const IfaceSelector sel = parsed("eth,ib");
    CHECK(sel.matches("eth1"));
    CHECK(sel.matches("ib0"));
    CHECK_FALSE(sel.matches("ens1"));
}

TEST_CASE("IfaceSelector: ^ excludes prefixes", "[devices]")
{
    const IfaceSelector sel = parsed("^eth");
    CHECK(sel.exclude);
    CHECK_FALSE(sel.exact);
    CHECK_FALSE(sel.matches("eth0"));
    CHECK_FALSE(sel.matches("eth10"));
    CHECK(sel.matches("ens0"));
    CHECK(sel.matches("lo"));
}

TEST_CASE("IfaceSelector: = selects exact names", "[devices]")
{
    const IfaceSelector sel = parsed("=eth0");
    CHECK(sel.exact);
    CHECK_FALSE(sel.exclude);
    CHECK(sel.matches("eth0"));
    CHECK_FALSE(sel.matches("eth01"));
    CHECK_FALSE(sel.matches("eth"));
    CHECK_FALSE(sel.matches("eth1"));
}

TEST_CASE("IfaceSelector: ^= and =^ both exclude exact names", "[devices]")
{
    for (const char *spec : {"^=eth0", "=^eth0"}) {
        INFO(spec);
        const IfaceSelector sel = parsed(spec);
        CHECK(sel.exclude);
        CHECK(sel.exact);
        CHECK(sel.names == Names{"eth0"});
        CHECK_FALSE(sel.matches("eth0"));
        CHECK(sel.matches("eth01"));
        CHECK(sel.matches("eth1"));
        CHECK(sel.matches("ens0"));
    }
}

TEST_CASE("IfaceSelector: a :port suffix is ignored", "[devices]")
{
    const IfaceSelector sel = parsed("=eth0:1,ib0:2");
    CHECK(sel.names == Names{"eth0", "ib0"});
    CHECK(sel.matches("eth0"));
    CHECK(sel.matches("ib0"));
    CHECK_FALSE(sel.matches("eth0:1"));
}

TEST_CASE("IfaceSelector: empty entries are dropped", "[devices]")
{
    CHECK(parsed("eth,,ens").names == Names{"eth", "ens"});
    CHECK(parsed(",eth,").names == Names{"eth"});
    CHECK(parsed(":5,eth").names == Names{"eth"});
    // Nothing selected by an empty include list; everything by an empty exclude list.
    const IfaceSelector none = parsed(",,");
    CHECK(none.names.empty());
    CHECK_FALSE(none.matches("eth0"));
    CHECK(parsed("^").matches("eth0"));
}

TEST_CASE("IfaceSelector: bad characters and over-long names are rejected", "[devices]")
{
    CHECK_THAT(parse_error("eth 0"), Catch::Contains("bad character"));
    CHECK_THAT(parse_error("eth0,e/th"), Catch::Contains("e/th"));
    CHECK_THAT(parse_error("eth*"), Catch::Contains("bad character"));
    CHECK_THAT(parse_error("^^eth"), Catch::Contains("bad character"));
    CHECK_THAT(parse_error("==eth"), Catch::Contains("bad character"));
    CHECK_THAT(parse_error("eth\n"), Catch::Contains("bad character"));
    CHECK_THAT(parse_error("abcdefghijklmnop"), Catch::Contains("too long")); // 16 chars
    CHECK_THAT(parse_error("eth,abcdefghijklmnopqrstuvwxyz"), Catch::Contains("too long"));
    // The longest valid name and every allowed character class.
    CHECK(parsed("abcdefghijklmno").names == Names{"abcdefghijklmno"});
    CHECK(parsed("A-b_c.d@e9").names == Names{"A-b_c.d@e9"});
}

TEST_CASE("select_devices: empty spec skips lo, docker*, virbr* and down interfaces", "[devices]")
{
    const std::vector<IfaceInfo> ifaces = {
        iface("lo", "127.0.0.1"),         iface("docker0", "172.17.0.1"),
        iface("eth0", "10.0.0.1"),        iface("virbr0", "192.168.122.1"),
        iface("eth1", "10.0.1.1", false), iface("ib0", "10.1.0.1"),
        iface("dockerX", "172.18.0.1"),
    };
    const auto devs = select(ifaces, "");
    CHECK(names_of(devs) == Names{"eth0", "ib0"});
    REQUIRE(devs.size() == 2);
    CHECK(devs[0].addr == ifaces[2].addr);
    CHECK(devs[1].addr == ifaces[5].addr);
}

TEST_CASE("select_devices: empty spec falls back to lo when nothing else is up", "[devices]")
{
    const std::vector<IfaceInfo> ifaces = {
        iface("lo", "127.0.0.1"),
        iface("docker0", "172.17.0.1"),
        iface("eth0", "10.0.0.1", false),
    };
    CHECK(names_of(select(ifaces, "")) == Names{"lo"});
    // Not even lo: no device, still success.
    CHECK(select({iface("eth0", "10.0.0.1", false)}, "").empty());
}

TEST_CASE("select_devices: an explicit spec keeps down interfaces", "[devices]")
{
    const std::vector<IfaceInfo> ifaces = {
        iface("eth0", "10.0.0.1", false),
        iface("eth1", "10.0.1.1"),
        iface("ens1", "10.0.2.1"),
        iface("lo", "127.0.0.1"),
    };
    CHECK(names_of(select(ifaces, "eth")) == Names{"eth0", "eth1"});
    CHECK(names_of(select(ifaces, "=eth0")) == Names{"eth0"});
    CHECK(names_of(select(ifaces, "^eth")) == Names{"ens1", "lo"});
    CHECK(select(ifaces, "=eth").empty());
}

TEST_CASE("select_devices: family selection", "[devices]")
{
    const std::vector<IfaceInfo> ifaces = {
        iface("eth0", "2001:db8::1"), iface("eth0", "10.0.0.1"), iface("eth0", "10.0.0.2"),
        iface("eth1", "2001:db8::2"), iface("eth2", "10.0.2.1"),
    };
    SECTION("default prefers each interface's first IPv4 address, one device per interface")
    {
        const auto devs = select(ifaces, "eth");
        REQUIRE(devs.size() == 3);
        std::vector<std::string> n = names_of(devs);
        std::sort(n.begin(), n.end());
        CHECK(n == Names{"eth0", "eth1", "eth2"});
        for (const Device &d : devs) {
            if (d.name == "eth0") CHECK(d.addr == ifaces[1].addr);
            if (d.name == "eth1") CHECK(d.addr == ifaces[3].addr);
            if (d.name == "eth2") CHECK(d.addr == ifaces[4].addr);
        }
    }
    SECTION("AF_INET only picks IPv4")
    {
        const auto devs = select(ifaces, "eth", "AF_INET");
        CHECK(names_of(devs) == Names{"eth0", "eth2"});
        for (const Device &d : devs) CHECK(d.addr.family == AF_INET);
    }
    SECTION("AF_INET6 only picks IPv6")
    {
        const auto devs = select(ifaces, "eth", "AF_INET6");
        CHECK(names_of(devs) == Names{"eth0", "eth1"});
        for (const Device &d : devs) CHECK(d.addr.family == AF_INET6);
        REQUIRE(devs.size() == 2);
        CHECK(devs[0].addr == ifaces[0].addr);
    }
    SECTION("a bad family string is -EINVAL")
    {
        for (const char *fam : {"inet", "AF_UNIX", "af_inet", "AF_INET "}) {
            std::vector<Device> out;
            std::string why;
            INFO(fam);
            CHECK(vigil::net::select_devices(ifaces, "eth", fam, &out, &why) == -EINVAL);
            CHECK_THAT(why, Catch::Contains("VIGIL_SOCKET_FAMILY"));
        }
    }
    SECTION("a bad spec is -EINVAL")
    {
        std::vector<Device> out;
        std::string why;
        CHECK(vigil::net::select_devices(ifaces, "eth/0", "", &out, &why) == -EINVAL);
        CHECK_FALSE(why.empty());
    }
}

// Regression: devices keep the interfaces' order even when an IPv6-only interface comes
// first (an earlier version listed every IPv4 interface first).
TEST_CASE("select_devices keeps the interfaces' order with mixed families", "[devices]")
{
    const std::vector<IfaceInfo> ifaces = {
        iface("eth0", "2001:db8::1"),
        iface("eth1", "10.0.1.1"),
    };
    CHECK(names_of(select(ifaces, "eth")) == Names{"eth0", "eth1"});
}

TEST_CASE("list_interfaces enumerates at least loopback", "[devices]")
{
    std::vector<IfaceInfo> out;
    REQUIRE(vigil::net::list_interfaces(&out) == 0);
    bool have_loopback = false;
    for (const IfaceInfo &i : out) {
        CHECK_FALSE(i.name.empty());
        CHECK((i.addr.family == AF_INET || i.addr.family == AF_INET6));
        CHECK(i.addr.port == 0);
        // Link-local IPv6 is skipped.
        CHECK_FALSE((i.addr.family == AF_INET6 && i.addr.addr[0] == 0xfe &&
                     (i.addr.addr[1] & 0xc0) == 0x80));
        have_loopback = have_loopback || i.loopback;
    }
    CHECK(have_loopback);
}

TEST_CASE("read_sysfs: speed override, default speed, stable guid", "[devices]")
{
    Device a;
    a.name = "lo";
    vigil::net::read_sysfs(&a, 0);
    CHECK(a.speed_mbps > 0);
    CHECK(a.pci_path.empty()); // loopback is virtual
    Device b;
    b.name = "lo";
    vigil::net::read_sysfs(&b, 1234);
    CHECK(b.speed_mbps == 1234);
    CHECK(b.guid == a.guid);
    Device c;
    c.name = "vigil-no-such-if";
    vigil::net::read_sysfs(&c, 0);
    CHECK(c.speed_mbps == 10000);
    CHECK(c.pci_path.empty());
    CHECK(c.numa_node == -1);
    CHECK(c.guid != a.guid);
}
