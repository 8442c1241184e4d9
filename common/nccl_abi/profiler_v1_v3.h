/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declarations of NCCL's profiler v1, v2 and v3 plugin structs (NCCL 2.23-2.26;
 * still accepted by 2.28.9 and 2.30.7 through shims). Layouts from NCCL
 * src/include/plugin/profiler/profiler_v{1,2,3}.h. Declared for reference and layout checks;
 * Vigil exports v4, v5 and v6 only (see abi_profiler.cc for why). C-compatible. */
#ifndef VIGIL_NCCL_ABI_PROFILER_V1_V3_H
#define VIGIL_NCCL_ABI_PROFILER_V1_V3_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "profiler_common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint8_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            const char *name;
            uint64_t commHash;
            uint64_t seqNumber;
            uint8_t func;
            void const *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            uint8_t datatype;
            uint32_t op;
            size_t trafficBytes;
            uint8_t nMaxChannels;
            uint8_t nWarps;
            uint8_t algo;
            uint8_t proto;
            int isCollnet;
            int isNvls;
        } coll;
        struct {
            const char *name;
            uint64_t commHash;
            uint8_t func;
            void *buff;
            uint8_t datatype;
            size_t count;
            int peer;
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
    };
} ncclProfilerEventDescr_v1_t;

/* v1-v3 share this state-args layout. */
typedef union {
    struct {
        size_t transSize;
        int steps;
    } proxyOp;
    struct {
        int appendedProxyOps;
    } proxyCtrl;
} ncclProfilerEventStateArgs_v1_t;
typedef ncclProfilerEventStateArgs_v1_t ncclProfilerEventStateArgs_v2_t;
typedef ncclProfilerEventStateArgs_v1_t ncclProfilerEventStateArgs_v3_t;

typedef struct {
    uint8_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            const char *name;
            uint64_t commHash;
            uint64_t seqNumber;
            const char *func;
            void const *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
            size_t trafficBytes;
            uint8_t nMaxChannels;
            uint8_t nWarps;
            const char *algo;
            const char *proto;
        } coll;
        struct {
            const char *name;
            uint64_t commHash;
            const char *func;
            void *buff;
            const char *datatype;
            size_t count;
            int peer;
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
    };
} ncclProfilerEventDescr_v2_t;

typedef struct {
    uint8_t type;
    void *parentObj;
    int rank;
    union {
        struct {
            const char *name;
            uint64_t commHash;
            uint64_t seqNumber;
            const char *func;
            void const *sendBuff;
            void *recvBuff;
            size_t count;
            int root;
            const char *datatype;
            uint8_t nMaxChannels;
            uint8_t nWarps;
            const char *algo;
            const char *proto;
        } coll;
        struct {
            const char *name;
            uint64_t commHash;
            const char *func;
            void *buff;
            const char *datatype;
            size_t count;
            int peer;
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
        } kernelCh;
        struct {
            int64_t id;
            void *data;
        } netPlugin;
    };
} ncclProfilerEventDescr_v3_t;

/* v1-v3: init(void** context, int* eActivationMask); no communicator information. */
#define VIGIL_DECLARE_PROFILER_V1_V3(N)                                                           \
    typedef struct {                                                                              \
        const char *name;                                                                         \
        ncclResult_t (*init)(void **context, int *eActivationMask);                               \
        ncclResult_t (*startEvent)(void *context, void **eHandle, ncclProfilerEventDescr_v##N##_t *eDescr); \
        ncclResult_t (*stopEvent)(void *eHandle);                                                 \
        ncclResult_t (*recordEventState)(void *eHandle, ncclProfilerEventState_v##N##_t eState,   \
                                         ncclProfilerEventStateArgs_v##N##_t *eStateArgs);        \
        ncclResult_t (*finalize)(void *context);                                                  \
    } ncclProfiler_v##N##_t;
VIGIL_DECLARE_PROFILER_V1_V3(1)
VIGIL_DECLARE_PROFILER_V1_V3(2)
VIGIL_DECLARE_PROFILER_V1_V3(3)
#undef VIGIL_DECLARE_PROFILER_V1_V3

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_PROFILER_V1_V3_H */
