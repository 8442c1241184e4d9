// SPDX-License-Identifier: Apache-2.0
// Replay driver for the profiler plugin (profiler_plugin/, docs/profiler.md): a stand-in for
// NCCL that dlopens the built library like NCCL does (RTLD_NOW | RTLD_LOCAL, ncclProfiler_v6
// -> v5 -> v4), replays the exact call sequences NCCL produces (docs/nccl-abi.md,
// "Profiler calls and handles" and "Profiler versions and shims": which thread makes which
// call, NULL/stale handles, the v4 shim's behaviour) and checks the trace and summary the
// plugin writes.
//
// The plugin's state is per process (parameters are read and the pools sized at the first
// init), so every scenario runs in a forked child: it clears VIGIL_*, sets its own
// environment (VIGIL_PROFILE_DIR = a fresh directory, ...), loads the library, replays,
// finalizes every context (the last finalize closes the files), dlcloses it like NCCL 2.30.7
// and writes what it observed to driver.json. The Catch2 side then parses every file (the
// trace as a whole, every summary line) and asserts.
//
// Scenarios (TEST_CASE names carry the numbers): 1 AllReduce in a group (v6, v5), 2 Send+Recv
// (v6, v5, and the net plugin library), 3 NULL/foreign/stale handles, 4 a restarted proxy
// step, 5 two communicators, 6 concurrent user and proxy threads, 7 the v4 table, 8 pool
// exhaustion, 9/10 VIGIL_PROFILE_EVENTS, 11 the file bound, 12 PXN, 13 graph replay,
// 14 non-blocking communicator (launch threads come and go), 15 a new communicator after the
// last finalize, with the library kept loaded (NCCL 2.28.9) or dlclosed and reopened (2.30.7).
//
// Environment: PROFILER_REPLAY_SO (libnccl-profiler-vigil.so), PROFILER_REPLAY_NET_SO
// (libnccl-net-vigil.so, which exports the same tables); PROFILER_REPLAY_KEEP=1 keeps the
// scenario directories; PROFILER_REPLAY_VERBOSE=1 echoes the plugin's WARNs.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "nccl_abi/profiler_net_vigil.h"
#include "nccl_abi/profiler_v4.h"
#include "nccl_abi/profiler_v6.h"
#include "nccl_abi/profiler_v7.h"

extern char **environ;

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// v7's descriptor is v6's with fields appended: the first 112 bytes are the v6 (and, for v5
// event types, the v5) descriptor.
using Descr = ncclProfilerEventDescr_v7_t;
using Args = ncclProfilerEventStateArgs_v5_t;
static_assert(sizeof(ncclProfilerEventDescr_v5_t) == sizeof(ncclProfilerEventDescr_v6_t), "v5/v6 descriptors");
static_assert(sizeof(Descr) == 136, "v7 descriptor");

std::string g_base; // this run's temporary directory

uint64_t mono_ns()
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The GPU's globaltimer: advances with the host clock, from another origin.
constexpr uint64_t kGpuOffset = 1'700'000'000'000'000'000ull;
uint64_t gpu_now() { return mono_ns() + kGpuOffset; }
constexpr uint64_t kKernelStartLag = 2000; // the channel started this long before the proxy saw it
constexpr uint64_t kKernelStopLag = 1000;  // and finished this long before

void spin(uint64_t ns)
{
    const uint64_t t = mono_ns();
    while (mono_ns() - t < ns) {
    }
}

std::string hex(uint64_t h)
{
    char b[24];
    std::snprintf(b, sizeof(b), "0x%016llx", static_cast<unsigned long long>(h));
    return b;
}

void *const kPoison = reinterpret_cast<void *>(uintptr_t{0xdeadbeefcafef00dull});
void *const kStream = reinterpret_cast<void *>(uintptr_t{0x7f0000001000ull});
void *const kBuf = reinterpret_cast<void *>(uintptr_t{0x7f0000200000ull});

// ---- the NCCL side (runs in the forked child) --------------------------------------------

std::mutex g_warn_mu;
std::vector<std::string> g_warns;

void logger(ncclDebugLogLevel level, unsigned long /*flags*/, const char * /*file*/, int /*line*/, const char *fmt,
            ...)
{
    if (level != NCCL_LOG_WARN) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (std::getenv("PROFILER_REPLAY_VERBOSE") != nullptr) std::fprintf(stderr, "[child %d] WARN %s\n", getpid(), buf);
    std::lock_guard<std::mutex> g(g_warn_mu);
    g_warns.emplace_back(buf);
}

// NCCL's one process-wide ncclProfilerEventMask (v2.28.9-1:src/plugin/profiler.cc:185).
int g_mask = 0;

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

// ---- user thread / launch side (docs/nccl-abi.md, "Profiler calls and handles") ----------

struct Task {
    Comm *comm = nullptr;
    bool coll = true;
    const char *func = "AllReduce";
    size_t count = 0;
    const char *dtype = "ncclFloat32";
    int root = 0;
    int peer = -1;
    uint8_t nch = 2;
    const char *algo = "RING";
    const char *proto = "SIMPLE";
    void *api = nullptr; // CollApi / P2pApi handle
    void *ev = nullptr;  // Coll / P2p handle
    uint64_t seq = 0;
    uint64_t t0 = 0, t1 = 0;         // host time around S(Coll/P2p)
    uint64_t api_t0 = 0, api_t1 = 0; // host time around S(CollApi/P2pApi): the enqueue
    bool captured = false;           // enqueued into a CUDA graph: replays have no API call
    uint64_t user_tag = 0;           // v7
};

/// hostStreamPlanTask (enqueue.cc:350-471): S(Group), S(Coll/P2p) per task, post the proxy
/// ops, E(Coll/P2p), E(Group). Runs on the launch thread (or a CUDA callback thread on graph
/// replays).
void launch_plan(Prof &p, Comm &c, std::vector<Task *> &tasks, const std::function<void(Task &)> &post)
{
    Descr g{};
    g.type = ncclProfileGroup;
    void *gh = p.start(c.ctx, g);
    for (Task *t : tasks) {
        Descr d{};
        d.parentObj = t->api;
        d.rank = c.rank;
        if (t->coll) {
            d.type = ncclProfileColl;
            t->seq = c.seq++;
            d.coll.seqNumber = t->seq;
            d.coll.func = t->func;
            d.coll.sendBuff = kBuf;
            d.coll.recvBuff = kBuf;
            d.coll.count = t->count;
            d.coll.root = t->root;
            d.coll.datatype = t->dtype;
            d.coll.nChannels = t->nch;
            d.coll.nWarps = 16;
            d.coll.algo = t->algo;
            d.coll.proto = t->proto;
            d.coll.parentGroup = gh;
            d.coll.userTag = t->user_tag;
        } else {
            d.type = ncclProfileP2p;
            d.p2p.func = t->func;
            d.p2p.buff = kBuf;
            d.p2p.datatype = t->dtype;
            d.p2p.count = t->count;
            d.p2p.peer = t->peer;
            d.p2p.nChannels = t->nch;
            d.p2p.parentGroup = gh;
        }
        t->t0 = mono_ns();
        t->ev = p.start(c.ctx, d);
        t->t1 = mono_ns();
    }
    if (post)
        for (Task *t : tasks) post(*t);
    for (Task *t : tasks)
        if (t->ev) p.stop(t->ev);
    if (gh) p.stop(gh);
}

/// The user thread's NCCL calls between ncclGroupStart and ncclGroupEnd.
class User
{
public:
    explicit User(Prof &p) : p_(p) {}
    std::function<void(Task &)> post; // uploadProxyOps + ncclProxyStart
    bool graph = false;               // being captured into a CUDA graph
    uint64_t user_tag = 0;            // v7: the tag of the next calls (ncclCommSetUserTag-like)
    bool nonblocking = false;         // the comm is non-blocking: groupLaunch on an NCCL pthread
    ~User() { wait_launch(); }

    /// The user polls ncclCommGetAsyncError until the previous group's launch is done.
    void wait_launch()
    {
        if (launcher_.joinable()) launcher_.join();
    }
    void group_start()
    {
        if (depth_ == 0) wait_launch();
        ++depth_;
    }
    void all_reduce(Comm &c, size_t count, uint8_t nch, const char *dtype = "ncclFloat32")
    {
        Task t;
        t.comm = &c;
        t.count = count;
        t.nch = nch;
        t.dtype = dtype;
        t.user_tag = user_tag;
        api_first(c);
        Descr d{};
        d.type = ncclProfileCollApi;
        d.parentObj = gapi_;
        d.collApi.func = "AllReduce";
        d.collApi.count = count;
        d.collApi.datatype = dtype;
        d.collApi.root = 0;
        d.collApi.stream = kStream;
        d.collApi.graphCaptured = graph;
        d.collApi.userTag = user_tag;
        t.captured = graph;
        t.api_t0 = mono_ns();
        t.api = p_.start(c.ctx, d);
        t.api_t1 = mono_ns();
        if (t.api) p_.stop(t.api); // E(CollApi) at the end of the enqueue call
        tasks_.push_back(t);
    }
    void p2p(Comm &c, bool send, int peer, size_t count, uint8_t nch, const char *dtype = "ncclFloat32")
    {
        Task t;
        t.comm = &c;
        t.coll = false;
        t.func = send ? "Send" : "Recv";
        t.peer = peer;
        t.count = count;
        t.nch = nch;
        t.dtype = dtype;
        api_first(c);
        Descr d{};
        d.type = ncclProfileP2pApi;
        d.parentObj = gapi_;
        d.p2pApi.func = t.func;
        d.p2pApi.count = count;
        d.p2pApi.datatype = dtype;
        d.p2pApi.stream = kStream;
        d.p2pApi.graphCaptured = graph;
        t.captured = graph;
        t.api_t0 = mono_ns();
        t.api = p_.start(c.ctx, d);
        t.api_t1 = mono_ns();
        if (t.api) p_.stop(t.api);
        tasks_.push_back(t);
    }
    /// ncclGroupEnd: R(24), then per communicator's plan S/E(KernelLaunch) and the plan's
    /// host task (unless captured), then E(GroupApi). Returns the tasks with their handles.
    std::vector<Task> group_end()
    {
        if (--depth_ > 0) return {};
        if (gapi_) p_.record(gapi_, ncclProfilerGroupEndApiStart, nullptr);
        if (nonblocking) {
            // group.cc:735-736: the launch runs on a new thread and E(GroupApi) follows the
            // spawn at once, so it can precede KernelLaunch/Group/Coll (docs/nccl-abi.md,
            // "Profiler calls and handles").
            auto tasks = std::make_shared<std::vector<Task>>();
            tasks->swap(tasks_);
            void *gapi = gapi_;
            launcher_ = std::thread([this, tasks, gapi] { launch(*tasks, gapi); });
            if (gapi_) p_.stop(gapi_);
            gapi_ = nullptr;
            gapi_started_ = false;
            return {};
        }
        launch(tasks_, gapi_);
        if (gapi_) p_.stop(gapi_);
        gapi_ = nullptr;
        gapi_started_ = false;
        std::vector<Task> out;
        out.swap(tasks_);
        return out;
    }

private:
    /// groupLaunch -> doLaunches: per communicator's plan S/E(KernelLaunch), then the plan's
    /// host task unless it was captured.
    void launch(std::vector<Task> &tasks, void *gapi)
    {
        std::vector<Comm *> comms;
        for (Task &t : tasks)
            if (std::find(comms.begin(), comms.end(), t.comm) == comms.end()) comms.push_back(t.comm);
        for (Comm *c : comms) {
            Descr kl{};
            kl.type = ncclProfileKernelLaunch;
            kl.parentObj = gapi;
            kl.kernelLaunch.stream = kStream;
            void *k = p_.start(c->ctx, kl);
            if (k) p_.stop(k);
            if (graph) continue; // the host task was captured: it runs at every replay
            std::vector<Task *> mine;
            for (Task &t : tasks)
                if (t.comm == c) mine.push_back(&t);
            launch_plan(p_, *c, mine, post);
        }
    }
    void api_first(Comm &c)
    {
        // Only the first op of the outermost group starts GroupApi, with that op's comm
        // context (profiler.cc:221-227); groupDepth counts the internal group start.
        if (gapi_started_) return;
        gapi_started_ = true;
        Descr d{};
        d.type = ncclProfileGroupApi;
        d.groupApi.graphCaptured = graph;
        d.groupApi.groupDepth = depth_ + 1;
        gapi_ = p_.start(c.ctx, d);
        if (gapi_) p_.record(gapi_, ncclProfilerGroupStartApiStop, nullptr); // NULL args (2.28.9)
    }
    Prof &p_;
    int depth_ = 0;
    bool gapi_started_ = false;
    void *gapi_ = nullptr;
    std::vector<Task> tasks_;
    std::thread launcher_;
};

// ---- proxy progress thread (proxy.cc, transport/net.cc, transport/profiler.cc) -------------

struct Work {
    Comm *comm = nullptr;
    void *parent = nullptr; // the Coll/P2p handle the ops were stamped with
    uint64_t seq = 0;
    bool log = false;
    uint8_t nch = 2;
    int peer = 1;
    bool send = true, recv = true;
    int nsteps = 4;
    size_t step_bytes = 65536;
    bool kernel = true;
    uint64_t step_ns = 1000;                 // network time of one transfer
    std::vector<vigilNetProfDescr_v1_t> net; // emitted from the first isend of channel 0
    int restart_recv_step = -1;              // irecv returned NULL once: S(step) twice
    // The GPU side, as a real kernel gives it:
    uint64_t kernel_ns = 0;   // the channels run this long after their start (spun)
    int64_t gpu_shift_ns = 0; // added to every stamp: <0 ran earlier than the proxy saw
    int drop_channel = -1;    // this channel's KernelCh never comes (NCCL lost it)
    int bad_stamps = 0;       // 1: every channel's stop before its start; 2: starts 3 s early
    bool phases = false;      // v7: three KernelPhase children per channel
};

size_t step_size(const Work &w, int k) { return w.step_bytes + 64 * static_cast<size_t>(k); }

void run_work(Child &c, Work &w)
{
    Prof &p = c.p;
    void *ctx = w.comm->ctx;
    const int rank = w.comm->rank;
    Args sub{}; // sub->transSize: every state record passes it; assigned only at 9 and 11
    std::vector<void *> kch(w.nch, nullptr);
    std::vector<uint64_t> gstart(w.nch, 0), gstop(w.nch, 0);
    for (int ch = 0; ch < w.nch; ++ch) {
        if (!w.kernel) break;
        Descr d{};
        d.type = ncclProfileKernelCh;
        d.parentObj = w.parent;
        d.kernelCh.channelId = static_cast<uint8_t>(ch);
        d.kernelCh.pTimer = gstart[ch] = gpu_now() - kKernelStartLag + static_cast<uint64_t>(w.gpu_shift_ns);
        if (w.bad_stamps == 2) d.kernelCh.pTimer = gstart[ch] -= 3'000'000'000ull;
        if (ch == w.drop_channel) continue;
        kch[ch] = p.start(ctx, d);
    }
    if (w.kernel_ns) spin(w.kernel_ns);
    for (int ch = 0; ch < w.nch; ++ch) {
        void *op[2] = {nullptr, nullptr}; // send, recv
        for (int dir = 0; dir < 2; ++dir) {
            if (dir == 0 ? !w.send : !w.recv) continue;
            Descr d{};
            d.type = ncclProfileProxyOp;
            d.parentObj = w.parent;
            d.rank = rank;
            d.proxyOp.pid = getpid();
            d.proxyOp.channelId = static_cast<uint8_t>(ch);
            d.proxyOp.peer = w.peer;
            d.proxyOp.nSteps = w.nsteps;
            d.proxyOp.chunkSize = static_cast<int>(w.step_bytes);
            d.proxyOp.isSend = dir == 0;
            op[dir] = p.start(ctx, d);
            if (op[dir]) p.record(op[dir], ncclProfilerProxyOpInProgress_v4, &sub);
        }
        for (int k = 0; k < w.nsteps; ++k) {
            if (w.send) {
                Descr d{};
                d.type = ncclProfileProxyStep;
                d.parentObj = op[0];
                d.rank = rank;
                d.proxyStep.step = k;
                void *s = p.start(ctx, d);
                const bool st = op[0] && s; // states need both handles (profiler.cc:632, 554)
                if (st) p.record(s, ncclProfilerProxyStepSendGPUWait, &sub);
                if (st) p.record(s, ncclProfilerProxyStepSendPeerWait_v4, &sub);
                if (ch == 0 && k == 0) {
                    // isend(..., phandle = &step): the net plugin's events (net_plugin/comm.cc)
                    for (vigilNetProfDescr_v1_t &nd : w.net) {
                        Descr n{};
                        n.type = ncclProfileNetPlugin;
                        n.parentObj = s;
                        n.rank = rank;
                        n.netPlugin.id = VIGIL_PROFILER_NET_ID;
                        n.netPlugin.data = &nd;
                        void *nh = p.start(ctx, n);
                        if (nh) p.stop(nh);
                    }
                }
                spin(w.step_ns / 2);
                sub.proxyStep.transSize = step_size(w, k);
                if (st) p.record(s, ncclProfilerProxyStepSendWait, &sub);
                spin(w.step_ns / 2);
                if (s) p.stop(s);
            }
            if (w.recv) {
                Descr d{};
                d.type = ncclProfileProxyStep;
                d.parentObj = op[1];
                d.rank = rank;
                d.proxyStep.step = k;
                void *s = p.start(ctx, d);
                if (k == w.restart_recv_step) {
                    // irecv returned a NULL request: the next pass starts the step again and
                    // overwrites the handle; the first one is never stopped (net.cc:1432-1455).
                    void *again = p.start(ctx, d);
                    std::lock_guard<std::mutex> g(c.mu);
                    c.out["restart"] = {{"first", reinterpret_cast<uintptr_t>(s)},
                                        {"second", reinterpret_cast<uintptr_t>(again)}};
                    s = again;
                }
                const bool st = op[1] && s;
                if (st) p.record(s, ncclProfilerProxyStepRecvWait, &sub);
                spin(w.step_ns / 2);
                sub.proxyStep.transSize = step_size(w, k);
                if (st) p.record(s, ncclProfilerProxyStepRecvFlushWait, &sub);
                if (st) p.record(s, ncclProfilerProxyStepRecvGPUWait, &sub);
                spin(w.step_ns / 2);
                if (s) p.stop(s);
            }
        }
        for (void *o : op) // when all subs are done
            if (o) p.stop(o);
    }
    uint64_t k0 = 0, k1 = 0;
    for (int ch = 0; ch < w.nch; ++ch) {
        if (!kch[ch]) continue;
        k0 = mono_ns();
        Args a{};
        a.kernelCh.pTimer = gstop[ch] = gpu_now() - kKernelStopLag + static_cast<uint64_t>(w.gpu_shift_ns);
        if (w.bad_stamps == 1) a.kernelCh.pTimer = gstop[ch] = gstart[ch] - 5000;
        if (w.phases) {
            // NCCL >= 2.31, symmetric kernels: each phase as start, record(31), stop, all
            // before the channel's own stop (src/plugin/profiler.cc, profilerFireKernelPhaseEvents).
            static const char *const kPhaseNames[] = {"initial_sync", "compute", "final_sync"};
            const uint64_t span = (gstop[ch] - gstart[ch]) / 3;
            for (uint8_t ph = 0; ph < 3; ++ph) {
                Descr d{};
                d.type = ncclProfileKernelPhase;
                d.parentObj = kch[ch];
                d.kernelPhase.channelId = static_cast<uint8_t>(ch);
                d.kernelPhase.phaseId = ph;
                d.kernelPhase.phaseName = kPhaseNames[ph];
                d.kernelPhase.pTimer = gstart[ch] + ph * span;
                void *hp = p.start(ctx, d);
                Args pa{};
                pa.kernelCh.pTimer = gstart[ch] + (ph + 1) * span;
                if (hp) p.record(hp, ncclProfilerKernelPhaseStop, &pa);
                if (hp) p.stop(hp);
            }
        }
        p.record(kch[ch], ncclProfilerKernelChStop, &a);
        p.stop(kch[ch]);
        k1 = mono_ns();
    }
    if (w.log) {
        std::lock_guard<std::mutex> g(c.mu);
        c.proxy_log.push_back({{"comm", hex(w.comm->hash)},
                               {"seq", w.seq},
                               {"k0", k0},
                               {"k1", k1},
                               {"gpu_start", gstart},
                               {"gpu_stop", gstop}});
    }
}

Work work_for(const Task &t)
{
    Work w;
    w.comm = t.comm;
    w.parent = t.ev;
    w.seq = t.seq;
    w.nch = t.nch;
    w.peer = t.coll ? (t.comm->rank + 1) % t.comm->nranks : t.peer;
    if (!t.coll) {
        w.send = std::strcmp(t.func, "Send") == 0;
        w.recv = !w.send;
    }
    return w;
}

/// One proxy progress thread; ops are handed over through a mutex-protected queue, as
/// ncclProxyStart hands them to NCCL's proxy thread.
class Proxy
{
public:
    /// `ctrl`: the communicator that created the thread; its context gets the ProxyCtrl
    /// events (proxy.cc:1874) when the live mask asks for them.
    explicit Proxy(Child &c, Comm *ctrl = nullptr) : c_(c), ctrl_(ctrl), th_([this] { loop(); }) {}
    ~Proxy() { finish(); }
    void post(Work w)
    {
        {
            std::lock_guard<std::mutex> g(mu_);
            q_.push_back(std::move(w));
        }
        cv_.notify_one();
    }
    /// Waits until the thread has run out of work and sleeps (pthread_cond_wait).
    void wait_idle()
    {
        std::unique_lock<std::mutex> g(mu_);
        idle_cv_.wait(g, [&] { return sleeping_ && q_.empty(); });
    }
    void finish()
    {
        {
            std::lock_guard<std::mutex> g(mu_);
            done_ = true;
        }
        cv_.notify_one();
        if (th_.joinable()) th_.join();
    }

private:
    // ProxyCtrl: S -> R... -> E on one event, re-reading the live mask each time (proxy.cc:567).
    void *ctrl_start()
    {
        if (ctrl_ == nullptr || !(__atomic_load_n(&g_mask, __ATOMIC_RELAXED) & ncclProfileProxyCtrl)) return nullptr;
        Descr d{};
        d.type = ncclProfileProxyCtrl;
        return c_.p.start(ctrl_->ctx, d);
    }
    void ctrl_state(void *h, int state, int appended = 0)
    {
        if (h == nullptr) return;
        Args a{};
        a.proxyCtrl.appendedProxyOps = appended;
        c_.p.record(h, state, &a);
    }
    void ctrl_once(int state)
    {
        void *h = ctrl_start();
        ctrl_state(h, state);
        if (h) c_.p.stop(h);
    }
    void loop()
    {
        for (;;) {
            Work w;
            {
                std::unique_lock<std::mutex> g(mu_);
                if (q_.empty() && !done_) {
                    ctrl_once(ncclProfilerProxyCtrlIdle);
                    void *sl = ctrl_start();
                    ctrl_state(sl, ncclProfilerProxyCtrlSleep);
                    sleeping_ = true;
                    idle_cv_.notify_all();
                    cv_.wait(g, [&] { return !q_.empty() || done_; });
                    sleeping_ = false;
                    ctrl_state(sl, ncclProfilerProxyCtrlWakeup);
                    if (sl) c_.p.stop(sl);
                    if (!q_.empty()) ctrl_once(ncclProfilerProxyCtrlActive);
                }
                if (q_.empty()) return;
                w = std::move(q_.front());
                q_.pop_front();
            }
            void *ap = ctrl_start();
            ctrl_state(ap, ncclProfilerProxyCtrlAppend);
            ctrl_state(ap, ncclProfilerProxyCtrlAppendEnd, w.nch * ((w.send ? 1 : 0) + (w.recv ? 1 : 0)));
            if (ap) c_.p.stop(ap);
            run_work(c_, w);
        }
    }
    Child &c_;
    Comm *ctrl_ = nullptr;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Work> q_;
    bool done_ = false;
    std::condition_variable idle_cv_;
    bool sleeping_ = false;
    std::thread th_;
};

// ---- the fork harness ------------------------------------------------------------------

using Env = std::vector<std::pair<std::string, std::string>>;

struct Outcome {
    std::string tag, dir;
    int status = -1;
    json drv;
    std::string drv_error;
    std::vector<std::string> summaries, traces; // paths
    std::vector<json> lines;
    std::vector<std::string> bad_lines;
    json trace;
    std::string trace_error;
    uintmax_t trace_bytes = 0, summary_bytes = 0;

    std::vector<json> of(const std::string &type) const
    {
        std::vector<json> v;
        for (const json &l : lines)
            if (l.is_object() && l.value("type", "") == type) v.push_back(l);
        return v;
    }
    json stats() const
    {
        json s;
        for (const json &l : of("stats")) s = l;
        return s;
    }
    json process() const
    {
        auto v = of("process");
        return v.empty() ? json() : v.front();
    }
    std::vector<json> events(const std::string &ph, const std::string &name = "") const
    {
        std::vector<json> v;
        if (!trace.is_object() || !trace.contains("traceEvents")) return v;
        for (const json &e : trace["traceEvents"])
            if (e.value("ph", "") == ph && (name.empty() || e.value("name", "") == name)) v.push_back(e);
        return v;
    }
    /// The tid of the track named `name` (null if there is none).
    json tid_of(const std::string &name) const
    {
        for (const json &e : events("M", "thread_name"))
            if (e["args"].value("name", "") == name) return e["tid"];
        return json();
    }
    std::set<std::string> thread_names() const
    {
        std::set<std::string> s;
        for (const json &e : events("M", "thread_name")) s.insert(e["args"].value("name", ""));
        return s;
    }
};

std::string describe_status(int st)
{
    if (WIFEXITED(st)) return "exited with " + std::to_string(WEXITSTATUS(st));
    if (WIFSIGNALED(st)) return std::string("killed by signal ") + std::to_string(WTERMSIG(st)) + " (" +
                                strsignal(WTERMSIG(st)) + ")";
    return "status " + std::to_string(st);
}

/// A summary record as the plugin wrote it.
std::string raw(const json &r) { return r.is_object() && r.contains("__raw") ? r["__raw"].get<std::string>() : raw(r); }

/// The exact value of a "%lld.%03lld" microsecond field of a raw summary line, in ns (a
/// double cannot hold epoch microseconds to the nanosecond).
int64_t exact_ns(const json &r, const std::string &key)
{
    const std::string line = raw(r);
    const std::string pat = "\"" + key + "\":";
    const size_t at = line.find(pat);
    if (at == std::string::npos) throw std::runtime_error("no " + key + " in " + line);
    size_t i = at + pat.size();
    int64_t whole = 0, frac = 0;
    int digits = 0;
    for (; i < line.size() && std::isdigit(static_cast<unsigned char>(line[i])); ++i) whole = whole * 10 + (line[i] - '0');
    if (i < line.size() && line[i] == '.')
        for (++i; i < line.size() && std::isdigit(static_cast<unsigned char>(line[i])) && digits < 3; ++i, ++digits)
            frac = frac * 10 + (line[i] - '0');
    for (; digits < 3; ++digits) frac *= 10;
    return whole * 1000 + frac;
}

std::string plugin_path()
{
    const char *p = std::getenv("PROFILER_REPLAY_SO");
    return p ? p : "";
}
std::string net_plugin_path()
{
    const char *p = std::getenv("PROFILER_REPLAY_NET_SO");
    return p ? p : "";
}

/// Parses one summary (every line) and one trace (as a whole) into `o`.
void load_files(Outcome &o, const std::string &summary, const std::string &trace)
{
    o.lines.clear();
    o.bad_lines.clear();
    o.trace = json();
    o.trace_error.clear();
    o.summary_bytes = fs::file_size(summary);
    {
        std::ifstream f(summary);
        std::string line;
        while (std::getline(f, line)) {
            try {
                json j = json::parse(line);
                if (j.is_object()) j["__raw"] = line; // exact decimals of the *_us fields
                o.lines.push_back(std::move(j));
            } catch (const std::exception &e) {
                o.bad_lines.push_back(line.substr(0, 300) + "  <- " + e.what());
            }
        }
    }
    o.trace_bytes = fs::file_size(trace);
    try {
        std::ifstream f(trace);
        o.trace = json::parse(f);
    } catch (const std::exception &e) {
        o.trace_error = e.what();
    }
}

/// Runs `body` in a forked child with `env` (VIGIL_PROFILE_DIR defaults to a fresh
/// directory) and collects what it and the plugin wrote.
Outcome run_child(const std::string &tag, const Env &env, const std::function<void(Child &)> &body)
{
    Outcome o;
    o.tag = tag;
    std::string tmpl = g_base + "/" + tag + "-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) {
        o.drv_error = std::string("mkdtemp: ") + std::strerror(errno);
        return o;
    }
    o.dir = buf.data();
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0); // its own group: whatever it leaves behind is ended with it (below)
        alarm(120);    // a hang is reported as SIGALRM
        std::vector<std::string> names;
        for (char **e = environ; e && *e; ++e)
            if (std::strncmp(*e, "VIGIL_", 6) == 0) {
                const char *eq = std::strchr(*e, '=');
                names.emplace_back(*e, eq ? static_cast<size_t>(eq - *e) : std::strlen(*e));
            }
        for (const std::string &n : names) unsetenv(n.c_str());
        setenv("VIGIL_PROFILE_DIR", o.dir.c_str(), 1);
        for (const auto &[k, v] : env) setenv(k.c_str(), v.c_str(), 1);
        int rc = 0;
        auto *c = new Child; // never destroyed: _exit below
        c->dir = o.dir;
        try {
            body(*c);
        } catch (const std::exception &e) {
            c->errors.push_back(std::string("exception: ") + e.what());
            rc = 3;
        }
        json &out = c->out;
        out["errors"] = c->errors;
        out["started"] = c->p.started.load();
        out["proxy_log"] = c->proxy_log;
        {
            std::lock_guard<std::mutex> g(g_warn_mu);
            out["warns"] = g_warns;
        }
        std::ofstream f(o.dir + "/driver.json");
        f << out.dump(1) << "\n";
        f.close();
        if (!f) rc = 4;
        _exit(rc);
    }
    if (pid < 0) {
        o.drv_error = std::string("fork: ") + std::strerror(errno);
        return o;
    }
    // A process the scenario forked and left hanging would hold the test's output pipe open
    // (and meson waiting for it) long after the scenario failed: the group is ended while the
    // child is still a zombie, whose pid (the group's id) cannot be reused meanwhile.
    siginfo_t si{};
    while (waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
    }
    kill(-pid, SIGKILL);
    while (waitpid(pid, &o.status, 0) < 0 && errno == EINTR) {
    }
    try {
        std::ifstream f(o.dir + "/driver.json");
        if (!f) throw std::runtime_error("no driver.json");
        o.drv = json::parse(f);
    } catch (const std::exception &e) {
        o.drv_error = e.what();
    }
    for (const auto &de : fs::directory_iterator(o.dir)) {
        const std::string n = de.path().filename().string();
        if (n.rfind("vigil-prof-", 0) != 0) continue;
        if (n.size() > 6 && n.compare(n.size() - 6, 6, ".jsonl") == 0) o.summaries.push_back(de.path().string());
        if (n.size() > 11 && n.compare(n.size() - 11, 11, ".trace.json") == 0) o.traces.push_back(de.path().string());
    }
    std::sort(o.summaries.begin(), o.summaries.end());
    std::sort(o.traces.begin(), o.traces.end());
    if (o.summaries.size() == 1 && o.traces.size() == 1) load_files(o, o.summaries[0], o.traces[0]);
    return o;
}

/// The child exited cleanly and reported no failure of its own.
#define REQUIRE_CHILD_OK(o)                                                                   \
    do {                                                                                      \
        INFO("scenario " << (o).tag << " in " << (o).dir << ": child " << describe_status((o).status)); \
        REQUIRE((o).drv_error == "");                                                         \
        INFO("child-side failures: " << (o).drv["errors"].dump(1));                          \
        CHECK((o).drv["errors"].empty());                                                    \
        REQUIRE(WIFEXITED((o).status));                                                       \
        REQUIRE(WEXITSTATUS((o).status) == 0);                                                \
    } while (0)

/// Both files exist, every summary line and the whole trace parse, and the trace's framing
/// and the last stats record are there.
#define REQUIRE_FILES_OK(o)                                                                   \
    do {                                                                                      \
        INFO("scenario " << (o).tag << " in " << (o).dir);                                    \
        REQUIRE((o).summaries.size() == 1);                                                   \
        REQUIRE((o).traces.size() == 1);                                                      \
        INFO("unparsable summary lines: " << json((o).bad_lines).dump(1));                   \
        REQUIRE((o).bad_lines.empty());                                                       \
        INFO("trace parse error: " << (o).trace_error);                                       \
        REQUIRE((o).trace_error == "");                                                       \
        REQUIRE((o).trace.is_object());                                                       \
        REQUIRE((o).trace["traceEvents"].is_array());                                         \
        REQUIRE((o).lines.size() >= 2);                                                       \
        REQUIRE((o).lines.front().value("type", "") == "process");                            \
        REQUIRE((o).lines.back().value("type", "") == "stats");                               \
    } while (0)

#define REQUIRE_NO_DROPS(st)                                                                  \
    do {                                                                                      \
        INFO("stats " << raw(st));                                                        \
        CHECK((st)["dropped_pool"] == 0);                                                     \
        CHECK((st)["dropped_ring"] == 0);                                                     \
        CHECK((st)["dropped_threads"] == 0);                                                  \
    } while (0)

void load_or_fail(Child &c, const std::string &path, int newest)
{
    const std::string why = c.p.load(path, newest);
    if (!why.empty()) throw std::runtime_error(why);
    c.out["version"] = c.p.version;
    c.out["name"] = c.p.name();
    c.out["symbols"] = {{"v4", dlsym(c.p.lib, "ncclProfiler_v4") != nullptr},
                        {"v5", dlsym(c.p.lib, "ncclProfiler_v5") != nullptr},
                        {"v6", dlsym(c.p.lib, "ncclProfiler_v6") != nullptr},
                        {"v7", dlsym(c.p.lib, "ncclProfiler_v7") != nullptr}};
}

void init_or_fail(Child &c, Comm &comm)
{
    const ncclResult_t rc = c.p.init(comm);
    if (rc != ncclSuccess) throw std::runtime_error("init returned " + std::to_string(rc));
    if (comm.ctx == nullptr) throw std::runtime_error("init gave a NULL context");
}

/// The last finalize closes the files; NCCL 2.30.7 then dlcloses the library.
void finalize_all(Child &c, std::initializer_list<Comm *> comms)
{
    for (Comm *m : comms) c.check(c.p.finalize(m->ctx) == ncclSuccess, "finalize failed");
    dlclose(c.p.lib);
}

json task_log(const Task &t)
{
    return {{"comm", hex(t.comm->hash)}, {"seq", t.seq}, {"count", t.count}, {"t0", t.t0}, {"t1", t.t1},
            {"api", t.api != nullptr && !t.captured}, {"api_t0", t.api_t0}, {"api_t1", t.api_t1}, {"func", t.func},
            {"peer", t.peer}};
}

/// A coll/p2p summary record's numbers are consistent: bytes/duration = algbw, busbw =
/// algbw x the bus factor (nccl-tests), all within the printed rounding.
void check_bandwidth(const json &r, double factor)
{
    INFO("record " << raw(r));
    const double dur = r["duration_us"].get<double>();
    const double bytes = r["bytes"].get<double>();
    const double alg = r["algbw_GBps"].get<double>();
    REQUIRE(dur > 0);
    CHECK(alg > 0);
    const double expect_alg = bytes / (dur * 1e3);
    CHECK(std::fabs(alg - expect_alg) <= 1e-4 + expect_alg * (0.0006 / dur + 1e-9));
    if (r.contains("busbw_GBps")) CHECK(std::fabs(r["busbw_GBps"].get<double>() - alg * factor) <= 2e-4);
}

/// The kernel-timed duration of a collective is the longest channel's GPU time, and its
/// kernel span the first channel start to the last channel stop, from the GPU timers the
/// replay gave (NCCL Inspector's definition; docs/profiler.md).
void check_kernel_duration(const json &r, const json &task, const json &plog)
{
    INFO("record " << raw(r) << "\ntask " << task.dump() << "\nproxy " << plog.dump());
    const auto &g0 = plog["gpu_start"], &g1 = plog["gpu_stop"];
    REQUIRE(g0.size() == g1.size());
    uint64_t longest = 0, first = UINT64_MAX, last = 0;
    for (size_t ch = 0; ch < g0.size(); ++ch) {
        const uint64_t a = g0[ch].get<uint64_t>(), b = g1[ch].get<uint64_t>();
        longest = std::max(longest, b - a);
        first = std::min(first, a);
        last = std::max(last, b);
    }
    CHECK(r["timing"] == "kernel_gpu");
    CHECK(std::fabs(r["duration_us"].get<double>() - static_cast<double>(longest) / 1e3) <= 0.0011);
    CHECK(std::fabs(r["kernel_us"].get<double>() - static_cast<double>(last - first) / 1e3) <= 0.0011);
    CHECK(r["channels_timed"] == g0.size());
}

/// start_us is the enqueue: the user's call (CollApi/P2pApi start) when the profiler got
/// one, else S(Coll/P2p).
void check_start_us(const json &r, const json &task, int64_t m2r)
{
    INFO("record " << raw(r) << "\ntask " << task.dump() << "\nmono_to_realtime_ns " << m2r);
    const int64_t s = exact_ns(r, "start_us");
    const bool api = task.value("api", false);
    CHECK(s >= task[api ? "api_t0" : "t0"].get<int64_t>() + m2r);
    CHECK(s <= task[api ? "api_t1" : "t1"].get<int64_t>() + m2r);
}

// ---- scenario 1: AllReduce in a group, full replay -------------------------------------

constexpr int kArColls = 20;
constexpr int kArSteps = 4;
constexpr uint64_t kArHash = 0x5f3c9a1e22b07d11ull;

vigilNetProfDescr_v1_t window_descr(int seq, int slot, uint32_t gen)
{
    vigilNetProfDescr_v1_t d{};
    d.type = vigilNetProfWindow;
    d.slot = static_cast<uint8_t>(slot);
    d.degraded = seq % 5 == 4;
    d.state = 1;
    d.generation = gen;
    d.dev = 0;
    d.window_us = 1000;
    d.start_ns = mono_ns() - 1'000'000;
    d.bytes = 1048576 + static_cast<uint64_t>(seq);
    d.busy_ns = 500'000 + static_cast<uint64_t>(seq);
    d.lat_p99_ns = 55'100 + static_cast<uint64_t>(seq);
    return d;
}

json net_log(const vigilNetProfDescr_v1_t &d)
{
    return {{"type", d.type},           {"slot", d.slot},         {"degraded", d.degraded}, {"state", d.state},
            {"generation", d.generation}, {"dev", d.dev},         {"window_us", d.window_us},
            {"start_ns", d.start_ns},   {"bytes", d.bytes},       {"busy_ns", d.busy_ns},
            {"lat_p99_ns", d.lat_p99_ns}};
}

void body_allreduce(Child &c, const std::string &path, int version)
{
    load_or_fail(c, path, version);
    Comm comm{kArHash, 3, 8, 2, "replay-ar"};
    init_or_fail(c, comm);
    c.out["mask"] = g_mask;
    Proxy proxy(c, &comm);
    User user(c.p);
    json tasks = json::array(), nets = json::array();
    int failover_at = kArColls / 2;
    std::vector<vigilNetProfDescr_v1_t> pending_net;
    user.post = [&](Task &t) {
        Work w = work_for(t);
        w.log = true;
        w.nsteps = kArSteps;
        w.step_bytes = t.count * 4 / (t.nch * kArSteps);
        w.step_ns = 20'000;
        w.net = pending_net;
        proxy.post(std::move(w));
    };
    for (int i = 0; i < kArColls; ++i) {
        // The net plugin's window for this transfer; a failover before collective 10 moves
        // the connection to the backup path (generation 1).
        pending_net.clear();
        if (i == failover_at) {
            vigilNetProfDescr_v1_t f{};
            f.type = vigilNetProfFailover;
            f.slot = 0;
            f.generation = 1;
            f.dev = 0;
            f.start_ns = mono_ns();
            f.bytes = 65536;
            pending_net.push_back(f);
        }
        pending_net.push_back(window_descr(i, i >= failover_at ? 1 : 0, i >= failover_at ? 1 : 0));
        for (const auto &d : pending_net) nets.push_back(net_log(d));
        user.group_start();
        user.all_reduce(comm, 262144 + 256 * static_cast<size_t>(i), 2);
        for (const Task &t : user.group_end()) tasks.push_back(task_log(t));
        if (i == failover_at - 1) proxy.wait_idle(); // a pause in the job: the proxy sleeps
    }
    proxy.finish();
    c.out["tasks"] = tasks;
    c.out["net"] = nets;
    finalize_all(c, {&comm});
}

void check_allreduce(int version)
{
    const std::string tag = "allreduce-v" + std::to_string(version);
    Outcome o = run_child(tag, {{"VIGIL_PROFILE_EVENTS", "all"}},
                          [&](Child &c) { body_allreduce(c, plugin_path(), version); });
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    CHECK(o.drv["version"] == version);
    CHECK(o.drv["name"] == "Vigil");
    CHECK(o.drv["symbols"] == json({{"v4", true}, {"v5", true}, {"v6", true}, {"v7", true}}));
    CHECK((o.drv["mask"].get<int>() & 0xfff) == 0xfff);

    const json proc = o.process();
    CHECK(proc["abi"] == "v" + std::to_string(version));
    CHECK(proc["mask"] == o.drv["mask"]);
    const int64_t m2r = proc["mono_to_realtime_ns"].get<int64_t>();
    const std::string comm = hex(kArHash);

    auto comms = o.of("comm");
    REQUIRE(comms.size() == 1);
    CHECK(comms[0]["comm"] == comm);
    CHECK(comms[0]["name"] == "replay-ar");
    CHECK(comms[0]["rank"] == 3);
    CHECK(comms[0]["nranks"] == 8);
    CHECK(comms[0]["nnodes"] == 2);

    // One coll record per seq, in seq order, with the descriptor's values and kernel timing.
    const json &tasks = o.drv["tasks"];
    const json &plog = o.drv["proxy_log"];
    REQUIRE(tasks.size() == kArColls);
    REQUIRE(plog.size() == kArColls);
    auto colls = o.of("coll");
    REQUIRE(colls.size() == kArColls);
    for (int i = 0; i < kArColls; ++i) {
        const json &r = colls[static_cast<size_t>(i)];
        INFO("coll record " << raw(r));
        CHECK(r["seq"] == i);
        CHECK(r["comm"] == comm);
        CHECK(r["rank"] == 3);
        CHECK(r["nranks"] == 8);
        CHECK(r["func"] == "AllReduce");
        CHECK(r["count"] == 262144 + 256 * i);
        CHECK(r["datatype"] == "ncclFloat32");
        CHECK(r["bytes"] == (262144 + 256 * i) * 4);
        CHECK(r["algo"] == "RING");
        CHECK(r["proto"] == "SIMPLE");
        CHECK(r["channels"] == 2);
        CHECK(r["timing"] == "kernel_gpu");
        check_bandwidth(r, 2.0 * 7 / 8);
        const json &t = tasks[static_cast<size_t>(i)];
        REQUIRE(t["seq"] == i);
        check_start_us(r, t, m2r);
        for (const json &pl : plog)
            if (pl["seq"] == i) check_kernel_duration(r, t, pl);
    }

    // Net records: every window and the failover, with the descriptor's values.
    const json &nets = o.drv["net"];
    auto netrec = o.of("net");
    REQUIRE(netrec.size() == nets.size());
    size_t windows = 0, failovers = 0;
    for (size_t i = 0; i < nets.size(); ++i) {
        const json &d = nets[i], &r = netrec[i];
        INFO("net record " << raw(r) << "\ndescriptor " << d.dump());
        CHECK(r["comm"] == comm);
        CHECK(r["rank"] == 3);
        CHECK(r["dev"] == d["dev"]);
        CHECK(r["slot"] == (d["slot"] == 0 ? "primary" : "backup"));
        CHECK(r["generation"] == d["generation"]);
        CHECK(r["bytes"] == d["bytes"]);
        CHECK(exact_ns(r, "start_us") == d["start_ns"].get<int64_t>() + m2r);
        if (d["type"] == vigilNetProfWindow) {
            ++windows;
            CHECK(r["event"] == "window");
            CHECK(r["window_us"] == d["window_us"]);
            CHECK(std::fabs(r["busy_us"].get<double>() - d["busy_ns"].get<double>() / 1e3) < 0.0015);
            CHECK(std::fabs(r["lat_p99_us"].get<double>() - d["lat_p99_ns"].get<double>() / 1e3) < 0.0015);
            CHECK(std::fabs(r["busy_bw_GBps"].get<double>() - d["bytes"].get<double>() / d["busy_ns"].get<double>()) <
                  1e-4);
            CHECK(r["degraded"] == (d["degraded"] != 0));
            CHECK(r["state"] == "active");
        } else {
            ++failovers;
            CHECK(r["event"] == "failover");
        }
    }
    CHECK(windows == kArColls);
    CHECK(failovers == 1);

    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
    CHECK(st["leaked"] == 0);
    CHECK(st["orphans"] == 0);
    CHECK(st["trace_dropped"] == 0);
    CHECK(st["summary_dropped"] == 0);

    // The trace: process and track names, slices for proxy ops/steps/kernels/API events, b/e
    // pairs for the collectives, an instant for the failover.
    auto procs = o.events("M", "process_name");
    REQUIRE(procs.size() == 1);
    CHECK(procs[0]["args"]["name"] == "rank 3 comm " + comm + " replay-ar");
    const json pid = procs[0]["pid"];
    const auto names = o.thread_names();
    INFO("thread names " << json(names).dump());
    for (const char *n : {"collectives", "api", "groups", "ch 0 send", "ch 0 recv", "ch 1 send", "ch 1 recv",
                          "ch 0 kernel", "ch 1 kernel", "net dev 0 primary", "net dev 0 backup", "ch 0 send s0",
                          "ch 1 recv s3"})
        CHECK(names.count(n) == 1);
    for (const json &e : o.trace["traceEvents"]) {
        INFO("event " << e.dump());
        CHECK(e["pid"] == pid);
        if (e["ph"] == "X") CHECK(e["dur"].get<double>() >= 0);
    }
    CHECK(o.events("X", "send op").size() == kArColls * 2);
    CHECK(o.events("X", "recv op").size() == kArColls * 2);
    CHECK(o.events("X", "kernel").size() == kArColls * 2);
    CHECK(o.events("X", "GroupApi").size() == kArColls);
    CHECK(o.events("X", "AllReduce").size() == kArColls); // CollApi, named by its func
    CHECK(o.events("X", "KernelLaunch").size() == kArColls);
    CHECK(o.events("X", "Group").size() == kArColls);
    auto windows_x = o.events("X", "window");
    CHECK(windows_x.size() == kArColls);
    for (const json &e : windows_x) CHECK(e["dur"] == 1000);
    auto fo = o.events("i", "failover");
    REQUIRE(fo.size() == 1);
    CHECK(fo[0]["args"]["generation"] == 1);
    CHECK(fo[0]["args"]["bytes"] == 65536);

    // Steps: one slice per transfer, its transSize from state 9 / 11 (not the stale value
    // NCCL passes with the other states), and its state times.
    auto steps = o.events("X", "step");
    CHECK(steps.size() == kArColls * 2 * 2 * kArSteps);
    for (const json &s : steps) {
        INFO("step " << s.dump());
        const json &a = s["args"];
        const int k = a["step"].get<int>();
        REQUIRE(k >= 0);
        REQUIRE(k < kArSteps);
        const bool send = a.contains("SendWait_us");
        if (send) {
            CHECK(a.contains("SendGPUWait_us"));
            CHECK(a.contains("SendPeerWait_us"));
        } else {
            CHECK(a.contains("RecvWait_us"));
            CHECK(a.contains("RecvFlushWait_us"));
            CHECK(a.contains("RecvGPUWait_us"));
        }
        // step_bytes = count*4/(2 ch * 4 steps) with count = 262144 + 256*seq
        const uint64_t b = a["bytes"].get<uint64_t>();
        const uint64_t base = b - 64 * static_cast<uint64_t>(k);
        CHECK((base - 131072) % 128 == 0);
        CHECK(base >= 131072);
        CHECK(base < 131072 + 128 * kArColls);
    }

    // Kernel channels: exactly the GPU timers given, placed on the host clock.
    std::multiset<uint64_t> given, seen;
    for (const json &pl : plog)
        for (const json &g : pl["gpu_start"]) given.insert(g.get<uint64_t>());
    for (const json &e : o.events("X", "kernel")) seen.insert(e["args"]["gpu_start_ns"].get<uint64_t>());
    CHECK(given == seen);

    // ProxyCtrl: one Append per posted work item with appendedProxyOps = 2 ch x 2 ops.
    CHECK(names.count("proxy ctrl") == 1);
    auto appends = o.events("X", "Append");
    CHECK(appends.size() == kArColls);
    for (const json &x : appends) {
        INFO("append " << x.dump());
        CHECK(x["args"]["appended"] == 4);
        CHECK(x["args"].contains("AppendEnd_us"));
    }
    // The pause: Idle, then Sleep ... Wakeup, then Active when work arrived.
    CHECK(o.events("X", "Sleep").size() >= 1);
    CHECK(o.events("X", "Idle").size() >= 1);
    CHECK(o.events("X", "Active").size() >= 1);
    for (const json &x : o.events("X", "Sleep")) CHECK(x["args"].contains("Wakeup_us"));

    auto b = o.events("b"), e = o.events("e");
    REQUIRE(b.size() == kArColls);
    REQUIRE(e.size() == kArColls);
    std::map<std::string, double> bts;
    std::set<uint64_t> seqs;
    for (const json &x : b) {
        CHECK(x["cat"] == "coll");
        CHECK(x["name"] == "AllReduce");
        bts[x["id"].get<std::string>()] = x["ts"].get<double>();
        seqs.insert(x["args"]["seq"].get<uint64_t>());
    }
    CHECK(seqs.size() == kArColls);
    for (const json &x : e) {
        INFO("end " << x.dump());
        REQUIRE(bts.count(x["id"].get<std::string>()) == 1);
        CHECK(x["ts"].get<double>() >= bts[x["id"].get<std::string>()]);
    }
}

// ---- scenario 2: Send + Recv in one group --------------------------------------------

constexpr uint64_t kP2pHash = 0x0123456789abcdefull;

void body_p2p(Child &c, const std::string &path, int version)
{
    load_or_fail(c, path, version);
    Comm comm{kP2pHash, 2, 4, 2, nullptr};
    init_or_fail(c, comm);
    Proxy proxy(c);
    User user(c.p);
    json tasks = json::array();
    user.post = [&](Task &t) {
        Work w = work_for(t);
        w.log = true;
        w.step_ns = 10'000;
        w.step_bytes = t.count * 4 / (t.nch * w.nsteps);
        proxy.post(std::move(w));
    };
    user.group_start();
    user.p2p(comm, true, 5, 4096, 2);
    user.p2p(comm, false, 5, 8192, 1);
    for (const Task &t : user.group_end()) tasks.push_back(task_log(t));
    proxy.finish();
    c.out["tasks"] = tasks;
    finalize_all(c, {&comm});
}

void check_p2p(const std::string &tag, const std::string &path, int version)
{
    Outcome o = run_child(tag, {}, [&](Child &c) { body_p2p(c, path, version); });
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    CHECK(o.drv["version"] == version);
    const int64_t m2r = o.process()["mono_to_realtime_ns"].get<int64_t>();
    auto p2p = o.of("p2p");
    REQUIRE(p2p.size() == 2);
    CHECK(o.of("coll").empty());
    const json &tasks = o.drv["tasks"];
    REQUIRE(tasks.size() == 2);
    for (const json &r : p2p) {
        INFO("p2p record " << raw(r));
        const bool send = r["func"] == "Send";
        const json &t = tasks[send ? 0 : 1];
        CHECK(r["func"] == (send ? "Send" : "Recv"));
        CHECK(r["comm"] == hex(kP2pHash));
        CHECK(r["rank"] == 2);
        CHECK(r["nranks"] == 4);
        CHECK(r["peer"] == 5);
        CHECK(r["count"] == (send ? 4096 : 8192));
        CHECK(r["datatype"] == "ncclFloat32");
        CHECK(r["bytes"] == (send ? 16384 : 32768));
        CHECK(r["channels"] == (send ? 2 : 1));
        CHECK(r["timing"] == "kernel_gpu");
        check_bandwidth(r, 1.0);
        check_start_us(r, t, m2r);
    }
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
    CHECK(o.events("b").size() == 2);
    CHECK(o.events("e").size() == 2);
    for (const json &x : o.events("b")) CHECK(x["cat"] == "p2p");
    CHECK(o.events("X", "send op").size() == 2); // 2 channels of the Send
    CHECK(o.events("X", "recv op").size() == 1);
    CHECK(o.events("X", "kernel").size() == 3);
}

// ---- scenario 3: NULL and foreign handles ------------------------------------------------

void body_bad_handles(Child &c)
{
    load_or_fail(c, plugin_path(), 5);
    Comm comm{0xbadbadbadull, 0, 2, 2, "bad"};
    init_or_fail(c, comm);
    Prof &p = c.p;
    uint64_t bad = 0;
    int local = 42;
    Args a{};
    a.proxyStep.transSize = 123;

    // NULL: tolerated, never counted.
    c.check(p.stop(nullptr) == ncclSuccess, "stopEvent(NULL)");
    c.check(p.record(nullptr, ncclProfilerProxyStepSendWait, &a) == ncclSuccess, "recordEventState(NULL)");
    c.check(p.record(nullptr, ncclProfilerNetPluginUpdate, nullptr) == ncclSuccess, "recordEventState(NULL, NULL)");
    // Pointers we never issued.
    c.check(p.stop(&local) == ncclSuccess, "stopEvent(&local)");
    ++bad;
    c.check(p.record(&local, ncclProfilerProxyStepSendWait, &a) == ncclSuccess, "record(&local)");
    ++bad;
    c.check(p.stop(kPoison) == ncclSuccess, "stopEvent(poison)");
    ++bad;
    // With the recorder's tag but a pool that does not exist, and a slot that is not open.
    void *tag_bad_pool = reinterpret_cast<void *>(uintptr_t{0x5affffffffffffffull});
    void *tag_free_slot = reinterpret_cast<void *>(uintptr_t{0x5a00000000000002ull});
    p.stop(tag_bad_pool);
    ++bad;
    p.record(tag_bad_pool, ncclProfilerProxyOpInProgress_v4, &a);
    ++bad;
    p.stop(tag_free_slot);
    ++bad;
    c.check(local == 42, "the plugin wrote through a foreign handle");

    // Double stop and state-after-stop of real handles.
    User user(p);
    std::vector<Task> tasks;
    user.post = [&](Task &t) {
        Descr d{};
        d.type = ncclProfileProxyOp;
        d.parentObj = t.ev;
        d.rank = comm.rank;
        d.proxyOp.pid = getpid();
        d.proxyOp.channelId = 0;
        d.proxyOp.peer = 1;
        d.proxyOp.nSteps = 1;
        d.proxyOp.chunkSize = 1024;
        d.proxyOp.isSend = 1;
        void *op = p.start(comm.ctx, d);
        c.check(op != nullptr, "proxy op not recorded");
        p.record(op, ncclProfilerProxyOpInProgress_v4, &a);
        Descr s{};
        s.type = ncclProfileProxyStep;
        s.parentObj = op;
        s.proxyStep.step = 0;
        void *step = p.start(comm.ctx, s);
        Descr n{};
        n.type = ncclProfileNetPlugin;
        n.parentObj = step;
        vigilNetProfDescr_v1_t nd{};
        nd.type = vigilNetProfFailback;
        nd.slot = 0;
        nd.generation = 2;
        nd.start_ns = mono_ns();
        n.netPlugin.id = VIGIL_PROFILER_NET_ID;
        n.netPlugin.data = &nd;
        void *net = p.start(comm.ctx, n);
        c.check(net != nullptr, "net event not recorded");
        p.stop(net);
        p.stop(net); // NetPlugin stops are forwarded unchecked: a stale handle
        ++bad;
        p.record(net, ncclProfilerNetPluginUpdate, &a);
        ++bad;
        p.stop(step);
        p.stop(step);
        ++bad;
        p.stop(op);
        p.stop(op);
        ++bad;
        p.record(op, ncclProfilerProxyOpInProgress_v4, &a);
        ++bad;
        Descr k{};
        k.type = ncclProfileKernelCh;
        k.parentObj = t.ev;
        k.kernelCh.channelId = 0;
        k.kernelCh.pTimer = gpu_now() - kKernelStartLag;
        void *kh = p.start(comm.ctx, k);
        Args ka{};
        ka.kernelCh.pTimer = gpu_now();
        p.record(kh, ncclProfilerKernelChStop, &ka);
        p.stop(kh);
        p.record(kh, ncclProfilerKernelChStop, &ka);
        ++bad;
    };
    user.group_start();
    user.all_reduce(comm, 1024, 1);
    tasks = user.group_end();
    // E(Coll) happened in group_end; stop it again (a stale task eventHandle on a replay).
    if (!tasks.empty() && tasks[0].ev) {
        p.stop(tasks[0].ev);
        ++bad;
    }

    // 2.30.7's v5 shim forwards 23/24 with a pointer to an uninitialised union.
    {
        Descr g{};
        g.type = ncclProfileGroupApi;
        g.groupApi.groupDepth = 1;
        void *gh = p.start(comm.ctx, g);
        Args junk;
        std::memset(static_cast<void *>(&junk), 0xa5, sizeof(junk));
        p.record(gh, ncclProfilerGroupStartApiStop, &junk);
        p.record(gh, ncclProfilerGroupEndApiStart, &junk);
        p.stop(gh);
    }

    // Types NCCL never sends to a v5 table (CE, several bits, none, beyond): *eHandle = NULL.
    json nulls = json::object();
    for (uint64_t type : {uint64_t{ncclProfileCeColl}, uint64_t{ncclProfileCeSync}, uint64_t{ncclProfileCeBatch},
                          uint64_t{0}, uint64_t{ncclProfileColl | ncclProfileP2p}, uint64_t{1} << 20,
                          uint64_t{1} << 63}) {
        Descr d{};
        d.type = type;
        void *h = kPoison;
        p.start_raw(comm.ctx, &h, d);
        nulls[std::to_string(type)] = h == nullptr;
    }
    c.out["v5_nulls"] = nulls;
    // The v6 table does receive CE events from 2.30.7; the plugin does not record them.
    auto *t6 = static_cast<ncclProfiler_v6_t *>(dlsym(p.lib, "ncclProfiler_v6"));
    if (t6 != nullptr) {
        ncclProfilerEventDescr_v6_t d{};
        d.type = ncclProfileCeColl;
        d.ceColl.func = "AllGather";
        void *h = kPoison;
        t6->startEvent(comm.ctx, &h, &d);
        c.out["v6_ce_null"] = h == nullptr;
    }
    // Garbage eHandle pointer argument: NULL.
    {
        Descr d{};
        d.type = ncclProfileGroup;
        c.check(p.v5->startEvent(comm.ctx, nullptr, reinterpret_cast<ncclProfilerEventDescr_v5_t *>(&d)) ==
                    ncclSuccess,
                "startEvent(eHandle NULL)");
        void *h = kPoison;
        p.v5->startEvent(comm.ctx, &h, nullptr);
        c.out["null_descr_null"] = h == nullptr;
    }
    // A stale handle whose slot now holds a live event (NCCL's recycled proxy args keep
    // sub->kernelEventHandle, docs/nccl-abi.md, "Profiler calls and handles"): with
    // VIGIL_PROFILE_POOL=64, 64 more events on the same thread reuse the stopped one's slot.
    // The stale handle must not reach the live event: counted as foreign, and every live
    // event is recorded once, by its own stop.
    std::thread recycler([&] {
        Descr d{};
        d.type = ncclProfileProxyOp;
        d.rank = comm.rank;
        d.proxyOp.pid = getpid();
        d.proxyOp.channelId = 5;
        d.proxyOp.peer = 1;
        d.proxyOp.nSteps = 1;
        d.proxyOp.isSend = 1;
        void *stale = p.start(comm.ctx, d);
        c.check(stale != nullptr, "recycler: first op not recorded");
        p.stop(stale);
        std::vector<void *> live;
        for (int i = 0; i < 64; ++i) live.push_back(p.start(comm.ctx, d));
        c.out["recycler_live"] = std::count_if(live.begin(), live.end(), [](void *h) { return h != nullptr; });
        Args ka{};
        p.record(stale, ncclProfilerProxyOpInProgress_v4, &ka);
        ++bad;
        p.stop(stale);
        ++bad;
        for (void *h : live)
            if (h) p.stop(h);
    });
    recycler.join();
    c.out["bad"] = bad;
    finalize_all(c, {&comm});
}

// ---- scenario 4: a restarted proxy step ------------------------------------------------

void body_restart(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0x4e57a47ull, 1, 2, 2, nullptr};
    init_or_fail(c, comm);
    Proxy proxy(c);
    User user(c.p);
    user.post = [&](Task &t) {
        Work w = work_for(t);
        w.nch = 1;
        w.nsteps = 6;
        w.restart_recv_step = 3;
        proxy.post(std::move(w));
    };
    user.group_start();
    user.all_reduce(comm, 6 * 4096, 1);
    user.group_end();
    proxy.finish();
    finalize_all(c, {&comm});
}

// ---- scenario 5: several communicators ---------------------------------------------------

constexpr uint64_t kHashA = 0xa11ce00000000001ull, kHashB = 0xb0b0000000000002ull;

void body_multicomm(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm a{kHashA, 1, 4, 2, "A"}, b{kHashB, 6, 16, 4, "B"};
    init_or_fail(c, a);
    init_or_fail(c, b);
    Proxy pa(c), pb(c); // separate communicators: separate proxy threads
    User user(c.p);
    json tasks = json::array();
    user.post = [&](Task &t) {
        Work w = work_for(t);
        w.log = true;
        w.step_ns = 5000;
        w.step_bytes = 4096;
        (t.comm == &a ? pa : pb).post(std::move(w));
    };
    for (int i = 0; i < 12; ++i) {
        user.group_start();
        if (i % 3 == 2) {
            // One group spanning both communicators: a single GroupApi, started with A's
            // context; B's CollApi carries it as parent
            // (docs/nccl-abi.md, "Profiler calls and handles").
            user.all_reduce(a, 1000 + i, 2);
            user.all_reduce(b, 2000 + i, 1, "ncclBfloat16");
        } else if (i % 2 == 0) {
            user.all_reduce(a, 1000 + i, 2);
        } else {
            user.all_reduce(b, 2000 + i, 1, "ncclBfloat16");
        }
        for (const Task &t : user.group_end()) tasks.push_back(task_log(t));
    }
    pa.finish();
    pb.finish();
    c.out["tasks"] = tasks;
    finalize_all(c, {&a, &b});
}

// ---- scenario 6: concurrent user and proxy threads ---------------------------------------

constexpr int kManyColls = 2000;

void body_threads(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0x7777777777777777ull, 0, 8, 2, nullptr};
    init_or_fail(c, comm);
    Proxy proxy(c);
    std::thread user_thread([&] {
        User user(c.p);
        user.post = [&](Task &t) {
            Work w = work_for(t);
            w.nsteps = 2;
            w.step_ns = 2000;
            proxy.post(std::move(w));
        };
        for (int i = 0; i < kManyColls; ++i) {
            user.group_start();
            user.all_reduce(comm, 1024 + static_cast<size_t>(i), 2);
            user.group_end();
        }
    });
    user_thread.join();
    proxy.finish();
    finalize_all(c, {&comm});
}

// ---- scenario 7: the v4 table ------------------------------------------------------------

void body_v4(Child &c)
{
    load_or_fail(c, plugin_path(), 4);
    Comm comm{0x4444000000000004ull, 1, 2, 2, "v4"};
    init_or_fail(c, comm);
    c.out["mask"] = g_mask;
    // Types a v4 table never receives, squeezed into its uint8_t type: NULL, no crash.
    json nulls = json::object();
    for (int type : std::initializer_list<int>{ncclProfileGroupApi, ncclProfileCollApi, ncclProfileP2pApi,
                                              ncclProfileKernelLaunch, 0x81, 0}) {
        ncclProfilerEventDescr_v4_t d;
        std::memset(static_cast<void *>(&d), 77, sizeof(d));
        d.type = static_cast<uint8_t>(type);
        d.parentObj = nullptr;
        void *h = kPoison;
        c.check(c.p.v4->startEvent(comm.ctx, &h, &d) == ncclSuccess, "v4 startEvent");
        nulls[std::to_string(type)] = h == nullptr;
    }
    c.out["nulls"] = nulls;
    Proxy proxy(c);
    User user(c.p);
    json tasks = json::array();
    user.post = [&](Task &t) {
        Work w = work_for(t);
        w.step_ns = 5000;
        proxy.post(std::move(w));
    };
    for (int i = 0; i < 3; ++i) {
        user.group_start();
        user.all_reduce(comm, 4096, 2);
        for (const Task &t : user.group_end()) tasks.push_back(task_log(t));
    }
    user.group_start();
    user.p2p(comm, true, 0, 512, 1);
    user.p2p(comm, false, 0, 512, 1);
    user.group_end();
    proxy.finish();
    finalize_all(c, {&comm});
}

// ---- scenario 8: pool exhaustion ---------------------------------------------------------

void body_pool(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0x9001ull, 0, 2, 2, nullptr};
    init_or_fail(c, comm);
    User user(c.p);
    void *coll = nullptr;
    user.post = [&](Task &t) { coll = t.ev; };
    user.group_start();
    user.all_reduce(comm, 65536, 2);
    user.group_end();
    std::thread proxy([&] {
        std::vector<void *> ops;
        int nulls = 0;
        for (int i = 0; i < 200; ++i) {
            Descr d{};
            d.type = ncclProfileProxyOp;
            d.parentObj = coll;
            d.rank = comm.rank;
            d.proxyOp.pid = getpid();
            d.proxyOp.channelId = static_cast<uint8_t>(i % 2);
            d.proxyOp.peer = 1;
            d.proxyOp.nSteps = 1;
            d.proxyOp.chunkSize = 1024;
            d.proxyOp.isSend = 1;
            void *h = kPoison; // must be overwritten, NULL included
            c.p.start_raw(comm.ctx, &h, d);
            if (h == nullptr) {
                ++nulls;
            } else {
                c.p.started.fetch_add(1);
                ops.push_back(h);
            }
        }
        c.out["nulls"] = nulls;
        c.out["non_null"] = ops.size();
        c.out["poison_left"] = std::count(ops.begin(), ops.end(), kPoison);
        for (void *h : ops)
            if (h != kPoison) c.p.stop(h);
    });
    proxy.join();
    finalize_all(c, {&comm});
}

// ---- scenarios 9, 10: VIGIL_PROFILE_EVENTS -------------------------------------------------

void body_mask(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0x3a5cull, 0, 2, 1, nullptr};
    int mask = 0x7fff; // must be overwritten
    const ncclResult_t rc = c.p.init(comm, &mask);
    c.out["rc"] = rc;
    c.out["mask"] = mask;
    c.out["ctx_null"] = comm.ctx == nullptr;
    Descr d{};
    d.type = ncclProfileColl;
    d.coll.func = "AllReduce";
    d.coll.datatype = "ncclFloat32";
    d.coll.count = 1;
    d.coll.nChannels = 1;
    void *h = kPoison;
    c.p.start_raw(comm.ctx, &h, d);
    c.out["coll_null"] = h == nullptr;
    if (h != nullptr && h != kPoison) c.p.stop(h);
    c.p.stop(nullptr);
    c.p.record(nullptr, ncclProfilerProxyStepSendWait, nullptr);
    c.out["finalize_rc"] = c.p.finalize(comm.ctx);
    dlclose(c.p.lib);
}

// ---- scenario 11: file bound -------------------------------------------------------------

void body_bound(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0xb0d0000000000011ull, 0, 2, 2, nullptr};
    init_or_fail(c, comm);
    Proxy proxy(c);
    User user(c.p);
    user.post = [&](Task &t) {
        Work w = work_for(t);
        w.nsteps = 8;
        w.step_ns = 500;
        proxy.post(std::move(w));
    };
    for (int i = 0; i < 40; ++i) {
        user.group_start();
        user.all_reduce(comm, 65536, 2);
        user.group_end();
    }
    proxy.finish();
    finalize_all(c, {&comm});
}

// ---- scenario 12: PXN --------------------------------------------------------------------

void body_pxn(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0x9e70000000000012ull, 2, 8, 2, nullptr};
    init_or_fail(c, comm);
    Prof &p = c.p;
    // An op posted by another local rank's process: its context and parent pointers are
    // that process's (docs/nccl-abi.md, "Profiler calls and handles"); dereferencing either
    // would crash here.
    void *const their_ctx = reinterpret_cast<void *>(uintptr_t{0x10});
    void *const their_parent = reinterpret_cast<void *>(uintptr_t{0x28});
    json r = json::object();
    for (int dir = 0; dir < 2; ++dir) {
        Descr d{};
        d.type = ncclProfileProxyOp;
        d.parentObj = their_parent;
        d.rank = 5;
        d.proxyOp.pid = getpid() + 1;
        d.proxyOp.channelId = 3;
        d.proxyOp.peer = 9;
        d.proxyOp.nSteps = 2;
        d.proxyOp.chunkSize = 4096;
        d.proxyOp.isSend = dir == 0;
        void *op = p.start(their_ctx, d);
        r[dir == 0 ? "send_op" : "recv_op"] = op != nullptr;
        Args a{};
        if (op) p.record(op, ncclProfilerProxyOpInProgress_v4, &a);
        for (int k = 0; k < 2; ++k) {
            Descr s{};
            s.type = ncclProfileProxyStep;
            s.parentObj = op;
            s.rank = 5;
            s.proxyStep.step = k;
            void *step = p.start(their_ctx, s);
            r[(dir == 0 ? "send_step" : "recv_step") + std::to_string(k)] = step != nullptr;
            if (op && step) {
                a.proxyStep.transSize = 4096;
                p.record(step, dir == 0 ? ncclProfilerProxyStepSendWait : ncclProfilerProxyStepRecvFlushWait, &a);
            }
            if (dir == 0 && k == 0) {
                vigilNetProfDescr_v1_t nd = window_descr(0, 0, 0);
                Descr n{};
                n.type = ncclProfileNetPlugin;
                n.parentObj = step;
                n.netPlugin.id = VIGIL_PROFILER_NET_ID;
                n.netPlugin.data = &nd;
                void *nh = p.start(their_ctx, n);
                r["net"] = nh != nullptr;
                if (nh) p.stop(nh);
            }
            if (step) p.stop(step);
        }
        if (op) p.stop(op);
    }
    c.out["pxn"] = r;
    // Our own work still goes through afterwards.
    Proxy proxy(c);
    User user(p);
    user.post = [&](Task &t) { proxy.post(work_for(t)); };
    user.group_start();
    user.all_reduce(comm, 8192, 1);
    user.group_end();
    proxy.finish();
    finalize_all(c, {&comm});
}

// ---- scenario 13: CUDA graph replay --------------------------------------------------------

void body_graph(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0x6a9e000000000013ull, 0, 4, 2, nullptr};
    init_or_fail(c, comm);
    Proxy proxy(c);
    User user(c.p);
    json tasks = json::array();
    user.post = [&](Task &t) {
        Work w = work_for(t);
        w.log = true;
        w.step_ns = 2000;
        proxy.post(std::move(w));
    };
    // Capture: GroupApi/CollApi graphCaptured, KernelLaunch once; the plan has proxy ops, so
    // hostStreamPlanTask is a host node and Group/Coll come at every replay.
    user.graph = true;
    user.group_start();
    user.all_reduce(comm, 777216, 2);
    std::vector<Task> captured = user.group_end();
    user.graph = false;
    if (captured.size() != 1) throw std::runtime_error("capture produced no task");
    c.out["captured_api"] = reinterpret_cast<uintptr_t>(captured[0].api);
    // Other work meanwhile: with VIGIL_PROFILE_POOL=64 the CollApi's slot is reused.
    for (int i = 0; i < 30; ++i) {
        user.group_start();
        user.all_reduce(comm, 1024, 2);
        for (const Task &t : user.group_end()) tasks.push_back(task_log(t));
    }
    // Replays, from a CUDA host-callback thread: Coll.parentObj is the CollApi handle from
    // capture time, stopped long ago.
    std::thread cb([&] {
        for (int r = 0; r < 3; ++r) {
            Task t = captured[0];
            std::vector<Task *> v{&t};
            launch_plan(c.p, comm, v, user.post);
            std::lock_guard<std::mutex> g(c.mu);
            tasks.push_back(task_log(t));
        }
    });
    cb.join();
    proxy.finish();
    c.out["tasks"] = tasks;
    finalize_all(c, {&comm});
}


// ---- scenario 14: non-blocking communicator (a launch thread per group) ------------------

constexpr int kNbGroups = 300;

void body_nonblocking(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0x0b10c000000000014ull, 1, 4, 2, "nb"};
    init_or_fail(c, comm);
    Proxy proxy(c, &comm);
    {
        User user(c.p);
        user.nonblocking = true;
        user.post = [&](Task &t) {
            Work w = work_for(t);
            w.nsteps = 2;
            w.step_ns = 1000;
            proxy.post(std::move(w));
        };
        for (int i = 0; i < kNbGroups; ++i) {
            user.group_start();
            user.all_reduce(comm, 2048 + static_cast<size_t>(i), 2);
            user.group_end();
        }
        user.wait_launch();
    }
    proxy.finish();
    finalize_all(c, {&comm});
}

// ---- scenario 15: the last communicator goes, another comes ---------------------------------

constexpr uint64_t kSess1 = 0x5e5510000000000aull, kSess2 = 0x5e5520000000000bull;

/// One non-blocking communicator's life on the main (user) thread: init, `n` collectives
/// launched from NCCL pthreads, its proxy thread, ncclCommDestroy (proxy joined, finalize).
/// With the default events the user thread itself records nothing (API events are not
/// selected); the launch and proxy threads that did have exited before finalize.
void session(Child &c, Comm &comm, int n)
{
    init_or_fail(c, comm);
    Proxy proxy(c, &comm);
    User user(c.p);
    user.nonblocking = true;
    user.post = [&](Task &t) { proxy.post(work_for(t)); };
    for (int i = 0; i < n; ++i) {
        user.group_start();
        user.all_reduce(comm, 4096, 2);
        user.group_end();
    }
    user.wait_launch();
    proxy.finish();
    c.check(c.p.finalize(comm.ctx) == ncclSuccess, "finalize failed");
}

void body_sessions(Child &c, bool unload)
{
    load_or_fail(c, plugin_path(), 6);
    Comm a{kSess1, 0, 2, 2, "first"}, b{kSess2, 1, 2, 2, "second"};
    const uint64_t before = c.p.started.load();
    session(c, a, 5);
    c.out["started1"] = c.p.started.load() - before;
    if (unload) {
        // NCCL 2.30.7 dlcloses the plugin when its last communicator is finalized and
        // dlopens it again for the next one. The plugin libraries are linked -z nodelete,
        // so the library must stay mapped through that and serve the next session.
        dlclose(c.p.lib);
        void *still = dlopen(plugin_path().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
        c.out["still_loaded"] = still != nullptr;
        if (still) dlclose(still);
        c.p.forget();
        load_or_fail(c, plugin_path(), 6);
    }
    const uint64_t mid = c.p.started.load();
    session(c, b, 7);
    c.out["started2"] = c.p.started.load() - mid;
    dlclose(c.p.lib);
}

} // namespace

// =========================================================================================

TEST_CASE("the plugin library is there", "[profiler-replay]")
{
    INFO("PROFILER_REPLAY_SO must name libnccl-profiler-vigil.so (set by meson test)");
    REQUIRE(!plugin_path().empty());
    REQUIRE(fs::exists(plugin_path()));
}

TEST_CASE("1. AllReduce in a group through the v6 table", "[profiler-replay]") { check_allreduce(6); }

TEST_CASE("1. AllReduce in a group through the v5 table", "[profiler-replay]") { check_allreduce(5); }

TEST_CASE("2. Send + Recv to a remote peer in one group", "[profiler-replay]")
{
    check_p2p("p2p-v6", plugin_path(), 6);
    check_p2p("p2p-v5", plugin_path(), 5);
}

TEST_CASE("2b. the net plugin library exports the same profiler", "[profiler-replay]")
{
    REQUIRE(!net_plugin_path().empty());
    check_p2p("p2p-netlib-v6", net_plugin_path(), 6);
}

TEST_CASE("3. NULL and foreign handles", "[profiler-replay]")
{
    Outcome o = run_child("bad-handles", {{"VIGIL_PROFILE_POOL", "64"}}, body_bad_handles);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    const json st = o.stats();
    INFO("stats " << raw(st));
    CHECK(o.drv["bad"].get<int>() == 15);
    CHECK(o.drv["recycler_live"] == 64);
    int recycled = 0; // the recycler's ops: channel 5
    const json tid = o.tid_of("ch 5 send");
    for (const json &e : o.events("X", "send op"))
        if (e["tid"] == tid) ++recycled;
    CHECK(recycled == 65);
    CHECK(st["foreign_handles"] == o.drv["bad"]);
    CHECK(st["events"] == o.drv["started"]);
    for (const auto &[type, isnull] : o.drv["v5_nulls"].items()) {
        INFO("v5 startEvent type " << type);
        CHECK(isnull == true);
    }
    CHECK(o.drv["v6_ce_null"] == true);
    CHECK(o.drv["null_descr_null"] == true);
    // The collective itself is recorded despite all that.
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 1);
    CHECK(colls[0]["seq"] == 0);
    CHECK(colls[0]["timing"] == "kernel_gpu");
    auto nets = o.of("net");
    REQUIRE(nets.size() == 1);
    CHECK(nets[0]["event"] == "failback");
    CHECK(nets[0]["generation"] == 2);
}

TEST_CASE("4. a restarted proxy step is recorded once", "[profiler-replay]")
{
    Outcome o = run_child("restart", {{"VIGIL_PROFILE_EVENTS", "all"}}, body_restart);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    REQUIRE(o.drv.contains("restart"));
    CHECK(o.drv["restart"]["first"] != 0);
    CHECK(o.drv["restart"]["second"] != 0);
    CHECK(o.drv["restart"]["first"] != o.drv["restart"]["second"]);
    std::map<int, int> recv_steps, send_steps;
    for (const json &s : o.events("X", "step")) {
        const bool recv = s["args"].contains("RecvWait_us");
        (recv ? recv_steps : send_steps)[s["args"]["step"].get<int>()]++;
        if (recv && s["args"]["step"] == 3) {
            INFO("restarted step " << s.dump());
            CHECK(s["args"].contains("RecvFlushWait_us"));
            CHECK(s["args"].contains("RecvGPUWait_us"));
            CHECK(s["args"]["bytes"] == 65536 + 64 * 3);
        }
    }
    CHECK(recv_steps == std::map<int, int>{{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}});
    CHECK(send_steps == std::map<int, int>{{0, 1}, {1, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}});
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["foreign_handles"] == 0);
    CHECK(st["events"] == o.drv["started"]);
    REQUIRE(o.of("coll").size() == 1);
    CHECK(o.of("coll")[0]["timing"] == "kernel_gpu");
}

TEST_CASE("5. several communicators", "[profiler-replay]")
{
    Outcome o = run_child("multicomm", {}, body_multicomm);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    const int64_t m2r = o.process()["mono_to_realtime_ns"].get<int64_t>();
    auto comms = o.of("comm");
    REQUIRE(comms.size() == 2);
    std::map<std::string, json> comm_rec;
    for (const json &r : comms) comm_rec[r["comm"].get<std::string>()] = r;
    REQUIRE(comm_rec.count(hex(kHashA)) == 1);
    REQUIRE(comm_rec.count(hex(kHashB)) == 1);
    CHECK(comm_rec[hex(kHashA)]["rank"] == 1);
    CHECK(comm_rec[hex(kHashA)]["nranks"] == 4);
    CHECK(comm_rec[hex(kHashA)]["name"] == "A");
    CHECK(comm_rec[hex(kHashB)]["rank"] == 6);
    CHECK(comm_rec[hex(kHashB)]["nranks"] == 16);
    CHECK(comm_rec[hex(kHashB)]["nnodes"] == 4);

    std::map<std::pair<std::string, uint64_t>, json> expect;
    for (const json &t : o.drv["tasks"]) expect[{t["comm"].get<std::string>(), t["seq"].get<uint64_t>()}] = t;
    REQUIRE(expect.size() == 16); // A: 8 (seq 0-7), B: 8 (seq 0-7)
    std::map<std::string, std::vector<uint64_t>> seqs;
    auto colls = o.of("coll");
    CHECK(colls.size() == expect.size());
    for (const json &r : colls) {
        INFO("coll " << raw(r));
        const std::string cm = r["comm"].get<std::string>();
        const bool isA = cm == hex(kHashA);
        REQUIRE((isA || cm == hex(kHashB)));
        const auto key = std::make_pair(cm, r["seq"].get<uint64_t>());
        REQUIRE(expect.count(key) == 1);
        const json &t = expect[key];
        seqs[cm].push_back(key.second);
        CHECK(r["rank"] == (isA ? 1 : 6));
        CHECK(r["nranks"] == (isA ? 4 : 16));
        CHECK(r["count"] == t["count"]);
        CHECK(r["datatype"] == (isA ? "ncclFloat32" : "ncclBfloat16"));
        CHECK(r["bytes"] == t["count"].get<uint64_t>() * (isA ? 4 : 2));
        CHECK(r["channels"] == (isA ? 2 : 1));
        CHECK(r["timing"] == "kernel_gpu");
        const double n = isA ? 4 : 16;
        check_bandwidth(r, 2 * (n - 1) / n);
        check_start_us(r, t, m2r);
    }
    for (const auto &cm : {hex(kHashA), hex(kHashB)}) {
        INFO("comm " << cm);
        CHECK(seqs[cm] == std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7});
    }
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
    std::set<std::string> pnames;
    for (const json &e : o.events("M", "process_name")) pnames.insert(e["args"]["name"].get<std::string>());
    CHECK(pnames == std::set<std::string>{"rank 1 comm " + hex(kHashA) + " A", "rank 6 comm " + hex(kHashB) + " B"});
}

TEST_CASE("6. a user thread and a proxy thread, 2000 collectives", "[profiler-replay]")
{
    // Each thread's ring holds all its events: the writer may be starved for a while on a
    // loaded host (the count must be exact; keeping up is a benchmark's question).
    Outcome o = run_child("threads", {{"VIGIL_PROFILE_RING", "32768"}}, body_threads);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    auto colls = o.of("coll");
    CHECK(colls.size() == kManyColls);
    std::vector<int> count(kManyColls, 0);
    for (const json &r : colls) {
        const uint64_t s = r["seq"].get<uint64_t>();
        REQUIRE(s < kManyColls);
        ++count[s];
        if (r["count"] != 1024 + s) FAIL_CHECK("seq " << s << " count " << r["count"]);
    }
    CHECK(std::count(count.begin(), count.end(), 1) == kManyColls);
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
}

TEST_CASE("7. the v4 table", "[profiler-replay]")
{
    Outcome o = run_child("v4", {}, body_v4);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    CHECK(o.drv["version"] == 4);
    CHECK(o.process()["abi"] == "v4");
    for (const auto &[type, isnull] : o.drv["nulls"].items()) {
        INFO("v4 startEvent type " << type);
        CHECK(isnull == true);
    }
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 3);
    for (size_t i = 0; i < 3; ++i) {
        INFO("coll " << raw(colls[i]));
        CHECK(colls[i]["seq"] == i);
        CHECK(colls[i]["channels"] == 2);
        CHECK(colls[i]["bytes"] == 16384);
        CHECK(colls[i]["timing"] == "kernel_gpu");
        check_bandwidth(colls[i], 1.0);
    }
    auto p2p = o.of("p2p");
    REQUIRE(p2p.size() == 2);
    std::set<std::string> funcs;
    for (const json &r : p2p) {
        INFO("p2p " << raw(r));
        funcs.insert(r["func"].get<std::string>());
        CHECK(r["channels"] == 0); // the 2.28+ v4 shim leaves nChannels uninitialised (77)
        CHECK(r["bytes"] == 2048);
        CHECK(r["peer"] == 0);
        CHECK(r["timing"] != "none");
    }
    CHECK(funcs == std::set<std::string>{"Send", "Recv"});
    CHECK(o.events("X", "GroupApi").empty());
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
}

TEST_CASE("8. pool exhaustion", "[profiler-replay]")
{
    Outcome o = run_child("pool", {{"VIGIL_PROFILE_POOL", "64"}}, body_pool);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    CHECK(o.drv["nulls"] == 136);
    CHECK(o.drv["non_null"] == 64);
    CHECK(o.drv["poison_left"] == 0);
    const json st = o.stats();
    INFO("stats " << raw(st));
    CHECK(st["dropped_pool"] == 136);
    CHECK(st["dropped_ring"] == 0);
    CHECK(st["dropped_threads"] == 0);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
    CHECK(o.events("X", "send op").size() == 64);
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 1);
    CHECK(colls[0]["timing"] == "proxy_cpu");
}

TEST_CASE("9. a bad VIGIL_PROFILE_EVENTS gets a WARN and the default events", "[profiler-replay]")
{
    // Observability never stops a job, nor switches itself off for a typo: the default set.
    Outcome o = run_child("bad-events", {{"VIGIL_PROFILE_EVENTS", "coll,bogus"}}, body_mask);
    REQUIRE_CHILD_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    CHECK(o.drv["rc"] == ncclSuccess);
    const int want = ncclProfileColl | ncclProfileP2p | ncclProfileProxyOp | ncclProfileKernelCh |
                     ncclProfileNetPlugin;
    CHECK((o.drv["mask"].get<int>() & want) == want);
    CHECK(o.drv["ctx_null"] == false);
    CHECK(o.drv["coll_null"] == false);
    CHECK(o.drv["finalize_rc"] == ncclSuccess);
    bool warned = false;
    for (const json &w : o.drv["warns"]) {
        const std::string t = w.get<std::string>();
        warned |= t.find("bogus") != std::string::npos && t.find("using the default") != std::string::npos;
    }
    CHECK(warned);
}

TEST_CASE("10. VIGIL_PROFILE_EVENTS through init's mask", "[profiler-replay]")
{
    struct Case {
        const char *text;
        int must;
    };
    const Case cases[] = {
        {"coll", ncclProfileColl | ncclProfileP2p | ncclProfileGroup},
        {"net", ncclProfileNetPlugin | ncclProfileProxyStep | ncclProfileProxyOp},
        {"4095", 4095},
        {"all", 4095},
        {" coll , kernel-ch ", ncclProfileColl | ncclProfileKernelCh},
    };
    for (const Case &k : cases) {
        Outcome o = run_child("mask", {{"VIGIL_PROFILE_EVENTS", k.text}}, body_mask);
        INFO("VIGIL_PROFILE_EVENTS=\"" << k.text << "\" driver " << o.drv.dump());
        REQUIRE_CHILD_OK(o);
        CHECK(o.drv["rc"] == ncclSuccess);
        CHECK(o.drv["ctx_null"] == false);
        const int mask = o.drv["mask"].get<int>();
        CHECK((mask & k.must) == k.must);
        CHECK((mask & ~0xffff) == 0);
        CHECK((mask & 0x7000) == 0); // copy-engine events: never asked for
        if (std::string(k.text) == "4095") CHECK(mask == 4095);
        CHECK(o.drv["coll_null"] == false);
        REQUIRE_FILES_OK(o);
        CHECK(o.process()["mask"] == mask);
    }
}

TEST_CASE("11. VIGIL_PROFILE_MAX_BYTES bounds the trace", "[profiler-replay]")
{
    Outcome o = run_child("bound", {{"VIGIL_PROFILE_EVENTS", "all"}, {"VIGIL_PROFILE_MAX_BYTES", "65536"}},
                          body_bound);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    CHECK(o.trace_bytes <= 65536 + 16);
    CHECK(o.trace_bytes > 60000);
    const json st = o.stats();
    INFO("stats " << raw(st));
    CHECK(st["trace_dropped"].get<uint64_t>() > 0);
    CHECK(o.summary_bytes <= 65536 + 512);
    CHECK(o.of("coll").size() == 40); // the summary had room for all of them
    CHECK(st["summary_dropped"] == 0);
    REQUIRE_NO_DROPS(st);
}

TEST_CASE("12. PXN: another process's proxy op", "[profiler-replay]")
{
    Outcome o = run_child("pxn", {{"VIGIL_PROFILE_EVENTS", "all"}}, body_pxn);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    const json &r = o.drv["pxn"];
    CHECK(r["send_step0"] == true);
    CHECK(r["send_step1"] == true);
    CHECK(r["recv_step0"] == true);
    CHECK(r["recv_step1"] == true);
    CHECK(r["net"] == true);
    // The op and its steps are in the trace, marked foreign.
    int foreign_ops = 0;
    for (const json &e : o.events("X")) {
        if ((e["name"] == "send op" || e["name"] == "recv op") && e["args"]["foreign"] == true) {
            ++foreign_ops;
            CHECK(e["args"]["peer"] == 9);
        }
    }
    CHECK(foreign_ops == 2);
    int pxn_steps = 0;
    const std::set<std::string> names = o.thread_names();
    for (const char *t : {"ch 3 send s0", "ch 3 send s1", "ch 3 recv s0", "ch 3 recv s1"}) {
        INFO("track " << t);
        CHECK(names.count(t) == 1);
    }
    for (const json &e : o.events("X", "step"))
        if (e["args"]["bytes"] == 4096) ++pxn_steps;
    CHECK(pxn_steps == 4);
    REQUIRE(o.of("coll").size() == 1);
    CHECK(o.of("coll")[0]["timing"] == "kernel_gpu");
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["foreign_handles"] == 0);
    CHECK(st["events"] == o.drv["started"]);
}

TEST_CASE("13. graph replay: Coll parent is a long-stopped CollApi", "[profiler-replay]")
{
    Outcome o = run_child("graph", {{"VIGIL_PROFILE_EVENTS", "all"}, {"VIGIL_PROFILE_POOL", "64"}}, body_graph);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    const int64_t m2r = o.process()["mono_to_realtime_ns"].get<int64_t>();
    std::map<uint64_t, json> tasks;
    for (const json &t : o.drv["tasks"]) tasks[t["seq"].get<uint64_t>()] = t;
    REQUIRE(tasks.size() == 33);
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 33);
    int replays = 0;
    for (const json &r : colls) {
        INFO("coll " << raw(r));
        const uint64_t s = r["seq"].get<uint64_t>();
        REQUIRE(tasks.count(s) == 1);
        CHECK(r["count"] == tasks[s]["count"]);
        CHECK(r["timing"] == "kernel_gpu");
        CHECK(r["channels"] == 2);
        check_bandwidth(r, 2.0 * 3 / 4);
        check_start_us(r, tasks[s], m2r);
        if (s >= 30) {
            ++replays;
            CHECK(r["count"] == 777216);
            CHECK(r["bytes"] == 777216 * 4);
        }
    }
    CHECK(replays == 3);
    // The capture's API events carry graphCaptured.
    int captured = 0;
    for (const json &e : o.events("X", "AllReduce"))
        if (e["args"]["graph_captured"] == true) ++captured;
    CHECK(captured == 1);
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
}

TEST_CASE("14. non-blocking communicator: a new launch thread per group", "[profiler-replay]")
{
    // Pools are per thread and given back when a thread exits: 300 launch threads in turn
    // must fit in 4 pools (main, proxy, the current launch thread).
    Outcome o = run_child("nonblocking", {{"VIGIL_PROFILE_EVENTS", "all"}, {"VIGIL_PROFILE_THREADS", "4"}},
                          body_nonblocking);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir);
    auto colls = o.of("coll");
    CHECK(colls.size() == kNbGroups);
    std::set<uint64_t> seqs;
    for (const json &r : colls) {
        seqs.insert(r["seq"].get<uint64_t>());
        CHECK(r["timing"] == "kernel_gpu");
    }
    CHECK(seqs.size() == kNbGroups);
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["events"] == o.drv["started"]);
    CHECK(st["foreign_handles"] == 0);
    CHECK(o.events("X", "GroupApi").size() == kNbGroups);
    CHECK(o.events("X", "KernelLaunch").size() == kNbGroups);
}

void check_sessions(bool unload)
{
    Outcome o = run_child(unload ? "sessions-reload" : "sessions", {}, [&](Child &c) { body_sessions(c, unload); });
    REQUIRE_CHILD_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    // "A process that destroys its last communicator and creates another starts a new pair
    // of files rather than truncating the first" (writer.cc, open_files).
    REQUIRE(o.summaries.size() == 2);
    REQUIRE(o.traces.size() == 2);
    std::map<std::string, int> colls_of;
    for (size_t i = 0; i < 2; ++i) {
        Outcome one = o;
        one.summaries = {o.summaries[i]};
        one.traces = {o.traces[i]};
        load_files(one, o.summaries[i], o.traces[i]);
        INFO("files " << o.summaries[i] << " " << o.traces[i]);
        REQUIRE_FILES_OK(one);
        for (const json &r : one.of("coll")) colls_of[r["comm"].get<std::string>()]++;
        auto comms = one.of("comm");
        REQUIRE(comms.size() == 1);
        const bool first = comms[0]["comm"] == hex(kSess1);
        CHECK(one.of("coll").size() == (first ? 5u : 7u));
        const json st = one.stats();
        INFO("stats " << raw(st));
        REQUIRE_NO_DROPS(st);
        CHECK(st["foreign_handles"] == 0);
        // Each file's stats describe that file, like its trace_dropped/summary_dropped/orphans
        // (reset per session), not the whole process's history.
        CHECK(st["events"] == o.drv[first ? "started1" : "started2"]);
    }
    if (unload) CHECK(o.drv["still_loaded"] == true); // -z nodelete: dlclose unmaps nothing
    CHECK(colls_of[hex(kSess1)] == 5);
    CHECK(colls_of[hex(kSess2)] == 7);
}

TEST_CASE("15a. a second communicator after the last finalize (plugin stays loaded)", "[profiler-replay]")
{
    check_sessions(false);
}

TEST_CASE("15b. a second communicator after dlclose and dlopen (NCCL 2.30.7)", "[profiler-replay]")
{
    check_sessions(true);
}

int main(int argc, char *argv[])
{
    std::string tmpl = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) +
                       "/vigil-prof-replay-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) {
        std::perror("mkdtemp");
        return 2;
    }
    g_base = buf.data();
    const int rc = Catch::Session().run(argc, argv);
    if (rc == 0 && std::getenv("PROFILER_REPLAY_KEEP") == nullptr) {
        std::error_code ec;
        fs::remove_all(g_base, ec);
    } else {
        std::fprintf(stderr, "profiler replay: scenario files kept in %s\n", g_base.c_str());
    }
    return rc;
}

// ---- scenario 16: the process exits with a communicator alive ------------------------------
// Most jobs never destroy their communicators. exit() then runs the library's static
// destructors while its writer thread is running: the process must exit normally (not
// std::terminate on a joinable thread) and the files must be complete.
void body_exit_live(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0xe417ull, 1, 2, 1, "exit-live"};
    if (c.p.init(comm) != ncclSuccess || comm.ctx == nullptr) throw std::runtime_error("init failed");
    for (uint64_t seq = 0; seq < 5; ++seq) {
        Descr d{};
        d.type = ncclProfileColl;
        d.rank = 1;
        d.coll.seqNumber = seq;
        d.coll.func = "AllReduce";
        d.coll.datatype = "ncclFloat32";
        d.coll.count = 1024;
        d.coll.nChannels = 1;
        d.coll.algo = "RING";
        d.coll.proto = "SIMPLE";
        void *h = kPoison;
        c.p.start_raw(comm.ctx, &h, d);
        if (h == nullptr || h == kPoison) throw std::runtime_error("no Coll handle");
        c.p.stop(h);
    }
    c.out["errors"] = c.errors;
    c.out["exited"] = true;
    std::ofstream f(c.dir + "/driver.json");
    f << c.out.dump(1) << "\n";
    f.close();
    std::exit(0); // no finalize, no dlclose: static destructors and atexit handlers run
}

TEST_CASE("16. the process exits with a communicator alive", "[profiler-replay]")
{
    Outcome o = run_child("exit-live", {}, body_exit_live);
    REQUIRE_CHILD_OK(o);
    INFO("scenario dir " << o.dir);
    CHECK(o.drv["exited"] == true);
    REQUIRE(o.summaries.size() == 1);
    CHECK(o.bad_lines.empty());
    CHECK(o.of("coll").size() == 5); // pending collectives completed at exit
    CHECK(o.of("stats").size() == 1);
    CHECK(o.trace_error == "");
}

// ---- scenario 17: many communicators over the process's life -------------------------------
// More init/finalize cycles than the context table has slots (1024), then dlclose as NCCL
// 2.30.7 does: finalized slots are reused and no writer thread outlives the last finalize.
void body_many_comms(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    int reused_ok = 0;
    for (int k = 0; k < 1100; ++k) {
        Comm comm{0x1000ull + static_cast<uint64_t>(k), 0, 2, 1, nullptr};
        if (c.p.init(comm) != ncclSuccess) throw std::runtime_error("init failed");
        reused_ok += comm.ctx != nullptr;
        if (c.p.finalize(comm.ctx) != ncclSuccess) throw std::runtime_error("finalize failed");
    }
    // Two live at once still get distinct contexts.
    Comm a{0xaull, 0, 2, 1, nullptr}, b{0xbull, 1, 2, 1, nullptr};
    c.p.init(a);
    c.p.init(b);
    c.out["distinct"] = a.ctx != nullptr && b.ctx != nullptr && a.ctx != b.ctx;
    c.p.finalize(a.ctx);
    c.p.finalize(b.ctx);
    c.out["contexts"] = reused_ok;
    dlclose(c.p.lib);
}

TEST_CASE("17. more communicators over the process's life than context slots", "[profiler-replay]")
{
    Outcome o = run_child("many-comms", {{"VIGIL_PROFILE_DIR", ""}}, body_many_comms);
    REQUIRE_CHILD_OK(o);
    CHECK(o.drv["contexts"] == 1100);
    CHECK(o.drv["distinct"] == true);
}

// ---- scenario 18: a forked child exits -----------------------------------------------------
// Data-loader workers fork a process that has live communicators and may leave with exit():
// the child must not write the parent's buffered output (or anything) into its files, must
// not try to stop a writer thread that does not exist in it, must not be caught with a heap
// the writer thread was in the middle of changing (GCC 12's AddressSanitizer allocator has no
// fork handler: the child's leak check at exit then waits forever for the writer's lock), and
// must not unlink the parent's counters segment (`vigil export` reads it) when it leaves after
// the parent finalized its last communicator.

#if defined(__SANITIZE_ADDRESS__)
// LeakSanitizer's check at exit is not reliable in a process forked from a multithreaded one
// with GCC 12's runtime: its thread registry keeps the parent's thread ids ("Running thread N
// was not suspended") and its tracer can crash on them (the child then exits 1). The runtime
// asks this hook (sanitizer/lsan_interface.h) before it checks; the children of scenario 18
// say no; the test's own process is checked as usual.
static std::atomic<bool> g_no_leak_check{false};
extern "C" __attribute__((used, visibility("default"))) int __lsan_is_turned_off()
{
    return g_no_leak_check.load() ? 1 : 0;
}
#endif

/// Forks a child that leaves with exit(0) (static destructors and atexit handlers run in it)
/// and returns its exit code (128 + signal when killed).
int fork_and_exit()
{
    const pid_t child = fork();
    if (child == 0) {
        alarm(30); // not inherited from the scenario's alarm; a hang is reported as SIGALRM
#if defined(__SANITIZE_ADDRESS__)
        g_no_leak_check = true;
#endif
        std::exit(0);
    }
    if (child < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

/// This process's profiler counters segments in /dev/shm ("vigilprof-<uid>-<pid>-<token>").
int own_counter_segments()
{
    const std::string pre = "vigilprof-" + std::to_string(getuid()) + "-" + std::to_string(getpid()) + "-";
    int n = 0;
    for (const auto &de : fs::directory_iterator("/dev/shm"))
        if (de.path().filename().string().rfind(pre, 0) == 0) ++n;
    return n;
}

void body_fork_exit(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Comm comm{0xf0f0ull, 0, 2, 1, "fork"};
    if (c.p.init(comm) != ncclSuccess || comm.ctx == nullptr) throw std::runtime_error("init failed");
    auto coll = [&](uint64_t seq) {
        Descr d{};
        d.type = ncclProfileColl;
        d.coll.seqNumber = seq;
        d.coll.func = "AllReduce";
        d.coll.datatype = "ncclFloat32";
        d.coll.count = 256;
        d.coll.nChannels = 1;
        void *h = nullptr;
        c.p.start_raw(comm.ctx, &h, d);
        c.p.stop(h);
    };
    // Forks at random points of the writer's 5 ms drain cycle, each after new records for it.
    std::vector<int> exits;
    uint64_t seq = 0;
    for (int k = 0; k < 8; ++k) {
        for (int j = 0; j < 3; ++j) coll(seq++);
        std::this_thread::sleep_for(std::chrono::microseconds(700 * k));
        exits.push_back(fork_and_exit());
    }
    c.out["child_exits"] = exits;
    for (int j = 0; j < 3; ++j) coll(seq++);
    c.out["colls"] = seq;
    if (c.p.finalize(comm.ctx) != ncclSuccess) throw std::runtime_error("finalize failed");
    c.out["segments_before"] = own_counter_segments();
    c.out["last_child_exit"] = fork_and_exit(); // no communicator left: the child releases everything it may
    c.out["segments_after"] = own_counter_segments();
}

TEST_CASE("18. a forked child exits with the parent's communicator alive", "[profiler-replay]")
{
    Outcome o = run_child("fork-exit", {}, body_fork_exit);
    REQUIRE_CHILD_OK(o);
    INFO("scenario dir " << o.dir);
    CHECK(o.drv["child_exits"] == std::vector<int>(8, 0));
    CHECK(o.drv["last_child_exit"] == 0);
    CHECK(o.drv["segments_before"] == 1);
    CHECK(o.drv["segments_after"] == 1); // the parent's segment outlives the child
    CHECK(o.bad_lines.empty());
    CHECK(o.of("process").size() == 1);
    CHECK(o.of("stats").size() == 1);
    std::vector<uint64_t> seqs, want(o.drv.value("colls", uint64_t{0}));
    for (const json &l : o.of("coll")) seqs.push_back(l["seq"].get<uint64_t>());
    for (uint64_t i = 0; i < want.size(); ++i) want[i] = i;
    CHECK(want.size() == 27);
    CHECK(seqs == want);
    CHECK(o.trace_error == "");
}

// ---- scenarios 19-22: the shapes of real GPU runs ----------------------------------------

/// One communicator with its proxy thread and user, whose works `tweak` shapes (the n-th work
/// posted is tweak(w, n)), all-reducing one collective per group.
struct Job {
    Comm comm;
    Proxy proxy;
    User user;
    json tasks = json::array();
    int posted = 0;
    std::function<void(Work &, int)> tweak;
    Job(Child &c, Comm cm, std::function<void(Work &, int)> shape)
        : comm(cm), proxy(c), user(c.p), tweak(std::move(shape))
    {
        init_or_fail(c, comm);
        user.post = [this](Task &t) {
            Work w = work_for(t);
            w.log = true;
            w.step_ns = 2000;
            tweak(w, posted++);
            proxy.post(std::move(w));
        };
    }
    /// `n` groups of one all-reduce each, issued back to back; then waits for the launches.
    void all_reduce(int n, size_t count)
    {
        for (int i = 0; i < n; ++i) {
            user.group_start();
            user.all_reduce(comm, count, 2);
            for (const Task &t : user.group_end()) tasks.push_back(task_log(t));
        }
        user.wait_launch();
    }
};

// Scenario 19: v7 (NCCL 2.31): user tags, kernel phases, a mask RAS changes.

constexpr uint64_t kV7Hash = 0x7a7a000000000019ull;

void body_v7(Child &c)
{
    load_or_fail(c, plugin_path(), 7);
    bool kernel = true;
    Job job(c, Comm{kV7Hash, 1, 2, 2, "v7"}, [&](Work &w, int) {
        w.kernel = kernel;
        w.phases = kernel;
    });
    c.out["mask_after_init"] = g_mask;
    for (int i = 0; i < 4; ++i) {
        job.user.user_tag = 1000 + static_cast<uint64_t>(i);
        job.all_reduce(1, 65536);
    }
    job.proxy.wait_idle();
    // RAS switches kernel-channel events off from its own thread (NCCL >= 2.31): collectives
    // started from now on get none, and must not wait for them.
    std::thread ras([] { __atomic_and_fetch(&g_mask, ~ncclProfileKernelCh, __ATOMIC_RELAXED); });
    ras.join();
    kernel = false;
    job.user.user_tag = 0;
    job.all_reduce(3, 65536);
    job.proxy.finish();
    std::this_thread::sleep_for(std::chrono::milliseconds(350)); // past the settle time
    __atomic_or_fetch(&g_mask, ncclProfileKernelCh, __ATOMIC_RELAXED);
    finalize_all(c, {&job.comm});
}

TEST_CASE("19. v7 (NCCL 2.31): user tags, kernel phases, a mask RAS changes after init", "[profiler-replay]")
{
    Outcome o = run_child("v7", {{"VIGIL_PROFILE_EVENTS", "all"}}, body_v7);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    CHECK(o.drv["version"] == 7);
    CHECK(o.process()["abi"] == "v7");
    CHECK((o.drv["mask_after_init"].get<int>() & ncclProfileKernelPhase) != 0);
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 7);
    for (size_t i = 0; i < colls.size(); ++i) {
        const json &r = colls[i];
        INFO("coll " << raw(r));
        CHECK(r["seq"] == i);
        if (i < 4) {
            CHECK(r["user_tag"] == 1000 + i);
            CHECK(r["timing"] == "kernel_gpu");
            CHECK(r["channels_timed"] == 2);
        } else {
            // Kernel channels off: timed by the network work, written without waiting.
            CHECK_FALSE(r.contains("user_tag"));
            CHECK(r["timing"] == "proxy_cpu");
        }
    }
    const json st = o.stats();
    REQUIRE_NO_DROPS(st);
    CHECK(st["kernel_timeouts"] == 0);
    CHECK(st["kernel_anomalies"] == 0);
    CHECK(st["orphans"] == 0);
    CHECK(st["events"] == o.drv["started"]);
    // Three phases per channel of the first four collectives, named by NCCL, on their tracks.
    size_t phases = 0;
    for (const json &e : o.events("X"))
        if (e["name"] == "initial_sync" || e["name"] == "compute" || e["name"] == "final_sync") ++phases;
    CHECK(phases == 4 * 2 * 3);
    CHECK_FALSE(o.tid_of("ch 0 kernel phases").is_null());
}

// ---- scenario 20: a kernel channel that never comes ------------------------------------

void body_missing_channel(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Job job(c, Comm{0x0a155e0000000020ull, 0, 2, 2, nullptr}, [](Work &w, int n) {
        if (n == 0) w.drop_channel = 1; // the first collective's channel 1 is lost
    });
    job.all_reduce(6, 4096);
    job.proxy.wait_idle();
    std::this_thread::sleep_for(std::chrono::milliseconds(600)); // past the kernel timeout
    // One more: written in a regular pass, after the first one's timeout and before finalize.
    job.all_reduce(1, 4096);
    job.proxy.finish();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    finalize_all(c, {&job.comm});
}

TEST_CASE("20. a kernel channel that never comes neither stalls nor leaks", "[profiler-replay]")
{
    Outcome o = run_child("missing-channel", {{"VIGIL_PROFILE_KERNEL_TIMEOUT_MS", "300"}}, body_missing_channel);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    // Written in completion order: the five whole ones at once (not held back by the first),
    // then the first at its timeout, then the one issued after the timeout.
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 7);
    std::vector<int> order;
    for (const json &r : colls) order.push_back(r["seq"].get<int>());
    CHECK(order == std::vector<int>{1, 2, 3, 4, 5, 0, 6});
    const json &first = colls[5];
    CHECK(first["timing"] == "kernel_gpu");
    CHECK(first["channels_timed"] == 1);
    for (size_t i : {0u, 1u, 2u, 3u, 4u, 6u}) CHECK(colls[i]["channels_timed"] == 2);
    const json st = o.stats();
    CHECK(st["kernel_timeouts"] == 1);
    CHECK(st["orphans"] == 0);
}

// ---- scenario 21: kernel stamps of another task (NVIDIA/nccl#2368) -----------------------

void body_bad_stamps(Child &c)
{
    load_or_fail(c, plugin_path(), 6);
    Job job(c, Comm{0xbad5000000000021ull, 0, 2, 2, nullptr}, [](Work &w, int n) {
        w.bad_stamps = n == 2 ? 1 : n == 4 ? 2 : 0; // the 3rd ends before it begins, the 5th 3 s early
    });
    job.all_reduce(6, 4096);
    job.proxy.finish();
    finalize_all(c, {&job.comm});
}

TEST_CASE("21. kernel stamps of another task are detected, not printed", "[profiler-replay]")
{
    Outcome o = run_child("bad-stamps", {}, body_bad_stamps);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 6);
    for (const json &r : colls) {
        INFO("coll " << raw(r));
        const bool bad = r["seq"] == 2 || r["seq"] == 4;
        CHECK(r["timing"] == (bad ? "invalid" : "kernel_gpu"));
        CHECK(r["duration_us"].is_null() == bad);
        CHECK(r.contains("busbw_GBps") == !bad);
        if (bad) CHECK(r["channels_invalid"] == 2);
    }
    CHECK(o.stats()["kernel_anomalies"] == 2);
    size_t warned = 0;
    for (const json &w : o.drv["warns"]) warned += w.get<std::string>().find("nccl#2368") != std::string::npos;
    CHECK(warned == 1); // once per process
}

// ---- scenario 22: the shapes a real GPU gives ----------------------------------------------

void body_gpu_shapes(Child &c)
{
    load_or_fail(c, plugin_path(), 5);
    Job job(c, Comm{0x69b0000000000022ull, 0, 2, 2, nullptr}, [](Work &w, int n) {
        if (n < 4) {
            w.kernel_ns = 20'000'000; // four issued back to back: each runs 20 ms, in turn
        } else {
            // A small kernel that ran before the proxy saw it, and before NCCL stamped
            // S(Coll): stamps 300 us in the past.
            w.gpu_shift_ns = -300'000;
        }
    });
    job.all_reduce(4, 16 << 20);
    job.proxy.wait_idle();
    job.all_reduce(1, 256);
    job.proxy.finish();
    c.out["tasks"] = job.tasks;
    finalize_all(c, {&job.comm});
}

TEST_CASE("22. queued and eagerly launched collectives: durations are GPU time", "[profiler-replay]")
{
    Outcome o = run_child("gpu-shapes", {}, body_gpu_shapes);
    REQUIRE_CHILD_OK(o);
    REQUIRE_FILES_OK(o);
    INFO("scenario dir " << o.dir << "\ndriver " << o.drv.dump());
    auto colls = o.of("coll");
    REQUIRE(colls.size() == 5);
    const json &plog = o.drv["proxy_log"];
    REQUIRE(plog.size() == 5);
    double prev_queue = -1;
    for (size_t i = 0; i < 4; ++i) {
        const json &r = colls[i];
        INFO("coll " << raw(r));
        CHECK(r["seq"] == i);
        check_kernel_duration(r, o.drv["tasks"][i], plog[i]);
        // Each is its own channels' GPU time (checked above to the stamps): its 20 ms and its
        // network steps, not the queue before it.
        CHECK(r["duration_us"].get<double>() >= 20'000);
        // ...but in its queueing time, which grows down the queue.
        CHECK(r["queue_us"].get<double>() > prev_queue);
        prev_queue = r["queue_us"].get<double>();
    }
    CHECK(prev_queue >= 40'000);
    const json &small = colls[4];
    INFO("small " << raw(small));
    check_kernel_duration(small, o.drv["tasks"][4], plog[4]);
    CHECK(small["duration_us"].get<double>() > 0);
    CHECK(small["queue_us"].get<double>() >= 0);
    CHECK(o.stats()["kernel_anomalies"] == 0);
}
