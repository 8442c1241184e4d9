// SPDX-License-Identifier: Apache-2.0
// The profiler's writer: one background thread drains the recorder's rings, ties proxy,
// kernel-channel and net events back to their collective, and writes the Chrome trace, the
// JSONL summary (formats: docs/profiler.md) and the per-communicator counters that
// `vigil export` serves to Prometheus. Nothing here runs on NCCL's hot path.
#pragma once

#include <cstdint>
#include <string>

#include "contexts.h"

namespace vigil::prof {

struct WriterConfig {
    std::string dir;                 ///< VIGIL_PROFILE_DIR; empty: no files
    uint64_t max_bytes = 256u << 20; ///< per file
    uint32_t traced = 0;             ///< kinds written to the trace (mask bits)
    uint32_t recorded = 0;           ///< kinds recorded
    int abi = 0;
    uint64_t settle_ns = 250'000'000; ///< without kernel channels due: a collective with no
                                      ///< news for this long is complete
    /// With kernel channels due: how long a collective waits, with no news, for a missing
    /// KernelCh before it is written with what arrived (counted as kernel_timeouts). Long:
    /// a collective may wait that long for a late rank, and queued ones for those before.
    uint64_t kernel_timeout_ns = 60'000'000'000;
    uint64_t period_ns = 5'000'000;   ///< drain period
};

/// Starts the writer thread (idempotent while running). `cfg.dir` is created (owner-only)
/// when missing. Returns 0, or -errno with *why when the directory or the files cannot be
/// made or written (the thread then runs without files).
int start_writer(const WriterConfig &cfg, std::string *why);
/// Announces a communicator (summary "comm" record, trace process name). Serialised by the
/// caller (init's lock).
void writer_add_context(const Context &c);
/// Drains, then completes every pending collective of `c`. Serialised by the caller.
void writer_finalize_context(const Context &c);
/// Drains and writes everything pending, flushing the files. Thread-safe.
void flush_writer() noexcept;
/// Final drain, completes every pending collective, writes the `stats` record, closes the
/// files and joins the thread (idempotent).
void stop_writer() noexcept;
/// Gives back the Prometheus counters segment (library unload, writer stopped). Its
/// communicators' series disappear from `vigil export`.
void release_writer() noexcept;

/// Bytes of one element of NCCL datatype `name` ("ncclFloat32" ...); 0 when unknown.
int datatype_bytes(const char *name) noexcept;
/// nccl-tests' (doc/PERFORMANCE.md) size and bus-bandwidth factor of a collective `func`
/// with `count` elements of `type_bytes` on `nranks` ranks: *size is the bytes algbw is
/// computed from; returns busbw/algbw.
double bus_factor(const char *func, uint64_t count, int type_bytes, int nranks, uint64_t *size) noexcept;

} // namespace vigil::prof
