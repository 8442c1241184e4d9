// SPDX-License-Identifier: Apache-2.0
// The registry readers' shared part (`vigil dump`, `top`, `export`): every process's segment
// opened read-only, and a path's recent windows summed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "telemetry/registry.h"

namespace vigil::tool {

/// One process's telemetry registry, mapped read-only. Owned by the caller; not thread-safe.
struct Process {
    std::string file;
    std::unique_ptr<telemetry::RegistryView> view;
};

/// What open_all() found besides the processes it returns.
struct OpenStats {
    int removed = 0; ///< segments of dead processes it removed
    /// Settled segments (telemetry::segment_settled) it could not read: file, reason.
    std::vector<std::pair<std::string, std::string>> refused;
};

/// Removes dead processes' segments, then opens every live one of this user (or, with
/// `all_users`, of every user). A segment that cannot be read is skipped with one line on
/// stderr when `warn`, and counted in *stats when given.
std::vector<Process> open_all(bool all_users = false, OpenStats *stats = nullptr, bool warn = true);

/// "active", "standby", "dead" or "unused" (telemetry::PathState).
const char *state_name(int state);

/// A path's most recent windows summed over a span (recent()).
struct Recent {
    double bw = 0;         ///< bandwidth over busy time, bytes/s (0: never busy)
    double rate = 0;       ///< bytes/s from the oldest window summed until now
    uint64_t bytes = 0;    ///< bytes of the windows
    uint64_t busy_ns = 0;  ///< busy time of the windows
    uint64_t p50 = 0;      ///< worst window's median completion latency, ns
    uint64_t p99 = 0;      ///< worst window's p99 completion latency, ns
    uint64_t inflight = 0; ///< peak bytes in flight
    uint64_t baseline = 0; ///< the newest window's baseline, bytes/s (0: none learned yet)
    uint32_t windows = 0;  ///< windows summed
};
/// Sums the windows of `e` that ended within the last `span_ns` (CLOCK_MONOTONIC, which the
/// plugin stamps windows with): a path that stopped moving reads 0. Reads the ring without
/// taking it (telemetry::RegistryView::read); windows overwritten meanwhile end the sum.
Recent recent(const telemetry::PathEntry &e, uint64_t span_ns);

/// Each in-use path's share of its connection's bytes (same process, connection and
/// direction) over the recent span: with multipath both paths carry, each its share; a hot
/// standby carries 0. -1 where the connection moved nothing in the span.
std::vector<double> shares(const telemetry::RegistryView &v, uint64_t span_ns);

} // namespace vigil::tool
