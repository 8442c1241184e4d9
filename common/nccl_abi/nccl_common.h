/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declarations of NCCL's shared plugin types (result codes, logger, profiler
 * callback). Values from NCCL 2.28.9 src/include/nccl_common.h:17-56 and nccl.h; see
 * docs/nccl-abi.md, "Net plugin: loader and calls". C-compatible. */
#ifndef VIGIL_NCCL_ABI_NCCL_COMMON_H
#define VIGIL_NCCL_ABI_NCCL_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ncclResult_t as in nccl.h (values are part of the ABI). */
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

typedef enum {
    NCCL_LOG_NONE = 0,
    NCCL_LOG_VERSION = 1,
    NCCL_LOG_WARN = 2,
    NCCL_LOG_INFO = 3,
    NCCL_LOG_ABORT = 4,
    NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

/* Subsystem flags (nccl_common.h:30-44). */
enum {
    NCCL_INIT = 0x1,
    NCCL_COLL = 0x2,
    NCCL_P2P = 0x4,
    NCCL_SHM = 0x8,
    NCCL_NET = 0x10,
    NCCL_GRAPH = 0x20,
    NCCL_TUNING = 0x40,
    NCCL_ENV = 0x80,
    NCCL_ALLOC = 0x100,
    NCCL_CALL = 0x200,
    NCCL_PROXY = 0x400,
    NCCL_NVLS = 0x800,
    NCCL_BOOTSTRAP = 0x1000,
    NCCL_REG = 0x2000,
    NCCL_PROFILE = 0x4000,
    NCCL_ALL = ~0
};

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char *file,
                                  int line, const char *fmt, ...);

/* type: 0 start, 1 stop, 2 update, 3 update-and-stop (nccl_common.h:46-56). */
typedef ncclResult_t (*ncclProfilerCallback_t)(void **eHandle, int type, void *pHandle,
                                               int64_t pluginId, void *extData);

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_NCCL_COMMON_H */
