// SPDX-License-Identifier: Apache-2.0
// Logging bridge: every message goes through NCCL's ncclDebugLogger_t once a plugin's init
// has handed it over; before that (and in tests) through a stderr stub honouring NCCL_DEBUG.
#pragma once

#include <cstdint>
#include <mutex>

#include "clock.h"
#include "nccl_abi/nccl_common.h"

#ifndef VIGIL_LOG_PREFIX
#define VIGIL_LOG_PREFIX "Vigil"
#endif

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

/// A bound on the WARN lines of one kind of per-connection event. A port that fails takes
/// every connection on it along, thousands of them at scale, each with its own failover line
/// on both ends: a WARN per connection would be thousands of lines per process for one fault.
/// Events of a kind are counted in windows of kWindowNs from the first event of a window: the
/// first kWarns of a window log at WARN, the rest at INFO (NCCL_DEBUG=INFO still shows every
/// one); the first held back adds a WARN that says so, and the next event after the window
/// adds one with how many were held back in it. One static instance per kind of event.
/// Thread-safe (a mutex, taken once per event; callers' clock reads may cross); no allocation.
class Burst
{
public:
    static constexpr int kWarns = 8;
    static constexpr uint64_t kWindowNs = 10'000'000'000;

    /// `what`: the events, plural, for the notes ("failovers"); `prefix`: the notes' prefix,
    /// the including library's. Both static storage.
    explicit Burst(const char *what, const char *prefix = VIGIL_LOG_PREFIX) noexcept
        : what_(what), prefix_(prefix)
    {
    }
    Burst(const Burst &) = delete;
    Burst &operator=(const Burst &) = delete;

    /// The level of the next event's line, at `now` (ns, CLOCK_MONOTONIC): NCCL_LOG_WARN or
    /// NCCL_LOG_INFO. Writes the notes above itself, before the caller writes the line.
    ncclDebugLogLevel level(uint64_t now) noexcept;

    /// Every Burst of the process starts a new window at its next event (tests that read
    /// WARN lines call this first).
    static void restart_all() noexcept;

private:
    const char *what_;
    const char *prefix_;
    std::mutex mu_;
    uint64_t start_ns_ = 0;  // the window's first event
    uint64_t last_ns_ = 0;   // ... and its latest
    uint64_t epoch_ = 0;     // restart_all()'s count when the window began
    uint64_t events_ = 0;    // in the window
    bool open_ = false;      // a window has begun
};

} // namespace vigil::log

/// One WARN per event, where the error is first classified.
#define VLOG_WARN(fmt, ...)                                                                    \
    ::vigil::log::write(NCCL_LOG_WARN, NCCL_ALL, __func__, __LINE__, VIGIL_LOG_PREFIX " " fmt, \
                        ##__VA_ARGS__)
/// A per-connection event's line at the level `burst` (a vigil::log::Burst) gives it now:
/// WARN for the first of a window, INFO under NCCL_NET after.
#define VLOG_BURST(burst, fmt, ...)                                                            \
    do {                                                                                       \
        const ncclDebugLogLevel vlog_level_ = (burst).level(::vigil::now_ns());                \
        ::vigil::log::write(vlog_level_, vlog_level_ == NCCL_LOG_WARN ? NCCL_ALL : NCCL_NET,   \
                            __func__, __LINE__, VIGIL_LOG_PREFIX " " fmt, ##__VA_ARGS__);      \
    } while (0)
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
