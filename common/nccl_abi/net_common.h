/* SPDX-License-Identifier: Apache-2.0 */
/* Constants and device-handle types shared by every ncclNet_vN version.
 * Values from NCCL 2.28.9 src/include/plugin/nccl_net.h and nccl_device/net_device.h
 * (docs/nccl-abi.md, "Net plugin: loader and calls"). C-compatible. */
#ifndef VIGIL_NCCL_ABI_NET_COMMON_H
#define VIGIL_NCCL_ABI_NET_COMMON_H

#include "nccl_common.h"

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4
#define NCCL_NET_MAX_REQUESTS 32
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1
#define NCCL_NET_MULTI_REQUEST 0x2
#define NCCL_NET_MAX_DEVS_PER_NIC_V11 4
#define NCCL_NET_MAX_DEVS_PER_NIC_V12 8
#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)
#define NCCL_NET_ATTR_UNDEF (-1)
#define NCCL_NET_ID_UNDEF (-1)
/* NCCL's proxy passes an int sizes[NCCL_PROXY_MAX_SUBS] array to test() (net.cc:1505). */
#define NCCL_PROXY_MAX_SUBS 64

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    NCCL_NET_DEVICE_HOST = 0,
    NCCL_NET_DEVICE_UNPACK = 1,
    NCCL_NET_DEVICE_GIN_PROXY = 2,
    NCCL_NET_DEVICE_GIN_GDAKI = 3
} ncclNetDeviceType;

#define NCCL_NET_DEVICE_INVALID_VERSION 0x0

/* Identical layout for v7..v12 (net_device.h:24-36). */
typedef struct {
    ncclNetDeviceType netDeviceType;
    int netDeviceVersion;
    void *handle;
    size_t size;
    int needsProxyProgress;
} ncclNetDeviceHandle_t;

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_NET_COMMON_H */
