// SPDX-License-Identifier: Apache-2.0
// `vigil report`: the straggler report over the files of a job's profiler and net plugin.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace vigil::tool {

/// `vigil report [--out DIR] [--no-plots] [--top N] DIR...`
///
/// Reads, in every DIR (or given as files), the profiler summaries
/// (`vigil-prof-<host>-<pid>.jsonl`), the profiler traces (`vigil-prof-<host>-<pid>.trace.json`)
/// and the net plugin's telemetry files (`vigil-<host>-<pid>.jsonl`, `.jsonl.1`). Collectives
/// are aligned across ranks by (comm, function, seq); the report prints the collectives with the largest
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

/// One input of the report held in memory: `name` is a file name as `vigil report` finds
/// them (it decides the kind, host and pid), `text` the file's content.
struct ReportFile {
    std::string name;
    std::string text;
};

/// `vigil report --no-plots --top TOP` over inputs held in memory (tests and fuzzing): reads,
/// judges and prints to stdout as run_report() does, and returns the texts of report.json in
/// *report and of merged.trace.json in *merged instead of writing them. Files whose name is
/// not a vigil file name are ignored. Never throws. Returns 0, 2 when no input has a vigil
/// file name, 1 after an internal error (its message on stderr).
int report_from_memory(const std::vector<ReportFile> &files, size_t top, std::string *report,
                       std::string *merged);

} // namespace vigil::tool
