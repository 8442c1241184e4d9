// SPDX-License-Identifier: Apache-2.0
// VIGIL_* variable table: parser, validation, dump and the README table.
#include "params.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <strings.h>
#include <unistd.h>

#include "log.h"

namespace vigil {
namespace {

#define VIGIL_STR2(x) #x
#define VIGIL_STR(x) VIGIL_STR2(x)

constexpr ParamSpec kSpecs[] = {
#define VIGIL_PARAM_INT(member, suffix, cls, def, lo, hi, doc)                                      \
    {"VIGIL_" suffix, ParamType::Int, VIGIL_STR(def), lo, hi, doc, ParamClass::cls},
#define VIGIL_PARAM_BYTES(member, suffix, cls, def, lo, hi, doc)                                    \
    {"VIGIL_" suffix, ParamType::Bytes, VIGIL_STR(def), lo, hi, doc, ParamClass::cls},
#define VIGIL_PARAM_BOOL(member, suffix, cls, def, doc)                                             \
    {"VIGIL_" suffix, ParamType::Bool, (def) ? "1" : "0", 0, 1, doc, ParamClass::cls},
#define VIGIL_PARAM_STR(member, suffix, cls, def, doc)                                         \
    {"VIGIL_" suffix, ParamType::String, def, 0, 0, doc, ParamClass::cls},
#include "params.def"
#undef VIGIL_PARAM_INT
#undef VIGIL_PARAM_BYTES
#undef VIGIL_PARAM_BOOL
#undef VIGIL_PARAM_STR
};

// Applies a parsed value to the member of row `index`, in params.def order.
void assign(Params &p, size_t index, int64_t number, const std::string &text)
{
    size_t i = 0;
#define VIGIL_PARAM_INT(member, suffix, cls, def, lo, hi, doc)                                      \
    if (i++ == index) p.member = number;
#define VIGIL_PARAM_BYTES(member, suffix, cls, def, lo, hi, doc)                                    \
    if (i++ == index) p.member = number;
#define VIGIL_PARAM_BOOL(member, suffix, cls, def, doc)                                             \
    if (i++ == index) p.member = number != 0;
#define VIGIL_PARAM_STR(member, suffix, cls, def, doc)                                              \
    if (i++ == index) p.member = text;
#include "params.def"
#undef VIGIL_PARAM_INT
#undef VIGIL_PARAM_BYTES
#undef VIGIL_PARAM_BOOL
#undef VIGIL_PARAM_STR
    (void)number;
    (void)text;
}

std::string effective_value(const Params &p, size_t index)
{
    size_t i = 0;
    std::string out;
    // assign/append, not `= "1"` or `"\"" + s`: GCC 12 at -O3 reports a bogus -Wrestrict in
    // basic_string::_M_replace for those forms (GCC bug 105329).
#define VIGIL_PARAM_INT(member, suffix, cls, def, lo, hi, doc)                                      \
    if (i++ == index) out = std::to_string(p.member);
#define VIGIL_PARAM_BYTES(member, suffix, cls, def, lo, hi, doc)                                    \
    if (i++ == index) out = std::to_string(p.member);
#define VIGIL_PARAM_BOOL(member, suffix, cls, def, doc)                                             \
    if (i++ == index) out.assign(1, p.member ? '1' : '0');
#define VIGIL_PARAM_STR(member, suffix, cls, def, doc)                                              \
    if (i++ == index) out.assign(1, '"').append(p.member).append(1, '"');
#include "params.def"
#undef VIGIL_PARAM_INT
#undef VIGIL_PARAM_BYTES
#undef VIGIL_PARAM_BOOL
#undef VIGIL_PARAM_STR
    return out;
}

bool iequals(std::string_view a, std::string_view b)
{
    return a.size() == b.size() &&
           std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) ==
                      std::tolower(static_cast<unsigned char>(y));
           });
}

const char *type_name(ParamType t)
{
    switch (t) {
    case ParamType::Int: return "int";
    case ParamType::Bytes: return "bytes";
    case ParamType::Bool: return "bool";
    case ParamType::String: return "string";
    }
    return "?";
}

} // namespace

std::span<const ParamSpec> param_specs() noexcept
{
    return kSpecs;
}

std::string parse_number(const ParamSpec &spec, std::string_view text, int64_t *out)
{
    if (spec.type == ParamType::Bool) {
        static constexpr std::array<std::string_view, 4> yes{"1", "true", "yes", "on"};
        static constexpr std::array<std::string_view, 4> no{"0", "false", "no", "off"};
        for (auto y : yes)
            if (iequals(text, y)) return *out = 1, "";
        for (auto n : no)
            if (iequals(text, n)) return *out = 0, "";
        return "expected one of 0/1/true/false/yes/no/on/off";
    }
    int64_t v = 0;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec == std::errc::result_out_of_range) return "out of range";
    if (ec != std::errc() || ptr == text.data()) return "not an integer";
    std::string_view rest(ptr, static_cast<size_t>(text.data() + text.size() - ptr));
    if (!rest.empty()) {
        if (spec.type != ParamType::Bytes) return "trailing characters after the integer";
        int shift = 0;
        if (iequals(rest, "k") || iequals(rest, "kib")) shift = 10;
        else if (iequals(rest, "m") || iequals(rest, "mib")) shift = 20;
        else if (iequals(rest, "g") || iequals(rest, "gib")) shift = 30;
        else return "unknown size suffix (use K, M or G)";
        if (v > (INT64_MAX >> shift) || v < -(INT64_MAX >> shift)) return "out of range";
        v *= int64_t{1} << shift;
    }
    if (v < spec.min || v > spec.max)
        return "must be in [" + std::to_string(spec.min) + ", " + std::to_string(spec.max) + "]";
    *out = v;
    return "";
}

ParamSource environment_source()
{
    ParamSource src;
    src.lookup = [](const char *name) -> const char * { return std::getenv(name); };
    for (char **e = environ; e != nullptr && *e != nullptr; ++e) {
        std::string_view kv(*e);
        src.names.emplace_back(kv.substr(0, kv.find('=')));
    }
    return src;
}

ParamLoad load_params(const ParamSource &src)
{
    ParamLoad load;
    for (size_t i = 0; i < std::size(kSpecs); ++i) {
        const ParamSpec &spec = kSpecs[i];
        const std::string name(spec.name);
        const char *raw = src.lookup ? src.lookup(name.c_str()) : nullptr;
        if (raw == nullptr) continue;
        std::string text(raw);
        load.set.emplace_back(name, text);
        int64_t number = 0;
        if (spec.type != ParamType::String) {
            std::string why = parse_number(spec, text, &number);
            if (!why.empty()) {
                std::string msg = name + "=\"" + text + "\": " + why;
                (spec.cls == ParamClass::Data ? load.errors : load.warnings).push_back(msg);
                load.problems.push_back({i, std::move(msg)});
                continue;
            }
        }
        assign(load.values, i, number, text);
    }
    for (const std::string &n : src.names) {
        if (n.rfind("VIGIL_", 0) != 0) continue;
        bool known = std::any_of(std::begin(kSpecs), std::end(kSpecs),
                                 [&](const ParamSpec &s) { return s.name == n; });
        if (!known) load.unknown.push_back(n);
    }
    return load;
}

ParamScope scope_of(const ParamSpec &spec) noexcept
{
    if (spec.name.rfind("VIGIL_PROFILE_", 0) == 0) return ParamScope::Profiler;
    if (spec.name.rfind("VIGIL_TUNER_", 0) == 0) return ParamScope::Tuner;
    return ParamScope::Net;
}

bool report_params(const ParamLoad &load, ParamScope scope)
{
    auto in_scope = [&](std::string_view name) {
        for (const ParamSpec &s : kSpecs)
            if (s.name == name) return scope_of(s) == scope;
        return false;
    };
    for (const auto &[name, value] : load.set)
        if (in_scope(name)) VLOG_INFO(NCCL_ENV, "%s set by environment to %s", name.c_str(), value.c_str());
    for (const std::string &u : load.unknown)
        VLOG_WARN("unknown variable %s ignored (see the README's variable table)", u.c_str());
    bool ok = true;
    for (const ParamProblem &p : load.problems) {
        const ParamSpec &spec = kSpecs[p.index];
        if (scope_of(spec) != scope) continue;
        if (spec.cls == ParamClass::Observe) {
            VLOG_WARN("bad value %s; using the default %.*s", p.message.c_str(),
                      static_cast<int>(spec.default_text.size()), spec.default_text.data());
        } else {
            VLOG_WARN("bad value %s", p.message.c_str());
            ok = false;
        }
    }
    if (log::enabled(NCCL_LOG_INFO)) {
        std::string line;
        for (size_t i = 0; i < std::size(kSpecs); ++i) {
            if (scope_of(kSpecs[i]) != scope) continue;
            line += line.empty() ? "" : " ";
            line += std::string(kSpecs[i].name.substr(6)) + ":" + effective_value(load.values, i);
        }
        VLOG_INFO(NCCL_ENV, "config %s", line.c_str());
    }
    return ok;
}

std::string params_markdown()
{
    std::string md = "| Variable | Type | Default | Range | Bad value | Meaning |\n"
                     "|---|---|---|---|---|---|\n";
    for (const ParamSpec &s : kSpecs) {
        std::string range = "–";
        if (s.type == ParamType::Int || s.type == ParamType::Bytes)
            range = std::to_string(s.min) + " … " + std::to_string(s.max);
        // Appends, not `"literal" + std::string`: GCC 12 at -O3 reports a bogus -Wrestrict in
        // basic_string::_M_replace for that form (GCC bug 105329).
        md.append("| `").append(s.name).append("` | ").append(type_name(s.type)).append(" | ");
        if (s.default_text.empty()) md.append("(empty)");
        else md.append("`").append(s.default_text).append("`");
        md.append(" | ").append(range).append(" | ");
        md.append(s.cls == ParamClass::Data ? "fails init" : "WARN, default");
        md.append(" | ").append(s.doc).append(" |\n");
    }
    return md;
}

} // namespace vigil
