// SPDX-License-Identifier: Apache-2.0
// NCCL-like tuner driving for vigil-netbench (see tuner_driver.h).
#include "tuner_driver.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <strings.h>
#include <string_view>

#include "loader.h"

namespace vigil::bench {
namespace {

const char *kAlgos[] = {"tree", "ring", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"};
const char *kProtos[] = {"ll", "ll128", "simple"};

// NCCL_ALGO / NCCL_PROTO as NCCL reads them: a comma list, "^" excludes (case-insensitive).
template <size_t N> void parse_list(const char *env, const char *(&names)[N], bool *enabled)
{
    for (size_t i = 0; i < N; ++i) enabled[i] = true;
    if (env == nullptr || *env == '\0') return;
    std::string_view s(env);
    const bool exclude = s.front() == '^';
    if (exclude) s.remove_prefix(1);
    for (size_t i = 0; i < N; ++i) enabled[i] = exclude;
    while (!s.empty()) {
        const size_t c = s.find(',');
        const std::string_view tok = s.substr(0, c);
        for (size_t i = 0; i < N; ++i)
            if (tok.size() == std::strlen(names[i]) && strncasecmp(tok.data(), names[i], tok.size()) == 0)
                enabled[i] = !exclude;
        if (c == std::string_view::npos) break;
        s.remove_prefix(c + 1);
    }
}

int log2i(int n)
{
    int l = 0;
    while (n > 1) n >>= 1, ++l;
    return l;
}

} // namespace

std::string TunerDriver::load(const std::string &spec, void *net_handle)
{
    if (spec == "net") {
        lib_ = net_handle;
    } else {
        lib_ = dlopen(spec.c_str(), RTLD_NOW | RTLD_LOCAL);
        const bool lib_so = spec.rfind("lib", 0) == 0 && spec.size() > 3 && spec.compare(spec.size() - 3, 3, ".so") == 0;
        if (lib_ == nullptr && spec.find('/') == std::string::npos && !lib_so)
            lib_ = dlopen(("libnccl-tuner-" + spec + ".so").c_str(), RTLD_NOW | RTLD_LOCAL);
        own_lib_ = lib_ != nullptr;
    }
    if (lib_ == nullptr) return "cannot load tuner " + spec + ": " + (spec == "net" ? "no net plugin" : dlerror());
    if ((v7_ = static_cast<ncclTuner_v7_t *>(dlsym(lib_, "ncclTunerPlugin_v7")))) version_ = 7;
    else if ((v6_ = static_cast<ncclTuner_v6_t *>(dlsym(lib_, "ncclTunerPlugin_v6")))) version_ = 6;
    else if ((v5_ = static_cast<ncclTuner_v5_t *>(dlsym(lib_, "ncclTunerPlugin_v5")))) version_ = 5;
    else if ((v4_ = static_cast<ncclTuner_v4_t *>(dlsym(lib_, "ncclTunerPlugin_v4")))) version_ = 4;
    else if ((v3_ = static_cast<ncclTuner_v3_t *>(dlsym(lib_, "ncclTunerPlugin_v3")))) version_ = 3;
    else return "no ncclTunerPlugin_v7..v3 in " + spec;
    if (const char *f = std::getenv("VIGIL_BENCH_TUNER_API")) { // force an older table, as an older NCCL would
        const int want = std::atoi(f);
        v7_ = want == 7 ? static_cast<ncclTuner_v7_t *>(dlsym(lib_, "ncclTunerPlugin_v7")) : nullptr;
        v6_ = want == 6 ? static_cast<ncclTuner_v6_t *>(dlsym(lib_, "ncclTunerPlugin_v6")) : nullptr;
        v5_ = want == 5 ? static_cast<ncclTuner_v5_t *>(dlsym(lib_, "ncclTunerPlugin_v5")) : nullptr;
        v4_ = want == 4 ? static_cast<ncclTuner_v4_t *>(dlsym(lib_, "ncclTunerPlugin_v4")) : nullptr;
        v3_ = want == 3 ? static_cast<ncclTuner_v3_t *>(dlsym(lib_, "ncclTunerPlugin_v3")) : nullptr;
        if (!v7_ && !v6_ && !v5_ && !v4_ && !v3_) return "no ncclTunerPlugin_v" + std::to_string(want);
        version_ = want;
    }
    return "";
}

const char *TunerDriver::name() const
{
    return v7_ ? v7_->name : v6_ ? v6_->name : v5_ ? v5_->name : v4_ ? v4_->name : v3_ ? v3_->name : "none";
}

std::string TunerDriver::init(uint64_t comm_id, int nranks, int nnodes)
{
    nranks_ = nranks;
    nnodes_ = std::max(nnodes, 1);
    bool algo_on[NCCL_NUM_ALGORITHMS], proto_on[NCCL_NUM_PROTOCOLS];
    parse_list(std::getenv("NCCL_ALGO"), kAlgos, algo_on);
    parse_list(std::getenv("NCCL_PROTO"), kProtos, proto_on);
    for (int a = 0; a < NCCL_NUM_ALGORITHMS; ++a)
        for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) excluded_[a][p] = !algo_on[a] || !proto_on[p];
    // Defaults of the order of NCCL's (graph/tuning.cc): base and per-hop latencies, us.
    const double base[2][3] = {{6.8, 14.0, 8.4}, {6.6, 14.0, 8.4}};
    const double nvl[2][3] = {{0.6, 1.25, 4.0}, {0.6, 1.9, 3.4}};
    const double net[2][3] = {{5.0, 8.5, 14.0}, {2.7, 4.0, 14.0}};
    for (int a = 0; a < 2; ++a)
        for (int p = 0; p < 3; ++p) {
            k7_.baseLatencies[a][p] = k5_.baseLatencies[a][p] = base[a][p];
            k7_.hwLatencies[NCCL_HW_NVLINK][a][p] = k5_.hwLatencies[NCCL_HW_NVLINK][a][p] = nvl[a][p];
            k7_.hwLatencies[NCCL_HW_NET][a][p] = k5_.hwLatencies[NCCL_HW_NET][a][p] = net[a][p];
        }
    ncclNvlDomainInfo_v5_t nvl_info{nnodes_, nranks_ / nnodes_, nranks_ / nnodes_};
    ncclResult_t r = ncclInternalError;
    const auto n = static_cast<size_t>(nranks), nn = static_cast<size_t>(nnodes_);
    if (v7_) r = v7_->init(&ctx_, comm_id, n, nn, bench_logger, &nvl_info, &k7_);
    else if (v6_) r = v6_->init(&ctx_, comm_id, n, nn, bench_logger, &nvl_info, &k5_);
    else if (v5_) r = v5_->init(&ctx_, comm_id, n, nn, bench_logger, &nvl_info, &k5_);
    else if (v4_) r = v4_->init(n, nn, bench_logger, &ctx_);
    else if (v3_) r = v3_->init(n, nn, bench_logger, &ctx_);
    if (r != ncclSuccess) return "tuner init returned ncclResult " + std::to_string(r) + " (NCCL fails the communicator)";
    return "";
}

TunerDecision TunerDriver::collective(int coll, uint64_t bytes, int default_channels)
{
    TunerDecision d;
    // The cost table as NCCL builds it: -1, then a time for each usable entry (ring and,
    // for all-reduce, tree; no CollNet/NVLS hardware here), 0.0 for a 1-rank comm.
    float table[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
    for (auto &row : table)
        for (float &x : row) x = -1.0f;
    const double bw[2][3] = {{1500, 6000, 9000}, {2000, 8000, 10000}}; // bytes per us
    const int nsteps = coll == ncclFuncAllReduce ? 2 * (nranks_ - 1) : nranks_ - 1;
    const int inter = nnodes_ == 1 ? 0 : coll == ncclFuncAllReduce ? 2 * (nnodes_ - 1) : nnodes_ - 1;
    for (int a = 0; a < 2; ++a)
        for (int p = 0; p < 3; ++p) {
            if (excluded_[a][p] || (a == NCCL_ALGO_TREE && coll != ncclFuncAllReduce)) continue;
            const double *b = k5_.baseLatencies[a], *hn = k5_.hwLatencies[NCCL_HW_NVLINK][a],
                         *ht = k5_.hwLatencies[NCCL_HW_NET][a];
            const double lat = a == NCCL_ALGO_RING ? b[p] + (nsteps - inter) * hn[p] + inter * ht[p]
                                                   : b[p] + 2 * ((nranks_ / nnodes_ - 1) * hn[p] + log2i(nnodes_) * ht[p]);
            table[a][p] = static_cast<float>(lat + static_cast<double>(bytes) / bw[a][p]);
        }
    if (nranks_ == 1) {
        for (auto &row : table)
            for (float &x : row) x = -1.0f;
        table[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = 0.0f;
    }
    int n_channels = 0;
    auto **cost = reinterpret_cast<float **>(table);
    const auto f = static_cast<ncclFunc_t>(coll);
    if (v7_) v7_->getCollInfo(ctx_, f, bytes, 1, cost, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, &n_channels);
    else if (v6_) v6_->getCollInfo(ctx_, f, bytes, 1, cost, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, &n_channels);
    else if (v5_) v5_->getCollInfo(ctx_, f, bytes, 1, cost, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, &n_channels);
    else if (v4_) v4_->getCollInfo(ctx_, f, bytes, 1, cost, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, &n_channels);
    else if (v3_) v3_->getCollInfo(ctx_, f, bytes, 1, cost, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, &n_channels);
    // NCCL's selection: skip negatives, strictly smallest, ties to the first in scan order.
    float best = -1.0f;
    for (int a = 0; a < NCCL_NUM_ALGORITHMS; ++a)
        for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p)
            if (table[a][p] >= 0.0f && (best < 0.0f || table[a][p] < best)) {
                best = table[a][p];
                d.algo = a;
                d.proto = p;
            }
    d.channels = n_channels > 0 ? n_channels : default_channels;
    if (d.algo < 0) return d;
    // Chunk size: NCCL's default, then getChunkSize per channel piece (lo, mid, hi) with
    // nChannels 1, clamped to the buffer and rounded down to the protocol grain.
    const uint64_t grain = d.proto == NCCL_PROTO_LL ? 16 : d.proto == NCCL_PROTO_LL128 ? 1920 : 512;
    const uint64_t buffer_max = d.proto == NCCL_PROTO_SIMPLE ? (4u << 20) / 2 : d.proto == NCCL_PROTO_LL ? 64 << 10 : 600 << 10;
    d.chunk = d.proto == NCCL_PROTO_SIMPLE ? 512 << 10 : d.proto == NCCL_PROTO_LL ? 16 << 10 : 120 * 1920;
    auto *chunk_fn = v7_ ? v7_->getChunkSize : v6_ ? v6_->getChunkSize : nullptr;
    if (chunk_fn != nullptr) {
        const int pieces = std::min(d.channels, 3);
        uint64_t out = d.chunk;
        for (int i = 0; i < pieces; ++i) {
            size_t c = d.chunk;
            const uint64_t piece = bytes / static_cast<uint64_t>(std::max(d.channels, 1));
            chunk_fn(ctx_, f, piece, d.algo, d.proto, 1, &c);
            ++d.chunk_calls;
            out = std::min<uint64_t>(c, buffer_max) / grain * grain;
        }
        d.chunk = out;
    }
    return d;
}

void TunerDriver::finalize()
{
    if (ctx_ != nullptr) {
        if (v7_) v7_->finalize(ctx_);
        else if (v6_) v6_->finalize(ctx_);
        else if (v5_) v5_->finalize(ctx_);
        else if (v4_) v4_->destroy(ctx_);
        else if (v3_) v3_->destroy(ctx_);
    }
    ctx_ = nullptr;
    if (own_lib_) dlclose(lib_);
    lib_ = nullptr;
}

} // namespace vigil::bench
