// SPDX-License-Identifier: Apache-2.0
// Typed access to the VIGIL_* variables declared in params.def: parsing, validation,
// the INFO dump, unknown-name warnings and the README table.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vigil {

/// How a variable's text is parsed. Int: decimal integer. Bytes: integer with an optional
/// K, M, G (binary, also KiB/MiB/GiB) suffix. Bool: 0/1/true/false/yes/no/on/off. String:
/// taken verbatim.
enum class ParamType { Int, Bytes, Bool, String };

/// What a bad value costs (params.def's class column). Data: init fails, since the data path
/// would not be the one configured. Observe: one WARN and the default; telemetry, profiler
/// and tuner settings never stop a job.
enum class ParamClass { Data, Observe };

/// Which plugin reports a variable: VIGIL_PROFILE_* the profiler, VIGIL_TUNER_* the tuner,
/// every other one the net plugin (its telemetry included).
enum class ParamScope { Net, Tuner, Profiler };

/// The parsed values, one member per params.def line, defaults filled in. Plain data;
/// copy freely.
struct Params {
#define VIGIL_PARAM_INT(member, suffix, cls, def, lo, hi, doc) int64_t member = def;
#define VIGIL_PARAM_BYTES(member, suffix, cls, def, lo, hi, doc) int64_t member = def;
#define VIGIL_PARAM_BOOL(member, suffix, cls, def, doc) bool member = def;
#define VIGIL_PARAM_STR(member, suffix, cls, def, doc) std::string member = def;
#include "params.def"
#undef VIGIL_PARAM_INT
#undef VIGIL_PARAM_BYTES
#undef VIGIL_PARAM_BOOL
#undef VIGIL_PARAM_STR
};

/// One row of the table: full variable name ("VIGIL_NSTREAMS"), type, default as text,
/// inclusive range (numeric types only), the one-line doc and the class.
struct ParamSpec {
    std::string_view name;
    ParamType type;
    std::string_view default_text;
    int64_t min;
    int64_t max;
    std::string_view doc;
    ParamClass cls;
};

/// The plugin that reports `spec` (by its name's prefix).
ParamScope scope_of(const ParamSpec &spec) noexcept;

/// Every row of params.def, in declaration order. Static storage; thread-safe.
std::span<const ParamSpec> param_specs() noexcept;

/// One bad value: the row it belongs to and a readable message ("VIGIL_X=\"v\": why").
struct ParamProblem {
    size_t index;
    std::string message;
};

/// What load_params() found. `errors`: bad values of Data rows (init of the net plugin must
/// fail); `warnings`: bad values of Observe rows, whose member keeps its default; `unknown`:
/// the VIGIL_* names no row claims; `set`: the (name, value) pairs taken from the environment.
struct ParamLoad {
    Params values;
    std::vector<std::string> errors;
    std::vector<std::string> warnings;
    std::vector<std::string> unknown;
    std::vector<std::pair<std::string, std::string>> set;
    std::vector<ParamProblem> problems; ///< errors and warnings with their rows
};

/// Source of variables: `lookup(name)` returns the value or nullptr; `names` lists every
/// variable name present (to find unknown VIGIL_* ones).
struct ParamSource {
    std::function<const char *(const char *)> lookup;
    std::vector<std::string> names;
};

/// The process environment as a ParamSource. Not thread-safe against setenv().
ParamSource environment_source();

/// Parses and validates every row from `src`. Never throws on bad input (only bad_alloc).
ParamLoad load_params(const ParamSource &src);

/// Parses one value of `spec`'s type and range into *out (Int/Bytes/Bool; Bool as 0/1).
/// Returns an empty string on success, else the reason.
std::string parse_number(const ParamSpec &spec, std::string_view text, int64_t *out);

/// Logs the part of the load that `scope`'s plugin owns at INFO|NCCL_ENV (one line per
/// variable that was set, then one line with every effective value), one WARN per unknown
/// name, one WARN per bad value in scope (Observe rows: "using the default"). Returns false
/// when a Data row in scope has a bad value (the caller's init must fail), else true.
bool report_params(const ParamLoad &load, ParamScope scope);

/// The README's Markdown table (header + one row per variable), generated from the table.
std::string params_markdown();

} // namespace vigil
