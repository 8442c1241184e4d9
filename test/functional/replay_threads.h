// SPDX-License-Identifier: Apache-2.0
// The threads of the profiler replay (test_profiler_replay*.cc): the user thread's calls, the
// launch of a plan, and NCCL's proxy progress thread, each calling the profiler like NCCL.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "replay_nccl.h"

namespace replay {

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
inline void launch_plan(Prof &p, Comm &c, std::vector<Task *> &tasks, const std::function<void(Task &)> &post)
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

inline size_t step_size(const Work &w, int k) { return w.step_bytes + 64 * static_cast<size_t>(k); }

inline void run_work(Child &c, Work &w)
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

inline Work work_for(const Task &t)
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

} // namespace replay
