// SPDX-License-Identifier: Apache-2.0
// extern "C" ncclTunerPlugin_v7/_v6/_v5/_v4/_v3 tables: translate NCCL's arguments into the
// core's (tuner.h) and guard every entry point. Nothing else lives here.
//
// Why v3..v7: v3 is the first cost-table version (NCCL 2.22), v4 native in 2.24-2.27, v5 in
// 2.28-2.29, v6 in 2.30, v7 in 2.32 (docs/nccl-abi.md, "Which NCCL loads which table" and
// "Tuner"). v2 (out-parameters instead of the cost table) cannot honour NCCL_ALGO/NCCL_PROTO
// exclusions, so it is declared (common/nccl_abi/tuner_v2.h) but not exported.
// getCollInfo and getChunkSize never return an error: NCCL would fail the user's collective
// (enqueue.cc wraps both in NCCLCHECK).
#include <atomic>
#include <cstddef>
#include <cstring>

#include "abi_guard.h"
#include "nccl_abi/tuner_v3.h"
#include "nccl_abi/tuner_v4.h"
#include "nccl_abi/tuner_v5.h"
#include "nccl_abi/tuner_v6.h"
#include "nccl_abi/tuner_v7.h"
#include "tuner.h"
#include "version.h"

namespace {

using vigil::tuner::CommInfo;
using vigil::tuner::Context;
using vigil::tuner::Tuner;

static_assert(sizeof(ncclTuner_v4_t) == 32 && sizeof(ncclTuner_v5_t) == 32 && sizeof(ncclTuner_v6_t) == 40 &&
                  sizeof(ncclTuner_v7_t) == 40,
              "tuner struct layouts (docs/nccl-abi.md, Tuner)");
static_assert(sizeof(ncclTunerConstants_v5_t) == 1152, "v5 constants layout");
static_assert(sizeof(ncclTunerConstants_v7_t) == 1272, "v7 constants layout");
static_assert(offsetof(ncclTunerConstants_v7_t, hwLatencies) == offsetof(ncclTunerConstants_v5_t, hwLatencies),
              "v7 keeps v5's latency tables");

template <class Constants> void take_model(CommInfo *info, const Constants *k)
{
    if (k == nullptr) return;
    std::memcpy(info->model.base, k->baseLatencies, sizeof(info->model.base));
    std::memcpy(info->model.hw, k->hwLatencies, sizeof(info->model.hw));
    info->model.valid = true;
}

ncclResult_t open_context(void **context, const CommInfo &info, ncclDebugLogger_t log)
{
    return vigil::abi_guard("tuner init", [&] {
        if (context == nullptr) return ncclInvalidArgument;
        *context = nullptr;
        vigil::log::set_logger(log);
        std::string why;
        Tuner *t = Tuner::acquire();
        static std::atomic<bool> banner{false};
        if (!banner.exchange(true))
            VLOG_INFO(NCCL_INIT | NCCL_TUNING, "Vigil tuner %s, NCCL uses tuner v%d", VIGIL_VERSION, info.abi);
        Context *c = nullptr;
        if (t->open(info, nullptr, &c, &why) != 0) {
            Tuner::release(t);
            VLOG_WARN("init fails: %s", why.c_str());
            return ncclInvalidUsage;
        }
        *context = c;
        return ncclSuccess;
    });
}

template <class Nvl, class Constants>
ncclResult_t init_v5_up(void **context, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t log,
                        Nvl * /*nvlDomainInfo*/, Constants *constants, int abi)
{
    CommInfo info;
    info.comm = commId;
    info.has_comm = true;
    info.nranks = nRanks;
    info.nnodes = nNodes;
    info.abi = abi;
    take_model(&info, constants);
    return open_context(context, info, log);
}

ncclResult_t init_v7(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t log,
                     ncclNvlDomainInfo_v7_t *nvl, ncclTunerConstants_v7_t *k)
{
    return init_v5_up(ctx, commId, nRanks, nNodes, log, nvl, k, 7);
}
ncclResult_t init_v6(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t log,
                     ncclNvlDomainInfo_v6_t *nvl, ncclTunerConstants_v6_t *k)
{
    return init_v5_up(ctx, commId, nRanks, nNodes, log, nvl, k, 6);
}
ncclResult_t init_v5(void **ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t log,
                     ncclNvlDomainInfo_v5_t *nvl, ncclTunerConstants_v5_t *k)
{
    return init_v5_up(ctx, commId, nRanks, nNodes, log, nvl, k, 5);
}

template <int Abi> ncclResult_t init_v34(size_t nRanks, size_t nNodes, ncclDebugLogger_t log, void **context)
{
    CommInfo info;
    info.nranks = nRanks;
    info.nnodes = nNodes;
    info.abi = Abi;
    return open_context(context, info, log);
}

ncclResult_t get_coll_info(void *context, ncclFunc_t collType, size_t nBytes, int numPipeOps, float **collCostTable,
                           int numAlgo, int numProto, int regBuff, int *nChannels)
{
    if (context != nullptr)
        static_cast<Context *>(context)->get_coll_info(static_cast<int>(collType), nBytes, numPipeOps,
                                                       reinterpret_cast<float *>(collCostTable), numAlgo, numProto,
                                                       regBuff, nChannels);
    return ncclSuccess;
}

ncclResult_t get_coll_info_v3(void *context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float **collCostTable, int numAlgo, int numProto, int *nChannels)
{
    // v3 has no regBuff: 0 (rules naming regBuff 1 never match, as in a v3 example tuner).
    return get_coll_info(context, collType, nBytes, numPipeOps, collCostTable, numAlgo, numProto, 0, nChannels);
}

ncclResult_t get_chunk_size(void *context, ncclFunc_t collType, size_t nBytes, int algo, int proto, int nChannels,
                            size_t *chunkSize)
{
    if (context != nullptr && chunkSize != nullptr) {
        uint64_t v = *chunkSize;
        static_cast<Context *>(context)->get_chunk_size(static_cast<int>(collType), nBytes, algo, proto, nChannels, &v);
        *chunkSize = static_cast<size_t>(v);
    }
    return ncclSuccess;
}

ncclResult_t finalize(void *context)
{
    return vigil::abi_guard("tuner finalize", [&] {
        if (context == nullptr) return ncclSuccess;
        auto *c = static_cast<Context *>(context);
        Tuner &t = c->tuner();
        t.close(c);
        Tuner::release(&t);
        return ncclSuccess;
    });
}

} // namespace

extern "C" {

[[gnu::visibility("default")]] ncclTuner_v7_t ncclTunerPlugin_v7 = {
    "Vigil", init_v7, get_coll_info, finalize, get_chunk_size};
[[gnu::visibility("default")]] ncclTuner_v6_t ncclTunerPlugin_v6 = {
    "Vigil", init_v6, get_coll_info, finalize, get_chunk_size};
[[gnu::visibility("default")]] ncclTuner_v5_t ncclTunerPlugin_v5 = {
    "Vigil", init_v5, get_coll_info, finalize};
[[gnu::visibility("default")]] ncclTuner_v4_t ncclTunerPlugin_v4 = {
    "Vigil", init_v34<4>, get_coll_info, finalize};
[[gnu::visibility("default")]] ncclTuner_v3_t ncclTunerPlugin_v3 = {
    "Vigil", init_v34<3>, get_coll_info_v3, finalize};

} // extern "C"
