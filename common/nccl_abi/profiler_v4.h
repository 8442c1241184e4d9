/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declaration of NCCL's profiler v4 plugin struct (native in NCCL 2.27; through
 * a shim in 2.28.9 and 2.30.7). Layout from NCCL v2.28.9-1
 * src/include/plugin/profiler/profiler_v4.h:10-121 (byte-identical in v2.27.7-1); see
 * docs/nccl-abi.md, "Profiler versions and shims". Descriptor: 104 bytes, union at offset 24.
 * In v4 the parent of a Coll or P2p event is the Group event; there are no API events.
 * C-compatible. */
#ifndef VIGIL_NCCL_ABI_PROFILER_V4_H
#define VIGIL_NCCL_ABI_PROFILER_V4_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "profiler_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint8_t type; /* ncclProfile* */
    void *parentObj;
    int rank;
    union {
        struct {
            uint64_t seqNumber;
            const char *func;
            void const *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
            uint8_t nChannels;
            uint8_t nWarps;
            const char *algo;
            const char *proto;
        } coll;
        struct {
            const char *func;
            void *buff;
            const char *datatype;
            size_t count;
            int peer;
            uint8_t nChannels; /* never copied by the 2.28+ v4 shim: garbage there */
        } p2p;
        struct {
            pid_t pid; /* of the process that posted the op (PXN: another one) */
            uint8_t channelId;
            int peer;
            int nSteps;
            int chunkSize;
            int isSend;
        } proxyOp;
        struct {
            int step;
        } proxyStep;
        struct {
            uint8_t channelId;
            uint64_t pTimer; /* GPU globaltimer at the channel's start (ns) */
        } kernelCh;
        struct {
            int64_t id;
            void *data;
        } netPlugin;
    };
} ncclProfilerEventDescr_v4_t;

/* 8 bytes; identical to v5's. */
typedef union {
    struct {
        size_t transSize;
    } proxyStep;
    struct {
        int appendedProxyOps;
    } proxyCtrl;
    struct {
        void *data;
    } netPlugin;
    struct {
        uint64_t pTimer;
    } kernelCh;
} ncclProfilerEventStateArgs_v4_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, int *eActivationMask, const char *commName, uint64_t commHash,
                         int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v4_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_v4_t eState,
                                     ncclProfilerEventStateArgs_v4_t *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} ncclProfiler_v4_t;

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_PROFILER_V4_H */
