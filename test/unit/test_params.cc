// SPDX-License-Identifier: Apache-2.0
// VIGIL_* parameter table: parsing, validation, unknown names, the README table.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "params.h"

using vigil::ParamSpec;
using vigil::ParamType;

namespace {

using Env = std::map<std::string, std::string>;

// A ParamSource over `env`; every key is also listed in `names`.
vigil::ParamSource fake_source(const Env &env)
{
    auto vars = std::make_shared<const Env>(env);
    vigil::ParamSource src;
    src.lookup = [vars](const char *name) -> const char * {
        auto it = vars->find(name);
        return it == vars->end() ? nullptr : it->second.c_str();
    };
    for (const auto &kv : *vars) src.names.push_back(kv.first);
    return src;
}

vigil::ParamLoad load(const Env &env)
{
    return vigil::load_params(fake_source(env));
}

const ParamSpec &spec_named(std::string_view name)
{
    for (const ParamSpec &s : vigil::param_specs())
        if (s.name == name) return s;
    FAIL("no spec named " << name);
    throw; // unreachable
}

// The numeric member behind `name` (bool as 0/1), read through params.def itself so that
// the generic tests below cover every row, including rows added later.
int64_t numeric_member(const vigil::Params &p, std::string_view name)
{
#define VIGIL_PARAM_INT(member, suffix, cls, def, lo, hi, doc)                                          \
    if (name == "VIGIL_" suffix) return p.member;
#define VIGIL_PARAM_BYTES(member, suffix, cls, def, lo, hi, doc)                                        \
    if (name == "VIGIL_" suffix) return p.member;
#define VIGIL_PARAM_BOOL(member, suffix, cls, def, doc)                                                 \
    if (name == "VIGIL_" suffix) return p.member ? 1 : 0;
#define VIGIL_PARAM_STR(member, suffix, cls, def, doc)
#include "params.def"
#undef VIGIL_PARAM_INT
#undef VIGIL_PARAM_BYTES
#undef VIGIL_PARAM_BOOL
#undef VIGIL_PARAM_STR
    FAIL("not a numeric parameter: " << name);
    return 0;
}

bool is_numeric(const ParamSpec &s)
{
    return s.type == ParamType::Int || s.type == ParamType::Bytes;
}

} // namespace

TEST_CASE("load_params with nothing set gives the params.def defaults", "[params]")
{
    const vigil::ParamLoad l = load({});
    CHECK(l.errors.empty());
    CHECK(l.unknown.empty());
    CHECK(l.set.empty());
    const vigil::Params &p = l.values;
    CHECK(p.socket_ifname.empty());
    CHECK(p.socket_family.empty());
    CHECK(p.nstreams == 2);
    CHECK(p.chunk_bytes == 524288);
    CHECK(p.socket_buf_bytes == 0);
    CHECK(p.max_recvs == 8);
    CHECK(p.speed_mbps == 0);
    CHECK(p.handshake_timeout_ms == 5000);
    CHECK(p.connect_timeout_ms == 30000);
    CHECK(p.abort_on_error == false);
}

TEST_CASE("param_specs: names, order and default text agree with params.def", "[params]")
{
    const auto specs = vigil::param_specs();
    // One row per params.def line, in order (update when a variable is added).
    REQUIRE(specs.size() == 51);
    CHECK(specs[0].name == "VIGIL_SOCKET_IFNAME");
    CHECK(specs[2].name == "VIGIL_NSTREAMS");
    CHECK(specs[3].name == "VIGIL_SOCKET_NTHREADS");
    CHECK(specs[10].name == "VIGIL_ABORT_ON_ERROR");
    CHECK(specs[11].name == "VIGIL_BACKUP");
    CHECK(specs[16].name == "VIGIL_FAILBACK_HOLD_MS");
    CHECK(specs[17].name == "VIGIL_MULTIPATH");
    CHECK(specs[18].name == "VIGIL_MULTIPATH_PIECE_BYTES");
    CHECK(specs[19].name == "VIGIL_TELEMETRY");
    CHECK(specs[22].name == "VIGIL_DEGRADE_WINDOWS");
    CHECK(specs[25].name == "VIGIL_PROFILE_EVENTS");
    CHECK(specs[30].name == "VIGIL_PROFILE_KERNEL_TIMEOUT_MS");
    CHECK(specs[31].name == "VIGIL_PROFILE_THREADS");
    CHECK(specs[32].name == "VIGIL_TUNER_BLOCK");
    CHECK(specs[37].name == "VIGIL_TUNER_HEARTBEAT_S");
    CHECK(specs[40].name == "VIGIL_FABRIC");
    CHECK(specs[41].name == "VIGIL_IB_HCA");
    CHECK(specs[50].name == "VIGIL_IB_SL");
    const vigil::Params defaults;
    for (const ParamSpec &s : specs) {
        INFO(s.name);
        CHECK(s.name.substr(0, 6) == "VIGIL_");
        CHECK_FALSE(s.doc.empty());
        CHECK(std::count_if(specs.begin(), specs.end(),
                            [&](const ParamSpec &o) { return o.name == s.name; }) == 1);
        if (s.type == ParamType::String) continue;
        // Every numeric/bool default parses within its own range and equals the member's.
        int64_t v = -12345;
        CHECK(vigil::parse_number(s, s.default_text, &v) == "");
        CHECK(v >= s.min);
        CHECK(v <= s.max);
        CHECK(v == numeric_member(defaults, s.name));
    }
}

TEST_CASE("every numeric parameter: bounds, below/above range, junk", "[params]")
{
    for (const ParamSpec &s : vigil::param_specs()) {
        if (!is_numeric(s)) continue;
        const std::string name(s.name);
        DYNAMIC_SECTION(name)
        {
            const int64_t def = numeric_member(vigil::Params{}, name);
            for (int64_t good : {s.min, s.max, s.min + (s.max - s.min) / 3}) {
                const auto l = load({{name, std::to_string(good)}});
                INFO(name << "=" << good);
                CHECK(l.errors.empty());
                CHECK(numeric_member(l.values, name) == good);
                REQUIRE(l.set.size() == 1);
                CHECK(l.set[0] == std::make_pair(name, std::to_string(good)));
            }
            const std::vector<std::string> bad = {
                std::to_string(s.min - 1),
                std::to_string(s.max + 1),
                "abc",
                "",
                " 5",
                "+5",
                "0x10",
                "1.5",
                std::to_string(s.min) + "zz",
                std::to_string(s.min) + " ",
                "99999999999999999999999",
            };
            for (const std::string &text : bad) {
                const auto l = load({{name, text}});
                INFO(name << "=\"" << text << "\"");
                // A Data row's bad value is an error, an Observe row's a warning.
                const auto &msgs = s.cls == vigil::ParamClass::Data ? l.errors : l.warnings;
                const auto &none = s.cls == vigil::ParamClass::Data ? l.warnings : l.errors;
                REQUIRE(msgs.size() == 1);
                CHECK(none.empty());
                CHECK_THAT(msgs[0], Catch::Contains(name));
                CHECK_THAT(msgs[0], Catch::Contains(text));
                REQUIRE(l.problems.size() == 1);
                CHECK(l.problems[0].message == msgs[0]);
                CHECK(numeric_member(l.values, name) == def); // default kept
                CHECK(l.set.size() == 1);                     // still reported as set
            }
        }
    }
}

TEST_CASE("Int parameters take no size suffix", "[params]")
{
    for (const char *text : {"1K", "2k", "1M", "1KiB"}) {
        const auto l = load({{"VIGIL_NSTREAMS", text}});
        INFO(text);
        REQUIRE(l.errors.size() == 1);
        CHECK_THAT(l.errors[0], Catch::Contains("VIGIL_NSTREAMS"));
        CHECK(l.values.nstreams == 2);
    }
}

TEST_CASE("Bytes parameters accept K/M/G and KiB/MiB/GiB suffixes", "[params]")
{
    const std::vector<std::pair<std::string, int64_t>> good = {
        {"1M", 1048576},  {"1m", 1048576}, {"1MiB", 1048576}, {"1mib", 1048576},
        {"4K", 4096},     {"64k", 65536},  {"4KiB", 4096},    {"64M", 67108864},
        {"65536", 65536}, {"0G", -1},      {"1G", -1},        {"1GiB", -1},
    };
    for (const auto &[text, want] : good) {
        const auto l = load({{"VIGIL_CHUNK_BYTES", text}});
        INFO("VIGIL_CHUNK_BYTES=" << text);
        if (want < 0) {
            // Parses, but outside [4096, 64 MiB].
            REQUIRE(l.errors.size() == 1);
            CHECK_THAT(l.errors[0], Catch::Contains("must be in"));
        } else {
            CHECK(l.errors.empty());
            CHECK(l.values.chunk_bytes == want);
        }
    }
    const auto g = load({{"VIGIL_SOCKET_BUF_BYTES", "256M"}});
    CHECK(g.errors.empty());
    CHECK(g.values.socket_buf_bytes == 268435456);
    const auto k = load({{"VIGIL_SOCKET_BUF_BYTES", "0K"}});
    CHECK(k.errors.empty());
    CHECK(k.values.socket_buf_bytes == 0);
}

TEST_CASE("Bytes parameters reject unknown suffixes and overflow", "[params]")
{
    for (const char *text : {"1T", "1TiB", "1KB", "1 M", "1MM", "M", "1Ki", "-1K",
                             "9223372036854775807K", "8589934592G"}) {
        const auto l = load({{"VIGIL_CHUNK_BYTES", text}});
        INFO("VIGIL_CHUNK_BYTES=" << text);
        REQUIRE(l.errors.size() == 1);
        CHECK_THAT(l.errors[0], Catch::Contains("VIGIL_CHUNK_BYTES"));
        CHECK(l.values.chunk_bytes == 524288);
    }
    int64_t v = 0;
    CHECK_THAT(vigil::parse_number(spec_named("VIGIL_CHUNK_BYTES"), "1T", &v),
               Catch::Contains("suffix"));
}

TEST_CASE("Bool parameters accept the documented spellings", "[params]")
{
    for (const char *yes : {"1", "true", "TRUE", "True", "yes", "YES", "on", "On"}) {
        const auto l = load({{"VIGIL_ABORT_ON_ERROR", yes}});
        INFO(yes);
        CHECK(l.errors.empty());
        CHECK(l.values.abort_on_error);
    }
    for (const char *no : {"0", "false", "FALSE", "no", "No", "off", "OFF"}) {
        // Start from a default of true is impossible, so check the parsed number directly too.
        const auto l = load({{"VIGIL_ABORT_ON_ERROR", no}});
        INFO(no);
        CHECK(l.errors.empty());
        CHECK_FALSE(l.values.abort_on_error);
        int64_t v = 7;
        CHECK(vigil::parse_number(spec_named("VIGIL_ABORT_ON_ERROR"), no, &v) == "");
        CHECK(v == 0);
    }
    for (const char *bad : {"2", "", "y", "n", "enable", "truee", " true", "-1"}) {
        const auto l = load({{"VIGIL_ABORT_ON_ERROR", bad}});
        INFO("\"" << bad << "\"");
        REQUIRE(l.errors.size() == 1);
        CHECK_THAT(l.errors[0], Catch::Contains("VIGIL_ABORT_ON_ERROR"));
        CHECK_FALSE(l.values.abort_on_error);
    }
}

TEST_CASE("String parameters are taken verbatim", "[params]")
{
    const auto l =
        load({{"VIGIL_SOCKET_IFNAME", "^=eth0, ib"}, {"VIGIL_SOCKET_FAMILY", "AF_INET6"}});
    CHECK(l.errors.empty());
    CHECK(l.values.socket_ifname == "^=eth0, ib");
    CHECK(l.values.socket_family == "AF_INET6");
}

TEST_CASE("unknown VIGIL_* names are reported, other names ignored, set lists what was given",
          "[params]")
{
    const auto l = load({{"VIGIL_FOO", "1"},
                         {"VIGIL_NSTREAMS", "4"},
                         {"VIGIL_nstreams", "5"},
                         {"NCCL_SOCKET_IFNAME", "eth0"},
                         {"PATH", "/bin"},
                         {"XVIGIL_BAR", "1"},
                         {"VIGIL_CHUNK_BYTES", "1M"}});
    CHECK(l.errors.empty());
    std::vector<std::string> unknown = l.unknown;
    std::sort(unknown.begin(), unknown.end());
    CHECK(unknown == std::vector<std::string>{"VIGIL_FOO", "VIGIL_nstreams"});
    CHECK(l.values.nstreams == 4);
    CHECK(l.values.chunk_bytes == 1048576);
    using Set = std::vector<std::pair<std::string, std::string>>;
    Set set = l.set;
    std::sort(set.begin(), set.end());
    CHECK(set == Set{{"VIGIL_CHUNK_BYTES", "1M"}, {"VIGIL_NSTREAMS", "4"}});
}

TEST_CASE("several bad values give one error each", "[params]")
{
    const auto l = load({{"VIGIL_NSTREAMS", "0"},
                         {"VIGIL_MAX_RECVS", "9"},
                         {"VIGIL_CHUNK_BYTES", "1T"},
                         {"VIGIL_SPEED_MBPS", "100"}});
    REQUIRE(l.errors.size() == 3);
    const std::string all = l.errors[0] + "\n" + l.errors[1] + "\n" + l.errors[2];
    CHECK_THAT(all, Catch::Contains("VIGIL_NSTREAMS"));
    CHECK_THAT(all, Catch::Contains("VIGIL_MAX_RECVS"));
    CHECK_THAT(all, Catch::Contains("VIGIL_CHUNK_BYTES"));
    CHECK(l.values.speed_mbps == 100);
}

TEST_CASE("report_params fails exactly when a Data row of its scope is bad", "[params]")
{
    using vigil::ParamScope;
    CHECK(vigil::report_params(load({{"VIGIL_NSTREAMS", "3"}, {"VIGIL_FOO", "x"}}), ParamScope::Net));
    const auto bad_data = load({{"VIGIL_NSTREAMS", "x"}});
    CHECK_FALSE(vigil::report_params(bad_data, ParamScope::Net));
    // The net plugin's bad value is not the profiler's or the tuner's business.
    CHECK(vigil::report_params(bad_data, ParamScope::Profiler));
    CHECK(vigil::report_params(bad_data, ParamScope::Tuner));
    // Observe rows never fail their plugin's init.
    for (const auto &[name, scope] :
         std::vector<std::pair<std::string, ParamScope>>{{"VIGIL_WINDOW_US", ParamScope::Net},
                                                         {"VIGIL_TELEMETRY", ParamScope::Net},
                                                         {"VIGIL_PROFILE_POOL", ParamScope::Profiler},
                                                         {"VIGIL_TUNER_BLOCK", ParamScope::Tuner}}) {
        INFO(name);
        CHECK(vigil::report_params(load({{name, "junk"}}), scope));
    }
}

TEST_CASE("classes: what observes or tunes is Observe, what moves data is Data", "[params]")
{
    using vigil::ParamClass;
    for (const ParamSpec &s : vigil::param_specs()) {
        const std::string name(s.name);
        INFO(name);
        const bool observe = name.rfind("VIGIL_PROFILE_", 0) == 0 || name.rfind("VIGIL_TUNER_", 0) == 0 ||
                             name == "VIGIL_TELEMETRY" || name.rfind("VIGIL_TELEMETRY_", 0) == 0 ||
                             name == "VIGIL_WINDOW_US" || name.rfind("VIGIL_DEGRADE_", 0) == 0;
        CHECK((s.cls == ParamClass::Observe) == observe);
        const vigil::ParamScope want = name.rfind("VIGIL_PROFILE_", 0) == 0 ? vigil::ParamScope::Profiler
                                       : name.rfind("VIGIL_TUNER_", 0) == 0  ? vigil::ParamScope::Tuner
                                                                             : vigil::ParamScope::Net;
        CHECK(vigil::scope_of(s) == want);
    }
}

TEST_CASE("params_markdown has a header and one row per spec", "[params]")
{
    const std::string md = vigil::params_markdown();
    std::vector<std::string> lines;
    std::istringstream in(md);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    const auto specs = vigil::param_specs();
    REQUIRE(lines.size() == specs.size() + 2); // header, separator, rows
    CHECK_THAT(lines[0], Catch::Contains("Variable"));
    CHECK_THAT(lines[0], Catch::Contains("Default"));
    CHECK(lines[1].find_first_not_of("|-") == std::string::npos);
    for (size_t i = 0; i < specs.size(); ++i) {
        const std::string &row = lines[i + 2];
        INFO(row);
        // Appends, not `"`" + std::string`: a bogus GCC 12 -Wrestrict at -O3 (GCC bug 105329).
        CHECK_THAT(row, Catch::Contains(std::string("`").append(specs[i].name).append("`")));
        // Six cells: a '|' inside a doc string would break the table.
        CHECK(std::count(row.begin(), row.end(), '|') == 7);
        if (is_numeric(specs[i])) CHECK_THAT(row, Catch::Contains(std::to_string(specs[i].max)));
        CHECK_THAT(row, Catch::Contains(specs[i].cls == vigil::ParamClass::Data ? "| fails init |"
                                                                                  : "| WARN, default |"));
    }
}

TEST_CASE("environment_source reads the process environment", "[params]")
{
    REQUIRE(setenv("VIGIL_UNIT_TEST_UNKNOWN", "1", 1) == 0);
    REQUIRE(setenv("VIGIL_NSTREAMS", "5", 1) == 0);
    const vigil::ParamSource src = vigil::environment_source();
    const vigil::ParamLoad l = vigil::load_params(src);
    unsetenv("VIGIL_UNIT_TEST_UNKNOWN");
    unsetenv("VIGIL_NSTREAMS");
    CHECK(std::find(src.names.begin(), src.names.end(), "VIGIL_NSTREAMS") != src.names.end());
    CHECK(l.values.nstreams == 5);
    CHECK(std::find(l.unknown.begin(), l.unknown.end(), "VIGIL_UNIT_TEST_UNKNOWN") !=
          l.unknown.end());
    REQUIRE(src.lookup != nullptr);
    CHECK(src.lookup("VIGIL_NSTREAMS") == nullptr); // unset again
}
