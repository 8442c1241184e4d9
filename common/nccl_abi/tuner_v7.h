/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declaration of NCCL's tuner v7 plugin struct (NCCL 2.32, used as is). From
 * NVIDIA/nccl src/include/plugin/tuner/tuner_v7.h (commit 2449986f); see docs/nccl-abi.md,
 * "Tuner". v6's slots; the constants' per-compute-capability rows grow
 * from 4 to 5 (Rubin), so ncclTunerConstants_v7_t is 1272 bytes; baseLatencies and
 * hwLatencies keep v5's offsets. C-compatible. */
#ifndef VIGIL_NCCL_ABI_TUNER_V7_H
#define VIGIL_NCCL_ABI_TUNER_V7_H

#include "tuner_v6.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_NUM_COMPCAPS_V7 5

typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v7_t;

typedef struct {
    double baseLatencies[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
    double hwLatencies[NCCL_NUM_HW_LINKS][NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
    double llMaxBws[NCCL_NUM_COMPCAPS_V7][NCCL_NUM_TUNING_SCALES_V5];
    double perChMaxRingLL128Bws[NCCL_NUM_COMPCAPS_V7][NCCL_NUM_TUNING_SCALES_V5];
    double perChMaxTreeLL128Bws[NCCL_NUM_COMPCAPS_V7][NCCL_NUM_TUNING_SCALES_V5];
    double perChMaxTreeBws[NCCL_NUM_COMPCAPS_V7][NCCL_NUM_TUNING_SCALES_V5];
    double perChMaxNVLSTreeBws[NCCL_NUM_COMPCAPS_V7][NCCL_NUM_TUNING_SCALES_V5];
} ncclTunerConstants_v7_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                         ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v7_t *nvlDomainInfo,
                         ncclTunerConstants_v7_t *constants);
    ncclResult_t (*getCollInfo)(void *context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                float **collCostTable, int numAlgo, int numProto, int regBuff,
                                int *nChannels);
    ncclResult_t (*finalize)(void *context);
    ncclResult_t (*getChunkSize)(void *context, ncclFunc_t collType, size_t nBytes, int algo,
                                 int proto, int nChannels, size_t *chunkSize);
} ncclTuner_v7_t;

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_TUNER_V7_H */
