// SPDX-License-Identifier: Apache-2.0
// An ncclDebugLogger_t for test programs that keeps every WARN line the plugins log, so a
// test can assert on what a user would read. NCCL's logger is a plain function pointer, so
// the capture is one per program.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unistd.h>
#include <vector>

#include "nccl_abi/nccl_common.h"

namespace vigil::test {

/// Every WARN logged through warn_logger, in order (formatted, truncated at 2 KiB). Guarded by
/// g_warn_mu.
inline std::mutex g_warn_mu;
inline std::vector<std::string> g_warns;

/// Pass `&warn_logger<kEnv>` to a plugin's init as NCCL's logger; with the environment
/// variable named by kEnv set, each WARN is also echoed to stderr with the process id (for
/// debugging a test). Thread-safe.
template <const char *EchoEnv>
void warn_logger(ncclDebugLogLevel level, unsigned long /*flags*/, const char * /*file*/, int /*line*/,
                 const char *fmt, ...)
{
    if (level != NCCL_LOG_WARN) return;
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (std::getenv(EchoEnv) != nullptr)
        std::fprintf(stderr, "[pid %d] WARN %s\n", static_cast<int>(getpid()), buf);
    std::lock_guard<std::mutex> lock(g_warn_mu);
    g_warns.emplace_back(buf);
}

} // namespace vigil::test
