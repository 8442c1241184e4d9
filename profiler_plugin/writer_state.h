// SPDX-License-Identifier: Apache-2.0
// Inside the profiler's writer (writer.h): its state, guarded by Writer::mu, and what its two
// halves share. writer.cc runs the thread, the files and the public calls; records.cc turns
// drained records into summary lines and trace events. Not for other files.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "clock.h"
#include "recorder.h"
#include "telemetry/prof_metrics.h"
#include "timing.h"
#include "writer.h"

namespace vigil::prof::detail {

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

/// The one writer of the process (never destroyed).
Writer &W();

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

/// Appends the summary line snprintf formatted into w.line (returning `n`); a line that did
/// not fit is dropped (and counted), never cut.
void summary_line(Writer &w, int n);
/// Turns one drained record into the pending collective it belongs to, or into trace events
/// and summary lines at once (`now`: the writer's clock, for completion).
void process(Writer &w, const Record &r, uint64_t now);
/// Writes a completed collective or p2p task: its summary line, its trace slices, its
/// Prometheus counts. `timed_out`: written before all its kernel channels arrived.
void emit_agg(Writer &w, const Agg &a, bool timed_out);

} // namespace vigil::prof::detail
