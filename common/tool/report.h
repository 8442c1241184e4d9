// SPDX-License-Identifier: Apache-2.0
// `vigil report`: the straggler report over the files of a job's profiler and net plugin.
#pragma once

namespace vigil::telemetry {

/// `vigil report [--out DIR] [--no-plots] [--top N] DIR...`
///
/// Reads, in every DIR (or given as files), the profiler summaries
/// (`vigil-prof-<host>-<pid>.jsonl`), the profiler traces (`vigil-prof-<host>-<pid>.trace.json`)
/// and the net plugin's telemetry files (`vigil-<host>-<pid>.jsonl`, `.jsonl.1`). Collectives
/// are aligned across ranks by (comm, seq); the report prints the collectives with the largest
/// arrival skew and names, each on a line of its own, the slowest rank (`slowest rank:`), the
/// slowest NIC (`slowest nic:`) and the slowest path (`slowest link:`), or says that none
/// stands out. It writes `report.json`, `merged.trace.json` and, unless `--no-plots`, two PNG
/// plots (drawn by `vigil_plot.py`; skipped with one line when python3 or matplotlib is
/// missing) into `--out` (default `./vigil-report`).
///
/// `argv` holds the arguments after the word `report` (`argv[0]` is the first of them).
/// Truncated lines, unknown records and fields and unreadable files are counted and reported,
/// never fatal. Never throws. Returns 0 on success, 1 when an output could not be written or
/// the plot script failed, 2 on a usage error or when no input file was found.
int run_report(int argc, char **argv);

} // namespace vigil::telemetry
