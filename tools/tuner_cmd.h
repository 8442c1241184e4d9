// SPDX-License-Identifier: Apache-2.0
// The `vigil tuner` subcommands and the tuner's part of `vigil top` and `vigil export`.
//   vigil tuner explain --rules FILE --coll C --bytes SIZE --nodes N --ranks N
//                       [--health any|healthy|degraded|failover] [--pipe-ops N] [--reg-buff 0|1]
//                       [--unusable ALGO/PROTO,...]
//       the decision the rules make for one collective, and the rule that made it
//   vigil tuner fit [--coll C] [--nodes N] [--ranks N] [--margin PCT] [ALGO/PROTO=]RESULTS...
//       a rules file that picks the fastest measured algorithm/protocol per size range from
//       nccl-tests output files (all_reduce_perf and the other *_perf tables)
#pragma once

#include <cstdio>
#include <functional>
#include <string>

namespace vigil::tool {

/// Runs `vigil tuner ...`: argv[0] is "tuner" (argv[1] the subcommand). Writes the result to
/// stdout and errors to stderr; returns the exit status (0 ok, 1 failed, 2 usage).
/// vigil_tool.cc calls it as `if (cmd == "tuner") return vigil::tool::tuner_command(argc - 1, argv + 1);`.
int tuner_command(int argc, char **argv);

/// The same, writing to `out` and `err` (tests).
int tuner_command_to(int argc, char **argv, FILE *out, FILE *err);

/// `vigil top`'s tuner section: one line per communicator of every live tuner on this host
/// (pid, comm, block, agreed state, fraction, degraded/failed NICs, proposer, calls, steered,
/// waits), under a header line; "" when no tuner runs. Reads the status segments
/// (common/telemetry/health.h); never blocks the tuner.
std::string tuner_top_text();

/// A process's launcher rank by (pid, host) as `vigil export` labels it, "" when unknown.
using RankOf = std::function<std::string(int pid, const std::string &host)>;

/// What tuner_metrics_text() read.
struct TunerScrape {
    int segments = 0; ///< live tuner status segments read
    int refused = 0;  ///< settled segments whose layout this build does not know
};

/// `vigil export`'s tuner families in Prometheus text format (HELP/TYPE lines included):
/// vigil_tuner_view_state (0 healthy, 1 degraded, 2 failover, 3 none yet), _view_fraction,
/// _view_block, _view_changes_total, _calls_total, _steered_total, _waits_total,
/// _wait_seconds_total, labelled pid, rank (from `rank_of`; none without it), comm (and
/// source on the state). Reads this user's tuners, or with `all_users` every user's.
/// Families with no communicator print no samples.
std::string tuner_metrics_text(bool all_users = false, const RankOf &rank_of = {}, TunerScrape *stats = nullptr);

} // namespace vigil::tool
