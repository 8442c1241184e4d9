/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declaration of NCCL's profiler v6 plugin struct (NCCL 2.29.7, 2.30.7; no
 * shim). Layout from NCCL v2.30.7-1 src/include/plugin/profiler/profiler_v6.h:14-147; see
 * docs/nccl-abi.md, "Profiler versions and shims". Descriptor: 112 bytes, union at 24; the
 * v5 members are unchanged, the copy-engine (CE) members are appended, so a v6 descriptor is
 * byte-compatible with v5 for every v5 event type. State args are v5's. C-compatible. */
#ifndef VIGIL_NCCL_ABI_PROFILER_V6_H
#define VIGIL_NCCL_ABI_PROFILER_V6_H

#include "profiler_v5.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        VIGIL_PROFILER_V5_UNION_MEMBERS
        struct {
            uint64_t seqNumber;
            const char *func;
            void const *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
            const char *syncStrategy;
            bool intraBatchSync;
            uint32_t batchSize;
            uint32_t numBatches;
            uint32_t ceSeqNum;
            void *stream;
        } ceColl;
        struct {
            bool isComplete;
            int nRanks;
        } ceCollSync;
        struct {
            int numOps;
            size_t totalBytes;
            bool useIntraSync;
        } ceCollBatch;
    };
} ncclProfilerEventDescr_v6_t;

typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v6_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask, const char *commName,
                         int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v6_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_v6_t eState,
                                     ncclProfilerEventStateArgs_v6_t *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} ncclProfiler_v6_t;

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_PROFILER_V6_H */
