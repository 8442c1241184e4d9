// SPDX-License-Identifier: Apache-2.0
// Profiler core: contexts, event selection, init/finalize and the hot-path entry points.
#include "profiler.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string_view>

#include "clock.h"
#include "log.h"
#include "params.h"
#include "recorder.h"
#include "writer.h"

namespace vigil::prof {

namespace {

Context g_contexts[kMaxContexts];

std::mutex g_init_mu;   // init/finalize only
int g_refs = 0;         // live contexts
bool g_broken = false;  // bad parameters: every context is NULL
std::atomic<uint32_t> g_recorded{0};
// NCCL's activation mask (one process-wide int; reference in profiler.h): read at each
// Coll/P2p start, since RAS may rewrite it from its own thread (NCCL >= 2.31). Kept only
// while a communicator is live.
std::atomic<int *> g_nccl_mask{nullptr};
int64_t g_mono_to_real = 0;
pid_t g_pid = 0;
WriterConfig g_writer_cfg; // from the parameters, read when no communicator is live

/// A free context slot (never used, or finalized: NCCL sends nothing for a finalized
/// communicator, and its records were drained at finalize), or 0. Under g_init_mu.
uint16_t free_context()
{
    for (uint16_t i = 1; i < kMaxContexts; ++i)
        if (g_contexts[i].magic == 0 || !g_contexts[i].live.load(std::memory_order_relaxed)) return i;
    return 0;
}

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

struct Name {
    std::string_view word;
    uint32_t bits;
};
constexpr Name kNames[] = {
    {"group", bit(Kind::kGroup)},
    {"coll", bit(Kind::kColl)},
    {"p2p", bit(Kind::kP2p)},
    {"proxy-op", bit(Kind::kProxyOp)},
    {"proxy-step", bit(Kind::kProxyStep)},
    {"proxy-ctrl", bit(Kind::kProxyCtrl)},
    {"kernel-ch", bit(Kind::kKernelCh)},
    {"kernel-phase", bit(Kind::kKernelPhase)},
    {"net", bit(Kind::kNet)},
    {"api", bit(Kind::kGroupApi) | bit(Kind::kCollApi) | bit(Kind::kP2pApi) | bit(Kind::kKernelLaunch)},
};
constexpr uint32_t kAll = ((1u << static_cast<unsigned>(Kind::kLegacyCount)) - 1) | bit(Kind::kKernelPhase);

int64_t calibrate()
{
    // The tightest of several realtime reads bracketed by monotonic ones.
    int64_t best_span = INT64_MAX, offset = 0;
    for (int i = 0; i < 16; ++i) {
        timespec a, r, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        clock_gettime(CLOCK_REALTIME, &r);
        clock_gettime(CLOCK_MONOTONIC, &b);
        const int64_t ma = a.tv_sec * 1'000'000'000ll + a.tv_nsec, mb = b.tv_sec * 1'000'000'000ll + b.tv_nsec;
        const int64_t rr = r.tv_sec * 1'000'000'000ll + r.tv_nsec;
        if (mb - ma < best_span) {
            best_span = mb - ma;
            offset = rr - (ma + (mb - ma) / 2);
        }
    }
    return offset;
}

} // namespace

bool parse_events(const std::string &text, Selection *out, std::string *why)
{
    uint32_t mask = 0;
    std::string_view s = text;
    if (!s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos) {
        char *end = nullptr;
        const unsigned long v = std::strtoul(text.c_str(), &end, 10);
        if (v > 0xffff) {
            *why = "mask " + text + " has bits beyond NCCL's event types (0-15)";
            return false;
        }
        mask = static_cast<uint32_t>(v) & kAll; // CE bits (12-14): never recorded
    } else {
        while (!s.empty()) {
            const size_t comma = s.find(',');
            std::string_view w = s.substr(0, comma);
            s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
            while (!w.empty() && std::isspace(static_cast<unsigned char>(w.front()))) w.remove_prefix(1);
            while (!w.empty() && std::isspace(static_cast<unsigned char>(w.back()))) w.remove_suffix(1);
            if (w.empty()) continue;
            if (w == "all") {
                mask = kAll;
                continue;
            }
            bool found = false;
            for (const Name &n : kNames)
                if (n.word == w) {
                    mask |= n.bits;
                    found = true;
                }
            if (!found) {
                *why = "unknown event type '" + std::string(w) +
                       "' (known: group, coll, p2p, proxy-op, proxy-step, proxy-ctrl, kernel-ch, kernel-phase, "
                       "net, api, all)";
                return false;
            }
        }
    }
    uint32_t rec = mask;
    // Every event below a collective is tied back to it, and the summary needs the
    // collective, so Coll/P2p are always recorded. Net events are children of proxy steps
    // (the net plugin never starts one without its parent), steps of proxy ops.
    if (rec & bit(Kind::kNet)) rec |= bit(Kind::kProxyStep);
    // A phase is tied to its collective through its kernel channel (NCCL >= 2.31 forces
    // kernel-channel events on with phases, too).
    if (rec & bit(Kind::kKernelPhase)) rec |= bit(Kind::kKernelCh);
    if (rec & bit(Kind::kProxyStep)) rec |= bit(Kind::kProxyOp);
    rec |= bit(Kind::kColl) | bit(Kind::kP2p);
    // The user's call (CollApi/P2pApi start, v5+) is a collective's enqueue time, the start
    // of its queueing (docs/profiler.md, "Timing"): one more event per collective.
    rec |= bit(Kind::kCollApi) | bit(Kind::kP2pApi);
    // NCCL 2.27 (v4 native) starts no Coll/P2p when the Group handle is NULL
    // (docs/nccl-abi.md, "Profiler calls and handles"), so groups get real handles too.
    rec |= bit(Kind::kGroup);
    out->traced = mask;
    out->recorded = rec;
    return true;
}

std::string events_text(uint32_t mask)
{
    std::string s;
    uint32_t named = 0;
    for (const Name &n : kNames)
        if ((mask & n.bits) == n.bits) {
            // Appends, not `"," + std::string`: a bogus GCC 12 -Wrestrict at -O3 (bug 105329).
            if (!s.empty()) s += ',';
            s += n.word;
            named |= n.bits;
        }
    if (const uint32_t rest = mask & ~named) { // e.g. one API bit of a numeric mask
        char b[16];
        std::snprintf(b, sizeof(b), "0x%x", rest);
        if (!s.empty()) s += ',';
        s += b;
    }
    return s.empty() ? "none" : s;
}

Context *context_of(void *p) noexcept
{
    const auto a = reinterpret_cast<uintptr_t>(p);
    const auto lo = reinterpret_cast<uintptr_t>(&g_contexts[0]);
    const auto hi = reinterpret_cast<uintptr_t>(&g_contexts[kMaxContexts]);
    if (a < lo || a >= hi || (a - lo) % sizeof(Context) != 0) return nullptr;
    Context *c = static_cast<Context *>(p);
    return c->magic == kContextMagic && c->live.load(std::memory_order_acquire) ? c : nullptr;
}

const Context *context_at(uint16_t i) noexcept
{
    return i > 0 && i < kMaxContexts && g_contexts[i].magic == kContextMagic ? &g_contexts[i] : nullptr;
}

int64_t mono_to_realtime_ns() noexcept { return g_mono_to_real; }

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
        if (g_mono_to_real == 0) g_mono_to_real = calibrate();
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
    const uint16_t i = free_context();
    if (i == 0) {
        VLOG_WARN("more than %u live communicators; events of comm 0x%llx are not recorded", kMaxContexts - 1u,
                  static_cast<unsigned long long>(comm_hash));
        return ncclSuccess;
    }
    Context &c = g_contexts[i];
    c.index = i;
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
