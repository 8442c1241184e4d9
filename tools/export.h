// SPDX-License-Identifier: Apache-2.0
// `vigil export`: the node's Vigil metrics in the Prometheus text exposition, served over HTTP
// (or printed once). Metric names, labels and what they mean: docs/operations.md.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <set>
#include <string>

namespace vigil::tool {

/// What an Exporter reads.
struct ExportOptions {
    bool all_users = false; ///< every user's segments (a node-wide service), not only ours
};

/// Reads every telemetry registry, profiler counters segment and tuner status segment of the
/// node at each scrape and renders them, with the exporter's own health (scrapes, segments
/// found, segments it could not read, dead ones it removed). Keeps only its own counters
/// between scrapes. Thread-safe: concurrent scrapes are served one at a time.
class Exporter
{
public:
    explicit Exporter(ExportOptions o) : opts_(o) {}
    /// One scrape: the whole exposition (text format 0.0.4). Never fails: a segment that
    /// cannot be read is left out, counted in vigil_exporter_scrape_errors_total and named
    /// once on stderr.
    std::string scrape();

private:
    enum Kind { kRegistry, kProfiler, kTuner, kKinds };
    ExportOptions opts_;
    std::mutex mu_;
    uint64_t scrapes_ = 0;
    uint64_t errors_ = 0;
    std::array<uint64_t, kKinds> removed_{};
    double last_duration_s_ = 0;
    std::set<std::string> warned_; ///< segments already named on stderr
};

/// The `vigil export` command: `argv` holds the words after "export". Returns the exit status
/// (0, 1 when it cannot listen, 2 on a usage error).
int export_command(int argc, char **argv);

} // namespace vigil::tool
