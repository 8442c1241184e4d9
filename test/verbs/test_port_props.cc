// SPDX-License-Identifier: Apache-2.0
// Port properties: the speed table, pointer support, PCI path and NUMA node from sysfs.
#include <catch2/catch.hpp>

#include <filesystem>

#include "port_props.h"
#include "tmpdir.h"

using namespace vigil::net::ib;

TEST_CASE("speed: width x lane speed, NCCL's figures", "[props]")
{
    CHECK(port_speed_mbps(1, 8) == 10000);     // rxe: 1X, FDR10 bit
    CHECK(port_speed_mbps(2, 32) == 100000);   // 4X EDR
    CHECK(port_speed_mbps(2, 64) == 200000);   // 4X HDR
    CHECK(port_speed_mbps(2, 128) == 400000);  // 4X NDR
    CHECK(port_speed_mbps(16, 128) == 200000); // 2X NDR
    CHECK(port_speed_mbps(8, 1) == 30000);     // 12X SDR
    CHECK(port_speed_mbps(4, 16) == 112000);   // 8X FDR
    CHECK(port_speed_mbps(2, 256) == 800000);  // 4X XDR (active_speed_ex)
    CHECK(port_speed_mbps(1, 2) == 5000);      // 1X DDR
    CHECK(port_speed_mbps(1, 4) == 10000);     // 1X QDR
}

TEST_CASE("speed: unknown or malformed values give 0, not a guess", "[props]")
{
    CHECK(port_speed_mbps(0, 32) == 0);
    CHECK(port_speed_mbps(2, 0) == 0);
    CHECK(port_speed_mbps(3, 32) == 0); // two width bits
    CHECK(port_speed_mbps(2, 512) == 0);
    CHECK(width_lanes(32) == 0);
    CHECK(lane_mbps(48) == 0);
}

TEST_CASE("ptrSupport: HOST always, CUDA with peermem, DMABUF with device and GPU driver",
          "[props]")
{
    CHECK(ptr_support({}, false) == kPtrHost);
    CHECK(ptr_support({}, true) == kPtrHost);
    CHECK(ptr_support({true, false}, true) == (kPtrHost | kPtrCuda));
    CHECK(ptr_support({false, true}, false) == kPtrHost);
    CHECK(ptr_support({false, true}, true) == (kPtrHost | kPtrDmabuf));
    CHECK(ptr_support({true, true}, true) == (kPtrHost | kPtrCuda | kPtrDmabuf));
    // NCCL's NCCL_PTR_* values, which the ABI shim passes through unchanged.
    CHECK(kPtrHost == 0x1);
    CHECK(kPtrCuda == 0x2);
    CHECK(kPtrDmabuf == 0x4);
}

TEST_CASE("ptrSupport: this build machine has no GPU peer memory", "[props]")
{
    // Not a claim about every host: where nvidia_peermem is loaded this reads true.
    const PlatformCaps caps = detect_platform_caps();
    if (!std::filesystem::exists("/sys/module/nvidia_peermem")) CHECK_FALSE(caps.peermem);
    if (!std::filesystem::exists("/proc/driver/nvidia")) CHECK_FALSE(caps.gpu_dmabuf);
}

TEST_CASE("pciPath: the real path of the device link; none for a virtual device", "[props]")
{
    vigil::test::TempDir root;
    const std::string pci = root.path() + "/devices/pci0000:00/0000:00:02.0/0000:03:00.0";
    root.write("devices/pci0000:00/0000:00:02.0/0000:03:00.0/numa_node", "1\n");
    std::filesystem::create_directories(root.path() + "/class/infiniband/mlx5_0");
    std::filesystem::create_symlink(pci, root.path() + "/class/infiniband/mlx5_0/device");
    std::filesystem::create_directories(root.path() + "/class/infiniband/rxe_a0");
    std::string path, why;
    pci_path("mlx5_0", &path, &why, root.path());
    CHECK(path == pci);
    CHECK(why.empty());
    CHECK(numa_node("mlx5_0", root.path()) == 1);
    pci_path("rxe_a0", &path, &why, root.path());
    CHECK(path.empty());
    CHECK(why.find("virtual device") != std::string::npos);
    CHECK(numa_node("rxe_a0", root.path()) == -1);
}
