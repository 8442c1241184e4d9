// SPDX-License-Identifier: Apache-2.0
// `vigil report`: finding the inputs and reading them into the model.
#include "report_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace vigil::tool::report {
namespace {

void add_coll(const json &j, const Origin &org, Data &d)
{
    const std::string comm = str(j, "comm");
    if (comm.empty() || !has_num(j, "seq") || !has_num(j, "rank") || !has_num(j, "start_us")) {
        ++d.incomplete;
        return;
    }
    const int rank = as_int(num(j, "rank"));
    const int64_t seq = as_i64(num(j, "seq"));
    const std::string func = str(j, "func", "?");
    d.origins.try_emplace(RankKey{comm, rank}, org);
    Coll &c = d.colls[CollKey{comm, func, seq}];
    if (c.arrivals.empty()) {
        c.comm = comm;
        c.seq = seq;
        c.func = func;
        c.bytes = num(j, "bytes");
    }
    c.nranks = std::max(c.nranks, as_int(num(j, "nranks")));
    // A record without a duration (the profiler could not time it: timing "none" or
    // "invalid") still says when the rank arrived.
    const double dur = has_num(j, "duration_us") ? num(j, "duration_us") : -1;
    c.arrivals.push_back({rank, num(j, "start_us"), dur, num(j, "busbw_GBps"), std::max(0.0, num(j, "queue_us"))});
}

void add_p2p(const json &j, const Origin &org, Data &d)
{
    const std::string comm = str(j, "comm");
    if (comm.empty() || !has_num(j, "rank")) {
        ++d.incomplete;
        return;
    }
    const RankKey k{comm, as_int(num(j, "rank"))};
    d.origins.try_emplace(k, org);
    P2pStat &p = d.p2p[k];
    ++p.count;
    p.bytes += num(j, "bytes");
    if (has_num(j, "duration_us")) {
        p.dur_sum += num(j, "duration_us");
        ++p.timed;
    }
}

// A profiler `net` record: a window, failover or failback of the path carrying a transfer.
void add_net(const json &j, const Origin &org, Data &d)
{
    const std::string ev = str(j, "event");
    const std::string dev = "dev " + str(j, "dev", "?");
    const std::string slot = str(j, "slot", "?");
    const std::string who = "pid " + org.pid + " rank " + str(j, "rank", "?");
    const std::string key = org.host + " " + who + " " + dev + " " + slot;
    PathStat &p = d.prof_paths[key];
    if (p.label.empty()) {
        p.label = "host " + key;
        p.needle = who + " " + dev + " " + slot + ",";
        p.source = "profiler";
        p.host = org.host;
        p.device = dev;
        p.slots.insert(slot);
        p.origins.insert(org.host + ":" + org.pid);
    }
    if (ev == "window") {
        p.add_window(num(j, "bytes"), num(j, "busy_us") / 1e6, false, truthy(j, "degraded"), num(j, "lat_p99_us"));
    } else if (ev == "failover" || ev == "failback") {
        ++d.event_counts[ev];
        d.events.push_back({"profiler", org.host, ev,
                            who + " " + dev + " " + slot + ", generation " + str(j, "generation", "?") +
                                ", " + str(j, "bytes", "0") + " bytes"});
    } else {
        ++d.unknown;
    }
}

/// A telemetry `path` record: what a registry entry's windows belong to, until the entry is
/// described again (entries are reused by later paths).
struct PathDesc {
    std::string kind, slot, device, local, peer;
};

} // namespace

// The content of an input: its file, or the text it holds. Null when the file cannot be opened.
std::unique_ptr<std::istream> open_input(const Input &in)
{
    if (in.text != nullptr) return std::make_unique<std::istringstream>(*in.text);
    auto f = std::make_unique<std::ifstream>(in.path);
    if (!*f) return nullptr;
    return f;
}

bool has_num(const json &j, const char *k)
{
    const auto it = j.find(k);
    return it != j.end() && it->is_number();
}

double num(const json &j, const char *k, double def)
{
    const auto it = j.find(k);
    if (it == j.end()) return def;
    if (it->is_number()) return it->get<double>();
    if (it->is_boolean()) return it->get<bool>() ? 1 : 0;
    return def;
}

std::string str(const json &j, const char *k, const std::string &def)
{
    const auto it = j.find(k);
    if (it == j.end()) return def;
    if (it->is_string()) return it->get<std::string>();
    if (it->is_number()) return it->dump();
    return def;
}

// Numbers from files into integers, clamped: converting an out-of-range double is undefined.
int as_int(double x)
{
    return std::isnan(x) ? 0 : static_cast<int>(std::clamp(x, -2147483648.0, 2147483647.0));
}

int64_t as_i64(double x)
{
    return std::isnan(x) ? 0 : static_cast<int64_t>(std::clamp(x, -9.0e18, 9.0e18));
}

bool truthy(const json &j, const char *k)
{
    const auto it = j.find(k);
    if (it == j.end()) return false;
    if (it->is_string()) return *it == "true" || *it == "1";
    return num(j, k) != 0;
}

// Names from files may hold bytes that are not UTF-8: replace them rather than throw.
std::string dumps(const json &j, int indent)
{
    return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

double median(std::vector<double> v)
{
    if (v.empty()) return 0;
    const size_t m = v.size() / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m), v.end());
    const double hi = v[m];
    if (v.size() % 2) return hi;
    return (*std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m)) + hi) / 2;
}

double quantile(std::vector<double> v, double q)
{
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

std::optional<Input> classify(const fs::path &p)
{
    const std::string n = p.filename().string();
    const auto cut = [&](size_t pre, size_t suf) {
        return n.size() > pre + suf ? n.substr(pre, n.size() - pre - suf) : std::string();
    };
    Input in{p, Kind::kSummary, "", "", nullptr};
    std::string stem;
    if (n.starts_with("vigil-prof-")) {
        if (n.ends_with(".trace.json")) in.kind = Kind::kTrace, stem = cut(11, 11);
        else if (n.ends_with(".jsonl")) stem = cut(11, 6);
        else return std::nullopt;
    } else if (n.starts_with("vigil-")) {
        in.kind = Kind::kTelemetry;
        if (n.ends_with(".jsonl")) stem = cut(6, 6);
        else if (n.ends_with(".jsonl.1")) stem = cut(6, 8);
        else return std::nullopt;
    } else {
        return std::nullopt;
    }
    if (stem.empty()) return std::nullopt;
    // Host names may hold '-': the pid is what follows the last one.
    const size_t dash = stem.rfind('-');
    in.host = dash == std::string::npos ? stem : stem.substr(0, dash);
    in.pid = dash == std::string::npos ? "?" : stem.substr(dash + 1);
    return in;
}

// Every input file of the given directories (or files), each once, in name order. Prints why
// an argument gave nothing.
std::vector<Input> find_inputs(const std::vector<std::string> &args)
{
    std::map<std::string, Input> found;
    auto add = [&](const fs::path &p) {
        std::error_code ec;
        if (!fs::is_regular_file(p, ec)) return;
        if (auto in = classify(p)) {
            const fs::path canon = fs::weakly_canonical(p, ec);
            found.emplace(ec ? p.string() : canon.string(), *in);
        }
    };
    for (const std::string &a : args) {
        std::error_code ec;
        const size_t before = found.size();
        if (fs::is_directory(a, ec)) {
            fs::directory_iterator it(a, ec), end;
            for (; !ec && it != end; it.increment(ec)) add(it->path());
            if (ec) std::fprintf(stderr, "vigil report: cannot list %s: %s\n", a.c_str(), ec.message().c_str());
        } else if (fs::exists(a, ec)) {
            add(a);
        } else {
            std::fprintf(stderr, "vigil report: %s: no such file or directory\n", a.c_str());
            continue;
        }
        if (found.size() == before) std::fprintf(stderr, "vigil report: %s: no vigil files in it\n", a.c_str());
    }
    std::vector<Input> out;
    for (auto &[k, in] : found) out.push_back(in);
    return out;
}

void read_summary(const Input &in, Data &d)
{
    Origin org{in.host, in.pid};
    json stats;
    if (!read_jsonl(in, d.bad, [&](const json &j) {
            const std::string type = str(j, "type");
            if (type == "process") {
                org.host = str(j, "host", org.host);
                org.pid = str(j, "pid", org.pid);
            } else if (type == "comm") {
                int &n = d.comm_nranks[str(j, "comm")];
                n = std::max(n, as_int(num(j, "nranks")));
            } else if (type == "coll") {
                add_coll(j, org, d);
            } else if (type == "p2p") {
                add_p2p(j, org, d);
            } else if (type == "net") {
                add_net(j, org, d);
            } else if (type == "stats") {
                stats = j; // the last one of the file counts
            } else {
                ++d.unknown;
            }
        }))
        return;
    ++d.summaries;
    const std::string name = in.path.string();
    d.process_of[name.substr(0, name.size() - 6)] = org;
    if (!stats.is_object()) return;
    for (const auto &[k, v] : stats.items())
        if (v.is_number() && (k.starts_with("dropped_") || k.ends_with("_dropped"))) d.drops[k] += v.get<double>();
}

void read_telemetry(const Input &in, Data &d)
{
    std::map<int64_t, PathDesc> paths;
    if (!read_jsonl(in, d.bad, [&](const json &j) {
            const std::string type = str(j, "type");
            if (type == "path") {
                paths[as_i64(num(j, "path", -1))] =
                    PathDesc{str(j, "kind", "?"), str(j, "slot", "?"), str(j, "device", "?"), str(j, "local", "?"),
                             str(j, "peer", "?")};
            } else if (type == "window") {
                const auto it = paths.find(as_i64(num(j, "path", -1)));
                if (it == paths.end()) {
                    ++d.orphan_windows; // its path record was in a file we do not have
                    return;
                }
                const PathDesc &pd = it->second;
                const std::string key = in.host + " " + pd.device + " " + pd.local + " -> " + pd.peer + " " + pd.kind;
                PathStat &p = d.tele_paths[key];
                if (p.label.empty()) {
                    p.label = "host " + key;
                    p.needle = pd.local + " -> " + pd.peer;
                    p.source = "telemetry";
                    p.host = in.host;
                    p.device = pd.device;
                    p.local = pd.local;
                    p.peer = pd.peer;
                    p.kind = pd.kind;
                }
                p.slots.insert(pd.slot);
                p.origins.insert(in.host + ":" + in.pid);
                p.add_window(num(j, "bytes"), num(j, "busy_ns") / 1e9, truthy(j, "receiver_bound"),
                             truthy(j, "degraded"), num(j, "lat_p99_ns") / 1e3);
            } else if (type == "event" || type == "signal") {
                const std::string ev = type == "signal" ? "signal" : str(j, "event", "?");
                if (type == "event" && j.contains("mono_ns") &&
                    !d.seen_events.insert(in.host + ":" + in.pid + " " + j["mono_ns"].dump() + " " + ev).second)
                    return; // carried into a rotated file: counted where first read
                ++d.event_counts[ev];
                d.events.push_back({"telemetry", in.host, ev,
                                    type == "signal" ? "signal " + str(j, "signal", "?") : str(j, "text")});
            } else if (type == "events_dropped") {
                const int64_t n = as_i64(num(j, "count"));
                d.event_counts["events_dropped"] += static_cast<uint64_t>(std::max<int64_t>(0, n));
            } else {
                ++d.unknown;
            }
        }))
        return;
    ++d.telemetry;
}

} // namespace vigil::tool::report
