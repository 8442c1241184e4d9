/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declaration of NCCL's tuner v4 plugin struct (native in NCCL 2.24-2.27,
 * shimmed by 2.28-2.32). From NCCL v2.28.9-1 src/include/plugin/tuner/tuner_v4.h:53;
 * docs/nccl-abi.md, "Tuner". v3 plus `regBuff` (1 when this rank's
 * buffers are registered: rank-local, may differ between ranks). 32 bytes on x86-64.
 * C-compatible. */
#ifndef VIGIL_NCCL_ABI_TUNER_V4_H
#define VIGIL_NCCL_ABI_TUNER_V4_H

#include "tuner_v3.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *name;
    ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void **context);
    ncclResult_t (*getCollInfo)(void *context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                float **collCostTable, int numAlgo, int numProto, int regBuff,
                                int *nChannels);
    ncclResult_t (*destroy)(void *context);
} ncclTuner_v4_t;

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_TUNER_V4_H */
