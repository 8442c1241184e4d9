// SPDX-License-Identifier: Apache-2.0
// Command-line conventions shared by Vigil's tools: one-line usage errors and strict numbers.
//
// Every tool (vigil and its subcommands, vigil-netbench, vigil-params) follows one contract:
// `--help` (or `-h`) prints the command's own usage to stdout and exits 0; a usage error
// (unknown option, missing or malformed value) prints exactly one line to stderr naming what
// was wrong and exits 2; nothing runs after a usage error.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace vigil::cli {

/// Exit status of a usage error (BSD sysexits would say 64; 2 is what getopt-style tools use).
inline constexpr int kUsageError = 2;

/// True for the words that ask for help: `--help` and `-h`.
inline bool is_help(const std::string &arg)
{
    return arg == "--help" || arg == "-h";
}

/// Prints `PROG: WHAT (see PROG --help)` as one line to `err` and returns kUsageError.
/// `prog` is the command as the user typed it, e.g. "vigil tuner fit". Thread-safety: as
/// std::fprintf on `err`.
inline int usage_error(FILE *err, const char *prog, const std::string &what)
{
    std::fprintf(err, "%s: %s (see %s --help)\n", prog, what.c_str(), prog);
    return kUsageError;
}

/// Prints `PROG: unknown option 'OPT' (see PROG --help)` as one line; returns kUsageError.
inline int unknown_option(FILE *err, const char *prog, const std::string &opt)
{
    return usage_error(err, prog, "unknown option '" + opt + "'");
}

/// Parses all of `s` as a decimal integer in [lo, hi]. Returns false, leaving `*out` as it
/// was, for an empty string, a sign where none fits, trailing characters, overflow or a value
/// outside the range.
template <class Int>
bool parse_int(const std::string &s, Int lo, Int hi, Int *out)
{
    if (s.empty()) return false;
    char *end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (errno != 0 || *end != '\0') return false;
    if (v < static_cast<long long>(lo) || v > static_cast<long long>(hi)) return false;
    *out = static_cast<Int>(v);
    return true;
}

/// Parses all of `s` as a finite decimal number in [lo, hi] (e.g. seconds). Returns false,
/// leaving `*out` as it was, for anything else.
inline bool parse_double(const std::string &s, double lo, double hi, double *out)
{
    if (s.empty()) return false;
    char *end = nullptr;
    errno = 0;
    const double v = std::strtod(s.c_str(), &end);
    if (errno != 0 || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

} // namespace vigil::cli
