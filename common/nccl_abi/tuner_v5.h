/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declaration of NCCL's tuner v5 plugin struct (native in NCCL 2.28-2.29,
 * shimmed by 2.30-2.32). From NCCL v2.28.9-1 src/include/plugin/tuner/tuner_v5.h:12-85;
 * docs/nccl-abi.md, "Tuner". init gains the communicator id, NVL
 * domain info and the in/out tuning constants (NCCL runs its model after init, so edits
 * change its own estimates). The fourth slot is `finalize`. 32 bytes; constants 1152 bytes.
 * C-compatible. */
#ifndef VIGIL_NCCL_ABI_TUNER_V5_H
#define VIGIL_NCCL_ABI_TUNER_V5_H

#include "tuner_v4.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_NUM_COMPCAPS_V5 4      /* Volta, Ampere, Hopper, Blackwell */
#define NCCL_NUM_TUNING_SCALES_V5 3 /* 1, 2, >= 4 nodes */

typedef struct {
    int nNvlDomains;
    int minRanksPerNvlDomain;
    int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;

/* Latencies in microseconds, bandwidths in GB/s (NCCL's model units). */
typedef struct {
    double baseLatencies[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
    double hwLatencies[NCCL_NUM_HW_LINKS][NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
    double llMaxBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
    double perChMaxRingLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
    double perChMaxTreeLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
    double perChMaxTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
    double perChMaxNVLSTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
} ncclTunerConstants_v5_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                         ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v5_t *nvlDomainInfo,
                         ncclTunerConstants_v5_t *constants);
    ncclResult_t (*getCollInfo)(void *context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                float **collCostTable, int numAlgo, int numProto, int regBuff,
                                int *nChannels);
    ncclResult_t (*finalize)(void *context);
} ncclTuner_v5_t;

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_TUNER_V5_H */
