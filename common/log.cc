// SPDX-License-Identifier: Apache-2.0
// Logging bridge implementation: NCCL's logger when set, else a stderr stub.
#include "log.h"

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

void write(ncclDebugLogLevel level, unsigned long flags, const char *func, int line,
           const char *fmt, ...) noexcept
{
    if (!enabled(level)) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    ncclDebugLogger_t fn = g_logger.load(std::memory_order_acquire);
    if (fn != nullptr) {
        fn(level, flags, func, line, "%s", buf);
        return;
    }
    char host[64] = "?";
    gethostname(host, sizeof(host) - 1);
    std::fprintf(stderr, "%s:%d:%ld NCCL %s %s\n", host, static_cast<int>(getpid()),
                 static_cast<long>(syscall(SYS_gettid)), level_name(level), buf);
}

} // namespace vigil::log
