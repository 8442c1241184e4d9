// SPDX-License-Identifier: Apache-2.0
// extern "C" ncclProfiler_v7/_v6/_v5/_v4 tables: translate NCCL's descriptors into Records
// and guard every entry point. Nothing else lives here.
//
// Why v4-v7 only: v4 is native in NCCL 2.27 and shimmed by 2.28-2.30, v5 native in 2.28, v6
// in 2.29/2.30 and v7 in 2.31 (docs/nccl-abi.md). v1-v3 (2.23-2.26) lack kernel-channel
// timing and the communicator's identity in init, which the straggler report needs; they are
// declared in common/nccl_abi/profiler_v1_v3.h only.
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "abi_guard.h"
#include "nccl_abi/profiler_net_vigil.h"
#include "nccl_abi/profiler_v4.h"
#include "nccl_abi/profiler_v6.h"
#include "nccl_abi/profiler_v7.h"
#include "profiler.h"

namespace {

using vigil::prof::Kind;
using vigil::prof::Record;

static_assert(sizeof(ncclProfilerEventDescr_v4_t) == 104, "profiler v4 descriptor layout");
static_assert(sizeof(ncclProfilerEventDescr_v5_t) == 112, "profiler v5 descriptor layout");
static_assert(sizeof(ncclProfilerEventDescr_v6_t) == 112, "profiler v6 descriptor layout");
static_assert(sizeof(ncclProfilerEventDescr_v7_t) == 136, "profiler v7 descriptor layout");
static_assert(offsetof(ncclProfilerEventDescr_v7_t, kernelCh.pTimer) == 32, "profiler v7 kernelCh layout");
static_assert(offsetof(ncclProfilerEventDescr_v7_t, coll.userTag) == 128, "profiler v7 coll layout");
static_assert(offsetof(ncclProfilerEventDescr_v7_t, collApi.userTag) == 72, "profiler v7 collApi layout");
static_assert(sizeof(ncclProfilerEventStateArgs_v5_t) == 8, "profiler state args layout");

int kind_index(uint64_t type)
{
    // Exactly one bit; CE events (12-14) and types newer than this code are not recorded
    // (RAS may switch any type on after init, NCCL >= 2.31: they get a NULL handle).
    if (type == 0 || (type & (type - 1)) != 0) return -1;
    const unsigned k = static_cast<unsigned>(__builtin_ctzll(type));
    return vigil::prof::recordable(k) ? static_cast<int>(k) : -1;
}

void fill_net(Record *r, int64_t id, const void *data)
{
    if (id == VIGIL_PROFILER_NET_ID && data != nullptr) {
        const auto *d = static_cast<const vigilNetProfDescr_v1_t *>(data);
        if (d->type < vigilNetProfWindow || d->type > vigilNetProfFailback) return; // not a type we know
        r->net.type = d->type;
        r->net.slot = d->slot;
        r->net.degraded = d->degraded;
        r->net.state = d->state;
        r->net.generation = d->generation;
        r->net.dev = d->dev;
        r->net.window_us = d->window_us;
        r->net.start_ns = d->start_ns;
        r->net.bytes = d->bytes;
        r->net.busy_ns = d->busy_ns;
        r->net.lat_p99_ns = d->lat_p99_ns;
        r->net.conn = d->conn;
        r->net.share_permille = d->share_permille <= 1000 ? d->share_permille : 0;
    } else {
        r->foreign_net.plugin_id = id; // another net plugin's event: kept as a bare slice
    }
}

/// Task-level events, whose members have the same names in v4, v5 and v6 (the layouts
/// differ in the header's `type` width; the compiler follows each).
template <class Descr> void fill_task(Record *r, const Descr &d)
{
    switch (r->kind) {
    case Kind::kColl:
        r->coll.seq = d.coll.seqNumber;
        r->coll.count = d.coll.count;
        r->coll.func = d.coll.func;
        r->coll.datatype = d.coll.datatype;
        r->coll.algo = d.coll.algo;
        r->coll.proto = d.coll.proto;
        r->coll.root_rank = d.coll.root;
        r->coll.channels = d.coll.nChannels;
        r->coll.warps = d.coll.nWarps;
        break;
    case Kind::kP2p:
        r->p2p.count = d.p2p.count;
        r->p2p.func = d.p2p.func;
        r->p2p.datatype = d.p2p.datatype;
        r->p2p.peer = d.p2p.peer;
        r->p2p.channels = d.p2p.nChannels;
        break;
    case Kind::kProxyOp:
        r->op.pid = d.proxyOp.pid;
        r->op.peer = d.proxyOp.peer;
        r->op.steps = d.proxyOp.nSteps;
        r->op.chunk = d.proxyOp.chunkSize;
        r->op.channel = d.proxyOp.channelId;
        r->op.is_send = d.proxyOp.isSend != 0;
        break;
    case Kind::kProxyStep:
        r->step.step = d.proxyStep.step;
        break;
    case Kind::kKernelCh:
        r->kch.channel = d.kernelCh.channelId;
        r->kch.gpu_start_ns = d.kernelCh.pTimer;
        break;
    case Kind::kNet:
        fill_net(r, d.netPlugin.id, d.netPlugin.data);
        break;
    default: // Group, ProxyCtrl: no payload; API events: fill_api
        break;
    }
}

/// What v7 adds: the application's tags, and the phases of a symmetric kernel's channel.
void fill_v7(Record *r, const ncclProfilerEventDescr_v7_t &d)
{
    switch (r->kind) {
    case Kind::kColl: r->coll.user_tag = d.coll.userTag; break;
    case Kind::kP2p: r->p2p.user_tag = d.p2p.userTag; break;
    case Kind::kKernelPhase:
        r->phase.channel = d.kernelPhase.channelId;
        r->phase.phase = d.kernelPhase.phaseId;
        r->phase.name = d.kernelPhase.phaseName;
        r->phase.gpu_start_ns = d.kernelPhase.pTimer;
        break;
    default: break;
    }
}

/// The v5/v6/v7 API events (v6 and v7 only append members).
template <class Descr> void fill_api(Record *r, const Descr &d)
{
    switch (r->kind) {
    case Kind::kGroupApi:
        r->api.depth = d.groupApi.groupDepth;
        r->api.graph_captured = d.groupApi.graphCaptured;
        break;
    case Kind::kCollApi:
        r->api.func = d.collApi.func;
        r->api.count = d.collApi.count;
        r->api.datatype = d.collApi.datatype;
        r->api.graph_captured = d.collApi.graphCaptured;
        break;
    case Kind::kP2pApi:
        r->api.func = d.p2pApi.func;
        r->api.count = d.p2pApi.count;
        r->api.datatype = d.p2pApi.datatype;
        r->api.graph_captured = d.p2pApi.graphCaptured;
        break;
    default: // KernelLaunch: no payload we keep
        break;
    }
}

template <class Descr> ncclResult_t start_v5(void *context, void **eHandle, Descr *d)
{
    return vigil::abi_guard("profiler startEvent", [&] {
        if (eHandle == nullptr) return ncclSuccess;
        *eHandle = nullptr;
        if (d == nullptr) return ncclSuccess;
        const int k = kind_index(d->type);
        if (k < 0) return ncclSuccess;
        const Kind kind = static_cast<Kind>(k);
        Record *r = vigil::prof::open_event(context, kind, d->parentObj, eHandle,
                                            kind == Kind::kProxyOp ? d->proxyOp.pid : 0);
        if (r != nullptr) {
            if (kind != Kind::kKernelPhase) fill_task(r, *d);
            fill_api(r, *d);
            if constexpr (std::is_same_v<Descr, ncclProfilerEventDescr_v7_t>) fill_v7(r, *d);
        }
        return ncclSuccess;
    });
}

ncclResult_t start_v4(void *context, void **eHandle, ncclProfilerEventDescr_v4_t *d)
{
    return vigil::abi_guard("profiler startEvent", [&] {
        if (eHandle == nullptr) return ncclSuccess;
        *eHandle = nullptr;
        if (d == nullptr) return ncclSuccess;
        const int k = kind_index(d->type);
        if (k < 0 || k >= static_cast<int>(Kind::kGroupApi)) return ncclSuccess; // v4 has no API events
        const Kind kind = static_cast<Kind>(k);
        Record *r = vigil::prof::open_event(context, kind, d->parentObj, eHandle,
                                            kind == Kind::kProxyOp ? d->proxyOp.pid : 0);
        if (r == nullptr) return ncclSuccess;
        fill_task(r, *d);
        // The 2.28+ v4 shim never copies p2p.nChannels
        // (docs/nccl-abi.md, "Profiler versions and shims"): untrusted.
        if (kind == Kind::kP2p) r->p2p.channels = 0;
        return ncclSuccess;
    });
}

ncclResult_t stop(void *eHandle)
{
    return vigil::abi_guard("profiler stopEvent", [&] {
        vigil::prof::stop_event(eHandle);
        return ncclSuccess;
    });
}

ncclResult_t record(void *eHandle, ncclProfilerEventState_t state, ncclProfilerEventStateArgs_v5_t *args)
{
    return vigil::abi_guard("profiler recordEventState", [&] {
        uint64_t a = 0;
        // 23/24 arrive with NULL (2.28.9) or an uninitialised union (2.30.7): never read it.
        const bool has = args != nullptr && state != ncclProfilerGroupStartApiStop &&
                         state != ncclProfilerGroupEndApiStart;
        if (has) std::memcpy(&a, args, sizeof(a));
        vigil::prof::record_state(eHandle, static_cast<int>(state), a, has);
        return ncclSuccess;
    });
}

ncclResult_t finalize(void *context)
{
    return vigil::abi_guard("profiler finalize", [&] { return vigil::prof::finalize(context); });
}

ncclResult_t init_v56(void **context, uint64_t commId, int *mask, const char *name, int nnodes, int nranks,
                      int rank, ncclDebugLogger_t logfn, int abi)
{
    return vigil::abi_guard("profiler init", [&] {
        if (context == nullptr || mask == nullptr) return ncclInvalidArgument;
        *context = nullptr;
        return vigil::prof::init(context, commId, mask, name, nnodes, nranks, rank, logfn, abi);
    });
}

ncclResult_t init_v7(void **context, uint64_t commId, int *mask, const char *name, int nnodes, int nranks,
                     int rank, ncclDebugLogger_t logfn)
{
    return init_v56(context, commId, mask, name, nnodes, nranks, rank, logfn, 7);
}

ncclResult_t init_v6(void **context, uint64_t commId, int *mask, const char *name, int nnodes, int nranks,
                     int rank, ncclDebugLogger_t logfn)
{
    return init_v56(context, commId, mask, name, nnodes, nranks, rank, logfn, 6);
}

ncclResult_t init_v5(void **context, uint64_t commId, int *mask, const char *name, int nnodes, int nranks,
                     int rank, ncclDebugLogger_t logfn)
{
    return init_v56(context, commId, mask, name, nnodes, nranks, rank, logfn, 5);
}

ncclResult_t init_v4(void **context, int *mask, const char *name, uint64_t commHash, int nnodes, int nranks,
                     int rank, ncclDebugLogger_t logfn)
{
    return init_v56(context, commHash, mask, name, nnodes, nranks, rank, logfn, 4);
}

} // namespace

extern "C" {

[[gnu::visibility("default")]] ncclProfiler_v7_t ncclProfiler_v7 = {
    "Vigil", init_v7, start_v5<ncclProfilerEventDescr_v7_t>, stop, record, finalize,
};

[[gnu::visibility("default")]] ncclProfiler_v6_t ncclProfiler_v6 = {
    "Vigil", init_v6, start_v5<ncclProfilerEventDescr_v6_t>, stop, record, finalize,
};

[[gnu::visibility("default")]] ncclProfiler_v5_t ncclProfiler_v5 = {
    "Vigil", init_v5, start_v5<ncclProfilerEventDescr_v5_t>, stop, record, finalize,
};

[[gnu::visibility("default")]] ncclProfiler_v4_t ncclProfiler_v4 = {
    "Vigil", init_v4, start_v4, stop, record, finalize,
};

} // extern "C"
