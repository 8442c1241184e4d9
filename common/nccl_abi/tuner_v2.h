/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declaration of NCCL's tuner v2 plugin struct and the ids every tuner version
 * shares (collective types, algorithms, protocols). Values from NCCL v2.28.9-1
 * src/include/plugin/tuner/tuner_v2.h and src/include/plugin/nccl_tuner.h:25-57,
 * nccl_common.h:58-72; see docs/nccl-abi.md, "Tuner".
 * v2 (NCCL 2.21-2.30 through shims) returns its choice in out-parameters instead of editing
 * the cost table; Vigil declares it for completeness and does not export it. C-compatible. */
#ifndef VIGIL_NCCL_ABI_TUNER_V2_H
#define VIGIL_NCCL_ABI_TUNER_V2_H

#include "nccl_common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ncclFunc_t (nccl_common.h:58-72): only these five reach a tuner. */
typedef enum {
    ncclFuncBroadcast = 0,
    ncclFuncReduce = 1,
    ncclFuncAllGather = 2,
    ncclFuncReduceScatter = 3,
    ncclFuncAllReduce = 4,
    ncclFuncSendRecv = 5,
    ncclFuncSend = 6,
    ncclFuncRecv = 7,
    ncclNumFuncs = 8
} ncclFunc_t;

/* Algorithm and protocol ids: the row and column of the cost table (nccl_tuner.h:25-41). */
#define NCCL_NUM_ALGORITHMS 7
#define NCCL_ALGO_UNDEF -1
#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_ALGO_COLLNET_DIRECT 2
#define NCCL_ALGO_COLLNET_CHAIN 3
#define NCCL_ALGO_NVLS 4
#define NCCL_ALGO_NVLS_TREE 5
#define NCCL_ALGO_PAT 6

#define NCCL_NUM_PROTOCOLS 3
#define NCCL_PROTO_UNDEF -1
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2

/* A cost-table entry NCCL must not select (unsupported, excluded by NCCL_ALGO/NCCL_PROTO). */
#define NCCL_ALGO_PROTO_IGNORE -1.0

/* Hardware link classes of ncclTunerConstants hwLatencies (tuner_v5.h:18-22). */
#define NCCL_HW_NVLINK 0
#define NCCL_HW_PCI 1
#define NCCL_HW_NET 2
#define NCCL_NUM_HW_LINKS 3

typedef struct {
    const char *name;
    ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void **context);
    /* Out: *algorithm, *protocol (both or neither), *nChannels (0: NCCL's choice). */
    ncclResult_t (*getCollInfo)(void *context, ncclFunc_t collType, size_t nBytes, int collNetSupport,
                                int nvlsSupport, int numPipeOps, int *algorithm, int *protocol,
                                int *nChannels);
    ncclResult_t (*destroy)(void *context);
} ncclTuner_v2_t;

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_TUNER_V2_H */
