// SPDX-License-Identifier: Apache-2.0
// Port properties from the hardware.
#include "port_props.h"

#include <climits>
#include <cstdlib>
#include <fstream>
#include <unistd.h>

namespace vigil::net::ib {

int width_lanes(uint32_t active_width) noexcept
{
    switch (active_width) {
    case 1: return 1;
    case 2: return 4;
    case 4: return 8;
    case 8: return 12;
    case 16: return 2;
    default: return 0;
    }
}

int lane_mbps(uint32_t active_speed) noexcept
{
    switch (active_speed) {
    case 1: return 2500;     // SDR
    case 2: return 5000;     // DDR
    case 4: return 10000;    // QDR
    case 8: return 10000;    // FDR10
    case 16: return 14000;   // FDR
    case 32: return 25000;   // EDR
    case 64: return 50000;   // HDR
    case 128: return 100000; // NDR
    case 256: return 200000; // XDR (active_speed_ex only)
    default: return 0;
    }
}

int port_speed_mbps(uint32_t active_width, uint32_t active_speed) noexcept
{
    return width_lanes(active_width) * lane_mbps(active_speed);
}

PlatformCaps detect_platform_caps() noexcept
{
    PlatformCaps caps;
    for (const char *f : {"/sys/kernel/mm/memory_peers/nv_mem/version",
                          "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
                          "/sys/module/nvidia_peermem/version", "/sys/module/nv_peer_mem/version"})
        caps.peermem = caps.peermem || access(f, F_OK) == 0;
    caps.gpu_dmabuf = access("/proc/driver/nvidia/version", F_OK) == 0;
    return caps;
}

int ptr_support(const PlatformCaps &caps, bool device_dmabuf) noexcept
{
    int bits = kPtrHost;
    if (caps.peermem) bits |= kPtrCuda;
    if (device_dmabuf && caps.gpu_dmabuf) bits |= kPtrDmabuf;
    return bits;
}

void pci_path(std::string_view device, std::string *path, std::string *why,
              std::string_view sysfs_root)
{
    path->clear();
    why->clear();
    const std::string link =
        std::string(sysfs_root) + "/class/infiniband/" + std::string(device) + "/device";
    char *real = realpath(link.c_str(), nullptr);
    if (real == nullptr) {
        *why = "virtual device: " + link + " does not exist (no PCI function behind it)";
        return;
    }
    *path = real;
    free(real);
    if (path->find("/pci") == std::string::npos) {
        *why = "not a PCI device: " + *path;
        path->clear();
    }
}

int numa_node(std::string_view device, std::string_view sysfs_root) noexcept
{
    try {
        std::ifstream f(std::string(sysfs_root) + "/class/infiniband/" + std::string(device) +
                        "/device/numa_node");
        int node = -1;
        if (f >> node) return node;
    } catch (...) {
    }
    return -1;
}

} // namespace vigil::net::ib
