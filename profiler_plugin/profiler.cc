// SPDX-License-Identifier: Apache-2.0
// Profiler core: init/finalize of communicator contexts and the hot-path entry points.
#include "profiler.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "clock.h"
#include "log.h"
#include "params.h"
#include "recorder.h"
#include "writer.h"

namespace vigil::prof {

namespace {

std::mutex g_init_mu;   // init/finalize only
int g_refs = 0;         // live contexts
bool g_broken = false;  // bad parameters: every context is NULL
std::atomic<uint32_t> g_recorded{0};
// NCCL's activation mask (one process-wide int: docs/nccl-abi.md, "Profiler versions and
// shims"): read at each Coll/P2p start, since RAS may rewrite it from its own thread
// (NCCL >= 2.31). Kept only while a communicator is live.
std::atomic<int *> g_nccl_mask{nullptr};
pid_t g_pid = 0;
WriterConfig g_writer_cfg; // from the parameters, read when no communicator is live

/// At exit with communicators still alive (most jobs never destroy theirs), the writer is
/// stopped so the files end complete; at unload (every communicator finalized) the pools and
/// the counters segment are given back. Static objects of this library are destroyed at
/// both, after the thread_local pool claims of the exiting thread.
struct Lifetime {
    ~Lifetime()
    {
        std::unique_lock<std::mutex> g(g_init_mu, std::try_to_lock); // another thread may be
        if (!g.owns_lock()) return;                                  // stuck in init at exit
        stop_writer(); // a no-op in a forked child: the writer's fork handler says none runs
        if (g_refs == 0 && Recorder::instance().release()) release_writer();
    }
} g_lifetime;

} // namespace

ncclResult_t init(void **context, uint64_t comm_hash, int *mask, const char *name, int nnodes, int nranks, int rank,
                  ncclDebugLogger_t logfn, int abi)
{
    *context = nullptr;
    if (logfn != nullptr) log::set_logger(logfn);
    std::lock_guard<std::mutex> g(g_init_mu);
    if (g_refs == 0 && !g_broken) {
        ParamLoad load = load_params(environment_source());
        Selection sel;
        std::string why;
        // VIGIL_PROFILE_* values are Observe ones: a bad value costs a WARN and its default.
        (void)report_params(load, ParamScope::Profiler);
        bool ok = true;
        if (!parse_events(load.values.profile_events, &sel, &why)) {
            const std::string def = Params{}.profile_events;
            VLOG_WARN("bad value VIGIL_PROFILE_EVENTS=\"%s\": %s; using the default %s",
                      load.values.profile_events.c_str(), why.c_str(), def.c_str());
            ok = parse_events(def, &sel, &why);
        }
        RecorderConfig rc;
        rc.threads = static_cast<uint32_t>(load.values.profile_threads);
        rc.pool = static_cast<uint32_t>(load.values.profile_pool);
        rc.ring = static_cast<uint32_t>(load.values.profile_ring);
        if (ok && Recorder::instance().configure(rc) != 0) {
            VLOG_WARN("cannot reserve the event pools (%u threads x %u events): %s; profiling is off", rc.threads,
                      rc.pool, std::strerror(ENOMEM));
            ok = false;
        }
        calibrate_clock();
        g_pid = getpid();
        if (ok) {
            WriterConfig &wc = g_writer_cfg;
            wc.dir = load.values.profile_dir;
            wc.max_bytes = static_cast<uint64_t>(load.values.profile_max_bytes);
            wc.kernel_timeout_ns = static_cast<uint64_t>(load.values.profile_kernel_timeout_ms) * 1'000'000ull;
            wc.traced = sel.traced;
            wc.recorded = sel.recorded;
            wc.abi = abi;
            g_recorded.store(sel.recorded, std::memory_order_release);
            VLOG_INFO(NCCL_INIT | NCCL_PROFILE, "profiler v%d: recording %s (mask 0x%x), files %s", abi,
                      events_text(sel.traced).c_str(), sel.recorded,
                      wc.dir.empty() ? "off" : wc.dir.c_str());
        } else {
            g_broken = true;
            g_recorded.store(0, std::memory_order_release);
        }
    }
    // The mask is one process-wide int shared by every communicator (docs/nccl-abi.md,
    // "Profiler versions and shims"): every init writes the same value, so the last writer
    // cannot disagree.
    *mask = static_cast<int>(g_recorded.load(std::memory_order_relaxed));
    if (g_broken) return ncclSuccess;
    g_nccl_mask.store(mask, std::memory_order_release);
    Context *slot = free_context();
    if (slot == nullptr) {
        VLOG_WARN("more than %u live communicators; events of comm 0x%llx are not recorded", kMaxContexts - 1u,
                  static_cast<unsigned long long>(comm_hash));
        return ncclSuccess;
    }
    Context &c = *slot;
    c.comm_hash = comm_hash;
    std::snprintf(c.name, sizeof(c.name), "%s", name ? name : "");
    c.rank = rank;
    c.nranks = nranks;
    c.nnodes = nnodes;
    c.abi = abi;
    c.init_ns = now_ns();
    c.magic = kContextMagic;
    if (g_refs == 0) { // the writer runs exactly while a context is live
        std::string why;
        if (start_writer(g_writer_cfg, &why) != 0)
            VLOG_WARN("VIGIL_PROFILE_DIR=\"%s\": %s; profiling continues without files", g_writer_cfg.dir.c_str(),
                      why.c_str());
    }
    writer_add_context(c);
    ++g_refs;
    c.live.store(true, std::memory_order_release);
    *context = &c;
    return ncclSuccess;
}

ncclResult_t finalize(void *context)
{
    std::lock_guard<std::mutex> g(g_init_mu);
    Context *c = context_of(context);
    if (c == nullptr) return ncclSuccess;
    writer_finalize_context(*c);
    c->live.store(false, std::memory_order_release); // its slot may be reused from now on
    if (--g_refs == 0) {
        g_nccl_mask.store(nullptr, std::memory_order_release);
        stop_writer();
    }
    return ncclSuccess;
}

void flush() noexcept { flush_writer(); }

bool kernel_channels_due() noexcept
{
    if (!(g_recorded.load(std::memory_order_relaxed) & bit(Kind::kKernelCh))) return false;
    const int *m = g_nccl_mask.load(std::memory_order_acquire);
    // NCCL's mask is a plain int another thread may store to: read it as an atomic.
    return m == nullptr || (__atomic_load_n(m, __ATOMIC_RELAXED) & static_cast<int>(bit(Kind::kKernelCh))) != 0;
}

Record *open_event(void *context, Kind kind, void *parent, void **eHandle, int op_pid) noexcept
{
    // Always written: NCCL keeps whatever is there
    // (docs/nccl-abi.md, "Profiler calls and handles").
    *eHandle = nullptr;
    if (!(g_recorded.load(std::memory_order_relaxed) & bit(kind))) return nullptr;
    const uint64_t ph = reinterpret_cast<uint64_t>(parent);
    // PXN: an op posted by another process; its context and parent are that process's
    // pointers and are never touched (docs/nccl-abi.md, "Profiler calls and handles").
    const bool foreign = kind == Kind::kProxyOp && op_pid != 0 && op_pid != g_pid;
    // A step's ProxyOp and a net event's step were opened by this same proxy thread: the
    // only parents whose records may be read (another thread's slot can be reused under the
    // reader). Their context wins over the one NCCL passes, which under PXN is foreign too.
    // Likewise a kernel phase's channel (both on NCCL's profiler thread).
    const bool child = kind == Kind::kProxyStep || kind == Kind::kNet || kind == Kind::kKernelPhase;
    const Record *own = child ? Recorder::instance().peek_own(ph) : nullptr;
    Context *ctx = nullptr;
    if (!foreign && own == nullptr) {
        ctx = context_of(context);
        if (ctx == nullptr && !child) return nullptr;
    }
    uint64_t h;
    Record *r = Recorder::instance().open(kind, now_ns(), &h);
    if (r == nullptr) return nullptr;
    r->ctx = own ? own->ctx : ctx ? ctx->index : 0;
    if (foreign) {
        r->flags = kFlagForeign;
    } else if (own != nullptr) {
        r->parent = own->id;
        r->root = own->root;
        r->flags |= own->flags & kFlagForeign;
        if (kind == Kind::kProxyStep && own->kind == Kind::kProxyOp) {
            r->step.channel = own->op.channel;
            r->step.is_send = own->op.is_send;
        }
    } else if (Recorder::is_ours(ph)) {
        // Another thread's event, never read: kept as a name. For a ProxyOp or KernelCh it is
        // the Coll/P2p, usually stopped already (it stops once enqueued, before its proxy ops
        // and kernel channels start; docs/nccl-abi.md, "Profiler calls and handles"): the
        // writer ties them by it.
        r->parent = ph;
        if (kind == Kind::kProxyOp || kind == Kind::kKernelCh) r->root = ph;
    }
    if (kind == Kind::kProxyStep && own == nullptr) r->step.channel = 255;
    if ((kind == Kind::kColl || kind == Kind::kP2p) && kernel_channels_due()) r->flags |= kFlagKernelCh;
    *eHandle = reinterpret_cast<void *>(h);
    return r;
}

void record_state(void *eHandle, int state, uint64_t arg, bool has_arg) noexcept
{
    if (eHandle == nullptr) return;
    Record *r = Recorder::instance().find(reinterpret_cast<uint64_t>(eHandle));
    if (r == nullptr) return;
    const uint64_t now = now_ns();
    const uint64_t dt64 = now - r->start_ns;
    const uint32_t dt = dt64 > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(dt64);
    switch (r->kind) {
    case Kind::kProxyStep: {
        const int k = r->nstates < kMaxStates ? r->nstates++ : kMaxStates - 1;
        r->step.state[k] = static_cast<uint8_t>(state);
        r->step.at_ns[k] = dt;
        // transSize is meaningful at SendWait (9) and RecvFlushWait (11) only
        // (docs/nccl-abi.md, "Profiler calls and handles").
        if (has_arg && (state == 9 || state == 11)) r->step.trans_size = arg;
        break;
    }
    case Kind::kProxyOp:
        if (state == 19 && r->op.in_progress_ns == 0) r->op.in_progress_ns = now;
        break;
    case Kind::kKernelCh:
        if (state == 22 && has_arg) r->kch.gpu_stop_ns = arg;
        break;
    case Kind::kKernelPhase:
        if (state == 31 && has_arg) r->phase.gpu_stop_ns = arg;
        break;
    case Kind::kProxyCtrl: {
        const int k = r->nstates < kMaxStates ? r->nstates++ : kMaxStates - 1;
        r->ctrl.state[k] = static_cast<uint8_t>(state);
        r->ctrl.at_ns[k] = dt;
        if (has_arg && state == 18) r->ctrl.appended = static_cast<int32_t>(arg);
        break;
    }
    case Kind::kGroupApi:
        // 23/24: the end of ncclGroupStart and the start of ncclGroupEnd.
        if (state == 23) r->api.start_stop_ns = dt;
        if (state == 24) r->api.end_start_ns = dt;
        break;
    default:
        break;
    }
}

void stop_event(void *eHandle) noexcept
{
    if (eHandle == nullptr) return;
    Record *r = Recorder::instance().find(reinterpret_cast<uint64_t>(eHandle));
    if (r == nullptr) return;
    Recorder::instance().close(r, now_ns());
}

} // namespace vigil::prof
