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

/// The parsed values, one member per params.def line, defaults filled in. Plain data;
/// copy freely.
struct Params {
#define VIGIL_PARAM_INT(member, suffix, def, lo, hi, doc) int64_t member = def;
#define VIGIL_PARAM_BYTES(member, suffix, def, lo, hi, doc) int64_t member = def;
#define VIGIL_PARAM_BOOL(member, suffix, def, doc) bool member = def;
#define VIGIL_PARAM_STR(member, suffix, def, doc) std::string member = def;
#include "params.def"
#undef VIGIL_PARAM_INT
#undef VIGIL_PARAM_BYTES
#undef VIGIL_PARAM_BOOL
#undef VIGIL_PARAM_STR
};

/// One row of the table: full variable name ("VIGIL_NSTREAMS"), type, default as text,
/// inclusive range (numeric types only) and the one-line doc.
struct ParamSpec {
    std::string_view name;
    ParamType type;
    std::string_view default_text;
    int64_t min;
    int64_t max;
    std::string_view doc;
};

/// Every row of params.def, in declaration order. Static storage; thread-safe.
std::span<const ParamSpec> param_specs() noexcept;

/// What load_params() found. `errors` holds one readable message per bad value (the
/// caller's init must fail when non-empty); `unknown` the VIGIL_* names no row claims;
/// `set` the (name, value) pairs taken from the environment.
struct ParamLoad {
    Params values;
    std::vector<std::string> errors;
    std::vector<std::string> unknown;
    std::vector<std::pair<std::string, std::string>> set;
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

/// Logs the load at INFO|NCCL_ENV (one line per variable that was set, then one line with
/// every effective value) and one WARN per unknown name. Returns false (after one WARN per
/// error) when the load has errors.
bool report_params(const ParamLoad &load);

/// The README's Markdown table (header + one row per variable), generated from the table.
std::string params_markdown();

} // namespace vigil
