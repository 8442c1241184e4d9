/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declaration of NCCL's tuner v3 plugin struct (native in NCCL 2.22-2.23, shimmed
 * by 2.24-2.32). From NCCL v2.28.9-1 src/include/plugin/tuner/tuner_v3.h; see
 * docs/nccl-abi.md, "Tuner". The first cost-table version: collCostTable is a flat
 * float[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS] passed cast to float**
 * (v2.28.9-1:src/enqueue.cc:1933-1945).
 * No commId: Vigil applies rules but no health steering under v3. C-compatible. */
#ifndef VIGIL_NCCL_ABI_TUNER_V3_H
#define VIGIL_NCCL_ABI_TUNER_V3_H

#include "tuner_v2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void **context);
    ncclResult_t (*getCollInfo)(void *context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                float **collCostTable, int numAlgo, int numProto, int *nChannels);
    ncclResult_t (*destroy)(void *context);
} ncclTuner_v3_t;

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_TUNER_V3_H */
