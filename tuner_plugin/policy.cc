// SPDX-License-Identifier: Apache-2.0
// Cost-table selection, rule application and model-based re-estimation.
#include "policy.h"

#include <algorithm>

namespace vigil::tuner {
namespace {

int log2i(int n)
{
    int l = 0;
    while (n > 1) {
        n >>= 1;
        ++l;
    }
    return l;
}

} // namespace

Choice select_like_nccl(const CostTable &t) noexcept
{
    Choice best;
    float min = -1.0f;
    for (int a = 0; a < t.n_algo; ++a)
        for (int p = 0; p < t.n_proto; ++p) {
            const float c = t.at(a, p);
            if (c < 0.0f) continue;
            if (min < 0.0f || c < min) {
                min = c;
                best = {a, p};
            }
        }
    return best;
}

double model_latency_us(const LatencyModel &m, int coll, int algo, int proto, int nranks, int nnodes,
                        int pipe_ops) noexcept
{
    if (!m.valid || algo < 0 || algo >= kNumAlgos || proto < 0 || proto >= kNumProtos || nranks < 1) return 0;
    nnodes = std::max(nnodes, 1);
    const int ppn = std::max(nranks / nnodes, 1);
    const double intra = m.hw[0][algo][proto], inter = m.hw[2][algo][proto];
    const bool allreduce = coll == 4;
    const int nsteps = allreduce ? 2 * (nranks - 1) : nranks - 1;
    double lat = m.base[algo][proto];
    switch (algo) {
    case 1: { // ring
        const int inter_steps = nnodes == 1 ? 0 : allreduce ? 2 * (nnodes - 1) : nnodes - 1;
        lat += (nsteps - inter_steps) * intra + inter_steps * inter;
        break;
    }
    case 0: // tree (all-reduce only in NCCL)
        lat += 2 * ((ppn - 1) * intra + log2i(nnodes) * inter);
        break;
    case 2: // collnet direct: 0.4 us arity serialization per local rank
        lat += 2 * (std::min(1, ppn - 1) * intra + (ppn - 1) * 0.4) + inter;
        break;
    case 3: // collnet chain
        lat += 2 * (ppn - 1) * intra + inter;
        break;
    case 4: // nvls
        if (nnodes > 1) lat += inter;
        break;
    case 5: // nvls tree
        lat += intra + 2 * log2i(nnodes) * inter;
        break;
    case 6: // pat
        lat += log2i(nnodes) * (inter / 3.5) + nranks * 2.8;
        break;
    default: break;
    }
    const int ops = std::max(pipe_ops, 1);
    const int count = algo == 1 ? ops : (ops + 7) / 8;
    return lat * count;
}

int reestimate(const CostTable &t, const LatencyModel &m, int coll, uint64_t /*bytes*/, int nranks, int nnodes,
               int pipe_ops, double fraction) noexcept
{
    if (!(fraction > 0.0) || fraction >= 1.0 || nnodes <= 1 || !m.valid) return 0;
    int changed = 0;
    for (int a = 0; a < std::min(t.n_algo, kNumAlgos); ++a)
        for (int p = 0; p < std::min(t.n_proto, kNumProtos); ++p) {
            float &c = t.at(a, p);
            if (c < 0.0f) continue;
            const double cost = c;
            const double lat = std::min(cost, model_latency_us(m, coll, a, p, nranks, nnodes, pipe_ops));
            const double re = lat + (cost - lat) / fraction;
            const auto f = static_cast<float>(re);
            if (f != c) {
                c = f;
                ++changed;
            }
        }
    return changed;
}

int apply_rules(const Rules &rules, const CollQuery &q, const CostTable &t, int *n_channels) noexcept
{
    for (size_t i = 0; i < rules.rules.size(); ++i) {
        const Rule &r = rules.rules[i];
        if (!rule_matches(r, q) || !t.usable(r.algo, r.proto)) continue;
        t.at(r.algo, r.proto) = 0.0f;
        if (r.channels > 0) *n_channels = r.channels;
        return static_cast<int>(i);
    }
    return -1;
}

uint64_t proto_grain(int proto) noexcept
{
    switch (proto) {
    case 0: return 16;
    case 1: return 1920;
    case 2: return 512;
    default: return 0;
    }
}

uint64_t chunk_for(const Rules &rules, const CollQuery &q, int algo, int proto, uint64_t nccl_value,
                   int *rule_index) noexcept
{
    *rule_index = -1;
    const uint64_t grain = proto_grain(proto);
    if (grain == 0) return nccl_value;
    CollQuery cq = q;
    for (size_t i = 0; i < rules.rules.size(); ++i) {
        const Rule &r = rules.rules[i];
        if (r.chunk == 0 || r.algo != algo || r.proto != proto) continue;
        cq.pipe_ops = r.pipe_ops; // not passed to getChunkSize: match anything
        cq.reg_buff = r.reg_buff;
        if (!rule_matches(r, cq)) continue;
        *rule_index = static_cast<int>(i);
        return std::max(r.chunk / grain * grain, grain);
    }
    return nccl_value;
}

} // namespace vigil::tuner
