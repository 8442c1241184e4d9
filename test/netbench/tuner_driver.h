// SPDX-License-Identifier: Apache-2.0
// Drives an NCCL tuner plugin the way NCCL's enqueue does, for vigil-netbench --tuner: loads
// ncclTunerPlugin_v7 .. _v3 (newest first, as NCCL's tuner.cc), calls init per
// communicator with default tuning constants, and per collective builds a cost table
// (-1 everywhere, NCCL's predicted time for usable entries, NCCL_ALGO/NCCL_PROTO
// exclusions as -1), calls getCollInfo, selects like NCCL, then calls getChunkSize per
// channel piece (v6/v7) and clamps and aligns the result as NCCL does.
// Reference: docs/nccl-abi.md, "Tuner". No GPU: the decision is
// recorded and checked for agreement across ranks, not executed.
#pragma once

#include <cstdint>
#include <string>

#include "nccl_abi/tuner_v7.h"

namespace vigil::bench {

/// What NCCL would run for one collective.
struct TunerDecision {
    int algo = -1;
    int proto = -1;
    int channels = 0;     ///< after the tuner (0: NCCL's own count)
    uint64_t chunk = 0;   ///< after getChunkSize (v6/v7), else NCCL's default
    int chunk_calls = 0;  ///< getChunkSize calls made (NCCL: up to 3 per collective)
};

class TunerDriver
{
public:
    /// `spec`: "net" (the symbols of the already loaded net plugin library `net_handle`,
    /// as NCCL falls back to) or a name/path with NCCL_TUNER_PLUGIN's rules (verbatim, then
    /// libnccl-tuner-NAME.so). Returns "" or the reason.
    std::string load(const std::string &spec, void *net_handle);
    /// init for one communicator of `nranks` ranks on `nnodes` nodes. Returns "" or why.
    std::string init(uint64_t comm_id, int nranks, int nnodes);
    /// One collective of `bytes` per rank; `default_channels` is NCCL's own count.
    TunerDecision collective(int coll, uint64_t bytes, int default_channels);
    void finalize();
    int version() const { return version_; }
    const char *name() const;

private:
    void *lib_ = nullptr;
    bool own_lib_ = false;
    int version_ = 0;
    void *ctx_ = nullptr;
    int nranks_ = 0, nnodes_ = 0;
    ncclTuner_v7_t *v7_ = nullptr;
    ncclTuner_v6_t *v6_ = nullptr;
    ncclTuner_v5_t *v5_ = nullptr;
    ncclTuner_v4_t *v4_ = nullptr;
    ncclTuner_v3_t *v3_ = nullptr;
    ncclTunerConstants_v7_t k7_{};
    ncclTunerConstants_v5_t k5_{};
    bool excluded_[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS] = {};
};

} // namespace vigil::bench
