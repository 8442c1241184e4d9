/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declaration of NCCL's profiler v5 plugin struct (native in NCCL 2.28; through
 * a shim in 2.29.7/2.30.7). Layout from NCCL v2.28.9-1
 * src/include/plugin/profiler/profiler_v5.h:10-149; see docs/nccl-abi.md,
 * "Profiler versions and shims". Descriptor: 112 bytes, union at offset 24.
 * v5 adds the API events (GroupApi, CollApi, P2pApi, KernelLaunch); the parent of Coll/P2p
 * is the CollApi/P2pApi event and the Group moved to `parentGroup`. C-compatible. */
#ifndef VIGIL_NCCL_ABI_PROFILER_V5_H
#define VIGIL_NCCL_ABI_PROFILER_V5_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "profiler_common.h"
#include "profiler_v4.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The v5 union members; v6 repeats them and appends the CE members. */
#define VIGIL_PROFILER_V5_UNION_MEMBERS                                                           \
    struct {                                                                                      \
        bool graphCaptured;                                                                       \
        int groupDepth;                                                                           \
    } groupApi;                                                                                   \
    struct {                                                                                      \
        const char *func;                                                                         \
        size_t count;                                                                             \
        const char *datatype;                                                                     \
        int root;                                                                                 \
        void *stream;                                                                             \
        bool graphCaptured;                                                                       \
    } collApi;                                                                                    \
    struct {                                                                                      \
        const char *func;                                                                         \
        size_t count;                                                                             \
        const char *datatype;                                                                     \
        void *stream;                                                                             \
        bool graphCaptured;                                                                       \
    } p2pApi;                                                                                     \
    struct {                                                                                      \
        void *stream;                                                                             \
    } kernelLaunch;                                                                               \
    struct {                                                                                      \
        uint64_t seqNumber;                                                                       \
        const char *func;                                                                         \
        void const *sendBuff;                                                                     \
        void *recvBuff;                                                                           \
        size_t count;                                                                             \
        int root;                                                                                 \
        const char *datatype;                                                                     \
        uint8_t nChannels;                                                                        \
        uint8_t nWarps;                                                                           \
        const char *algo;                                                                         \
        const char *proto;                                                                        \
        void *parentGroup;                                                                        \
    } coll;                                                                                       \
    struct {                                                                                      \
        const char *func;                                                                         \
        void *buff;                                                                               \
        const char *datatype;                                                                     \
        size_t count;                                                                             \
        int peer;                                                                                 \
        uint8_t nChannels;                                                                        \
        void *parentGroup;                                                                        \
    } p2p;                                                                                        \
    struct {                                                                                      \
        pid_t pid;                                                                                \
        uint8_t channelId;                                                                        \
        int peer;                                                                                 \
        int nSteps;                                                                               \
        int chunkSize;                                                                            \
        int isSend;                                                                               \
    } proxyOp;                                                                                    \
    struct {                                                                                      \
        int step;                                                                                 \
    } proxyStep;                                                                                  \
    struct {                                                                                      \
        uint8_t channelId;                                                                        \
        uint64_t pTimer;                                                                          \
    } kernelCh;                                                                                   \
    struct {                                                                                      \
        int64_t id;                                                                               \
        void *data;                                                                               \
    } netPlugin;

typedef struct {
    uint64_t type; /* ncclProfile* */
    void *parentObj;
    int rank; /* set only for Coll, P2p, ProxyOp, ProxyStep, NetPlugin (0 otherwise) */
    union {
        VIGIL_PROFILER_V5_UNION_MEMBERS
    };
} ncclProfilerEventDescr_v5_t;

typedef ncclProfilerEventStateArgs_v4_t ncclProfilerEventStateArgs_v5_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask, const char *commName,
                         int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v5_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_v5_t eState,
                                     ncclProfilerEventStateArgs_v5_t *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} ncclProfiler_v5_t;

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_PROFILER_V5_H */
