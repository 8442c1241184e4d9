// SPDX-License-Identifier: Apache-2.0
// The profiler's writer thread (writer.h): its start and stop, the files it writes, fork
// safety, draining the recorder and completing collectives (records.cc formats them).
#include "writer.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

#include "log.h"
#include "output_dir.h"
#include "telemetry/json_text.h"
#include "version.h"
#include "writer_state.h"

namespace vigil::prof {

int datatype_bytes(const char *n) noexcept
{
    if (n == nullptr) return 0;
    struct T {
        const char *name;
        int bytes;
    };
    static constexpr T kTypes[] = {
        {"ncclInt8", 1},     {"ncclUint8", 1},   {"ncclInt32", 4},        {"ncclUint32", 4},
        {"ncclInt64", 8},    {"ncclUint64", 8},  {"ncclFloat16", 2},      {"ncclFloat32", 4},
        {"ncclFloat64", 8},  {"ncclBfloat16", 2}, {"ncclFloat8e4m3", 1},  {"ncclFloat8e5m2", 1},
    };
    for (const T &t : kTypes)
        if (std::strcmp(n, t.name) == 0) return t.bytes;
    return 0;
}

double bus_factor(const char *func, uint64_t count, int type_bytes, int nranks, uint64_t *size) noexcept
{
    const uint64_t b = count * static_cast<uint64_t>(type_bytes);
    const double n = nranks > 0 ? nranks : 1;
    *size = b;
    if (func == nullptr) return 1;
    if (std::strcmp(func, "AllReduce") == 0) return 2 * (n - 1) / n;
    if (std::strcmp(func, "AllGather") == 0 || std::strcmp(func, "ReduceScatter") == 0) {
        *size = b * static_cast<uint64_t>(n); // count is per rank (NCCL's Coll event)
        return (n - 1) / n;
    }
    if (std::strcmp(func, "AlltoAll") == 0) return (n - 1) / n;
    return 1; // Broadcast, Reduce, SendRecv
}


using namespace detail;

Writer &detail::W()
{
    // Never destroyed: a joinable std::thread's destructor would std::terminate a process
    // that exits with communicators alive; the library's Lifetime stops the thread instead.
    static Writer *w = new Writer;
    return *w;
}

namespace {

// fork(): data-loader workers fork processes with live communicators. Before it, the writer
// thread is let finish its cycle and is held off until fork returns (it runs nothing outside
// `mu` once started, and start_writer waits for the start), so the child's copy of the
// writer's state and of the heap is never caught mid-drain (an allocator without fork
// handlers, such as GCC 12's AddressSanitizer runtime, would leave the child a lock held by
// a thread that does not exist there). In the child, single-threaded: the thread, its mutex
// and condition variable are the parent's and are replaced unused (a condition variable with
// a waiter that will never wake can block the next notify); the files and the counters
// segment belong to the parent, so the child closes its descriptors without writing a byte
// and without unlinking the segment.
void before_fork() { W().mu.lock(); }
void after_fork_in_parent() { W().mu.unlock(); }
void after_fork_in_child()
{
    Writer &w = W();
    new (&w.th) std::thread();
    new (&w.cv) std::condition_variable();
    new (&w.mu) std::mutex();
    w.running = false;
    w.stop = false;
    w.trace.forget();
    w.summary.forget();
    std::fill(std::begin(w.comm_entry), std::end(w.comm_entry), nullptr);
    w.metrics.forget();
}

/// Completes collectives: with kernel channels due (kFlagKernelCh), once every channel's
/// KernelCh has arrived, or after kernel_timeout_ns with no news (counted); else once quiet
/// for settle_ns. `all` completes every pending one (of context `only`, or of every context
/// when only < 0). Unclaimed API calls older than the kernel timeout are dropped.
void complete(Writer &w, uint64_t now, bool all, int only = -1)
{
    std::vector<std::pair<const Agg *, bool>> done; // (collective, timed out)
    std::vector<uint64_t> done_ids;
    for (auto it = w.pending.begin(); it != w.pending.end();) {
        Agg &a = it->second;
        const bool mine = only < 0 || a.ctx == only;
        const uint64_t quiet_ns = now - a.touched_ns;
        if (a.have_rec) {
            const uint8_t ch = a.rec.kind == Kind::kColl ? a.rec.coll.channels : a.rec.p2p.channels;
            const bool due = (a.rec.flags & kFlagKernelCh) && ch > 0;
            const bool all_in = due && a.chans.size() >= ch;
            const bool late = due && !all_in && quiet_ns > w.cfg.kernel_timeout_ns;
            if ((mine && all) || all_in || late || (!due && quiet_ns > w.cfg.settle_ns)) {
                done.emplace_back(&a, late || (due && !all_in));
                done_ids.push_back(it->first);
                ++it;
                continue;
            }
        } else if ((mine && all) || quiet_ns > 4 * w.cfg.settle_ns + w.cfg.kernel_timeout_ns) {
            ++w.orphans; // work whose collective record was dropped or came after completion
            it = w.pending.erase(it);
            continue;
        }
        ++it;
    }
    // In arrival order, so a summary reads like the job's timeline.
    std::sort(done.begin(), done.end(), [](const auto &a, const auto &b) { return a.first->rec.start_ns < b.first->rec.start_ns; });
    for (const auto &[a, late] : done) emit_agg(w, *a, late);
    for (uint64_t id : done_ids) w.pending.erase(id);
    // A call is claimed when its collective is written, which may be a kernel timeout after
    // the collective's last event: keep calls well past that.
    const uint64_t keep_ns = 2 * w.cfg.kernel_timeout_ns + 4 * w.cfg.settle_ns;
    for (auto it = w.api_calls.begin(); it != w.api_calls.end();)
        it = now - it->second.seen_ns > keep_ns ? w.api_calls.erase(it) : std::next(it);
}

/// Drains the rings and completes collectives; `all` completes every pending one (of
/// context `only`, or of every context when only < 0). Never throws: the writer's maps
/// allocate, and a bad_alloc here must not terminate NCCL's process (the records it was
/// processing are lost, and counted as orphans by the next completion pass).
void drain_locked(Writer &w, bool all = false, int only = -1) noexcept
{
    try {
        const uint64_t now = now_ns();
        Recorder::instance().drain([&](const Record &r) { process(w, r, now); });
        complete(w, now, all, only);
    } catch (const std::exception &e) {
        if (!w.warned) VLOG_WARN("profiler writer: %s; some events are lost", e.what());
        w.warned = true;
    }
    const RecorderCounters c = Recorder::instance().counters();
    w.metrics.set_totals(c.events, c.dropped_pool + c.dropped_ring + c.dropped_threads + w.file_dropped_before +
                                       w.trace.dropped + w.summary.dropped);
}

void loop()
{
    Writer &w = W();
    std::unique_lock<std::mutex> g(w.mu);
    w.started = true;
    w.cv.notify_all();
    while (!w.stop) {
        drain_locked(w);
        w.cv.wait_for(g, std::chrono::nanoseconds(w.cfg.period_ns));
    }
}

int open_failed(Writer &w, const std::string &file, int err)
{
    w.open_error = "cannot create " + file + ": " + std::strerror(err);
    return -err;
}

int open_files(Writer &w)
{
    if (w.cfg.dir.empty()) return 0;
    if (int rc = ensure_output_dir(w.cfg.dir, &w.open_error); rc != 0) return rc;
    char host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    // A process that destroys its last communicator and creates another starts a new pair of
    // files (-1, -2, ...) and never truncates an earlier one, not even after NCCL unloaded and
    // reloaded the library (2.30.7 does at the last finalize), which resets every static here.
    const std::string stem = w.cfg.dir + "/vigil-prof-" + host + "-" + std::to_string(getpid());
    std::string base;
    int fd = -1;
    for (int n = 0; n < 10000 && fd < 0; ++n) {
        base = stem; // appended, not `"-" + to_string`: bogus GCC 12 -Wrestrict (bug 105329)
        if (n) base.append("-").append(std::to_string(n));
        fd = ::open((base + ".jsonl").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) return open_failed(w, base + ".jsonl", errno);
    }
    if (fd < 0) return open_failed(w, stem + "-N.jsonl (10000 taken)", EEXIST);
    w.summary.fd = fd;
    w.trace.fd = ::open((base + ".trace.json").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.trace.fd < 0) {
        const int e = errno;
        w.summary.close();
        return open_failed(w, base + ".trace.json", e);
    }
    w.summary.max = w.trace.max = w.cfg.max_bytes;
    static const char kHead[] = "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n";
    w.trace.put(kHead, sizeof(kHead) - 1);
    const int n = std::snprintf(w.line, sizeof(w.line),
                                "{\"type\":\"process\",\"host\":\"%s\",\"pid\":%d,\"version\":\"%s\",\"events\":\"%s\","
                                "\"mask\":%u,\"mono_to_realtime_ns\":%lld,\"abi\":\"v%d\"}\n",
                                telemetry::json_escape(host).c_str(), static_cast<int>(getpid()), VIGIL_VERSION,
                                events_text(w.cfg.traced).c_str(), w.cfg.recorded,
                                static_cast<long long>(mono_to_realtime_ns()), w.cfg.abi);
    summary_line(w, n);
    VLOG_INFO(NCCL_INIT | NCCL_PROFILE, "profiler files %s.{jsonl,trace.json}", base.c_str());
    return 0;
}

void write_stats(Writer &w)
{
    // This session's share: the recorder's counters are process-wide and survive sessions.
    RecorderCounters c = Recorder::instance().counters();
    const RecorderCounters &s0 = w.at_start;
    c.events -= s0.events;
    c.dropped_pool -= s0.dropped_pool;
    c.dropped_ring -= s0.dropped_ring;
    c.dropped_threads -= s0.dropped_threads;
    c.leaked -= s0.leaked;
    c.foreign_handles -= s0.foreign_handles;
    const int n = std::snprintf(
        w.line, sizeof(w.line),
        "{\"type\":\"stats\",\"events\":%llu,\"dropped_pool\":%llu,\"dropped_ring\":%llu,\"dropped_threads\":%llu,"
        "\"leaked\":%llu,\"foreign_handles\":%llu,\"orphans\":%llu,\"kernel_timeouts\":%llu,\"kernel_anomalies\":%llu,"
        "\"trace_dropped\":%llu,\"summary_dropped\":%llu}\n",
        static_cast<unsigned long long>(c.events), static_cast<unsigned long long>(c.dropped_pool),
        static_cast<unsigned long long>(c.dropped_ring), static_cast<unsigned long long>(c.dropped_threads),
        static_cast<unsigned long long>(c.leaked), static_cast<unsigned long long>(c.foreign_handles),
        static_cast<unsigned long long>(w.orphans), static_cast<unsigned long long>(w.kernel_timeouts),
        static_cast<unsigned long long>(w.kernel_anomalies), static_cast<unsigned long long>(w.trace.dropped),
        static_cast<unsigned long long>(w.summary.dropped));
    // The stats record is written even past the size bound: it is what says what was lost.
    if (n > 0 && static_cast<size_t>(n) < sizeof(w.line)) w.summary.raw(w.line, static_cast<size_t>(n));
}

} // namespace

int start_writer(const WriterConfig &cfg, std::string *why)
{
    Writer &w = W();
    std::unique_lock<std::mutex> g(w.mu);
    if (w.running) return 0;
    static const bool fork_handlers = pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child) == 0;
    if (!fork_handlers) VLOG_WARN("pthread_atfork failed: a process forked while profiling may hang or lose its counters");
    w.cfg = cfg;
    w.stop = false;
    w.trace = Out{};
    w.summary = Out{};
    w.named_tracks.clear();
    w.pending.clear();
    w.api_calls.clear();
    w.orphans = 0;
    w.kernel_timeouts = 0;
    w.kernel_anomalies = 0;
    for (CtxState &c : w.ctxs) c = CtxState{};
    w.at_start = Recorder::instance().counters();
    if (int e = w.metrics.open(); e != 0)
        VLOG_WARN("profiler counters segment: %s; vigil export will not show collectives", std::strerror(-e));
    w.open_error.clear();
    const int rc = open_files(w);
    if (rc != 0) *why = w.open_error;
    w.started = false;
    try {
        w.th = std::thread(loop);
    } catch (const std::exception &e) {
        VLOG_WARN("cannot start the profiler writer thread: %s", e.what());
        return -EAGAIN;
    }
    // Returns once the thread runs our code, under `mu` from then on: a fork right after
    // init must not catch it starting (see before_fork).
    w.cv.wait(g, [&] { return w.started; });
    w.running = true;
    return rc;
}

void writer_add_context(const Context &c)
{
    Writer &w = W();
    std::lock_guard<std::mutex> g(w.mu);
    const Us t(c.init_ns);
    const std::string name = telemetry::json_escape(c.name);
    int n = std::snprintf(w.line, sizeof(w.line),
                          "{\"type\":\"comm\",\"comm\":\"0x%016llx\",\"name\":\"%s\",\"rank\":%d,\"nranks\":%d,"
                          "\"nnodes\":%d,\"start_us\":%s}\n",
                          static_cast<unsigned long long>(c.comm_hash), name.c_str(), c.rank, c.nranks, c.nnodes, t.s);
    summary_line(w, n);
    w.ctxs[c.index] = CtxState{}; // the slot may have served a finalized communicator before
    w.comm_entry[c.index] = w.metrics.add_comm(c.comm_hash, c.name, c.rank, c.nranks);
    char b[256];
    n = std::snprintf(b, sizeof(b),
                      "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%u,\"args\":{\"name\":\"rank %d comm 0x%016llx%s%s\"}}",
                      c.index, c.rank, static_cast<unsigned long long>(c.comm_hash), name.empty() ? "" : " ",
                      name.c_str());
    trace_event(w, b, n);
}

namespace {
/// Drains, completes the collectives of context `only` (-1: none), flushes the files.
void flush_locked(Writer &w, int only)
{
    drain_locked(w, only >= 0, only);
    if (only >= 0) w.metrics.finalize_comm(w.comm_entry[only]);
    w.summary.flush();
    w.trace.flush();
}
} // namespace

void writer_finalize_context(const Context &c)
{
    Writer &w = W();
    std::lock_guard<std::mutex> g(w.mu);
    if (w.running) flush_locked(w, c.index);
}

void flush_writer() noexcept
{
    Writer &w = W();
    std::lock_guard<std::mutex> g(w.mu);
    if (w.running) flush_locked(w, -1);
}

void stop_writer() noexcept
{
    Writer &w = W();
    {
        std::lock_guard<std::mutex> g(w.mu);
        if (!w.running) return;
        w.stop = true;
    }
    w.cv.notify_all();
    w.th.join();
    std::lock_guard<std::mutex> g(w.mu);
    drain_locked(w, true);
    write_stats(w);
    w.file_dropped_before += w.trace.dropped + w.summary.dropped;
    static const char kTail[] = "\n]}\n";
    w.trace.raw(kTail, sizeof(kTail) - 1);
    w.trace.close();
    w.summary.close();
    w.running = false;
}

void release_writer() noexcept
{
    Writer &w = W();
    std::lock_guard<std::mutex> g(w.mu);
    if (!w.running) w.metrics.close();
}

} // namespace vigil::prof
