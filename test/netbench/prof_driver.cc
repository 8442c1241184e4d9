// SPDX-License-Identifier: Apache-2.0
// NCCL-like profiler event sequences for the network workloads (see prof_driver.h).
#include "prof_driver.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstring>

#include "loader.h"

namespace vigil::bench {

namespace {
ProfDriver *g_driver = nullptr; // the net callback carries no context (NCCL finds it from pHandle)
}

std::string ProfDriver::load(void *lib, const std::string &path)
{
    if (lib == nullptr) {
        lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) return std::string("cannot load profiler: ") + dlerror();
    }
    v6_ = static_cast<ncclProfiler_v6_t *>(dlsym(lib, "ncclProfiler_v6"));
    if (v6_ == nullptr) v5_ = static_cast<ncclProfiler_v5_t *>(dlsym(lib, "ncclProfiler_v5"));
    if (v6_ == nullptr && v5_ == nullptr) return "no ncclProfiler_v6 or _v5 symbol in the library";
    g_driver = this;
    return {};
}

std::string ProfDriver::init(uint64_t comm_hash, int nranks, int rank)
{
    rank_ = rank;
    const ncclResult_t r = v6_ ? v6_->init(&ctx_, comm_hash, &mask_, "netbench", nranks, nranks, rank, bench_logger)
                               : v5_->init(&ctx_, comm_hash, &mask_, "netbench", nranks, nranks, rank, bench_logger);
    // No GPU kernel here, so no kernel-channel events: NCCL's mask says so (as RAS could,
    // NCCL >= 2.31), and the profiler times collectives by their network work instead of
    // waiting for channels that never come.
    mask_ &= ~ncclProfileKernelCh;
    return r == ncclSuccess ? std::string() : "profiler init returned " + std::to_string(r);
}

void ProfDriver::finalize()
{
    if (v6_) v6_->finalize(ctx_);
    else if (v5_) v5_->finalize(ctx_);
    ctx_ = nullptr;
}

void *ProfDriver::start(ncclProfilerEventDescr_v6_t &d)
{
    // Like NCCL: only types in the mask are started (profiler.cc checks eActivationMask).
    if (!(static_cast<uint64_t>(mask_) & d.type)) return nullptr;
    void *h = nullptr;
    if (v6_) v6_->startEvent(ctx_, &h, &d);
    else v5_->startEvent(ctx_, &h, reinterpret_cast<ncclProfilerEventDescr_v5_t *>(&d)); // v5 prefix layout
    return h;
}

void *ProfDriver::coll(uint64_t seq, const char *func, size_t count, const char *datatype, int channels)
{
    ncclProfilerEventDescr_v6_t d{};
    d.type = ncclProfileColl;
    d.rank = rank_;
    d.coll.seqNumber = seq;
    d.coll.func = func;
    d.coll.count = count;
    d.coll.datatype = datatype;
    d.coll.nChannels = static_cast<uint8_t>(channels);
    d.coll.algo = "RING";
    d.coll.proto = "SIMPLE";
    void *h = start(d);
    stop(h); // a Coll stops once enqueued (docs/nccl-abi.md, "Profiler calls and handles")
    return h;
}

void *ProfDriver::op_start(void *coll, int channel, int peer, int nsteps, int chunk, bool send)
{
    ncclProfilerEventDescr_v6_t d{};
    d.type = ncclProfileProxyOp;
    d.parentObj = coll;
    d.rank = rank_;
    d.proxyOp.pid = getpid();
    d.proxyOp.channelId = static_cast<uint8_t>(channel);
    d.proxyOp.peer = peer;
    d.proxyOp.nSteps = nsteps;
    d.proxyOp.chunkSize = chunk;
    d.proxyOp.isSend = send;
    void *h = start(d);
    state(h, ncclProfilerProxyOpInProgress_v4, 0);
    return h;
}

void *ProfDriver::step_start(void *op, int step)
{
    ncclProfilerEventDescr_v6_t d{};
    d.type = ncclProfileProxyStep;
    d.parentObj = op;
    d.rank = rank_;
    d.proxyStep.step = step;
    return start(d);
}

void ProfDriver::state(void *h, int state, size_t trans_size)
{
    if (h == nullptr) return; // NCCL skips states of events the plugin dropped
    ncclProfilerEventStateArgs_v6_t a{};
    a.proxyStep.transSize = trans_size;
    if (v6_) v6_->recordEventState(h, static_cast<ncclProfilerEventState_v6_t>(state), &a);
    else v5_->recordEventState(h, static_cast<ncclProfilerEventState_v5_t>(state), &a);
}

void ProfDriver::stop(void *h)
{
    if (h == nullptr) return;
    if (v6_) v6_->stopEvent(h);
    else v5_->stopEvent(h);
}

ncclResult_t ProfDriver::net_callback(void **eHandle, int type, void *pHandle, int64_t pluginId, void *extData)
{
    // NCCL's ncclProfilerCallback (profiler.cc:687-715): 0 start, 1 stop, 2 update.
    ProfDriver *p = g_driver;
    if (p == nullptr) return ncclSuccess;
    if (type == 0) {
        ncclProfilerEventDescr_v6_t d{};
        d.type = ncclProfileNetPlugin;
        d.parentObj = pHandle;
        d.rank = p->rank_;
        d.netPlugin.id = pluginId;
        d.netPlugin.data = extData;
        *eHandle = p->start(d);
    } else if (type == 1) {
        p->stop(*eHandle);
    } else if (type == 2 && *eHandle != nullptr) {
        ncclProfilerEventStateArgs_v6_t a{};
        a.netPlugin.data = extData;
        if (p->v6_) p->v6_->recordEventState(*eHandle, ncclProfilerNetPluginUpdate, &a);
        else p->v5_->recordEventState(*eHandle, ncclProfilerNetPluginUpdate, &a);
    }
    return ncclSuccess;
}

} // namespace vigil::bench
