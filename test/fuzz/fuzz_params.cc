// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the VIGIL_* value parsers. The typed table (common/params.{h,cc}: ints, byte
// counts with K/M/G suffixes, bools, strings, each against its range) and the parsers that
// read the string-typed values the way the plugins' init does: interface selection
// (VIGIL_SOCKET_IFNAME, VIGIL_SOCKET_FAMILY), backup pairs (VIGIL_BACKUP), the profiler's
// event list (VIGIL_PROFILE_EVENTS), the tuner's store URL (VIGIL_TUNER_STORE) and, with the
// verbs fabric built, the HCA list and GID policy (VIGIL_IB_HCA, VIGIL_IB_ADDR_FAMILY,
// VIGIL_IB_ADDR_RANGE). VIGIL_INJECT_FAIL, a test-only switch whose parser lives with the
// send path, is parsed as a string only.
//
// Input: an environment, one NAME=VALUE per line (a line without '=' is a name with an empty
// value; NUL bytes, impossible in an environment, become spaces). Properties: load_params
// gives one error per bad value and takes no bad one; every number it takes is inside its
// range and reads back from its decimal form; the unknown names are exactly the VIGIL_*
// names the table does not hold; parse_number of each value under its own row and under a
// row of each numeric type is inside that row's range when it succeeds; the string parsers
// answer every value with a result or a reason.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "params.h"
#include "path_plan.h"
#include "profiler.h"
#include "store.h"
#include "sockets/interfaces.h"
#if VIGIL_HAVE_VERBS
#include "verbs/gid.h"
#include "verbs/hca_select.h"
#endif

namespace vn = vigil::net;

namespace {

using vigil::ParamSpec;
using vigil::ParamType;

// Every numeric row accepts what parse_number accepts only inside its range, and the value
// reads back from its decimal text.
void check_number(const ParamSpec &spec, std::string_view text)
{
    int64_t v = 0;
    if (!vigil::parse_number(spec, text, &v).empty()) return;
    FUZZ_CHECK(v >= spec.min && v <= spec.max);
    int64_t again = -1;
    const std::string dec = spec.type == ParamType::Bool ? (v ? "1" : "0") : std::to_string(v);
    FUZZ_CHECK(vigil::parse_number(spec, dec, &again).empty() && again == v);
}

// The interfaces select_devices() chooses from: up, down, loopback, IPv4 and IPv6.
std::vector<vn::IfaceInfo> interfaces()
{
    std::vector<vn::IfaceInfo> out;
    const char *names[] = {"eth0", "eth1", "ens1f0", "lo", "docker0", "ib0"};
    for (int i = 0; i < 6; ++i) {
        vn::IfaceInfo f;
        f.name = names[i];
        f.addr.family = i == 2 ? AF_INET6 : AF_INET;
        f.addr.addr[0] = 10;
        f.addr.addr[3] = static_cast<uint8_t>(i + 1);
        f.up = i != 5;
        f.loopback = f.name == "lo";
        out.push_back(f);
    }
    return out;
}

// The string-typed values, through the parsers the plugins' init hands them to.
void string_values(const vigil::Params &p)
{
    std::string why;
    std::vector<vn::Device> devs;
    static const std::vector<vn::IfaceInfo> ifaces = interfaces();
    if (vn::select_devices(ifaces, p.socket_ifname, p.socket_family, &devs, &why) != 0)
        FUZZ_CHECK(!why.empty());
    std::vector<vn::DeviceProps> props;
    for (const vn::Device &d : devs) {
        vn::DeviceProps dp;
        dp.name = d.name;
        props.push_back(dp);
    }
    if (props.empty()) {
        props.emplace_back();
        props.back().name = "eth0";
    }

    vn::BackupPlan plan;
    why.clear();
    if (vn::BackupPlan::parse(p.backup, props, &plan, &why)) {
        vn::ListenHandle h;
        h.addrs.resize(2);
        h.addr_devs = {0, 1};
        for (int d = 0; d < static_cast<int>(props.size()); ++d) {
            const vn::ConnectPlan c = plan.plan(d, h, -1);
            FUZZ_CHECK(c.local_dev[0] == d);
            for (size_t k = 0; k < c.local_dev.size(); ++k) {
                FUZZ_CHECK(c.local_dev[k] >= -1 && c.local_dev[k] < static_cast<int>(props.size()));
                FUZZ_CHECK(c.remote[k] >= -1 && c.remote[k] < static_cast<int>(h.addrs.size()));
            }
        }
    } else {
        FUZZ_CHECK(!why.empty());
    }

    vigil::prof::Selection sel;
    why.clear();
    if (vigil::prof::parse_events(p.profile_events, &sel, &why)) {
        FUZZ_CHECK((sel.traced & ~sel.recorded) == 0);
        (void)vigil::prof::events_text(sel.traced);
    } else {
        FUZZ_CHECK(!why.empty());
    }

    std::string kind, host;
    int port = 0;
    if (vigil::tuner::parse_store_url(p.tuner_store, &kind, &host, &port).empty())
        FUZZ_CHECK(kind != "redis" || (port >= 1 && port <= 65535 && !host.empty()));

#if VIGIL_HAVE_VERBS
    vn::ib::HcaSelector hca;
    why.clear();
    if (vn::ib::HcaSelector::parse(p.ib_hca, &hca, &why)) {
        for (const auto &e : hca.entries) (void)hca.matches(e.name, e.port);
        (void)hca.matches("mlx5_0", 1);
    } else {
        FUZZ_CHECK(!why.empty());
    }
    vn::ib::GidPolicy gid;
    why.clear();
    if (vn::ib::GidPolicy::parse(static_cast<int>(p.ib_gid_index), p.ib_addr_family,
                                 p.ib_addr_range, static_cast<int>(p.ib_roce_version_num), &gid,
                                 &why))
        FUZZ_CHECK(gid.range_bits >= 0 && gid.range_bits <= 128);
    else
        FUZZ_CHECK(!why.empty());
#endif
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int * /*argc*/, char *** /*argv*/)
{
    vigil::fuzz::init();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    std::string text(reinterpret_cast<const char *>(data), size);
    std::replace(text.begin(), text.end(), '\0', ' ');
    static const std::vector<const ParamSpec *> one_per_type = [] {
        std::vector<const ParamSpec *> out;
        for (ParamType t : {ParamType::Int, ParamType::Bytes, ParamType::Bool})
            for (const ParamSpec &spec : vigil::param_specs())
                if (spec.type == t) {
                    out.push_back(&spec);
                    break;
                }
        return out;
    }();
    std::map<std::string, std::string> env; // the first line of a name wins, as in getenv()
    vigil::ParamSource src;
    for (size_t pos = 0; pos < text.size();) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string::npos) nl = text.size();
        const std::string line = text.substr(pos, nl - pos);
        pos = nl + 1;
        const size_t eq = line.find('=');
        const std::string name = line.substr(0, eq);
        const std::string value = eq == std::string::npos ? std::string() : line.substr(eq + 1);
        if (env.emplace(name, value).second) src.names.push_back(name);
        // The value under its own row, and under one row of each numeric type.
        for (const ParamSpec &spec : vigil::param_specs())
            if (spec.type != ParamType::String && spec.name == name) check_number(spec, value);
        for (const ParamSpec *spec : one_per_type) check_number(*spec, value);
    }
    src.lookup = [&](const char *name) -> const char * {
        const auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
    };

    const vigil::ParamLoad load = vigil::load_params(src);
    size_t set = 0, numeric_ok = 0;
    for (const ParamSpec &spec : vigil::param_specs()) {
        const auto it = env.find(std::string(spec.name));
        if (it == env.end()) continue;
        ++set;
        int64_t v = 0;
        if (spec.type == ParamType::String || vigil::parse_number(spec, it->second, &v).empty())
            ++numeric_ok;
    }
    FUZZ_CHECK(load.set.size() == set);
    FUZZ_CHECK(load.errors.size() + load.warnings.size() == set - numeric_ok);
    FUZZ_CHECK(load.problems.size() == set - numeric_ok);
    size_t unknown = 0;
    for (const std::string &n : src.names) {
        if (n.rfind("VIGIL_", 0) != 0) continue;
        const auto specs = vigil::param_specs();
        unknown += std::none_of(specs.begin(), specs.end(),
                                [&](const ParamSpec &s) { return s.name == n; });
    }
    FUZZ_CHECK(load.unknown.size() == unknown);
    for (vigil::ParamScope scope :
         {vigil::ParamScope::Net, vigil::ParamScope::Tuner, vigil::ParamScope::Profiler})
        (void)vigil::report_params(load, scope);
    if (load.errors.empty()) string_values(load.values);
    return 0;
}
