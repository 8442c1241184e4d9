// SPDX-License-Identifier: Apache-2.0
// Logging bridge implementation: NCCL's logger when set, else a stderr stub.
#include "log.h"

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace vigil::log {
namespace {

std::atomic<ncclDebugLogger_t> g_logger{nullptr};

// NCCL_DEBUG as NCCL reads it (src/debug.cc): VERSION, WARN, INFO, ABORT, TRACE.
int stub_level() noexcept
{
    static const int level = [] {
        const char *s = std::getenv("NCCL_DEBUG");
        if (s == nullptr) return static_cast<int>(NCCL_LOG_NONE);
        if (strcasecmp(s, "VERSION") == 0) return static_cast<int>(NCCL_LOG_VERSION);
        if (strcasecmp(s, "WARN") == 0) return static_cast<int>(NCCL_LOG_WARN);
        if (strcasecmp(s, "INFO") == 0) return static_cast<int>(NCCL_LOG_INFO);
        if (strcasecmp(s, "ABORT") == 0) return static_cast<int>(NCCL_LOG_ABORT);
        if (strcasecmp(s, "TRACE") == 0) return static_cast<int>(NCCL_LOG_TRACE);
        return static_cast<int>(NCCL_LOG_NONE);
    }();
    return level;
}

const char *level_name(ncclDebugLogLevel level) noexcept
{
    switch (level) {
    case NCCL_LOG_WARN: return "WARN";
    case NCCL_LOG_INFO: return "INFO";
    case NCCL_LOG_TRACE: return "TRACE";
    default: return "VERSION";
    }
}

} // namespace

void set_logger(ncclDebugLogger_t fn) noexcept
{
    g_logger.store(fn, std::memory_order_release);
}

bool enabled(ncclDebugLogLevel level) noexcept
{
    if (g_logger.load(std::memory_order_acquire) != nullptr) return true;
    int cur = stub_level();
    // The stub treats ABORT like WARN: both print warnings only.
    if (cur == NCCL_LOG_ABORT) cur = NCCL_LOG_WARN;
    return static_cast<int>(level) <= cur;
}

namespace {

void emit(ncclDebugLogLevel level, unsigned long flags, const char *func, int line,
          const char *text) noexcept
{
    ncclDebugLogger_t fn = g_logger.load(std::memory_order_acquire);
    if (fn != nullptr) {
        fn(level, flags, func, line, "%s", text);
        return;
    }
    char host[64] = "?";
    gethostname(host, sizeof(host) - 1);
    std::fprintf(stderr, "%s:%d:%ld NCCL %s %s\n", host, static_cast<int>(getpid()),
                 static_cast<long>(syscall(SYS_gettid)), level_name(level), text);
}

/// One message a Deferral holds back: write()'s arguments, the text formatted.
struct Held {
    ncclDebugLogLevel level;
    unsigned long flags;
    const char *func; // __func__: static storage
    int line;
    char text[1024];
};
/// A thread's Deferral state. Zero-initialised and trivially destructible, so the thread_local
/// needs no guard or destructor registration on the paths that take a comm's lock.
struct DeferState {
    int depth;     // live Deferrals
    int n;         // messages queued in q
    bool overflow; // more than kHeld in this scope: the rest were written at once
    Held q[Deferral::kHeld];
};
thread_local DeferState t_defer;

void flush_held() noexcept
{
    DeferState &d = t_defer;
    for (int i = 0; i < d.n; ++i) {
        const Held &h = d.q[i];
        emit(h.level, h.flags, h.func, h.line, h.text);
    }
    d.n = 0;
    d.overflow = false;
}

} // namespace

Deferral::Deferral() noexcept { ++t_defer.depth; }

Deferral::~Deferral()
{
    if (--t_defer.depth > 0) return;
    if (t_defer.n > 0) flush_held();
    t_defer.overflow = false;
}

void write(ncclDebugLogLevel level, unsigned long flags, const char *func, int line,
           const char *fmt, ...) noexcept
{
    if (!enabled(level)) return;
    DeferState &d = t_defer;
    const bool hold = d.depth > 0 && d.n < Deferral::kHeld && !d.overflow;
    char buf[1024];
    char *text = hold ? d.q[d.n].text : buf;
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(text, sizeof(buf), fmt, ap);
    va_end(ap);
    if (hold) {
        Held &h = d.q[d.n++];
        h.level = level;
        h.flags = flags;
        h.func = func;
        h.line = line;
        return;
    }
    if (d.depth > 0) { // the queue is full: it goes first, so the order holds
        flush_held();
        d.overflow = true;
    }
    emit(level, flags, func, line, buf);
}

namespace {
std::atomic<uint64_t> g_burst_epoch{0};
} // namespace

void Burst::restart_all() noexcept
{
    g_burst_epoch.fetch_add(1, std::memory_order_relaxed);
}

ncclDebugLogLevel Burst::level(uint64_t now) noexcept
{
    const uint64_t epoch = g_burst_epoch.load(std::memory_order_relaxed);
    uint64_t held = 0, held_span_ms = 0, held_age_s = 0;
    bool first_held = false;
    ncclDebugLogLevel lv = NCCL_LOG_WARN;
    {
        std::lock_guard<std::mutex> g(mu_);
        if (!open_ || epoch != epoch_ || since(now, start_ns_) >= kWindowNs) {
            if (open_ && epoch == epoch_ && events_ > static_cast<uint64_t>(kWarns)) {
                held = events_ - static_cast<uint64_t>(kWarns);
                held_span_ms = since(last_ns_, start_ns_) / 1'000'000;
                held_age_s = since(now, last_ns_) / 1'000'000'000;
            }
            open_ = true;
            epoch_ = epoch;
            start_ns_ = now;
            events_ = 0;
        }
        ++events_;
        last_ns_ = std::max(last_ns_, now); // two threads' clock reads may cross
        if (events_ > static_cast<uint64_t>(kWarns)) {
            lv = NCCL_LOG_INFO;
            first_held = events_ == static_cast<uint64_t>(kWarns) + 1;
        }
    }
    if (held > 0)
        write(NCCL_LOG_WARN, NCCL_ALL, __func__, __LINE__,
              "%s %llu more %s were logged at INFO only, over %llu ms up to %llu s ago", prefix_,
              static_cast<unsigned long long>(held), what_, static_cast<unsigned long long>(held_span_ms),
              static_cast<unsigned long long>(held_age_s));
    if (first_held)
        write(NCCL_LOG_WARN, NCCL_ALL, __func__, __LINE__,
              "%s %d %s within %llu s (a port event reaches every connection on it): more in that "
              "time are logged at INFO only (NCCL_DEBUG=INFO), and counted at the next one after",
              prefix_, kWarns, what_, static_cast<unsigned long long>(kWindowNs / 1'000'000'000));
    return lv;
}

} // namespace vigil::log
