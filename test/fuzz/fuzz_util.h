// SPDX-License-Identifier: Apache-2.0
// What the fuzz targets share: a logger that formats every message and drops it, and the
// check that turns a broken property of a parser into a libFuzzer finding.
#pragma once

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include "log.h"

namespace vigil::fuzz {

/// An ncclDebugLogger_t that formats every message into a bounded buffer and drops it, so
/// hostile text reaching a WARN's `%s` is still read (where the sanitizers see it) without
/// flooding the fuzzer's output. Thread-safe.
inline void quiet_logger(ncclDebugLogLevel /*level*/, unsigned long /*flags*/,
                         const char * /*file*/, int /*line*/, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
}

/// Where check failures are written: a copy of stderr taken at start-up, so they are seen even
/// when libFuzzer runs with -close_fd_mask=2 (the report target's own stderr lines are noise).
inline int &report_fd()
{
    static int fd = dup(STDERR_FILENO);
    return fd;
}

/// Installs quiet_logger (the first logger installed wins for the process) and takes the
/// copy of stderr. Call from LLVMFuzzerInitialize.
inline void init()
{
    log::set_logger(&quiet_logger);
    (void)report_fd();
}

/// A property the parser must keep for every input was broken: says which, then aborts, which
/// libFuzzer reports as a crash and saves the input under the artifact prefix.
[[noreturn]] inline void fail(const char *file, int line, const char *what)
{
    char buf[512];
    const int n =
        std::snprintf(buf, sizeof(buf), "FUZZ CHECK FAILED %s:%d: %s\n", file, line, what);
    if (n > 0) {
        [[maybe_unused]] ssize_t w = write(report_fd(), buf, static_cast<size_t>(n));
    }
    std::abort();
}

} // namespace vigil::fuzz

/// Aborts with the condition's text when `cond` is false (in every build type: no NDEBUG).
#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) ::vigil::fuzz::fail(__FILE__, __LINE__, #cond);                               \
    } while (0)
