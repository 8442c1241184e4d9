// SPDX-License-Identifier: Apache-2.0
// The NCCL side of the profiler replay (test_profiler_replay*.cc): the loaded library called
// the way NCCL calls each table version, the communicators and what a forked child owns.
#pragma once

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nccl_abi/profiler_net_vigil.h"
#include "nccl_abi/profiler_v4.h"
#include "nccl_abi/profiler_v6.h"
#include "nccl_abi/profiler_v7.h"
#include "warn_capture.h"

using json = nlohmann::json;

// Shared by every scenario file: one definition each (inline), since the children, the
// harness and the scenarios must agree on g_base, g_mask and the WARNs captured.
namespace replay {

// v7's descriptor is v6's with fields appended: the first 112 bytes are the v6 (and, for v5
// event types, the v5) descriptor.
using Descr = ncclProfilerEventDescr_v7_t;
using Args = ncclProfilerEventStateArgs_v5_t;
static_assert(sizeof(ncclProfilerEventDescr_v5_t) == sizeof(ncclProfilerEventDescr_v6_t), "v5/v6 descriptors");
static_assert(sizeof(Descr) == 136, "v7 descriptor");

inline std::string g_base; // this run's temporary directory

inline uint64_t mono_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The GPU's globaltimer: advances with the host clock, from another origin.
inline constexpr uint64_t kGpuOffset = 1'700'000'000'000'000'000ull;
inline uint64_t gpu_now() { return mono_ns() + kGpuOffset; }
// A kernel channel started this long before the proxy saw it, and finished this long before.
inline constexpr uint64_t kKernelStartLag = 2000;
inline constexpr uint64_t kKernelStopLag = 1000;

inline void spin(uint64_t ns)
{
    const uint64_t t = mono_ns();
    while (mono_ns() - t < ns) {
    }
}

inline std::string hex(uint64_t h)
{
    char b[24];
    std::snprintf(b, sizeof(b), "0x%016llx", static_cast<unsigned long long>(h));
    return b;
}

inline void *const kPoison = reinterpret_cast<void *>(uintptr_t{0xdeadbeefcafef00dull});
inline void *const kStream = reinterpret_cast<void *>(uintptr_t{0x7f0000001000ull});
inline void *const kBuf = reinterpret_cast<void *>(uintptr_t{0x7f0000200000ull});

// ---- the NCCL side (runs in the forked child) --------------------------------------------

// The plugins' WARN lines (PROFILER_REPLAY_VERBOSE=1 echoes them).
using vigil::test::g_warn_mu;
using vigil::test::g_warns;
inline constexpr char kVerboseEnv[] = "PROFILER_REPLAY_VERBOSE";
inline constexpr auto logger = &vigil::test::warn_logger<kVerboseEnv>;

// NCCL's one process-wide ncclProfilerEventMask (v2.28.9-1:src/plugin/profiler.cc:185).
inline int g_mask = 0;

struct Comm {
    uint64_t hash = 0;
    int rank = 0;
    int nranks = 1;
    int nnodes = 1;
    const char *name = nullptr;
    void *ctx = nullptr;
    uint64_t seq = 0; // NCCL's per-communicator collective sequence number
};

/// The loaded library, called like NCCL calls it. `start` counts the handles the plugin
/// issued (non-NULL), which must equal the `events` of the stats record.
struct Prof {
    void *lib = nullptr;
    int version = 0;
    ncclProfiler_v7_t *v7 = nullptr;
    ncclProfiler_v6_t *v6 = nullptr;
    ncclProfiler_v5_t *v5 = nullptr;
    ncclProfiler_v4_t *v4 = nullptr;
    std::atomic<uint64_t> started{0};

    /// NCCL's loader: `newest` is the newest table the NCCL version knows (2.31: 7,
    /// 2.30.7: 6, 2.28.9: 5, 2.27.7: 4); it tries that one first and falls back to older ones.
    std::string load(const std::string &path, int newest)
    {
        lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) return std::string("dlopen ") + path + ": " + dlerror();
        if (newest >= 7) v7 = static_cast<ncclProfiler_v7_t *>(dlsym(lib, "ncclProfiler_v7"));
        if (v7 == nullptr && newest >= 6) v6 = static_cast<ncclProfiler_v6_t *>(dlsym(lib, "ncclProfiler_v6"));
        if (v7 == nullptr && v6 == nullptr && newest >= 5)
            v5 = static_cast<ncclProfiler_v5_t *>(dlsym(lib, "ncclProfiler_v5"));
        if (v7 == nullptr && v6 == nullptr && v5 == nullptr)
            v4 = static_cast<ncclProfiler_v4_t *>(dlsym(lib, "ncclProfiler_v4"));
        version = v7 ? 7 : v6 ? 6 : v5 ? 5 : v4 ? 4 : 0;
        if (version == 0) return "no ncclProfiler_v4..v" + std::to_string(newest) + " in " + path;
        return "";
    }
    const char *name() const { return v7 ? v7->name : v6 ? v6->name : v5 ? v5->name : v4->name; }
    /// After dlclose: the next load is NCCL loading the plugin for a new communicator.
    void forget()
    {
        lib = nullptr;
        v7 = nullptr;
        v6 = nullptr;
        v5 = nullptr;
        v4 = nullptr;
        version = 0;
    }

    ncclResult_t init(Comm &c, int *mask = &g_mask)
    {
        switch (version) {
        case 7: return v7->init(&c.ctx, c.hash, mask, c.name, c.nnodes, c.nranks, c.rank, logger);
        case 6: return v6->init(&c.ctx, c.hash, mask, c.name, c.nnodes, c.nranks, c.rank, logger);
        case 5: return v5->init(&c.ctx, c.hash, mask, c.name, c.nnodes, c.nranks, c.rank, logger);
        default: return v4->init(&c.ctx, mask, c.name, c.hash, c.nnodes, c.nranks, c.rank, logger);
        }
    }

    /// startEvent as NCCL delivers it to this table version. For v4 this is NCCL 2.28.9's v4
    /// shim (profiler_v4.cc:15-99): API and CE types are not forwarded (*h untouched), the
    /// v4 descriptor is not zero-initialised (we fill it with 77s), Coll/P2p get the Group
    /// as parentObj, and p2p.nChannels is never copied.
    ncclResult_t start_raw(void *ctx, void **h, const Descr &d)
    {
        if (version == 7) {
            Descr e = d;
            return v7->startEvent(ctx, h, &e);
        }
        // NCCL 2.31's v6 adapter drops what v6 does not know (KernelPhase); so do older NCCLs.
        if (d.type == ncclProfileKernelPhase) return ncclSuccess;
        if (version == 6) {
            ncclProfilerEventDescr_v6_t e;
            std::memcpy(static_cast<void *>(&e), &d, sizeof(e));
            return v6->startEvent(ctx, h, &e);
        }
        if (version == 5) {
            ncclProfilerEventDescr_v5_t e;
            std::memcpy(static_cast<void *>(&e), &d, sizeof(e));
            return v5->startEvent(ctx, h, &e);
        }
        if (d.type >= ncclProfileGroupApi) return ncclSuccess;
        ncclProfilerEventDescr_v4_t e;
        std::memset(static_cast<void *>(&e), 77, sizeof(e));
        e.type = static_cast<uint8_t>(d.type);
        e.parentObj = d.parentObj;
        e.rank = d.rank;
        switch (d.type) {
        case ncclProfileColl:
            e.parentObj = d.coll.parentGroup;
            e.coll.seqNumber = d.coll.seqNumber;
            e.coll.func = d.coll.func;
            e.coll.sendBuff = d.coll.sendBuff;
            e.coll.recvBuff = d.coll.recvBuff;
            e.coll.count = d.coll.count;
            e.coll.root = d.coll.root;
            e.coll.datatype = d.coll.datatype;
            e.coll.nChannels = d.coll.nChannels;
            e.coll.nWarps = d.coll.nWarps;
            e.coll.algo = d.coll.algo;
            e.coll.proto = d.coll.proto;
            break;
        case ncclProfileP2p:
            e.parentObj = d.p2p.parentGroup;
            e.p2p.func = d.p2p.func;
            e.p2p.buff = d.p2p.buff;
            e.p2p.datatype = d.p2p.datatype;
            e.p2p.count = d.p2p.count;
            e.p2p.peer = d.p2p.peer; // nChannels: not copied (stays 77)
            break;
        case ncclProfileProxyOp:
            e.proxyOp.pid = d.proxyOp.pid;
            e.proxyOp.channelId = d.proxyOp.channelId;
            e.proxyOp.peer = d.proxyOp.peer;
            e.proxyOp.nSteps = d.proxyOp.nSteps;
            e.proxyOp.chunkSize = d.proxyOp.chunkSize;
            e.proxyOp.isSend = d.proxyOp.isSend;
            break;
        case ncclProfileProxyStep: e.proxyStep.step = d.proxyStep.step; break;
        case ncclProfileKernelCh:
            e.kernelCh.channelId = d.kernelCh.channelId;
            e.kernelCh.pTimer = d.kernelCh.pTimer;
            break;
        case ncclProfileNetPlugin:
            e.netPlugin.id = d.netPlugin.id;
            e.netPlugin.data = d.netPlugin.data;
            break;
        default: break;
        }
        return v4->startEvent(ctx, h, &e);
    }
    /// NCCL's holders start zeroed.
    void *start(void *ctx, const Descr &d)
    {
        void *h = nullptr;
        start_raw(ctx, &h, d);
        if (h != nullptr) started.fetch_add(1, std::memory_order_relaxed);
        return h;
    }
    ncclResult_t record(void *h, int state, Args *a)
    {
        const auto s = static_cast<ncclProfilerEventState_t>(state);
        if (v7) return v7->recordEventState(h, s, a);
        if (state == ncclProfilerKernelPhaseStop) return ncclSuccess; // the v6 adapter drops it
        return v6 ? v6->recordEventState(h, s, a) : v5 ? v5->recordEventState(h, s, a) : v4->recordEventState(h, s, a);
    }
    ncclResult_t stop(void *h)
    {
        return v7 ? v7->stopEvent(h) : v6 ? v6->stopEvent(h) : v5 ? v5->stopEvent(h) : v4->stopEvent(h);
    }
    ncclResult_t finalize(void *ctx)
    {
        return v7 ? v7->finalize(ctx) : v6 ? v6->finalize(ctx) : v5 ? v5->finalize(ctx) : v4->finalize(ctx);
    }
};

/// Everything a child owns. `check` failures are reported to the parent through driver.json.
struct Child {
    std::string dir;
    Prof p;
    json out = json::object();
    std::mutex mu; // proxy_log, errors (proxy threads write them)
    json proxy_log = json::array();
    std::vector<std::string> errors;
    void check(bool ok, const std::string &what)
    {
        if (ok) return;
        std::lock_guard<std::mutex> g(mu);
        errors.push_back(what);
    }
};

} // namespace replay
