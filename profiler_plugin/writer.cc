// SPDX-License-Identifier: Apache-2.0
// Profiler writer thread: drain, aggregate per collective, write trace and summary.
#include "writer.h"

#include "output_dir.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "clock.h"
#include "log.h"
#include "recorder.h"
#include "telemetry/json_text.h"
#include "timing.h"
#include "telemetry/prof_metrics.h"
#include "version.h"

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

namespace {

/// A bounded output file with its own buffer, written with write(2). Not stdio: a process
/// that forks (data-loader workers) would have stdio flush the parent's buffered lines into
/// the file a second time when the child calls exit().
struct Out {
    int fd = -1;
    std::string buf;      // bytes not written yet (written at 64 KiB and at each flush)
    uint64_t bytes = 0;
    uint64_t max = 0;
    uint64_t dropped = 0; // lines (records) that did not fit
    bool first = true;    // trace: no comma before the first event

    bool is_open() const { return fd >= 0; }
    bool put(const char *s, size_t n)
    {
        if (fd < 0) return false;
        if (bytes + n > max) {
            ++dropped;
            return false;
        }
        raw(s, n);
        bytes += n;
        return true;
    }
    /// Past the size bound (the stats record and the trace's closing bracket).
    void raw(const char *s, size_t n)
    {
        if (fd < 0) return;
        buf.append(s, n);
        if (buf.size() >= (64u << 10)) flush();
    }
    void flush()
    {
        size_t off = 0;
        while (fd >= 0 && off < buf.size()) {
            const ssize_t k = ::write(fd, buf.data() + off, buf.size() - off);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) break; // disk full or gone: the rest is lost, the job goes on
            off += static_cast<size_t>(k);
        }
        buf.clear();
    }
    void close()
    {
        flush();
        forget();
    }
    /// In a forked child: closes this process's descriptor without writing the buffered
    /// bytes, which are the parent's to write.
    void forget()
    {
        if (fd >= 0) ::close(fd);
        fd = -1;
        buf.clear();
    }
};

/// Wall-clock microseconds ("%lld.%03lld") of a CLOCK_MONOTONIC time.
struct Us {
    char s[32];
    explicit Us(uint64_t mono_ns)
    {
        const long long v = static_cast<long long>(mono_ns) + mono_to_realtime_ns();
        std::snprintf(s, sizeof(s), "%lld.%03lld", v / 1000, v % 1000);
    }
};

const char *str(const char *s) { return s ? s : "?"; }

/// A communicator's hash as the files write it ("0x%016llx"; zeros when unknown).
struct CommHex {
    char s[24];
    explicit CommHex(const Context *c)
    {
        std::snprintf(s, sizeof(s), "0x%016llx", c ? static_cast<unsigned long long>(c->comm_hash) : 0ull);
    }
};

const char *state_name(int s)
{
    static const char *const kNames[] = {
        "SendPosted", "SendRemFifoWait", "SendTransmitted", "SendDone", "RecvPosted", "RecvReceived",
        "RecvTransmitted", "RecvDone", "SendGPUWait", "SendWait", "RecvWait", "RecvFlushWait", "RecvGPUWait",
        "Idle", "Active", "Sleep", "Wakeup", "Append", "AppendEnd", "InProgress", "SendPeerWait", "NetUpdate",
        "KernelChStop", "GroupStartApiStop", "GroupEndApiStart"};
    return s >= 0 && s < static_cast<int>(sizeof(kNames) / sizeof(kNames[0])) ? kNames[s] : "unknown";
}

/// A collective or p2p task being put together from its events.
struct Agg {
    Record rec{};             // the Coll/P2p record (valid when have_rec)
    bool have_rec = false;
    uint16_t ctx = 0;
    uint64_t proxy_end_ns = 0; // last ProxyOp/ProxyStep stop
    std::vector<ChannelTimes> chans; // its KernelCh events
    std::vector<Record> phases;      // its KernelPhase events (v7), traced with the channels
    uint64_t touched_ns = 0;   // writer time of the last event
};

struct CtxState {
    GpuOffset gpu;
    uint64_t colls = 0;
};

/// A user's call (CollApi/P2pApi start): the enqueue time of the Coll/P2p that names it as
/// its parent.
struct ApiCall {
    uint64_t start_ns = 0;
    uint64_t seen_ns = 0; // writer time it arrived (unclaimed calls are pruned)
};

struct Writer {
    WriterConfig cfg;
    std::mutex mu; // everything below; taken by the writer thread per cycle
    std::condition_variable cv;
    std::thread th;
    bool running = false;
    bool started = false; // the thread has entered loop()
    bool stop = false;
    Out trace, summary;
    std::unordered_map<uint64_t, Agg> pending;
    std::unordered_map<uint64_t, ApiCall> api_calls; // by the API event's id
    CtxState ctxs[kMaxContexts];
    std::set<std::pair<int, int>> named_tracks;
    uint64_t orphans = 0;
    uint64_t kernel_timeouts = 0;  // collectives written before all their channels arrived
    uint64_t kernel_anomalies = 0; // collectives whose kernel stamps failed the checks
    // Prometheus counters (vigil export); kept across writer restarts, like the contexts.
    telemetry::ProfMetrics metrics;
    RecorderCounters at_start; // the recorder's counters when this session's files opened
    uint64_t file_dropped_before = 0; // file records dropped by earlier sessions (Prometheus
                                      // counters must never go down)
    bool warned = false;              // one WARN for a failed drain
    std::string open_error;           // why the files could not be opened
    telemetry::CommEntry *comm_entry[kMaxContexts] = {};
    char line[2048];
};

Writer &W()
{
    // Never destroyed: a joinable std::thread's destructor would std::terminate a process
    // that exits with communicators alive; the library's Lifetime stops the thread instead.
    static Writer *w = new Writer;
    return *w;
}

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

void put(Out &o, const char *s, size_t n) { o.put(s, n); }

/// Appends one event formatted into `json` by snprintf returning `n`; an event that did not
/// fit its buffer is dropped (and counted), never cut.
template <size_t N> void trace_event(Writer &w, const char (&json)[N], int n)
{
    if (!w.trace.is_open()) return;
    if (n <= 0 || static_cast<size_t>(n) >= N) {
        ++w.trace.dropped;
        return;
    }
    const size_t len = static_cast<size_t>(n);
    if (w.trace.bytes + len + 2 > w.trace.max) {
        ++w.trace.dropped;
        return;
    }
    if (!w.trace.first) w.trace.put(",\n", 2);
    w.trace.first = false;
    w.trace.put(json, len);
}

void name_track(Writer &w, int pid, int tid, const char *name)
{
    if (!w.named_tracks.insert({pid, tid}).second) return;
    char b[256];
    const int n = std::snprintf(b, sizeof(b),
                                "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
                                pid, tid, name);
    trace_event(w, b, n);
    const int m = std::snprintf(b, sizeof(b),
                                "{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
                                pid, tid, tid);
    trace_event(w, b, m);
}

void summary_line(Writer &w, int n)
{
    if (n <= 0 || static_cast<size_t>(n) >= sizeof(w.line)) { // did not fit: dropped, never cut
        ++w.summary.dropped;
        return;
    }
    put(w.summary, w.line, static_cast<size_t>(n));
}

// Tracks (tid) of one communicator's trace process.
constexpr int kTidColl = 1, kTidApi = 2, kTidGroup = 3, kTidCtrl = 4;
int tid_op(int ch, int send) { return 100 + ch * 2 + (send ? 0 : 1); }
int tid_kch(int ch) { return 400 + ch; }
int tid_phase(int ch) { return 500 + ch; }
int tid_net(int dev, int slot) { return 700 + dev * 2 + slot; }
int tid_step(int ch, int send, int step) { return 1000 + (ch * 2 + (send ? 0 : 1)) * 8 + (step & 7); }

bool traced(const Writer &w, Kind k) { return (w.cfg.traced & bit(k)) != 0; }

void slice(Writer &w, const Record &r, int tid, const char *track, const char *name, const char *args);

/// The trace slice of one kernel channel of collective `coll_id`, on the host clock through
/// the GPU offset (when known), with the raw stamps and host times in its args, so a trace
/// holds what the timing was computed from.
void kernel_slice(Writer &w, uint16_t ctx, uint64_t coll_id, const ChannelTimes &ch, bool valid)
{
    const CtxState &cs = w.ctxs[ctx];
    if (!cs.gpu.known() || ch.gpu_start == 0 || ch.gpu_stop < ch.gpu_start) return;
    char track[24];
    std::snprintf(track, sizeof(track), "ch %u kernel", ch.channel);
    const int tid = tid_kch(ch.channel);
    name_track(w, ctx, tid, track);
    const Us ts(static_cast<uint64_t>(static_cast<int64_t>(ch.gpu_start) + cs.gpu.value()));
    char b[640];
    const int n = std::snprintf(
        b, sizeof(b),
        "{\"ph\":\"X\",\"name\":\"kernel\",\"pid\":%u,\"tid\":%d,\"ts\":%s,\"dur\":%.3f,\"args\":{\"coll\":\"0x%llx\","
        "\"channel\":%u,\"gpu_start_ns\":%llu,\"gpu_stop_ns\":%llu,\"host_start_ns\":%llu,\"host_stop_ns\":%llu,"
        "\"valid\":%s}}",
        ctx, tid, ts.s, static_cast<double>(ch.gpu_stop - ch.gpu_start) / 1e3, static_cast<unsigned long long>(coll_id),
        ch.channel, static_cast<unsigned long long>(ch.gpu_start), static_cast<unsigned long long>(ch.gpu_stop),
        static_cast<unsigned long long>(ch.host_start), static_cast<unsigned long long>(ch.host_stop),
        valid ? "true" : "false");
    trace_event(w, b, n);
}

/// The trace slice of one kernel phase (v7), placed like its channel's.
void phase_slice(Writer &w, const Record &r)
{
    const CtxState &cs = w.ctxs[r.ctx];
    const uint64_t g0 = r.phase.gpu_start_ns, g1 = r.phase.gpu_stop_ns;
    if (!cs.gpu.known() || g0 == 0 || g1 < g0) return;
    Record placed = r;
    placed.start_ns = static_cast<uint64_t>(static_cast<int64_t>(g0) + cs.gpu.value());
    placed.stop_ns = static_cast<uint64_t>(static_cast<int64_t>(g1) + cs.gpu.value());
    char args[128], track[32];
    std::snprintf(args, sizeof(args), "\"phase\":%u,\"gpu_start_ns\":%llu,\"gpu_stop_ns\":%llu", r.phase.phase,
                  static_cast<unsigned long long>(g0), static_cast<unsigned long long>(g1));
    std::snprintf(track, sizeof(track), "ch %u kernel phases", r.phase.channel);
    slice(w, placed, tid_phase(r.phase.channel), track, str(r.phase.name), args);
}

/// Timing fields of a summary record (after "bytes"...): duration, bandwidths, timing source,
/// kernel span, queueing, channels timed. Returns the characters written (or <= 0).
int timing_fields(char *out, size_t cap, const TimingResult &t, double algbw, double factor, bool coll)
{
    const bool timed = t.duration_us > 0;
    int n = timed ? std::snprintf(out, cap, ",\"duration_us\":%.3f,\"algbw_GBps\":%.4f", t.duration_us, algbw)
                  : std::snprintf(out, cap, ",\"duration_us\":null");
    auto more = [&](const char *fmt, auto... v) {
        if (n > 0 && static_cast<size_t>(n) < cap) n += std::snprintf(out + n, cap - static_cast<size_t>(n), fmt, v...);
    };
    if (timed && coll) more(",\"busbw_GBps\":%.4f", algbw * factor);
    more(",\"timing\":\"%s\"", timing_name(t.source));
    if (t.source == TimingSource::kKernelGpu) more(",\"kernel_us\":%.3f", t.kernel_us);
    if (t.queue_us >= 0) more(",\"queue_us\":%.3f", t.queue_us);
    if (t.channels_timed > 0) more(",\"channels_timed\":%d", t.channels_timed);
    if (t.source == TimingSource::kInvalid) more(",\"channels_invalid\":%d", t.channels_invalid);
    return n;
}

void emit_agg(Writer &w, const Agg &a, bool timed_out)
{
    const Record &r = a.rec;
    const Context *c = context_at(a.ctx);
    const int nranks = c ? c->nranks : 0;
    const bool coll = r.kind == Kind::kColl;
    const char *func = coll ? r.coll.func : r.p2p.func;
    const char *dt = coll ? r.coll.datatype : r.p2p.datatype;
    const uint64_t count = coll ? r.coll.count : r.p2p.count;
    const uint64_t tag = coll ? r.coll.user_tag : r.p2p.user_tag;
    const int tb = datatype_bytes(dt);
    uint64_t size = 0;
    const double factor = coll ? bus_factor(func, count, tb, nranks, &size) : (size = count * tb, 1.0);

    // The enqueue: the user's call when its API event reached us, else the Coll start.
    TimingInput in;
    in.enqueue_ns = r.start_ns;
    if (const auto it = w.api_calls.find(r.parent); r.parent != 0 && it != w.api_calls.end()) {
        in.enqueue_ns = it->second.start_ns;
        w.api_calls.erase(it); // claimed once: a graph replay's Coll names the capture's call
    }
    in.proxy_end_ns = a.proxy_end_ns;
    in.channels = a.chans;
    CtxState &cs = w.ctxs[a.ctx];
    const TimingResult t = time_collective(in, &cs.gpu, now_ns());
    if (timed_out) ++w.kernel_timeouts;
    if (t.source == TimingSource::kInvalid && w.kernel_anomalies++ == 0)
        VLOG_WARN("kernel-channel timestamps that cannot belong to their collective (%s seq %llu: a channel "
                  "ended before it began, began before the call, or ran longer than the collective existed); "
                  "such collectives are written with timing \"invalid\" and no duration. NCCL's work counter "
                  "has drifted from the GPU's (NVIDIA/nccl#2368: Broadcast with NCCL_ALLGATHERV_ENABLE=1)",
                  str(func), static_cast<unsigned long long>(coll ? r.coll.seq : 0));
    const double algbw = t.duration_us > 0 ? static_cast<double>(size) / (t.duration_us * 1e3) : 0; // GB/s
    const Us start(in.enqueue_ns);
    const CommHex comm(c);
    int n;
    if (coll) {
        n = std::snprintf(w.line, sizeof(w.line),
                          "{\"type\":\"coll\",\"comm\":\"%s\",\"rank\":%d,\"nranks\":%d,\"seq\":%llu,\"func\":\"%s\","
                          "\"count\":%llu,\"datatype\":\"%s\",\"bytes\":%llu,\"algo\":\"%s\",\"proto\":\"%s\","
                          "\"channels\":%u,\"start_us\":%s",
                          comm.s, c ? c->rank : -1, nranks, static_cast<unsigned long long>(r.coll.seq), str(func),
                          static_cast<unsigned long long>(count), str(dt), static_cast<unsigned long long>(size),
                          str(r.coll.algo), str(r.coll.proto), r.coll.channels, start.s);
    } else {
        n = std::snprintf(w.line, sizeof(w.line),
                          "{\"type\":\"p2p\",\"comm\":\"%s\",\"rank\":%d,\"nranks\":%d,\"func\":\"%s\",\"peer\":%d,"
                          "\"count\":%llu,\"datatype\":\"%s\",\"bytes\":%llu,\"channels\":%u,\"start_us\":%s",
                          comm.s, c ? c->rank : -1, nranks, str(func), r.p2p.peer, static_cast<unsigned long long>(count),
                          str(dt), static_cast<unsigned long long>(size), r.p2p.channels, start.s);
    }
    const size_t room = sizeof(w.line) - 96;
    if (n > 0 && static_cast<size_t>(n) < room)
        n += timing_fields(w.line + n, room - static_cast<size_t>(n), t, algbw, factor, coll);
    if (n > 0 && tag != 0 && static_cast<size_t>(n) < room)
        n += std::snprintf(w.line + n, room - static_cast<size_t>(n), ",\"user_tag\":%llu",
                           static_cast<unsigned long long>(tag));
    if (n > 0 && static_cast<size_t>(n) < sizeof(w.line) - 2) {
        w.line[n++] = '}';
        w.line[n++] = '\n';
        summary_line(w, n);
    }
    // Trace: an async slice from the enqueue to the end of the kernel (GPU end placed on the
    // host clock) or of the host-timed work; consecutive collectives overlap.
    const bool valid = t.source != TimingSource::kInvalid;
    if (traced(w, r.kind)) {
        uint64_t end = in.enqueue_ns;
        if (t.source == TimingSource::kKernelGpu && t.queue_us >= 0)
            end = in.enqueue_ns + static_cast<uint64_t>((t.queue_us + t.kernel_us) * 1e3);
        else if (t.duration_us > 0)
            end = in.enqueue_ns + static_cast<uint64_t>(t.duration_us * 1e3);
        const Us end_us(end);
        name_track(w, a.ctx, kTidColl, "collectives");
        char b[768];
        int m = std::snprintf(b, sizeof(b),
                              "{\"ph\":\"b\",\"cat\":\"%s\",\"name\":\"%s\",\"id\":\"0x%llx\",\"pid\":%u,\"tid\":%d,"
                              "\"ts\":%s,\"args\":{\"seq\":%llu,\"bytes\":%llu,\"algo\":\"%s\",\"proto\":\"%s\","
                              "\"channels\":%u,\"duration_us\":%.3f,\"busbw_GBps\":%.4f,\"timing\":\"%s\","
                              "\"enqueue_ns\":%llu,\"launch_ns\":%llu}}",
                              coll ? "coll" : "p2p", str(func), static_cast<unsigned long long>(r.id), a.ctx, kTidColl,
                              start.s, coll ? static_cast<unsigned long long>(r.coll.seq) : 0ull,
                              static_cast<unsigned long long>(size), coll ? str(r.coll.algo) : "",
                              coll ? str(r.coll.proto) : "", coll ? r.coll.channels : r.p2p.channels, t.duration_us,
                              coll ? algbw * factor : algbw, timing_name(t.source),
                              static_cast<unsigned long long>(in.enqueue_ns), static_cast<unsigned long long>(r.start_ns));
        trace_event(w, b, m);
        m = std::snprintf(b, sizeof(b),
                          "{\"ph\":\"e\",\"cat\":\"%s\",\"name\":\"%s\",\"id\":\"0x%llx\",\"pid\":%u,\"tid\":%d,\"ts\":%s}",
                          coll ? "coll" : "p2p", str(func), static_cast<unsigned long long>(r.id), a.ctx, kTidColl,
                          end_us.s);
        trace_event(w, b, m);
    }
    if (traced(w, Kind::kKernelCh))
        for (const ChannelTimes &ch : a.chans) kernel_slice(w, a.ctx, r.id, ch, valid);
    if (valid)
        for (const Record &p : a.phases) phase_slice(w, p);
    ++cs.colls;
    w.metrics.count(w.comm_entry[a.ctx], func, size,
                    t.duration_us > 0 ? static_cast<uint64_t>(t.duration_us * 1e3) : 0,
                    coll ? algbw * factor * 1e9 : algbw * 1e9);
}

/// A complete ("X") slice.
void slice(Writer &w, const Record &r, int tid, const char *track, const char *name, const char *args)
{
    name_track(w, r.ctx, tid, track);
    const Us ts(r.start_ns);
    char b[1024];
    const int n = std::snprintf(b, sizeof(b),
                                "{\"ph\":\"X\",\"name\":\"%s\",\"pid\":%u,\"tid\":%d,\"ts\":%s,\"dur\":%.3f,\"args\":{%s}}",
                                name, r.ctx, tid, ts.s, static_cast<double>(r.stop_ns - r.start_ns) / 1e3, args);
    trace_event(w, b, n);
}

void net_record(Writer &w, const Record &r)
{
    const NetInfo &ni = r.net;
    const Context *c = context_at(r.ctx);
    const CommHex comm(c);
    const char *slot = ni.slot == 0 ? "primary" : "backup";
    static const char *const kEv[] = {"unknown", "window", "failover", "failback"};
    const char *ev = ni.type <= 3 ? kEv[ni.type] : "unknown";
    static const char *const kSt[] = {"unused", "active", "standby", "dead"};
    const char *st = ni.state <= 3 ? kSt[ni.state] : "unknown";
    const Us ts(ni.start_ns);
    const double bw = ni.busy_ns ? static_cast<double>(ni.bytes) / static_cast<double>(ni.busy_ns) : 0; // GB/s
    int n;
    if (ni.type == 1) {
        n = std::snprintf(w.line, sizeof(w.line),
                          "{\"type\":\"net\",\"comm\":\"%s\",\"rank\":%d,\"event\":\"window\",\"dev\":%d,\"slot\":\"%s\","
                          "\"conn\":%llu,\"generation\":%u,\"start_us\":%s,\"window_us\":%u,\"bytes\":%llu,\"busy_us\":%.3f,"
                          "\"busy_bw_GBps\":%.4f,\"lat_p99_us\":%.3f,\"degraded\":%s,\"state\":\"%s\",\"share\":%.3f}\n",
                          comm.s, c ? c->rank : -1, ni.dev, slot, static_cast<unsigned long long>(ni.conn),
                          ni.generation, ts.s, ni.window_us,
                          static_cast<unsigned long long>(ni.bytes), static_cast<double>(ni.busy_ns) / 1e3, bw,
                          static_cast<double>(ni.lat_p99_ns) / 1e3, ni.degraded ? "true" : "false", st,
                          ni.share_permille / 1000.0);
    } else {
        n = std::snprintf(w.line, sizeof(w.line),
                          "{\"type\":\"net\",\"comm\":\"%s\",\"rank\":%d,\"event\":\"%s\",\"dev\":%d,\"slot\":\"%s\","
                          "\"conn\":%llu,\"generation\":%u,\"start_us\":%s,\"bytes\":%llu}\n",
                          comm.s, c ? c->rank : -1, ev, ni.dev, slot, static_cast<unsigned long long>(ni.conn), ni.generation, ts.s,
                          static_cast<unsigned long long>(ni.bytes));
    }
    summary_line(w, n);
    if (!traced(w, Kind::kNet)) return;
    char track[48];
    std::snprintf(track, sizeof(track), "net dev %d %s", ni.dev, slot);
    const int tid = tid_net(ni.dev < 0 ? 0 : ni.dev, ni.slot ? 1 : 0);
    name_track(w, r.ctx, tid, track);
    char b[768];
    if (ni.type == 1) {
        n = std::snprintf(b, sizeof(b),
                          "{\"ph\":\"X\",\"name\":\"window\",\"pid\":%u,\"tid\":%d,\"ts\":%s,\"dur\":%u,\"args\":{"
                          "\"bytes\":%llu,\"busy_us\":%.3f,\"busy_bw_GBps\":%.4f,\"lat_p99_us\":%.3f,\"degraded\":%s,"
                          "\"generation\":%u,\"share\":%.3f}}",
                          r.ctx, tid, ts.s, ni.window_us, static_cast<unsigned long long>(ni.bytes),
                          static_cast<double>(ni.busy_ns) / 1e3, bw, static_cast<double>(ni.lat_p99_ns) / 1e3,
                          ni.degraded ? "true" : "false", ni.generation, ni.share_permille / 1000.0);
    } else {
        n = std::snprintf(b, sizeof(b),
                          "{\"ph\":\"i\",\"s\":\"p\",\"name\":\"%s\",\"pid\":%u,\"tid\":%d,\"ts\":%s,\"args\":{"
                          "\"generation\":%u,\"bytes\":%llu}}",
                          ev, r.ctx, tid, ts.s, ni.generation, static_cast<unsigned long long>(ni.bytes));
    }
    trace_event(w, b, n);
}

Agg &agg_of(Writer &w, uint64_t id, uint16_t ctx, uint64_t now)
{
    Agg &a = w.pending[id];
    if (a.ctx == 0) a.ctx = ctx;
    a.touched_ns = now;
    return a;
}

/// Network work of a collective ended: its proxy-timed end moves to the latest stop.
void proxy_work(Writer &w, const Record &r, uint64_t now)
{
    if (r.root == 0) return;
    Agg &a = agg_of(w, r.root, r.ctx, now);
    a.proxy_end_ns = std::max(a.proxy_end_ns, r.stop_ns);
}

void process(Writer &w, const Record &r, uint64_t now)
{
    char args[512];
    switch (r.kind) {
    case Kind::kColl:
    case Kind::kP2p: {
        Agg &a = agg_of(w, r.id, r.ctx, now);
        a.rec = r;
        a.have_rec = true;
        a.ctx = r.ctx;
        break;
    }
    case Kind::kProxyOp: {
        proxy_work(w, r, now);
        if (!traced(w, r.kind)) break;
        std::snprintf(args, sizeof(args), "\"peer\":%d,\"steps\":%d,\"chunk\":%d,\"foreign\":%s", r.op.peer,
                      r.op.steps, r.op.chunk, (r.flags & kFlagForeign) ? "true" : "false");
        char track[32];
        std::snprintf(track, sizeof(track), "ch %u %s", r.op.channel, r.op.is_send ? "send" : "recv");
        slice(w, r, tid_op(r.op.channel, r.op.is_send), track, r.op.is_send ? "send op" : "recv op", args);
        break;
    }
    case Kind::kProxyStep: {
        proxy_work(w, r, now);
        if (!traced(w, r.kind)) break;
        int k = std::snprintf(args, sizeof(args), "\"step\":%d,\"bytes\":%llu", r.step.step,
                              static_cast<unsigned long long>(r.step.trans_size));
        for (int i = 0; i < r.nstates && k > 0 && k < static_cast<int>(sizeof(args)) - 64; ++i)
            k += std::snprintf(args + k, sizeof(args) - static_cast<size_t>(k), ",\"%s_us\":%.3f",
                               state_name(r.step.state[i]), static_cast<double>(r.step.at_ns[i]) / 1e3);
        const int ch = r.step.channel == 255 ? 0 : r.step.channel;
        char track[40];
        std::snprintf(track, sizeof(track), "ch %d %s s%d", ch, r.step.is_send ? "send" : "recv", r.step.step & 7);
        slice(w, r, tid_step(ch, r.step.is_send, r.step.step), track, "step", args);
        break;
    }
    case Kind::kKernelCh: {
        const ChannelTimes ch{r.kch.channel, r.kch.gpu_start_ns, r.kch.gpu_stop_ns, r.start_ns, r.stop_ns};
        if (r.root) {
            agg_of(w, r.root, r.ctx, now).chans.push_back(ch);
        } else if (traced(w, r.kind)) {
            kernel_slice(w, r.ctx, 0, ch, true); // a channel of no known collective
        }
        break;
    }
    case Kind::kKernelPhase:
        // Placed on the host clock with its collective, once the GPU offset is known.
        if (!traced(w, r.kind)) break;
        if (r.root) agg_of(w, r.root, r.ctx, now).phases.push_back(r);
        else phase_slice(w, r);
        break;
    case Kind::kNet:
        if (r.root) agg_of(w, r.root, r.ctx, now);
        if (r.net.type != 0) {
            net_record(w, r);
        } else if (traced(w, r.kind)) {
            std::snprintf(args, sizeof(args), "\"plugin_id\":%lld", static_cast<long long>(r.foreign_net.plugin_id));
            slice(w, r, tid_net(15, 0), "net (other plugin)", "net", args);
        }
        break;
    case Kind::kGroupApi:
    case Kind::kCollApi:
    case Kind::kP2pApi:
    case Kind::kKernelLaunch: {
        // A call captured into a CUDA graph enqueues no replay: each replay's Coll keeps the
        // capture's handle as its parent, and its own start is the replay's launch.
        if ((r.kind == Kind::kCollApi || r.kind == Kind::kP2pApi) && !r.api.graph_captured)
            w.api_calls[r.id] = ApiCall{r.start_ns, now};
        if (!traced(w, r.kind)) break;
        static const char *const kApi[] = {"GroupApi", "CollApi", "P2pApi", "KernelLaunch"};
        const char *name = kApi[static_cast<int>(r.kind) - static_cast<int>(Kind::kGroupApi)];
        if (r.kind == Kind::kCollApi || r.kind == Kind::kP2pApi) {
            name = str(r.api.func);
            std::snprintf(args, sizeof(args), "\"count\":%llu,\"datatype\":\"%s\",\"graph_captured\":%s",
                          static_cast<unsigned long long>(r.api.count), str(r.api.datatype),
                          r.api.graph_captured ? "true" : "false");
        } else if (r.kind == Kind::kGroupApi) {
            std::snprintf(args, sizeof(args), "\"depth\":%d,\"graph_captured\":%s,\"start_api_stop_us\":%.3f,"
                          "\"end_api_start_us\":%.3f", r.api.depth, r.api.graph_captured ? "true" : "false",
                          r.api.start_stop_ns / 1e3, r.api.end_start_ns / 1e3);
        } else {
            args[0] = '\0';
        }
        slice(w, r, kTidApi, "api", name, args);
        break;
    }
    case Kind::kGroup:
        if (traced(w, r.kind)) slice(w, r, kTidGroup, "groups", "Group", "");
        break;
    case Kind::kProxyCtrl: {
        if (!traced(w, r.kind)) break;
        int k = std::snprintf(args, sizeof(args), "\"appended\":%d", r.ctrl.appended);
        for (int i = 0; i < r.nstates && k > 0 && k < static_cast<int>(sizeof(args)) - 64; ++i)
            k += std::snprintf(args + k, sizeof(args) - static_cast<size_t>(k), ",\"%s_us\":%.3f",
                               state_name(r.ctrl.state[i]), static_cast<double>(r.ctrl.at_ns[i]) / 1e3);
        slice(w, r, kTidCtrl, "proxy ctrl", r.nstates ? state_name(r.ctrl.state[0]) : "ctrl", args);
        break;
    }
    default:
        break;
    }
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
