/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declarations of NCCL's profiler event types, mask bits and states, shared by
 * every profiler ABI version. Values from NCCL v2.30.7-1 src/include/plugin/nccl_profiler.h
 * (bits 0-11 and states 0-24 unchanged since 2.27/2.28), bit 15 and state 31 from NCCL's
 * nccl_profiler.h of the v7 interface (commit 88980683, NCCL 2.31); see docs/nccl-abi.md. Bits and states are never renumbered between
 * versions. C-compatible. */
#ifndef VIGIL_NCCL_ABI_PROFILER_COMMON_H
#define VIGIL_NCCL_ABI_PROFILER_COMMON_H

#include <stdint.h>

#include "nccl_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Event types; each is also its bit in the activation mask. */
enum {
    ncclProfileGroup = (1 << 0),
    ncclProfileColl = (1 << 1),
    ncclProfileP2p = (1 << 2),
    ncclProfileProxyOp = (1 << 3),
    ncclProfileProxyStep = (1 << 4),
    ncclProfileProxyCtrl = (1 << 5),
    ncclProfileKernelCh = (1 << 6),
    ncclProfileNetPlugin = (1 << 7),
    ncclProfileGroupApi = (1 << 8),  /* v5+ */
    ncclProfileCollApi = (1 << 9),   /* v5+ */
    ncclProfileP2pApi = (1 << 10),   /* v5+ */
    ncclProfileKernelLaunch = (1 << 11), /* v5+ */
    ncclProfileCeColl = (1 << 12),   /* v6 */
    ncclProfileCeSync = (1 << 13),   /* v6 */
    ncclProfileCeBatch = (1 << 14),  /* v6 */
    ncclProfileKernelPhase = (1 << 15) /* v7: phases of a symmetric kernel's channel */
};

/* Event states (one enum for every version; values never change). */
typedef enum {
    ncclProfilerProxyOpSendPosted = 0, /* 0-7 deprecated in v4, never sent */
    ncclProfilerProxyOpSendRemFifoWait = 1,
    ncclProfilerProxyOpSendTransmitted = 2,
    ncclProfilerProxyOpSendDone = 3,
    ncclProfilerProxyOpRecvPosted = 4,
    ncclProfilerProxyOpRecvReceived = 5,
    ncclProfilerProxyOpRecvTransmitted = 6,
    ncclProfilerProxyOpRecvDone = 7,
    ncclProfilerProxyStepSendGPUWait = 8,
    ncclProfilerProxyStepSendWait = 9,
    ncclProfilerProxyStepRecvWait = 10,
    ncclProfilerProxyStepRecvFlushWait = 11,
    ncclProfilerProxyStepRecvGPUWait = 12,
    ncclProfilerProxyCtrlIdle = 13,
    ncclProfilerProxyCtrlActive = 14,
    ncclProfilerProxyCtrlSleep = 15,
    ncclProfilerProxyCtrlWakeup = 16,
    ncclProfilerProxyCtrlAppend = 17,
    ncclProfilerProxyCtrlAppendEnd = 18,
    ncclProfilerProxyOpInProgress_v4 = 19,
    ncclProfilerProxyStepSendPeerWait_v4 = 20,
    ncclProfilerNetPluginUpdate = 21,
    ncclProfilerKernelChStop = 22,
    ncclProfilerGroupStartApiStop = 23, /* v5+; eStateArgs NULL (2.28.9) or uninitialised (2.30.7) */
    ncclProfilerGroupEndApiStart = 24,  /* v5+; same */
    ncclProfilerCeCollStart = 25,       /* 25-30: v6, defined but never sent by NCCL 2.30.7 */
    ncclProfilerCeCollComplete = 26,
    ncclProfilerCeSyncStart = 27,
    ncclProfilerCeSyncComplete = 28,
    ncclProfilerCeBatchStart = 29,
    ncclProfilerCeBatchComplete = 30,
    ncclProfilerKernelPhaseStop = 31    /* v7; stop pTimer in the kernelCh member of the args */
} ncclProfilerEventState_t;

typedef ncclProfilerEventState_t ncclProfilerEventState_v1_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v2_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v3_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v4_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v5_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v6_t;
typedef ncclProfilerEventState_t ncclProfilerEventState_v7_t;

/* pluginId of ncclProfileNetPlugin events: low 16 bits the descriptor version, next 16 the
 * plugin type (nccl_profiler.h:80-87). Vigil's type is in profiler_net_vigil.h. */
#define NCCL_PROFILER_NET_VER_BITS (16)
#define NCCL_PROFILER_NET_VER_MASK (~0U >> NCCL_PROFILER_NET_VER_BITS)
#define NCCL_PROFILER_NET_TYPE_MASK (~0U << NCCL_PROFILER_NET_VER_BITS)
#define NCCL_PROFILER_NET_TYPE_IB (1U << NCCL_PROFILER_NET_VER_BITS)
#define NCCL_PROFILER_NET_TYPE_SOCK (2U << NCCL_PROFILER_NET_VER_BITS)

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_PROFILER_COMMON_H */
