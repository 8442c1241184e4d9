// SPDX-License-Identifier: Apache-2.0
// vigil-profbench: cost of the profiler's hot path, measured through the ncclProfiler_v6
// table exactly as NCCL calls it (Google Benchmark; not a test). The table and the core are
// linked in (the same objects as libnccl-profiler-vigil.so), so the benchmark can drain the
// rings synchronously every kBatch events with the timer paused: no event ever takes the
// cheaper drop path.
//
//   vigil-profbench [--benchmark_repetitions=5 ...]
//
// Every event type is recorded (VIGIL_PROFILE_EVENTS=all) and the writer thread runs; with
// VIGIL_PROFILE_DIR set it also writes the files, and the summary's stats record shows the
// drop counters (which must be 0).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "nccl_abi/profiler_net_vigil.h"
#include "nccl_abi/profiler_v6.h"
#include "profiler.h"

extern "C" ncclProfiler_v6_t ncclProfiler_v6; // profiler_plugin/abi_profiler.cc

namespace {

constexpr int kBatch = 4096; // below the default ring of 16384 records per thread

ncclProfiler_v6_t *g_prof = nullptr;
void *g_ctx = nullptr;

void drain_pause(benchmark::State &state)
{
    state.PauseTiming();
    vigil::prof::flush(); // the writer takes everything now
    state.ResumeTiming();
}

void *start(ncclProfilerEventDescr_v6_t &d)
{
    void *h = nullptr;
    g_prof->startEvent(g_ctx, &h, &d);
    return h;
}

/// A ProxyOp that stays open: the parent of the measured steps, as on NCCL's proxy thread.
void *open_op()
{
    ncclProfilerEventDescr_v6_t d{};
    d.type = ncclProfileProxyOp;
    d.proxyOp.pid = getpid();
    d.proxyOp.channelId = 1;
    d.proxyOp.isSend = 1;
    return start(d);
}

/// startEvent + stopEvent of a ProxyStep (the most frequent event).
void BM_StepStartStop(benchmark::State &state)
{
    void *op = open_op();
    ncclProfilerEventDescr_v6_t d{};
    d.type = ncclProfileProxyStep;
    d.parentObj = op;
    int n = 0;
    for (auto _ : state) {
        d.proxyStep.step = n;
        void *h = start(d);
        g_prof->stopEvent(h);
        if (++n % kBatch == 0) drain_pause(state);
    }
    g_prof->stopEvent(op);
}

/// recordEventState on an open ProxyStep (NCCL records 3 per step).
void BM_StepRecordState(benchmark::State &state)
{
    void *op = open_op();
    ncclProfilerEventDescr_v6_t d{};
    d.type = ncclProfileProxyStep;
    d.parentObj = op;
    void *h = start(d);
    ncclProfilerEventStateArgs_v6_t a{};
    a.proxyStep.transSize = 1 << 20;
    int n = 0;
    for (auto _ : state) {
        g_prof->recordEventState(h, ncclProfilerProxyStepSendWait, &a);
        if (++n % 1024 == 0) { // a step keeps its first states; restart it now and then
            state.PauseTiming();
            g_prof->stopEvent(h);
            h = start(d);
            state.ResumeTiming();
        }
    }
    g_prof->stopEvent(h);
    g_prof->stopEvent(op);
}

/// A whole step as NCCL makes it on the send side: start, states 8, 20, 9, stop.
void BM_StepFullSend(benchmark::State &state)
{
    void *op = open_op();
    ncclProfilerEventDescr_v6_t d{};
    d.type = ncclProfileProxyStep;
    d.parentObj = op;
    ncclProfilerEventStateArgs_v6_t a{};
    a.proxyStep.transSize = 1 << 20;
    int n = 0;
    for (auto _ : state) {
        d.proxyStep.step = n;
        void *h = start(d);
        g_prof->recordEventState(h, ncclProfilerProxyStepSendGPUWait, &a);
        g_prof->recordEventState(h, ncclProfilerProxyStepSendPeerWait_v4, &a);
        g_prof->recordEventState(h, ncclProfilerProxyStepSendWait, &a);
        g_prof->stopEvent(h);
        if (++n % kBatch == 0) drain_pause(state);
    }
    g_prof->stopEvent(op);
}

/// A net-plugin window event (start + stop with our descriptor), as our net plugin emits.
void BM_NetEvent(benchmark::State &state)
{
    void *op = open_op();
    ncclProfilerEventDescr_v6_t sd{};
    sd.type = ncclProfileProxyStep;
    sd.parentObj = op;
    void *step = start(sd);
    vigilNetProfDescr_v1_t nd{};
    nd.type = vigilNetProfWindow;
    nd.bytes = 1 << 20;
    nd.busy_ns = 1000;
    ncclProfilerEventDescr_v6_t d{};
    d.type = ncclProfileNetPlugin;
    d.parentObj = step;
    d.netPlugin.id = VIGIL_PROFILER_NET_ID;
    d.netPlugin.data = &nd;
    int n = 0;
    for (auto _ : state) {
        void *h = start(d);
        g_prof->stopEvent(h);
        if (++n % kBatch == 0) drain_pause(state);
    }
    g_prof->stopEvent(step);
    g_prof->stopEvent(op);
}

/// A collective's Coll event (start + stop at enqueue).
void BM_CollStartStop(benchmark::State &state)
{
    ncclProfilerEventDescr_v6_t d{};
    d.type = ncclProfileColl;
    d.coll.func = "AllReduce";
    d.coll.datatype = "ncclFloat32";
    d.coll.algo = "RING";
    d.coll.proto = "SIMPLE";
    d.coll.count = 1 << 20;
    d.coll.nChannels = 2;
    uint64_t seq = 0;
    int n = 0;
    for (auto _ : state) {
        d.coll.seqNumber = seq++;
        void *h = start(d);
        g_prof->stopEvent(h);
        if (++n % kBatch == 0) drain_pause(state);
    }
}

/// stopEvent(NULL) and a foreign handle: what a tolerant plugin pays for NCCL's stale handles.
void BM_StopForeign(benchmark::State &state)
{
    int x = 0;
    for (auto _ : state) {
        g_prof->stopEvent(nullptr);
        g_prof->stopEvent(&x);
    }
}

BENCHMARK(BM_StepStartStop);
BENCHMARK(BM_StepRecordState);
BENCHMARK(BM_StepFullSend);
BENCHMARK(BM_NetEvent);
BENCHMARK(BM_CollStartStop);
BENCHMARK(BM_StopForeign);

} // namespace

int main(int argc, char **argv)
{
    g_prof = &ncclProfiler_v6;
    setenv("VIGIL_PROFILE_EVENTS", "all", 0);
    int mask = 0;
    if (g_prof->init(&g_ctx, 0x7e57ull, &mask, "profbench", 1, 2, 0, nullptr) != ncclSuccess || g_ctx == nullptr) {
        std::fprintf(stderr, "vigil-profbench: profiler init failed\n");
        return 1;
    }
    std::printf("# profiler %s, mask 0x%x, VIGIL_PROFILE_DIR=%s\n", g_prof->name, mask,
                std::getenv("VIGIL_PROFILE_DIR") ? std::getenv("VIGIL_PROFILE_DIR") : "(none)");
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    g_prof->finalize(g_ctx);
    return 0;
}
