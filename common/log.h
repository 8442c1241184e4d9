// SPDX-License-Identifier: Apache-2.0
// Logging bridge: every message goes through NCCL's ncclDebugLogger_t once a plugin's init
// has handed it over; before that (and in tests) through a stderr stub honouring NCCL_DEBUG.
#pragma once

#include "nccl_abi/nccl_common.h"

namespace vigil::log {

/// Installs NCCL's logger (may be NULL to return to the stub). Thread-safe: the pointer is
/// atomic and may be swapped while other threads log. The first non-NULL logger given wins
/// for the life of the process image, since NCCL hands every plugin the same function.
void set_logger(ncclDebugLogger_t fn) noexcept;

/// True when a message of `level` would be printed by the stub (NCCL_DEBUG) or when NCCL's
/// logger is installed (NCCL filters by itself). Cheap: one atomic load.
bool enabled(ncclDebugLogLevel level) noexcept;

/// Formats the message into a bounded buffer (1 KiB, truncated) and hands it to the logger.
/// Never throws, never allocates; safe from any thread.
[[gnu::format(printf, 5, 6)]] void write(ncclDebugLogLevel level, unsigned long flags,
                                         const char *func, int line, const char *fmt,
                                         ...) noexcept;

/// Holds back this thread's messages while it holds a lock foreign code must not run under:
/// NCCL's logger is foreign code (it takes NCCL's own locks, writes files, and may be a
/// framework's hook), so a comm's lock holder logs through a Deferral. While one lives on a
/// thread (nested ones count), write() formats each message as usual and queues it; the
/// outermost Deferral's destructor hands them to the logger in order. A thread that queues
/// more than kHeld messages in one scope writes the rest at once (never lost, never
/// reordered behind later ones). Per thread: no locking, no allocation; not movable.
class Deferral
{
public:
    static constexpr int kHeld = 8;
    Deferral() noexcept;
    ~Deferral();
    Deferral(const Deferral &) = delete;
    Deferral &operator=(const Deferral &) = delete;
};

} // namespace vigil::log

#ifndef VIGIL_LOG_PREFIX
#define VIGIL_LOG_PREFIX "Vigil"
#endif

/// One WARN per event, where the error is first classified.
#define VLOG_WARN(fmt, ...)                                                                    \
    ::vigil::log::write(NCCL_LOG_WARN, NCCL_ALL, __func__, __LINE__, VIGIL_LOG_PREFIX " " fmt, \
                        ##__VA_ARGS__)
/// INFO under a subsystem flag (NCCL_INIT, NCCL_NET, NCCL_ENV, ...).
#define VLOG_INFO(flags, fmt, ...)                                                             \
    ::vigil::log::write(NCCL_LOG_INFO, (flags), __func__, __LINE__, VIGIL_LOG_PREFIX " " fmt,  \
                        ##__VA_ARGS__)
#ifdef NDEBUG
#define VLOG_TRACE(flags, fmt, ...)                                                            \
    do {                                                                                       \
    } while (0)
#else
#define VLOG_TRACE(flags, fmt, ...)                                                            \
    ::vigil::log::write(NCCL_LOG_TRACE, (flags), __func__, __LINE__, VIGIL_LOG_PREFIX " " fmt, \
                        ##__VA_ARGS__)
#endif
