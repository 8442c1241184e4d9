// SPDX-License-Identifier: Apache-2.0
// Interface selection (NCCL syntax) and TCP device discovery.
#include "interfaces.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

namespace vigil::net {

bool IfaceSelector::parse(std::string_view spec, IfaceSelector *out, std::string *why)
{
    IfaceSelector sel;
    for (int i = 0; i < 2 && !spec.empty(); ++i) {
        if (spec.front() == '^' && !sel.exclude) {
            sel.exclude = true;
            spec.remove_prefix(1);
        } else if (spec.front() == '=' && !sel.exact) {
            sel.exact = true;
            spec.remove_prefix(1);
        }
    }
    while (!spec.empty()) {
        size_t comma = spec.find(',');
        std::string_view item = spec.substr(0, comma);
        spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
        item = item.substr(0, item.find(':')); // "name:port" -> name
        if (item.empty()) continue;
        if (item.size() >= IFNAMSIZ) {
            if (why) *why = "interface name too long: " + std::string(item);
            return false;
        }
        for (char c : item) {
            bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '_' || c == '.' || c == '-' || c == '@';
            if (!ok) {
                if (why) *why = "bad character in interface name: " + std::string(item);
                return false;
            }
        }
        sel.names.emplace_back(item);
    }
    *out = std::move(sel);
    return true;
}

bool IfaceSelector::matches(std::string_view ifname) const
{
    bool hit = false;
    for (const std::string &n : names) {
        if (exact ? ifname == n : ifname.substr(0, n.size()) == n) {
            hit = true;
            break;
        }
    }
    return exclude ? !hit : hit;
}

int list_interfaces(std::vector<IfaceInfo> *out)
{
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0) return -errno;
    for (ifaddrs *ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
        IfaceInfo info;
        if (ifa->ifa_name == nullptr || !Endpoint::from_sockaddr(ifa->ifa_addr, &info.addr))
            continue;
        if (info.addr.family == AF_INET6 && info.addr.addr[0] == 0xfe &&
            (info.addr.addr[1] & 0xc0) == 0x80)
            continue; // link-local: needs a scope and is not routable across hosts
        info.name = ifa->ifa_name;
        info.up = (ifa->ifa_flags & IFF_UP) != 0 && (ifa->ifa_flags & IFF_RUNNING) != 0;
        info.loopback = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
        info.addr.port = 0;
        out->push_back(info);
    }
    freeifaddrs(list);
    return 0;
}

int select_devices(const std::vector<IfaceInfo> &ifaces, std::string_view spec,
                   std::string_view family, std::vector<Device> *out, std::string *why)
{
    int want_first = AF_INET;
    bool only = false;
    if (family == "AF_INET") only = true;
    else if (family == "AF_INET6") want_first = AF_INET6, only = true;
    else if (!family.empty()) {
        if (why) *why = "VIGIL_SOCKET_FAMILY must be AF_INET, AF_INET6 or empty";
        return -EINVAL;
    }
    // One device per selected interface, in the order interfaces are listed; each takes its
    // first address of the preferred family, else (unless restricted) of the other one.
    const int other = want_first == AF_INET ? AF_INET6 : AF_INET;
    auto pick = [&](const IfaceSelector &sel, bool need_up) {
        std::vector<Device> devs;
        for (const IfaceInfo &i : ifaces) {
            if ((need_up && !i.up) || !sel.matches(i.name)) continue;
            if (i.addr.family != want_first && (only || i.addr.family != other)) continue;
            Device *seen = nullptr;
            for (Device &d : devs)
                if (d.name == i.name) seen = &d;
            if (seen == nullptr) {
                Device d;
                d.name = i.name;
                d.addr = i.addr;
                devs.push_back(d);
            } else if (seen->addr.family != want_first && i.addr.family == want_first) {
                seen->addr = i.addr;
            }
        }
        return devs;
    };
    IfaceSelector sel;
    if (!spec.empty()) {
        if (!IfaceSelector::parse(spec, &sel, why)) return -EINVAL;
        // An explicit selection is honoured even for interfaces that are down right now:
        // a port that is down at start-up is still the user's device.
        *out = pick(sel, false);
        return 0;
    }
    IfaceSelector::parse("^docker,lo,virbr", &sel, why);
    *out = pick(sel, true);
    if (out->empty()) {
        IfaceSelector::parse("=lo", &sel, why);
        *out = pick(sel, false);
    }
    return 0;
}

namespace {

std::string read_line(const std::string &path)
{
    std::ifstream f(path);
    std::string s;
    std::getline(f, s);
    return s;
}

} // namespace

void read_sysfs(Device *dev, int speed_override)
{
    const std::string base = "/sys/class/net/" + dev->name;
    char real[PATH_MAX];
    if (realpath((base + "/device").c_str(), real) != nullptr) {
        dev->pci_path = real;
        std::string numa = read_line(base + "/device/numa_node");
        if (!numa.empty()) dev->numa_node = std::atoi(numa.c_str());
    }
    std::string speed = read_line(base + "/speed");
    long mbps = speed.empty() ? -1 : std::strtol(speed.c_str(), nullptr, 10);
    dev->speed_mbps = mbps > 0 && mbps < INT_MAX ? static_cast<int>(mbps) : 10000;
    if (speed_override > 0) dev->speed_mbps = speed_override;
    std::string mac = read_line(base + "/address");
    std::string key = dev->name + "/" + mac;
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    dev->guid = h;
}

} // namespace vigil::net
