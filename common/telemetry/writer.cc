// SPDX-License-Identifier: Apache-2.0
// Telemetry JSONL writer thread and event log.
#include "writer.h"

#include "output_dir.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <ctime>
#include <pthread.h>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <stdio_ext.h>
#include <deque>
#include <mutex>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#include "clock.h"
#include "json_text.h"
#include "log.h"
#include "registry.h"

namespace vigil::telemetry {
namespace {

constexpr size_t kEventCapacity = 1024;
/// At most this many of the newest events are carried into each new file at rotation
/// (together at most a quarter of the size bound), so a file rotated out does not take the
/// failover history with it.
constexpr size_t kCarriedEvents = 256;
/// The longest flush_writer() waits for the drain and fsync it asked for, in ms.
constexpr int kFlushWaitMs = 300;

struct Event {
    uint64_t ns;
    EventType type;
    std::string text;
};

const char *type_name(EventType t)
{
    switch (t) {
    case EventType::kFailover: return "failover";
    case EventType::kFailback: return "failback";
    case EventType::kRebuild: return "rebuild";
    case EventType::kPathLost: return "path_lost";
    case EventType::kDegraded: return "degraded";
    case EventType::kHealthy: return "healthy";
    case EventType::kFatal: return "fatal";
    }
    return "?";
}

struct Writer {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Event> events;
    uint64_t events_dropped = 0;
    bool running = false, stop = false, flush = false;
    std::thread thread;
    std::string file;
    uint64_t max_bytes = 0;
    FILE *out = nullptr;  // unbuffered: lines reach the file only through flush_pending()
    std::string pending;  // whole lines not yet written
    uint64_t written = 0;
    std::vector<uint64_t> next;      // per registry entry: next ring index to write
    std::deque<std::string> recent;  // the newest event lines, each without its leading '{'
    size_t recent_bytes = 0;
    uint64_t flush_asked = 0; // flush_writer() calls so far (under mu)
    uint64_t flush_done = 0;  // of them, drained and synced (under mu; done_cv)
    uint64_t last_wait_ns = 0; // when the last waiting flush_writer() returned (under mu)
    std::condition_variable done_cv;
    std::vector<uint8_t> described;  // per entry: its "path" record is in the current file
    std::atomic<bool> live{false};
};

// Signal path: only async-signal-safe operations in the handler (atomics, nanosleep,
// sigaction, raise); the writer thread does the work.
std::atomic<int> g_signal{0};
std::atomic<bool> g_signal_flushed{false};
struct sigaction g_prev_term, g_prev_abrt;
bool g_handlers = false;

void on_fatal_signal(int sig, siginfo_t *info, void *ctx)
{
    g_signal.store(sig);
    timespec step{0, 10'000'000};
    for (int i = 0; i < 30 && !g_signal_flushed.load(); ++i) nanosleep(&step, nullptr);
    struct sigaction &prev = sig == SIGTERM ? g_prev_term : g_prev_abrt;
    if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
        prev.sa_sigaction(sig, info, ctx);
    } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
        prev.sa_handler(sig);
    } else if (prev.sa_handler == SIG_DFL) {
        sigaction(sig, &prev, nullptr);
        raise(sig);
    }
}

Writer &w()
{
    static Writer *wr = new Writer; // never destroyed (v8-v10 never finalize)
    return *wr;
}

// In a forked child (data-loader workers fork processes with live communicators): the
// writer thread does not exist there, and the lines buffered in the parent's stream must not
// be written a second time when the child's exit() flushes every stdio stream. Runs in the
// child right after fork, single-threaded, without locks (the parent's holder of `mu` may
// not exist in the child).
void forget_in_child()
{
    Writer &wr = w();
    if (wr.out != nullptr) __fpurge(wr.out);
    wr.out = nullptr; // the FILE is leaked in the child; the parent owns the file
    wr.pending.clear();
    wr.running = false;
    wr.live.store(false);
}

// Writes the pending lines with write(2) calls of whole lines: a process that exits (or dies)
// while the writer runs leaves whole lines in the file, never half of one (a stdio buffer
// flushes wherever it fills, and exit() flushes streams without their locks).
void flush_pending(Writer &wr)
{
    if (wr.out != nullptr) {
        const int fd = fileno(wr.out);
        size_t off = 0;
        while (off < wr.pending.size()) {
            const ssize_t n = ::write(fd, wr.pending.data() + off, wr.pending.size() - off);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break; // disk full or gone: telemetry is best effort
            off += static_cast<size_t>(n);
        }
    }
    wr.pending.clear();
}

FILE *open_unbuffered(const std::string &file, const char *mode)
{
    FILE *f = std::fopen(file.c_str(), mode);
    if (f != nullptr) std::setvbuf(f, nullptr, _IONBF, 0);
    return f;
}

// Appends a whole line to the current file's pending text.
void append(Writer &wr, std::string_view line)
{
    wr.pending.append(line);
    wr.written += line.size();
}

void rotate_if_needed(Writer &wr)
{
    if (wr.written < wr.max_bytes) return;
    flush_pending(wr);
    std::fclose(wr.out);
    std::rename(wr.file.c_str(), (wr.file + ".1").c_str());
    wr.out = open_unbuffered(wr.file, "w");
    wr.written = 0;
    // Each file stands alone: describe every path again before its next window, and start
    // with the newest events, marked as carried (readers count an event once by its pid,
    // mono_ns and name): with 1 ms windows a 64 KiB file holds well under a second, and the
    // failover that explains the job's end must not leave with the file rotated out.
    std::fill(wr.described.begin(), wr.described.end(), 0);
    for (const std::string &rest : wr.recent) {
        append(wr, "{\"carried\":true,");
        append(wr, rest);
    }
}

void put(Writer &wr, std::string_view line)
{
    if (wr.out == nullptr || line.empty()) return;
    append(wr, line);
    rotate_if_needed(wr);
}

void put(Writer &wr, const char *line, int n)
{
    if (n > 0) put(wr, std::string_view(line, static_cast<size_t>(n)));
}

// Keeps an event line (starting with '{') among the newest, within the carry bounds.
void remember_event(Writer &wr, std::string_view line)
{
    wr.recent.emplace_back(line.substr(1));
    wr.recent_bytes += line.size();
    const size_t budget = wr.max_bytes / 4;
    while (!wr.recent.empty() && (wr.recent.size() > kCarriedEvents || wr.recent_bytes > budget)) {
        wr.recent_bytes -= wr.recent.front().size() + 1;
        wr.recent.pop_front();
    }
}

// Drains events and every ring of this process's registry into the file. Called on the
// writer thread only.
void drain(Writer &wr)
{
    Registry &reg = Registry::instance();
    std::deque<Event> evs;
    uint64_t evdrop = 0;
    {
        std::lock_guard<std::mutex> g(wr.mu);
        evs.swap(wr.events);
        evdrop = std::exchange(wr.events_dropped, 0);
    }
    char buf[1024];
    for (const Event &e : evs) {
        // Bounded so the line always closes: 640 characters escape to at most 3840 bytes.
        const std::string text = json_escape(std::string_view(e.text).substr(0, 640));
        std::string line = std::string("{\"type\":\"event\",\"event\":\"") + type_name(e.type) +
                           "\",\"mono_ns\":" + std::to_string(e.ns) + ",\"text\":\"" + text + "\"}\n";
        remember_event(wr, line); // first: an event that fills the file is carried too
        put(wr, line);
    }
    if (evdrop) {
        const int n = std::snprintf(buf, sizeof(buf), "{\"type\":\"events_dropped\",\"count\":%llu}\n",
                                    static_cast<unsigned long long>(evdrop));
        put(wr, buf, n);
    }
    const uint32_t n_entries = reg.entries_used();
    if (wr.next.size() < n_entries) {
        wr.next.resize(n_entries, 0);
        wr.described.resize(n_entries, 0);
    }
    const uint32_t me = static_cast<uint32_t>(getpid());
    for (uint32_t i = 0; i < n_entries; ++i) {
        PathEntry &e = *reg.entry_at(i); // our own entry, writable: we are its ring's consumer
        const uint32_t use = e.in_use.load(std::memory_order_acquire);
        if (use == 0) {
            wr.described[i] = 0;
            continue;
        }
        if (e.ring.consumer_pid.load() != me) { // a new path in this entry
            e.ring.tail.store(e.ring.head.load());
            e.ring.consumer_pid.store(me);
            wr.next[i] = e.ring.tail.load();
            wr.described[i] = 0;
        }
        if (!wr.described[i]) {
            const int n = std::snprintf(buf, sizeof(buf),
                                        "{\"type\":\"path\",\"path\":%u,\"kind\":\"%s\",\"slot\":\"%s\",\"device\":\"%.16s\","
                                        "\"local\":\"%.64s\",\"peer\":\"%.64s\",\"conn\":%llu}\n",
                                        i, e.kind == 0 ? "send" : "recv", e.slot == 0 ? "primary" : "backup",
                                        e.dev_name, e.local, e.peer, static_cast<unsigned long long>(e.conn_id));
            put(wr, buf, std::min<int>(n, sizeof(buf) - 1));
            wr.described[i] = 1;
        }
        const uint64_t head = e.ring.head.load(std::memory_order_acquire);
        uint64_t &k = wr.next[i];
        if (k < e.ring.tail.load()) k = e.ring.tail.load();
        for (; k < head; ++k) {
            WindowRecord r;
            if (!RegistryView::read(e, k, &r)) continue;
            const int n = std::snprintf(
                buf, sizeof(buf),
                "{\"type\":\"window\",\"path\":%u,\"seq\":%llu,\"start_ns\":%llu,\"window_us\":%u,\"generation\":%u,"
                "\"bytes\":%llu,\"ops\":%llu,\"busy_ns\":%llu,\"busy_bw_Bps\":%.0f,\"lat_p50_ns\":%llu,"
                "\"lat_p99_ns\":%llu,\"lat_max_ns\":%llu,\"peak_inflight_bytes\":%llu,\"replays\":%u,\"errors\":%u,"
                "\"state\":%u,\"degraded\":%u,\"receiver_bound\":%u,\"wait_us\":%u,\"avg_queued_bytes\":%llu,"
                "\"baseline_Bps\":%llu,\"judged_Bps\":%llu}\n",
                i, static_cast<unsigned long long>(r.seq), static_cast<unsigned long long>(r.start_ns), r.window_us,
                r.generation, static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(r.ops),
                static_cast<unsigned long long>(r.busy_ns), r.busy_bandwidth(),
                static_cast<unsigned long long>(r.lat_p50_ns), static_cast<unsigned long long>(r.lat_p99_ns),
                static_cast<unsigned long long>(r.lat_max_ns), static_cast<unsigned long long>(r.peak_inflight_bytes),
                r.replays, r.errors, r.state, r.degraded, r.receiver_bound, r.wait_us,
                static_cast<unsigned long long>(r.avg_queued_bytes), static_cast<unsigned long long>(r.baseline_bps),
                static_cast<unsigned long long>(r.judged_bps));
            put(wr, buf, n);
        }
        e.ring.tail.store(head, std::memory_order_release);
        if (use == 2) { // retired and drained: free the entry for a new path
            e.ring.consumer_pid.store(0);
            e.in_use.store(0, std::memory_order_release);
            wr.described[i] = 0;
        }
    }
    flush_pending(wr);
}

void loop()
{
    // The signal handler waits for this thread: never run it here.
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGABRT);
    pthread_sigmask(SIG_BLOCK, &block, nullptr);
    Writer &wr = w();
    std::unique_lock<std::mutex> lk(wr.mu);
    while (!wr.stop) {
        wr.cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return wr.stop || wr.flush; });
        bool sync = std::exchange(wr.flush, false);
        const uint64_t asked = wr.flush_asked; // every event recorded before these is queued
        const int sig = g_signal.load();
        lk.unlock();
        if (sig != 0 && !g_signal_flushed.load()) {
            char buf[128];
            const int n = std::snprintf(buf, sizeof(buf), "{\"type\":\"signal\",\"signal\":%d,\"mono_ns\":%llu}\n", sig,
                                        static_cast<unsigned long long>(now_ns()));
            put(wr, buf, n);
            sync = true;
        }
        drain(wr);
        if (sync && wr.out != nullptr) fsync(fileno(wr.out));
        if (sig != 0) g_signal_flushed.store(true);
        lk.lock();
        if (sync && wr.flush_done < asked) {
            wr.flush_done = asked;
            wr.done_cv.notify_all();
        }
    }
    lk.unlock();
    drain(wr);
    lk.lock();
    wr.flush_done = wr.flush_asked; // nobody waits past the last drain
    wr.done_cv.notify_all();
}

} // namespace

void record_event(EventType type, const std::string &text) noexcept
{
    Writer &wr = w();
    try {
        std::lock_guard<std::mutex> g(wr.mu);
        if (!wr.running) return;
        if (wr.events.size() >= kEventCapacity) {
            wr.events.pop_front();
            ++wr.events_dropped;
        }
        wr.events.push_back(Event{now_ns(), type, text});
    } catch (...) {
    }
}

int start_writer(const std::string &dir, uint64_t max_file_bytes, std::string *why)
{
    Writer &wr = w();
    std::lock_guard<std::mutex> g(wr.mu);
    if (wr.running) return 0;
    if (!Registry::instance().is_open()) {
        *why = "no telemetry registry";
        return -ENODEV;
    }
    if (int rc = ensure_output_dir(dir, why); rc != 0) return rc;
    char host[64] = "host";
    gethostname(host, sizeof(host) - 1);
    wr.file = dir + "/vigil-" + host + "-" + std::to_string(getpid()) + ".jsonl";
    wr.out = open_unbuffered(wr.file, "a");
    if (wr.out == nullptr) {
        const int e = errno;
        *why = "cannot open " + wr.file + ": " + std::strerror(e);
        return -e;
    }
    wr.max_bytes = max_file_bytes;
    wr.running = true;
    wr.live.store(true);
    wr.stop = false;
    wr.thread = std::thread(loop);
    static bool atfork = false;
    if (!atfork) atfork = pthread_atfork(nullptr, nullptr, forget_in_child) == 0;
    if (!g_handlers) {
        struct sigaction sa {};
        sa.sa_sigaction = on_fatal_signal;
        sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, &g_prev_term);
        sigaction(SIGABRT, &sa, &g_prev_abrt);
        g_handlers = true;
    }
    return 0;
}

bool writer_running() noexcept
{
    return w().live.load(std::memory_order_acquire);
}

void flush_writer() noexcept
{
    Writer &wr = w();
    std::unique_lock<std::mutex> lk(wr.mu);
    if (!wr.running || wr.thread.get_id() == std::this_thread::get_id()) return;
    const uint64_t mine = ++wr.flush_asked;
    wr.flush = true;
    wr.cv.notify_all();
    // A process often exits right after its fatal error: wait, bounded, for the disk. When
    // thousands of connections fail at once (one thread failing them in turn), only a caller
    // after a quiet spell waits; the rest ride on the writer's next pass.
    const uint64_t t = now_ns();
    if (t - wr.last_wait_ns < kFlushWaitMs * 1'000'000ULL) return;
    wr.done_cv.wait_for(lk, std::chrono::milliseconds(kFlushWaitMs),
                        [&] { return wr.flush_done >= mine || !wr.running; });
    wr.last_wait_ns = now_ns();
}

void stop_writer() noexcept
{
    Writer &wr = w();
    {
        std::lock_guard<std::mutex> g(wr.mu);
        if (!wr.running) return;
        wr.stop = true;
    }
    wr.cv.notify_all();
    wr.thread.join();
    wr.live.store(false);
    if (g_handlers) {
        // Restore only what is still ours: a handler installed after us stays.
        for (auto [sig, prev] : {std::pair{SIGTERM, &g_prev_term}, std::pair{SIGABRT, &g_prev_abrt}}) {
            struct sigaction cur {};
            sigaction(sig, nullptr, &cur);
            if ((cur.sa_flags & SA_SIGINFO) != 0 && cur.sa_sigaction == on_fatal_signal)
                sigaction(sig, prev, nullptr);
        }
        g_handlers = false;
    }
    // Nobody consumes the rings any more: producers overwrite again; retired entries free.
    Registry &reg = Registry::instance();
    for (uint32_t i = 0; i < reg.entries_used(); ++i) {
        PathEntry *e = reg.entry_at(i);
        e->ring.consumer_pid.store(0);
        if (e->in_use.load() == 2) e->in_use.store(0, std::memory_order_release);
    }
    std::lock_guard<std::mutex> g(wr.mu);
    wr.running = false;
    if (wr.out != nullptr) std::fclose(wr.out);
    wr.out = nullptr;
}

} // namespace vigil::telemetry
