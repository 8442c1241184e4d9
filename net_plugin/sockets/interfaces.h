// SPDX-License-Identifier: Apache-2.0
// Network interfaces as NCCL devices: selection in NCCL_SOCKET_IFNAME syntax and discovery of
// each selected interface's address, PCI path and link speed. The TCP fabric's devices, and
// the verbs fabric's fallback address for its set-up sockets.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../handle.h"

namespace vigil::net {

/// A parsed interface list in NCCL's syntax (NCCL src/misc/utils.cc parseStringList and
/// matchIfList): comma-separated names, each a prefix unless the list starts with `=`
/// (exact names); a leading `^` (before or after `=`) turns the list into an exclusion
/// list. An optional `:port` suffix per entry is accepted and ignored (TCP has no ports).
struct IfaceSelector {
    bool exclude = false;
    bool exact = false;
    std::vector<std::string> names;

    /// Parses `spec`. Empty entries are dropped; an entry longer than IFNAMSIZ-1 or holding
    /// a character outside [A-Za-z0-9_.:@-] makes parse() fail with *why set.
    static bool parse(std::string_view spec, IfaceSelector *out, std::string *why);
    /// True when interface `ifname` is selected.
    bool matches(std::string_view ifname) const;
};

/// One NCCL device: a usable network interface. Plain value type.
struct Device {
    std::string name;      ///< interface name, unique per host ("eth0")
    Endpoint addr;         ///< its address (port 0)
    std::string pci_path;  ///< sysfs PCI path ("/sys/devices/pci0000:00/...") or empty (virtual)
    int speed_mbps = 0;    ///< link speed, Mbit/s
    uint64_t guid = 0;     ///< stable per host: hash of name and MAC
    int numa_node = -1;
};

/// An interface as getifaddrs() saw it, before selection (input to select_devices).
struct IfaceInfo {
    std::string name;
    Endpoint addr;
    bool up = false;
    bool loopback = false;
};

/// Enumerates the host's interfaces with an IPv4/IPv6 address (getifaddrs). Link-local IPv6
/// addresses are skipped. Returns -errno on failure.
int list_interfaces(std::vector<IfaceInfo> *out);

/// Applies `spec` (VIGIL_SOCKET_IFNAME; empty = NCCL's default `^docker,lo,virbr`, then `lo`
/// when nothing else is up) and `family` ("", "AF_INET", "AF_INET6") to `ifaces`. One
/// device per interface (its first address of the preferred family), in the order given.
/// Returns -EINVAL with *why on a bad spec or family.
int select_devices(const std::vector<IfaceInfo> &ifaces, std::string_view spec,
                   std::string_view family, std::vector<Device> *out, std::string *why);

/// Fills pci_path, speed_mbps, guid and numa_node of `dev` from /sys/class/net/<name>.
/// `speed_override` > 0 wins over the link's speed; 10000 when the link does not say.
void read_sysfs(Device *dev, int speed_override);

} // namespace vigil::net
