/* SPDX-License-Identifier: Apache-2.0 */
/* Vigil's own declaration of NCCL's tuner v6 plugin struct (NCCL 2.30, used as is; shimmed
 * by 2.32). From NCCL v2.30.7-1 src/include/plugin/tuner/tuner_v6.h:15-81; see
 * docs/nccl-abi.md, "Tuner". v5 plus a fifth slot getChunkSize (NULL: NCCL's value).
 * NCCL calls getChunkSize per channel piece (nChannels 1, nBytes of the piece) except for
 * CollNet, clamps the result to its buffer and rounds it down to the protocol grain.
 * 40 bytes. C-compatible. */
#ifndef VIGIL_NCCL_ABI_TUNER_V6_H
#define VIGIL_NCCL_ABI_TUNER_V6_H

#include "tuner_v5.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v6_t;
typedef ncclTunerConstants_v5_t ncclTunerConstants_v6_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes,
                         ncclDebugLogger_t logFunction, ncclNvlDomainInfo_v6_t *nvlDomainInfo,
                         ncclTunerConstants_v6_t *constants);
    ncclResult_t (*getCollInfo)(void *context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                                float **collCostTable, int numAlgo, int numProto, int regBuff,
                                int *nChannels);
    ncclResult_t (*finalize)(void *context);
    ncclResult_t (*getChunkSize)(void *context, ncclFunc_t collType, size_t nBytes, int algo,
                                 int proto, int nChannels, size_t *chunkSize);
} ncclTuner_v6_t;

#ifdef __cplusplus
}
#endif

#endif /* VIGIL_NCCL_ABI_TUNER_V6_H */
