// SPDX-License-Identifier: Apache-2.0
// What an HCA port is, as plain data for getProperties: speed from the port's width and
// lane speed, PCI path from sysfs, the pointer types the platform can register, and the rest
// of NCCL's device properties. No dependency on the net core.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace vigil::net::ib {

/// Pointer-type bits, equal to NCCL's NCCL_PTR_HOST / NCCL_PTR_CUDA / NCCL_PTR_DMABUF
/// (nccl_net.h) so the ABI shim copies them as they are.
constexpr int kPtrHost = 0x1;
constexpr int kPtrCuda = 0x2;
constexpr int kPtrDmabuf = 0x4;

/// Lanes of an ibv_port_attr.active_width bit (1:1X, 2:4X, 4:8X, 8:12X, 16:2X); 0 when the
/// value is not exactly one known bit.
int width_lanes(uint32_t active_width) noexcept;

/// Mbit/s of one lane for an active_speed (or active_speed_ex) bit, with NCCL's figures
/// (net_ib ibvSpeeds): SDR 2500, DDR 5000, QDR 10000, FDR10 10000, FDR 14000, EDR 25000,
/// HDR 50000, NDR 100000, XDR 200000; 0 when not exactly one known bit.
int lane_mbps(uint32_t active_speed) noexcept;

/// lanes x lane speed in Mbit/s, or 0 when either is unknown (the caller decides the
/// fallback; NCCL instead takes its table's last entry).
int port_speed_mbps(uint32_t active_width, uint32_t active_speed) noexcept;

/// What the platform offers for registering GPU memory. Plain data.
struct PlatformCaps {
    bool peermem = false;    ///< an NVIDIA peer-memory module is loaded (nvidia_peermem
                             ///< or nv_peer_mem: the files NCCL's ncclIbGdrSupport checks)
    bool gpu_dmabuf = false; ///< the NVIDIA kernel driver is loaded (/proc/driver/nvidia),
                             ///< the exporter of GPU memory as DMA-BUF
};

/// Reads the platform from /sys and /proc (cheap; a few access() calls). Thread-safe.
PlatformCaps detect_platform_caps() noexcept;

/// NCCL pointer types a port supports: HOST always; CUDA with a peer-memory module;
/// DMABUF when the device accepts DMA-BUF registration (`device_dmabuf`) and a GPU driver
/// exports DMA-BUFs. Pure.
int ptr_support(const PlatformCaps &caps, bool device_dmabuf) noexcept;

/// The PCI device of an RDMA device: the real path of /sys/class/infiniband/DEV/device
/// ("/sys/devices/pci0000:00/0000:00:02.0/0000:03:00.0"). Virtual devices (rxe, siw) have
/// no such link: *path is left empty and *why says so. `sysfs_root` replaces "/sys" in
/// tests. Never throws except std::bad_alloc.
void pci_path(std::string_view device, std::string *path, std::string *why,
              std::string_view sysfs_root = "/sys");

/// The NUMA node of the device's PCI function (its numa_node file), -1 when unknown.
int numa_node(std::string_view device, std::string_view sysfs_root = "/sys") noexcept;

/// NCCL's reports for an IB device (net_ib ncclIbGetPhysProperties): up to 8 receives per
/// irecv, latency 0 (NCCL's tuner has its own), and regIsGlobal (the fabric keeps a
/// registration cache).
constexpr int kMaxRecvs = 8;
constexpr float kLatencyUs = 0.0f;
constexpr bool kRegIsGlobal = true;

/// One NCCL device: one active port of one HCA. Plain data, copied out of the registry.
struct PortProps {
    std::string name;           ///< unique per NCCL device: "DEV:PORT" ("rxe_a0:1")
    std::string device;         ///< the HCA ("rxe_a0")
    int port = 1;               ///< 1-based
    std::string pci_path;       ///< sysfs PCI path; empty for virtual devices
    std::string pci_path_why;   ///< why pci_path is empty (for the log), else empty
    uint64_t guid = 0;          ///< node GUID, host byte order
    int speed_mbps = 0;         ///< width_lanes x lane_mbps; 0 when the port does not say
    int width_lanes = 0;        ///< 1, 2, 4, 8 or 12; 0 unknown
    int lane_mbps = 0;          ///< Mbit/s per lane; 0 unknown
    int ptr_support = kPtrHost; ///< kPtr* bits (NCCL_PTR_*)
    bool reg_is_global = kRegIsGlobal;
    int max_recvs = kMaxRecvs;
    float latency_us = kLatencyUs;
    int max_qp = 0;             ///< the device's max_qp (NCCL's maxComms)
    int max_qp_wr = 0;          ///< the device's max_qp_wr (largest work queue)
    bool infiniband = false;    ///< link layer: InfiniBand, else Ethernet (RoCE)
    int state = 0;              ///< enum ibv_port_state, kept current by port events
    int active_mtu = 0;         ///< enum ibv_mtu
    int mtu_bytes = 0;          ///< active_mtu in bytes
    int numa_node = -1;         ///< of the PCI function; -1 unknown or virtual
    uint16_t lid = 0;           ///< InfiniBand LID; 0 on RoCE
    int gid_index = -1;         ///< chosen GID (gid.h); -1: none usable
    uint8_t gid[16] = {};       ///< the GID at gid_index
    bool gid_preferred = false; ///< the GID has the asked family and RoCE version
    std::string gid_reason;     ///< one line: why this GID
    bool device_dmabuf = false; ///< the device accepts DMA-BUF registration
};

} // namespace vigil::net::ib
