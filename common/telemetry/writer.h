// SPDX-License-Identifier: Apache-2.0
// Telemetry files (VIGIL_TELEMETRY_DIR): a background thread drains this process's registry
// rings (as their consumer) and an event log (failovers, failbacks, rebuilds, degraded
// verdicts, fatal errors) into DIR/vigil-<host>-<pid>.jsonl, rotated at a size bound (one
// previous file kept as .1; each new file starts with the newest events again, marked
// "carried":true, within a quarter of the bound). A fatal error flushes at once, so the last
// windows and the failover history survive a job that is about to be killed.
#pragma once

#include <cstdint>
#include <string>

namespace vigil::telemetry {

/// Rare events, recorded from any thread (a lock, a bounded ring of kEventCapacity; when
/// full the oldest is dropped and counted). Formatting happens on the writer thread.
enum class EventType { kFailover, kFailback, kRebuild, kPathLost, kDegraded, kHealthy, kFatal };
void record_event(EventType type, const std::string &text) noexcept;

/// Starts the writer (idempotent). `dir` is created (owner-only) when missing. Returns 0, or
/// -errno with *why when the directory or the file cannot be made or written; the caller
/// runs on without files (observability never stops a job). Also installs
/// SIGTERM and SIGABRT handlers (chained to the previous ones): the handler only sets a flag
/// and waits (nanosleep, at most 300 ms) for the writer thread to write a "signal" record,
/// drain everything and fsync; then the previous handler runs, or the default action.
int start_writer(const std::string &dir, uint64_t max_file_bytes, std::string *why);
/// Writes everything pending now and syncs the file (fatal error path), and returns once
/// that is done or after at most 300 ms (a process often exits right after its fatal error;
/// a slow disk must not hold the caller longer). Thread-safe; no-op when the writer is not
/// running or when called on the writer's own thread.
void flush_writer() noexcept;
/// Stops the writer after a final drain (idempotent); frees retired entries and gives up
/// being the rings' consumer.
void stop_writer() noexcept;
/// True while the writer runs (entries of closed paths then wait for its last drain).
bool writer_running() noexcept;

} // namespace vigil::telemetry
