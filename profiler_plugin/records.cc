// SPDX-License-Identifier: Apache-2.0
// The profiler writer's records: a drained event becomes part of its collective (process),
// and a completed collective its summary line and trace slices (emit_agg); net windows and
// failovers, proxy ops and steps, API calls and kernel channels their lines and slices
// (formats: docs/profiler.md). Runs on the writer thread under Writer::mu.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "log.h"
#include "writer_state.h"

namespace vigil::prof::detail {
namespace {

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

} // namespace

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

namespace {

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

} // namespace

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

void summary_line(Writer &w, int n)
{
    if (n <= 0 || static_cast<size_t>(n) >= sizeof(w.line)) { // did not fit: dropped, never cut
        ++w.summary.dropped;
        return;
    }
    w.summary.put(w.line, static_cast<size_t>(n));
}

} // namespace vigil::prof::detail
