// SPDX-License-Identifier: Apache-2.0
// vigil-netbench's command line: its options with their defaults, and their parsing.
#pragma once

#include <cstdint>
#include <string>

namespace vigil::bench {

/// vigil-netbench's command line (see its --help). Sizes are in bytes, --timeout in seconds,
/// --delay-us in microseconds; bytes, iters and warmup at -1 take the workload's default.
struct Options {
    std::string plugin = "vigil";
    int api_version = 0;
    int rank = -1;
    int nranks = 2;
    std::string rendezvous;
    std::string workload = "allreduce";
    int64_t bytes = -1; // single size; -1 = workload default / sweep
    int64_t min_bytes = 8;
    int64_t max_bytes = 256ll << 20;
    int factor = 2;
    int iters = -1;
    int warmup = -1;
    int window = 8;
    bool recv_ahead = true; // latency: a receive posted ahead of the message awaited
    int64_t slice = 1 << 20;
    bool check = false;
    int dev = 0;
    int channels = 1;
    double timeout_s = 600;
    std::string profile; // "": off; "net": the plugin library's ncclProfiler; else a path
    int delay_rank = -1;  // all-reduce: this rank arrives late at every collective
    int delay_us = 0;
    std::string tuner;    // "": off; "net": the plugin library's ncclTunerPlugin; else a name/path
    int tuner_nodes = 0;  // nNodes told to the tuner (0: one rank per node)
    bool loop = false;    // all-reduce until the ranks agree to stop (SIGUSR1)
    bool progress = false; // every rank prints a JSON progress line per iteration
    bool yield = false;   // yield the CPU after a polling pass that moved nothing
    double idle_s = 10;   // fanout: seconds every connection stays open with nothing posted
    double duration_s = 0; // fanout: rounds for this long instead of --iters (0: --iters)
};

/// Parses the command line. --help prints the usage text on stdout and exits 0; a bad, missing
/// or unknown option prints one line on stderr and exits 2 (vigil::cli::kUsageError). Returns
/// the options otherwise, checked against each other (ranks, window, channels, --loop ...).
Options parse(int argc, char **argv);

} // namespace vigil::bench
