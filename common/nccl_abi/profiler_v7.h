/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declaration of NCCL's profiler v7 plugin struct (NCCL 2.31 and later; NCCL
 * tries ncclProfiler_v7 first, then v6 ... v1). Layout from NCCL
 * src/include/plugin/profiler/profiler_v7.h (commit 88980683): v6's members at v6's offsets,
 * with fields appended to collApi and p2pApi (userTag), coll (kernelVariant, isSymColl,
 * userTag), p2p (userTag) and ceColl (userTag), and a new kernelPhase member (the phases of
 * a symmetric kernel's channel; its stop time arrives as recordEventState(KernelPhaseStop)
 * with the kernelCh member of the args). init keeps v6's signature. Descriptor: 136 bytes,
 * union at 24; state args: v5's union. C-compatible. See docs/nccl-abi.md. */
#ifndef VIGIL_NCCL_ABI_PROFILER_V7_H
#define VIGIL_NCCL_ABI_PROFILER_V7_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "profiler_common.h"
#include "profiler_v5.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            bool graphCaptured;
            int groupDepth;
        } groupApi;
        struct {
            const char *func;
            size_t count;
            const char *datatype;
            int root;
            void *stream;
            bool graphCaptured;
            uint64_t userTag; /* v7: 0 = untagged */
        } collApi;
        struct {
            const char *func;
            size_t count;
            const char *datatype;
            void *stream;
            bool graphCaptured;
            uint64_t userTag; /* v7 */
        } p2pApi;
        struct {
            void *stream;
        } kernelLaunch;
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
            void *parentGroup;
            const char *kernelVariant; /* v7 */
            bool isSymColl;            /* v7 */
            uint64_t userTag;          /* v7 */
        } coll;
        struct {
            const char *func;
            void *buff;
            const char *datatype;
            size_t count;
            int peer;
            uint8_t nChannels;
            void *parentGroup;
            uint64_t userTag; /* v7 */
        } p2p;
        struct {
            pid_t pid;
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
            uint64_t pTimer; /* GPU %globaltimer at the channel's start */
        } kernelCh;
        struct {
            int64_t id;
            void *data;
        } netPlugin;
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
            uint64_t userTag; /* v7 */
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
        struct {
            uint8_t channelId;
            uint8_t phaseId;       /* 0 initial sync, 1 compute, 2 final sync */
            const char *phaseName;
            uint64_t pTimer;       /* GPU %globaltimer at the phase's start */
        } kernelPhase;
    };
} ncclProfilerEventDescr_v7_t;

typedef ncclProfilerEventStateArgs_v5_t ncclProfilerEventStateArgs_v7_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **context, uint64_t commId, int *eActivationMask, const char *commName,
                         int nNodes, int nranks, int rank, ncclDebugLogger_t logfn);
    ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v7_t *eDescr);
    ncclResult_t (*stopEvent)(void *eHandle);
    ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_v7_t eState,
                                     ncclProfilerEventStateArgs_v7_t *eStateArgs);
    ncclResult_t (*finalize)(void *context);
} ncclProfiler_v7_t;

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_PROFILER_V7_H */
