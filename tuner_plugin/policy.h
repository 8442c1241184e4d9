// SPDX-License-Identifier: Apache-2.0
// The steering policy over NCCL's cost table: NCCL's own selection (to report decisions),
// rule application, and the model-based re-estimation under a degraded agreed view.
// Pure functions of their arguments (no I/O, no allocation): identical inputs give
// bit-identical outputs on every rank.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rules.h"

namespace vigil::tuner {

inline constexpr int kNumAlgos = 7;  ///< NCCL_NUM_ALGORITHMS (tuner v3..v7)
inline constexpr int kNumProtos = 3; ///< NCCL_NUM_PROTOCOLS

/// NCCL's cost table as handed to getCollInfo: a flat float[numAlgo][numProto] (row =
/// algorithm) passed cast to float** (docs/nccl-abi.md, "Tuner").
/// Entries < 0 are unusable (NCCL_ALGO_PROTO_IGNORE = -1.0); the others are predicted times
/// in microseconds. Not owned.
struct CostTable {
    float *t = nullptr;
    int n_algo = 0;
    int n_proto = 0;
    float &at(int a, int p) const { return t[a * n_proto + p]; }
    bool usable(int a, int p) const { return a >= 0 && p >= 0 && a < n_algo && p < n_proto && at(a, p) >= 0.0f; }
};

/// An (algorithm, protocol) pair; -1/-1 when nothing is selectable.
struct Choice {
    int algo = -1;
    int proto = -1;
    bool operator==(const Choice &) const = default;
};

/// What NCCL selects from `t` after the tuner returns (enqueue.cc topoGetAlgoInfo, 2.28.9
/// :1822-1840): skip negative entries, take the strictly smallest; ties go to the lowest
/// algorithm, then the lowest protocol.
Choice select_like_nccl(const CostTable &t) noexcept;

/// The latency constants NCCL passes to a v5..v7 init (microseconds): baseLatencies[algo]
/// [proto] and hwLatencies[NVLINK|PCI|NET][algo][proto]. `valid` false under v3/v4.
struct LatencyModel {
    double base[kNumAlgos][kNumProtos] = {};
    double hw[3][kNumAlgos][kNumProtos] = {};
    bool valid = false;
};

/// The latency part of NCCL's predicted time for one entry, in microseconds, as NCCL's
/// model builds it (graph/tuning.cc ncclTopoTuneModel; per-algorithm hop counts): base
/// latency plus intra-node hops at the NVLink hardware latency and inter-node hops at the
/// NET latency, times NCCL's pipelined-op count (ring: numPipeOps; others:
/// ceil(numPipeOps / 8)). An approximation: NCCL also folds in the intra-node link type and
/// its per-NIC net overhead, which a tuner is not told. 0 for an invalid model.
double model_latency_us(const LatencyModel &m, int coll, int algo, int proto, int nranks, int nnodes,
                        int pipe_ops) noexcept;

/// Re-estimates every usable entry of a multi-node communicator's table for an effective
/// network bandwidth fraction `fraction` (0 < fraction <= 1): with L = min(cost,
/// model_latency_us(...)), cost' = L + (cost - L) / fraction. The latency part stays, the
/// bandwidth part grows, so protocol and algorithm crossovers move as NCCL's own model
/// would move them if it knew the real bandwidth. Negative entries are never touched;
/// fraction >= 1, nnodes <= 1 or an invalid model change nothing. Returns the number of
/// entries changed.
int reestimate(const CostTable &t, const LatencyModel &m, int coll, uint64_t bytes, int nranks, int nnodes,
               int pipe_ops, double fraction) noexcept;

/// Applies the first rule of `rules` that matches `q` and names a usable entry: that entry's
/// cost becomes 0.0 and, when the rule sets channels > 0, *n_channels takes it (as NCCL's
/// example tuner does; a matching rule whose entry is unusable or out of the table is
/// skipped). Returns the index of the rule applied, or -1.
int apply_rules(const Rules &rules, const CollQuery &q, const CostTable &t, int *n_channels) noexcept;

/// NCCL's chunk-size grain per protocol (device.h ncclProtoGrainSize, 2.30.7): LL 16 B,
/// LL128 1920 B, SIMPLE 512 B; 0 for an unknown protocol.
uint64_t proto_grain(int proto) noexcept;

/// getChunkSize under rules: the first rule with a chunk that matches (coll, nBytes as NCCL
/// passes it here, nodes, ranks, health) and names exactly (algo, proto) sets the chunk,
/// rounded down to the protocol grain and never below one grain. numPipeOps and regBuff are
/// not passed to getChunkSize and are ignored. Returns `nccl_value` when no rule applies or
/// the protocol is unknown. *rule_index: the rule used or -1.
uint64_t chunk_for(const Rules &rules, const CollQuery &q, int algo, int proto, uint64_t nccl_value,
                   int *rule_index) noexcept;

} // namespace vigil::tuner
