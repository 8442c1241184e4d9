// SPDX-License-Identifier: Apache-2.0
// `vigil report`: aligns collectives across ranks and names the slowest rank, NIC and path.
#include "report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <spawn.h>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"

extern char **environ;

namespace vigil::telemetry {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// What "stands out" means. A rank is named when it arrives late by more than the jitter of
// the others and by a real share of the collectives' duration, and either is the last one in
// a clear majority of the collectives or is late by much more, on average, than any other
// rank. A NIC or path is named when its busy-time
// bandwidth is clearly below the median of the others.
constexpr size_t kMinAligned = 3;      // collectives seen on >= 2 ranks before judging a comm
constexpr double kMinLateUs = 5.0;     // mean lateness below this is never worth naming
constexpr double kNoiseFactor = 2.0;   // ... nor below this many times the others' jitter (MAD)
constexpr double kMajority = 0.5;      // last in at least this fraction of the collectives,
constexpr double kOverChance = 1.5;    // and in at least this many times 1/nranks (2 ranks: 75%)
constexpr double kDominance = 3.0;     // or mean lateness >= this many times any other rank's
constexpr double kTogetherFrac = 0.25; // median skew <= this share of the work: "together"
constexpr double kMinLateShare = 0.05; // mean lateness below this share of the work is a
                                       // consequence (e.g. a slow link finishing one rank's
                                       // previous collective later), not a straggler
constexpr double kSlowRatio = 0.7;     // busy bandwidth below this share of the others' median
constexpr double kMinPathBytes = 1 << 20; // a path is "loaded" with at least 1 MiB ...
constexpr double kMinPathShare = 0.01;    // ... and 1% of the busiest path's bytes

struct Options {
    std::string out = "vigil-report";
    bool plots = true;
    size_t top = 10;
    std::vector<std::string> inputs;
};

enum class Kind { kSummary, kTrace, kTelemetry };

struct Input {
    fs::path path;
    Kind kind;
    std::string host, pid;            // from the file name
    const std::string *text = nullptr; // the content, when held in memory (report_from_memory)
};

// The content of an input: its file, or the text it holds. Null when the file cannot be opened.
std::unique_ptr<std::istream> open_input(const Input &in)
{
    if (in.text != nullptr) return std::make_unique<std::istringstream>(*in.text);
    auto f = std::make_unique<std::ifstream>(in.path);
    if (!*f) return nullptr;
    return f;
}

// ---- JSON access that never throws ---------------------------------------------------------

bool has_num(const json &j, const char *k)
{
    const auto it = j.find(k);
    return it != j.end() && it->is_number();
}

double num(const json &j, const char *k, double def = 0)
{
    const auto it = j.find(k);
    if (it == j.end()) return def;
    if (it->is_number()) return it->get<double>();
    if (it->is_boolean()) return it->get<bool>() ? 1 : 0;
    return def;
}

std::string str(const json &j, const char *k, const std::string &def = {})
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
std::string dumps(const json &j, int indent = -1)
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

// ---- input files ---------------------------------------------------------------------------

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

struct BadLines {
    uint64_t count = 0;
    std::string first; // FILE:LINE of the first one
};

// Calls `f` with every line of `input` that is a JSON object; counts the lines that are not
// (a truncated last line, garbage). False when the file cannot be opened.
template <class F> bool read_jsonl(const Input &input, BadLines &bad, F &&f)
{
    const fs::path &path = input.path;
    const std::unique_ptr<std::istream> in = open_input(input);
    if (!in) {
        std::fprintf(stderr, "vigil report: cannot open %s: %s\n", path.c_str(), std::strerror(errno));
        return false;
    }
    std::string line;
    uint64_t no = 0;
    while (std::getline(*in, line)) {
        ++no;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const json j = json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) {
            if (bad.count++ == 0) bad.first = path.string() + ":" + std::to_string(no);
            continue;
        }
        f(j);
    }
    return true;
}

// ---- the data ------------------------------------------------------------------------------

struct Origin {
    std::string host, pid;
};

struct RankKey {
    std::string comm;
    int rank;
    auto operator<=>(const RankKey &) const = default;
};

/// One rank's part of a collective.
struct Arrival {
    int rank;
    double start_us, duration_us, busbw; // duration_us < 0: untimed (timing "none"/"invalid")
    double queue_us = 0;                 // enqueue to the first kernel channel's start, when known
};

/// Which collective a record belongs to. NCCL counts `seqNumber` per communicator and per
/// collective function (AllReduce 0, 1, ... and Broadcast 0, 1, ... on one communicator;
/// ncclProfilerCollEvent in NCCL's src/plugin/profiler.cc), so the function is part of it.
struct CollKey {
    std::string comm, func;
    int64_t seq = 0;
    auto operator<=>(const CollKey &) const = default;
};

/// One collective, (comm, function, seq), as every rank saw it; the derived fields are filled
/// by derive().
struct Coll {
    std::string comm, func;
    int64_t seq = 0;
    double bytes = 0;
    int nranks = 0;
    std::vector<Arrival> arrivals;
    double first_us = 0, skew_us = 0, late_us = 0, work_us = 0, max_dur_us = 0, min_busbw = 0;
    int last_rank = -1, max_dur_rank = -1;
    std::vector<double> lateness; // per arrival: its start minus the median start of the others
};

struct P2pStat {
    uint64_t count = 0, timed = 0; // records, and those with a duration
    double bytes = 0, dur_sum = 0;
};

/// Windows of one path (or, aggregated, of one NIC) from one source.
struct PathStat {
    std::string label;  // human name, also the key
    std::string source; // "telemetry" or "profiler"
    std::string host, device, local, peer, kind;
    // What the texts of its events hold: telemetry "dev NAME LOCAL -> PEER" (a failover names
    // the old and the new path), profiler "pid P rank R dev D SLOT,".
    std::string needle;
    std::set<std::string> slots, origins;
    uint64_t windows = 0, loaded_windows = 0, degraded = 0;
    double bytes = 0, busy_s = 0, p99_max_us = 0;
    std::map<std::string, uint64_t> named; // events whose text names it: failover -> count, ...
    double bw() const { return busy_s > 0 ? bytes / busy_s : 0; }
    /// One window. Loaded = data in flight: a window may hold busy time and no completion
    /// (a message spanning windows completes in its last one), and its busy time still
    /// counts; one whose data waited for the receiving application (`receiver_bound`: it had
    /// not posted its receive) says nothing about the path's speed.
    void add_window(double w_bytes, double w_busy_s, bool receiver_bound, bool w_degraded, double p99_us)
    {
        ++windows;
        if (w_busy_s > 0 && !receiver_bound) {
            ++loaded_windows;
            bytes += w_bytes;
            busy_s += w_busy_s;
        }
        degraded += w_degraded;
        p99_max_us = std::max(p99_max_us, p99_us);
    }
};

struct EventRec {
    std::string source, host, event, text;
};

struct Data {
    std::map<CollKey, Coll> colls;
    std::map<RankKey, Origin> origins;
    std::map<RankKey, P2pStat> p2p;
    std::map<std::string, int> comm_nranks;
    std::map<std::string, PathStat> tele_paths, prof_paths;
    std::vector<EventRec> events;
    std::map<std::string, uint64_t> event_counts;
    std::map<std::string, double> drops; // summed "dropped" counters of the stats records
    // The process record of each summary, by file name less ".jsonl": its trace has the same
    // stem, and the name alone is ambiguous ("vigil-prof-HOST-PID-SESSION", hosts with '-').
    std::map<std::string, Origin> process_of;
    uint64_t duplicates = 0, unknown = 0, incomplete = 0, orphan_windows = 0;
    BadLines bad;
    size_t summaries = 0, traces = 0, telemetry = 0;
};

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

/// A telemetry `path` record: what a registry entry's windows belong to, until the entry is
/// described again (entries are reused by later paths).
struct PathDesc {
    std::string kind, slot, device, local, peer;
};

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

// ---- collectives ---------------------------------------------------------------------------

// Fills the derived fields of a collective; drops a rank's second record of it.
void derive(Coll &c, uint64_t *duplicates)
{
    auto &a = c.arrivals;
    std::stable_sort(a.begin(), a.end(), [](const Arrival &x, const Arrival &y) { return x.rank < y.rank; });
    const auto dup =
        std::unique(a.begin(), a.end(), [](const Arrival &x, const Arrival &y) { return x.rank == y.rank; });
    *duplicates += static_cast<uint64_t>(a.end() - dup);
    a.erase(dup, a.end());

    std::vector<double> starts;
    double last = -1e300, end = -1e300;
    c.first_us = 1e300;
    c.min_busbw = 0;
    for (const Arrival &x : a) {
        starts.push_back(x.start_us);
        c.first_us = std::min(c.first_us, x.start_us);
        if (x.start_us > last) last = x.start_us, c.last_rank = x.rank;
        if (x.duration_us < 0) continue; // untimed: its arrival counts, its end is unknown
        end = std::max(end, x.start_us + x.queue_us + x.duration_us); // its completion
        if (x.duration_us > c.max_dur_us || c.max_dur_rank < 0) c.max_dur_us = x.duration_us, c.max_dur_rank = x.rank;
        if (x.busbw > 0 && (c.min_busbw == 0 || x.busbw < c.min_busbw)) c.min_busbw = x.busbw;
    }
    c.skew_us = last - c.first_us;
    c.work_us = std::max(0.0, end - last);
    c.lateness.assign(a.size(), 0);
    if (a.size() < 2) return;
    // The median of the others, from one sort: dropping sorted position k shifts those above it.
    std::vector<double> s = starts;
    std::sort(s.begin(), s.end());
    const size_t m = s.size() - 1;
    for (size_t i = 0; i < a.size(); ++i) {
        const size_t k = static_cast<size_t>(std::lower_bound(s.begin(), s.end(), starts[i]) - s.begin());
        auto at = [&](size_t p) { return p < k ? s[p] : s[p + 1]; };
        const double med = m % 2 ? at(m / 2) : (at(m / 2 - 1) + at(m / 2)) / 2;
        c.lateness[i] = starts[i] - med;
        if (a[i].rank == c.last_rank) c.late_us = c.lateness[i];
    }
}

/// Per (comm, rank) aggregates over the collectives of the comm.
struct RankStat {
    Origin org;
    uint64_t colls = 0, aligned = 0, last = 0, missing = 0;
    std::vector<double> late;
    double dur_sum = 0, busbw_sum = 0;
    uint64_t busbw_n = 0, timed = 0; // timed: collectives with a duration
    P2pStat p2p;
    double mean_late() const
    {
        double s = 0;
        for (double x : late) s += x;
        return late.empty() ? 0 : s / static_cast<double>(late.size());
    }
    // Jitter: median absolute deviation of the lateness around its median.
    double mad_late() const
    {
        const double m = median(late);
        std::vector<double> dev;
        for (double x : late) dev.push_back(std::fabs(x - m));
        return median(dev);
    }
};

/// The verdict on one communicator.
struct CommVerdict {
    std::string comm;
    int nranks = 0;
    size_t colls = 0, complete = 0, aligned = 0, hosts = 0;
    double median_skew = 0, p99_skew = 0, max_skew = 0, median_work = 0;
    bool stands_out = false;
    int rank = -1;         // the candidate: largest mean lateness
    double frac = 0, mean_late = 0, noise = 0, next_late = 0, majority = 0;
    uint64_t last = 0;
    std::string diagnosis; // late_rank | together | desync_spread | too_few
    std::map<int, RankStat> ranks;
};

CommVerdict judge_comm(const std::string &comm, const std::vector<const Coll *> &colls, const Data &d)
{
    CommVerdict v;
    v.comm = comm;
    v.colls = colls.size();
    const auto cn = d.comm_nranks.find(comm);
    v.nranks = cn == d.comm_nranks.end() ? 0 : cn->second;
    for (const auto &[k, org] : d.origins)
        if (k.comm == comm) v.ranks[k.rank].org = org;
    for (const auto &[k, p] : d.p2p)
        if (k.comm == comm) v.ranks[k.rank].p2p = p;
    std::set<std::string> hosts;
    for (const auto &[r, rs] : v.ranks) hosts.insert(rs.org.host);
    v.hosts = hosts.size();

    std::vector<double> skews, works;
    for (const Coll *c : colls) {
        v.nranks = std::max(v.nranks, c->nranks);
        for (size_t i = 0; i < c->arrivals.size(); ++i) {
            const Arrival &a = c->arrivals[i];
            RankStat &rs = v.ranks[a.rank];
            ++rs.colls;
            if (a.duration_us >= 0) {
                rs.dur_sum += a.duration_us;
                ++rs.timed;
            }
            if (a.busbw > 0) rs.busbw_sum += a.busbw, ++rs.busbw_n;
            if (c->arrivals.size() < 2) continue;
            ++rs.aligned;
            rs.late.push_back(c->lateness[i]);
            if (a.rank == c->last_rank) ++rs.last;
        }
        if (c->arrivals.size() >= 2) {
            ++v.aligned;
            skews.push_back(c->skew_us);
            works.push_back(c->work_us);
        }
    }
    v.nranks = std::max(v.nranks, static_cast<int>(v.ranks.size()));
    for (const Coll *c : colls) {
        if (static_cast<int>(c->arrivals.size()) >= v.nranks) ++v.complete;
        for (auto &[r, rs] : v.ranks)
            if (!std::binary_search(c->arrivals.begin(), c->arrivals.end(), Arrival{r, 0, 0, 0, 0},
                                    [](const Arrival &x, const Arrival &y) { return x.rank < y.rank; }))
                ++rs.missing; // arrivals are sorted by rank (derive())
    }
    v.median_skew = median(skews);
    v.p99_skew = quantile(skews, 0.99);
    v.max_skew = skews.empty() ? 0 : *std::max_element(skews.begin(), skews.end());
    v.median_work = median(works);

    size_t ranks_aligned = 0;
    for (const auto &[r, rs] : v.ranks) {
        if (rs.aligned == 0) continue;
        ++ranks_aligned;
        if (v.rank < 0 || rs.mean_late() > v.mean_late) v.rank = r, v.mean_late = rs.mean_late();
    }
    if (v.aligned < kMinAligned || ranks_aligned < 2) {
        v.diagnosis = "too_few";
        return v;
    }
    const RankStat &cand = v.ranks[v.rank];
    std::vector<double> mads;
    for (const auto &[r, rs] : v.ranks) {
        if (r == v.rank || rs.aligned == 0) continue;
        mads.push_back(rs.mad_late());
        v.next_late = std::max(v.next_late, std::fabs(rs.mean_late()));
    }
    v.noise = median(mads);
    v.last = cand.last;
    v.frac = static_cast<double>(cand.last) / static_cast<double>(cand.aligned);
    v.majority = std::max(kMajority, kOverChance / static_cast<double>(ranks_aligned));
    const bool late_enough = v.mean_late >= std::max({kMinLateUs, kNoiseFactor * v.noise, kMinLateShare * v.median_work});
    const bool consistent = v.frac >= v.majority || v.mean_late >= kDominance * v.next_late;
    v.stands_out = late_enough && consistent;
    if (v.stands_out) v.diagnosis = "late_rank";
    else if (v.median_skew <= std::max(kMinLateUs, kTogetherFrac * v.median_work)) v.diagnosis = "together";
    else v.diagnosis = "desync_spread";
    return v;
}

// ---- paths and NICs ------------------------------------------------------------------------

/// The slowest of a set of paths or NICs, or why none is named.
struct SlowVerdict {
    const PathStat *who = nullptr; // set only when it stands out
    const PathStat *lowest = nullptr;
    double bw = 0, median_others = 0, ratio = 0;
    size_t loaded = 0;
    std::string why;
};

SlowVerdict judge_slowest(const std::vector<const PathStat *> &all, const char *what)
{
    SlowVerdict v;
    double max_bytes = 0;
    for (const PathStat *p : all) max_bytes = std::max(max_bytes, p->bytes);
    std::vector<const PathStat *> loaded;
    for (const PathStat *p : all)
        if (p->busy_s > 0 && p->bytes >= kMinPathBytes && p->bytes >= kMinPathShare * max_bytes) loaded.push_back(p);
    v.loaded = loaded.size();
    if (loaded.size() < 2) {
        v.why = all.empty() ? std::string("no ") + what + " telemetry found"
                            : std::string("fewer than 2 loaded ") + what + "s to compare";
        return v;
    }
    v.lowest = *std::min_element(loaded.begin(), loaded.end(), [](auto *a, auto *b) { return a->bw() < b->bw(); });
    std::vector<double> others;
    for (const PathStat *p : loaded)
        if (p != v.lowest) others.push_back(p->bw());
    v.bw = v.lowest->bw();
    v.median_others = median(others);
    v.ratio = v.median_others > 0 ? v.bw / v.median_others : 1;
    if (v.ratio < kSlowRatio) v.who = v.lowest;
    else {
        char buf[160];
        std::snprintf(buf, sizeof(buf), "none of %zu loaded %ss below %.2fx the median of the others", loaded.size(),
                      what, kSlowRatio);
        v.why = buf;
    }
    return v;
}

// The address part of an endpoint ("10.0.0.1:4242" -> "10.0.0.1", "[fe80::1]:42" -> "[fe80::1]").
std::string address_of(const std::string &endpoint)
{
    const size_t b = endpoint.find(']');
    if (b != std::string::npos) return endpoint.substr(0, b + 1);
    const size_t c = endpoint.rfind(':');
    return c == std::string::npos ? endpoint : endpoint.substr(0, c);
}

// Sums paths into one entry per NIC: (host, device, local address). The address tells NICs
// apart where host names do not (containers and network namespaces share one host name).
std::map<std::string, PathStat> nics_of(const std::map<std::string, PathStat> &paths)
{
    std::map<std::string, PathStat> nics;
    for (const auto &[k, p] : paths) {
        const std::string addr = address_of(p.local);
        const std::string key = p.host + " " + p.device + (addr.empty() ? "" : " " + addr);
        PathStat &n = nics[key];
        if (n.label.empty()) {
            n.label = "host " + key;
            n.source = p.source;
            n.host = p.host;
            n.device = p.device;
            n.needle = p.source == "telemetry" ? "dev " + p.device + " " : p.device + " ";
        }
        n.slots.insert(p.slots.begin(), p.slots.end());
        n.origins.insert(p.origins.begin(), p.origins.end());
        n.windows += p.windows;
        n.loaded_windows += p.loaded_windows;
        n.degraded += p.degraded;
        n.bytes += p.bytes;
        n.busy_s += p.busy_s;
        n.p99_max_us = std::max(n.p99_max_us, p.p99_max_us);
    }
    return nics;
}

// Counts the events whose text holds the path's or NIC's needle.
void name_events(PathStat *p, const std::vector<EventRec> &events)
{
    for (const EventRec &e : events) {
        if (e.source != p->source || e.host != p->host || e.text.find(p->needle) == std::string::npos) continue;
        // A degraded/healthy verdict starts with the path's kind: the other direction is not it.
        if (!p->kind.empty() && (e.text.starts_with("send ") || e.text.starts_with("recv ")) &&
            !e.text.starts_with(p->kind + " "))
            continue;
        ++p->named[e.event];
    }
}

std::string join(const std::set<std::string> &s, const char *sep)
{
    std::string o;
    for (const std::string &x : s) o += (o.empty() ? "" : sep) + x;
    return o;
}

json path_json(const PathStat &p)
{
    return json{{"label", p.label},       {"source", p.source},        {"host", p.host},
                {"device", p.device},     {"local", p.local},          {"peer", p.peer},
                {"kind", p.kind},         {"slots", join(p.slots, ",")}, {"processes", join(p.origins, ",")},
                {"windows", p.windows},   {"loaded_windows", p.loaded_windows}, {"degraded_windows", p.degraded},
                {"bytes", p.bytes},       {"busy_s", p.busy_s},        {"busy_bw_GBps", p.bw() / 1e9},
                {"lat_p99_max_us", p.p99_max_us}, {"events", p.named}};
}

json slow_json(const SlowVerdict &v)
{
    if (v.who == nullptr) return nullptr;
    json j = path_json(*v.who);
    j["median_others_GBps"] = v.median_others / 1e9;
    j["ratio"] = v.ratio;
    j["compared_with"] = v.loaded - 1;
    return j;
}

// ---- printing ------------------------------------------------------------------------------

uint64_t named(const PathStat &p, const char *event)
{
    const auto it = p.named.find(event);
    return it == p.named.end() ? 0 : it->second;
}

void print_paths(const char *title, const char *noun, const std::map<std::string, PathStat> &paths, size_t top)
{
    std::vector<const PathStat *> v;
    for (const auto &[k, p] : paths) v.push_back(&p);
    std::sort(v.begin(), v.end(), [](auto *a, auto *b) { return a->bw() < b->bw(); });
    std::printf("%s, slowest first (%zu of %zu):\n", title, std::min(top, v.size()), v.size());
    std::printf("  %-52s %14s %10s %8s %6s %9s %4s %4s\n", noun, "bytes", "busy_GBps", "windows", "degr",
                "p99max_us", "fo", "fb");
    for (size_t i = 0; i < v.size() && i < top; ++i)
        std::printf("  %-52s %14.0f %10.3f %8llu %6llu %9.1f %4llu %4llu\n", v[i]->label.c_str(), v[i]->bytes,
                    v[i]->bw() / 1e9, static_cast<unsigned long long>(v[i]->windows),
                    static_cast<unsigned long long>(v[i]->degraded), v[i]->p99_max_us,
                    static_cast<unsigned long long>(named(*v[i], "failover")),
                    static_cast<unsigned long long>(named(*v[i], "failback")));
}

void print_slow(const char *what, const SlowVerdict &v, const char *noun)
{
    if (v.who != nullptr) {
        std::string ev;
        for (const auto &[k, n] : v.who->named) ev += (ev.empty() ? "" : ", ") + std::to_string(n) + " " + k;
        std::printf("slowest %s: %s: busy bandwidth %.3f GB/s, %.2fx the median of the other %zu loaded %ss "
                    "(%.3f GB/s); %llu of %llu windows degraded; events naming it: %s\n",
                    what, v.who->label.c_str(), v.bw / 1e9, v.ratio, v.loaded - 1, noun, v.median_others / 1e9,
                    static_cast<unsigned long long>(v.who->degraded),
                    static_cast<unsigned long long>(v.who->windows), ev.empty() ? "none" : ev.c_str());
    } else if (v.lowest != nullptr) {
        std::printf("slowest %s: none stands out (%s; lowest %s at %.2fx the median)\n", what, v.why.c_str(),
                    v.lowest->label.c_str(), v.ratio);
    } else {
        std::printf("slowest %s: none stands out (%s)\n", what, v.why.c_str());
    }
}

std::string rank_name(const CommVerdict &v, int r)
{
    const auto it = v.ranks.find(r);
    std::string s = "rank " + std::to_string(r);
    if (it != v.ranks.end() && !it->second.org.host.empty())
        s += " (host " + it->second.org.host + " pid " + it->second.org.pid + ")";
    return s;
}

void print_comm(const CommVerdict &v, size_t top)
{
    std::printf("\ncomm %s: %zu ranks seen of %d on %zu host(s); %zu collectives, %zu with every rank\n",
                v.comm.c_str(), v.ranks.size(), v.nranks, v.hosts, v.colls, v.complete);
    std::printf("  %5s %-22s %8s %8s %10s %10s %10s %12s %9s %12s %13s\n", "rank", "host:pid", "colls", "last",
                "late_us", "jitter_us", "missing", "mean_dur_us", "busbw", "p2p", "p2p_dur_us");
    size_t shown = 0;
    for (const auto &[r, rs] : v.ranks) {
        if (shown++ == std::max<size_t>(top, 32)) {
            std::printf("  ... %zu more ranks in report.json\n", v.ranks.size() - shown + 1);
            break;
        }
        std::printf("  %5d %-22.22s %8llu %8llu %10.1f %10.1f %10llu %12.1f %9.3f %12llu %13.1f\n", r,
                    (rs.org.host + ":" + rs.org.pid).c_str(), static_cast<unsigned long long>(rs.colls),
                    static_cast<unsigned long long>(rs.last), rs.mean_late(), rs.mad_late(),
                    static_cast<unsigned long long>(rs.missing),
                    rs.timed ? rs.dur_sum / static_cast<double>(rs.timed) : 0,
                    rs.busbw_n ? rs.busbw_sum / static_cast<double>(rs.busbw_n) : 0,
                    static_cast<unsigned long long>(rs.p2p.count),
                    rs.p2p.timed ? rs.p2p.dur_sum / static_cast<double>(rs.p2p.timed) : 0);
    }
    std::printf("  arrival skew: median %.1f us, p99 %.1f us, max %.1f us; work after the last arrival: median "
                "%.1f us\n",
                v.median_skew, v.p99_skew, v.max_skew, v.median_work);
    if (v.diagnosis == "too_few") {
        std::printf("slowest rank: none stands out (comm %s: %zu collectives seen on 2 or more ranks, need %zu)\n",
                    v.comm.c_str(), v.aligned, kMinAligned);
        return;
    }
    if (v.stands_out) {
        std::printf("slowest rank: %s in comm %s: last in %llu of %zu collectives (%.0f%%), mean lateness %.1f us "
                    "(others: jitter %.1f us, largest mean %.1f us)\n",
                    rank_name(v, v.rank).c_str(), v.comm.c_str(), static_cast<unsigned long long>(v.last),
                    v.aligned, v.frac * 100, v.mean_late, v.noise, v.next_late);
        std::printf("arrival: rank %d arrives late (host-side/desync): the other ranks wait for it in the "
                    "collective (median skew %.1f us vs %.1f us of work after the last arrival)\n",
                    v.rank, v.median_skew, v.median_work);
    } else {
        std::printf("slowest rank: none stands out in comm %s (most late: %s, last in %.0f%%, mean lateness %.1f us; "
                    "others' jitter %.1f us)\n",
                    v.comm.c_str(), rank_name(v, v.rank).c_str(), v.frac * 100, v.mean_late, v.noise);
        if (v.diagnosis == "together")
            std::printf("arrival: all ranks arrive together (median skew %.1f us is %.0f%% of the %.1f us of work "
                        "after the last arrival): the time goes into the collectives themselves (network/GPU; "
                        "see slowest nic/link)\n",
                        v.median_skew, v.median_work > 0 ? 100 * v.median_skew / v.median_work : 0,
                        v.median_work);
        else
            std::printf("arrival: ranks arrive apart (median skew %.1f us vs %.1f us of work) but no single rank is "
                        "consistently last: desync spread over ranks\n",
                        v.median_skew, v.median_work);
    }
    if (v.hosts > 1)
        std::printf("  note: ranks on %zu hosts; lateness includes the clock offset between hosts (NTP/PTP "
                    "accuracy)\n",
                    v.hosts);
}

void print_top(const std::vector<const Coll *> &all, size_t top)
{
    std::vector<const Coll *> v = all;
    std::stable_sort(v.begin(), v.end(), [](auto *a, auto *b) { return a->skew_us > b->skew_us; });
    std::printf("\ncollectives with the largest arrival skew (%zu of %zu):\n", std::min(top, v.size()), v.size());
    std::printf("  %-18s %8s %-14s %12s %7s %10s %5s %10s %11s %5s %10s\n", "comm", "seq", "func", "bytes", "ranks",
                "skew_us", "last", "late_us", "max_dur_us", "rank", "min_busbw");
    for (size_t i = 0; i < v.size() && i < top; ++i) {
        const Coll &c = *v[i];
        const std::string ranks = std::to_string(c.arrivals.size()) + "/" + std::to_string(c.nranks);
        std::printf("  %-18.18s %8lld %-14.14s %12.0f %7s %10.1f %5d %10.1f %11.1f %5d %10.3f\n", c.comm.c_str(),
                    static_cast<long long>(c.seq), c.func.c_str(), c.bytes, ranks.c_str(), c.skew_us, c.last_rank,
                    c.late_us, c.max_dur_us, c.max_dur_rank, c.min_busbw);
    }
}

// ---- outputs -------------------------------------------------------------------------------

json rank_json(int r, const RankStat &rs)
{
    return json{{"rank", r},
                {"host", rs.org.host},
                {"pid", rs.org.pid},
                {"collectives", rs.colls},
                {"aligned", rs.aligned},
                {"last", rs.last},
                {"missing", rs.missing},
                {"mean_lateness_us", rs.mean_late()},
                {"jitter_us", rs.mad_late()},
                {"mean_duration_us", rs.timed ? rs.dur_sum / static_cast<double>(rs.timed) : 0},
                {"mean_busbw_GBps", rs.busbw_n ? rs.busbw_sum / static_cast<double>(rs.busbw_n) : 0},
                {"p2p", rs.p2p.count},
                {"p2p_bytes", rs.p2p.bytes},
                {"p2p_mean_duration_us", rs.p2p.timed ? rs.p2p.dur_sum / static_cast<double>(rs.p2p.timed) : 0}};
}

json comm_json(const CommVerdict &v)
{
    json ranks = json::array();
    for (const auto &[r, rs] : v.ranks) ranks.push_back(rank_json(r, rs));
    json j{{"comm", v.comm},           {"nranks", v.nranks},           {"ranks_seen", v.ranks.size()},
           {"hosts", v.hosts},         {"collectives", v.colls},       {"complete", v.complete},
           {"aligned", v.aligned},     {"median_skew_us", v.median_skew}, {"p99_skew_us", v.p99_skew},
           {"max_skew_us", v.max_skew}, {"median_work_us", v.median_work}, {"diagnosis", v.diagnosis},
           {"ranks", ranks}};
    j["slowest_rank"] = nullptr;
    if (v.diagnosis != "too_few") {
        json c{{"comm", v.comm},
               {"rank", v.rank},
               {"host", v.ranks.at(v.rank).org.host},
               {"pid", v.ranks.at(v.rank).org.pid},
               {"last", v.last},
               {"aligned", v.aligned},
               {"fraction_last", v.frac},
               {"mean_lateness_us", v.mean_late},
               {"others_jitter_us", v.noise},
               {"others_max_mean_lateness_us", v.next_late},
               {"majority_needed", v.majority}};
        j["candidate"] = c;
        if (v.stands_out) j["slowest_rank"] = c;
    }
    return j;
}

json coll_json(const Coll &c)
{
    return json{{"comm", c.comm},         {"seq", c.seq},           {"func", c.func},
                {"bytes", c.bytes},       {"nranks", c.nranks},     {"ranks_seen", c.arrivals.size()},
                {"first_start_us", c.first_us}, {"skew_us", c.skew_us}, {"last_rank", c.last_rank},
                {"last_lateness_us", c.late_us}, {"work_us", c.work_us}, {"max_duration_us", c.max_dur_us},
                {"max_duration_rank", c.max_dur_rank}, {"min_busbw_GBps", c.min_busbw}};
}

// One time series per (comm, rank), for the plots: seconds since the first collective.
json series_json(const std::vector<const Coll *> &colls, double first_us, const Data &d)
{
    std::map<RankKey, json> s;
    for (const Coll *c : colls)
        for (const Arrival &a : c->arrivals) {
            json &e = s[RankKey{c->comm, a.rank}];
            if (e.is_null()) {
                const auto o = d.origins.find(RankKey{c->comm, a.rank});
                e = json{{"comm", c->comm}, {"rank", a.rank}, {"host", o == d.origins.end() ? "" : o->second.host},
                         {"t_s", json::array()}, {"duration_us", json::array()}, {"busbw_GBps", json::array()}};
            }
            e["t_s"].push_back((a.start_us - first_us) / 1e6);
            e["duration_us"].push_back(a.duration_us >= 0 ? json(a.duration_us) : json(nullptr));
            e["busbw_GBps"].push_back(a.busbw);
        }
    json out = json::array();
    for (auto &[k, e] : s) out.push_back(std::move(e));
    return out;
}

bool write_file(const fs::path &p, const std::string &text)
{
    std::ofstream f(p, std::ios::trunc);
    f << text;
    f.close();
    if (!f) {
        std::fprintf(stderr, "vigil report: cannot write %s: %s\n", p.c_str(), std::strerror(errno));
        return false;
    }
    return true;
}

// The events of a trace file; a truncated file (a killed job) is salvaged line by line, as
// the profiler writes one event per line. `salvaged` tells which way it went.
std::vector<json> trace_events(const Input &input, bool *salvaged, bool *unreadable)
{
    *salvaged = *unreadable = false;
    const std::unique_ptr<std::istream> in = open_input(input);
    if (!in) {
        *unreadable = true;
        return {};
    }
    const std::string text((std::istreambuf_iterator<char>(*in)), std::istreambuf_iterator<char>());
    const json j = json::parse(text, nullptr, false);
    std::vector<json> out;
    const json *arr = nullptr;
    if (!j.is_discarded() && j.is_object() && j.contains("traceEvents")) arr = &j["traceEvents"];
    else if (!j.is_discarded() && j.is_array()) arr = &j;
    if (arr != nullptr && arr->is_array()) {
        for (const json &e : *arr)
            if (e.is_object()) out.push_back(e);
        return out;
    }
    *salvaged = true;
    size_t pos = 0;
    while (pos < text.size()) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string::npos) nl = text.size();
        std::string line = text.substr(pos, nl - pos);
        pos = nl + 1;
        const size_t b = line.find('{');
        if (b == std::string::npos) continue;
        line = line.substr(b);
        while (!line.empty() && (line.back() == ',' || line.back() == ' ' || line.back() == '\r')) line.pop_back();
        const json e = json::parse(line, nullptr, false);
        if (!e.is_discarded() && e.is_object() && e.contains("ph")) out.push_back(e);
    }
    if (out.empty()) *unreadable = true;
    return out;
}

// Concatenates every trace into one; each (file, pid) gets a pid of its own so the ranks of
// different processes do not collide, and its process_name says where it came from.
void write_merged_trace(const std::vector<Input> &inputs, const Data &d, std::ostream &f,
                        size_t *events, size_t *traces)
{
    f << "{\"displayTimeUnit\":\"ns\",\"traceEvents\":[";
    int next_pid = 1;
    bool first = true;
    *events = *traces = 0;
    for (const Input &in : inputs) {
        if (in.kind != Kind::kTrace) continue;
        bool salvaged = false, unreadable = false;
        std::vector<json> evs = trace_events(in, &salvaged, &unreadable);
        if (unreadable) {
            std::fprintf(stderr, "vigil report: %s: no trace events could be read\n", in.path.c_str());
            continue;
        }
        if (salvaged)
            std::fprintf(stderr, "vigil report: %s: not valid JSON (truncated?); salvaged %zu events\n",
                         in.path.c_str(), evs.size());
        ++*traces;
        const std::string name = in.path.string();
        const auto proc = d.process_of.find(name.substr(0, name.size() - 11)); // less ".trace.json"
        const Origin org = proc == d.process_of.end() ? Origin{in.host, in.pid} : proc->second;
        std::map<std::string, int> pids;
        for (json &e : evs) {
            const std::string old = e.contains("pid") ? dumps(e["pid"]) : "none";
            auto [it, fresh] = pids.try_emplace(old, next_pid);
            if (fresh) ++next_pid;
            e["pid"] = it->second;
            if (str(e, "ph") == "M" && str(e, "name") == "process_name" && e.contains("args") &&
                e["args"].is_object() && e["args"].contains("name") && e["args"]["name"].is_string())
                e["args"]["name"] = e["args"]["name"].get<std::string>() + " [" + org.host + ":" + org.pid + "]";
            f << (first ? "\n" : ",\n") << dumps(e);
            first = false;
            ++*events;
        }
    }
    f << "\n]}\n";
}

std::string plot_script()
{
    std::error_code ec;
    if (const char *e = std::getenv("VIGIL_PLOT_SCRIPT"); e != nullptr && *e != '\0') return e;
    // An installed vigil uses the script installed with it (PREFIX/share/vigil), never the
    // source tree it was built from, which may have moved on; a vigil in its build tree has
    // no share/ beside it and takes the source tree's.
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        const fs::path inst = exe.parent_path() / ".." / "share" / "vigil" / "vigil_plot.py";
        if (fs::is_regular_file(inst, ec)) return inst.string();
    }
#ifdef VIGIL_SOURCE_DIR
    const fs::path src = fs::path(VIGIL_SOURCE_DIR) / "scripts" / "vigil_plot.py";
    if (fs::is_regular_file(src, ec)) return src.string();
#endif
    return {};
}

// Runs the plot script with the first interpreter that can import matplotlib: $VIGIL_PYTHON,
// else python3 from PATH, then /usr/bin/python3 (a pyenv or venv python3 on PATH often lacks
// the distribution's python3-matplotlib). 0: plots written, or skipped for a missing python3 or
// matplotlib (said in one line); 1: the script failed.
int run_plots(const fs::path &out)
{
    const std::string script = plot_script();
    std::error_code ec;
    if (script.empty() || !fs::is_regular_file(script, ec)) {
        std::printf("plots: skipped (%s not found; set VIGIL_PLOT_SCRIPT)\n",
                    script.empty() ? "vigil_plot.py" : script.c_str());
        return 0;
    }
    std::vector<std::string> pythons = {"python3", "/usr/bin/python3"};
    if (const char *e = std::getenv("VIGIL_PYTHON"); e != nullptr && *e != '\0') pythons = {e};
    const std::string report = (out / "report.json").string(), dir = out.string();
    std::string why;
    for (const std::string &py : pythons) {
        std::vector<char *> args = {const_cast<char *>(py.c_str()), const_cast<char *>(script.c_str()),
                                    const_cast<char *>(report.c_str()), const_cast<char *>(dir.c_str()), nullptr};
        std::fflush(stdout);
        std::fflush(stderr);
        pid_t pid = 0;
        if (const int rc = posix_spawnp(&pid, py.c_str(), nullptr, nullptr, args.data(), environ); rc != 0) {
            if (why.empty()) why = py + ": " + std::strerror(rc);
            continue;
        }
        int status = 0;
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code == 127) { // the exec failed in the child: no such interpreter
            if (why.empty()) why = py + " not found";
            continue;
        }
        if (code == 3) {
            why = py + " cannot import matplotlib; install python3-matplotlib";
            continue;
        }
        if (code != 0) {
            std::printf("plots: failed (%s %s exited with %d)\n", py.c_str(), script.c_str(), code);
            return 1;
        }
        std::printf("plots: %s, %s\n", (out / "duration_over_time.png").c_str(),
                    (out / "busbw_over_time.png").c_str());
        return 0;
    }
    std::printf("plots: skipped (%s)\n", why.c_str());
    return 0;
}

// ---- main ----------------------------------------------------------------------------------

constexpr const char *kProg = "vigil report";

void usage(FILE *f)
{
    std::fprintf(f, "usage: vigil report [--out DIR] [--no-plots] [--top N] DIR...\n"
                    "Reads vigil-prof-*.jsonl / *.trace.json (profiler) and vigil-<host>-<pid>.jsonl\n"
                    "(telemetry) in each DIR; names the slowest rank, NIC and path; writes report.json,\n"
                    "merged.trace.json and plots into --out (default ./vigil-report).\n"
                    "  --out DIR     output directory\n"
                    "  --no-plots    skip the PNG plots\n"
                    "  --top N       collectives with the largest arrival skew to list\n");
}

// 0 parsed, 1 help shown, 2 usage error (one line on stderr).
int parse_args(int argc, char **argv, Options *o)
{
    for (int i = 0; i < argc; ++i) {
        const std::string a = argv[i];
        if (cli::is_help(a)) {
            usage(stdout);
            return 1;
        }
        if (a == "--no-plots") {
            o->plots = false;
        } else if (a == "--out" || a == "--top") {
            if (i + 1 >= argc) return cli::usage_error(stderr, kProg, a + " wants a value");
            const std::string val = argv[++i];
            if (a == "--out") {
                o->out = val;
                continue;
            }
            if (!cli::parse_int(val, size_t{0}, size_t{1000000}, &o->top))
                return cli::usage_error(stderr, kProg, "--top wants a count, not '" + val + "'");
        } else if (a.starts_with("-") && a != "-") {
            return cli::unknown_option(stderr, kProg, a);
        } else {
            o->inputs.push_back(a);
        }
    }
    if (o->inputs.empty()) return cli::usage_error(stderr, kProg, "no input directory given");
    return 0;
}

void print_inputs(const Data &d, size_t hosts)
{
    std::printf("vigil report: %zu profiler summaries, %zu traces, %zu telemetry files from %zu host(s)\n",
                d.summaries, d.traces, d.telemetry, hosts);
    if (d.bad.count)
        std::printf("warning: %llu unparsable lines skipped (truncated or corrupt; first at %s)\n",
                    static_cast<unsigned long long>(d.bad.count), d.bad.first.c_str());
    if (d.unknown)
        std::printf("note: %llu records of unknown type ignored\n", static_cast<unsigned long long>(d.unknown));
    if (d.incomplete)
        std::printf("note: %llu coll/p2p records without comm, seq, rank or start_us ignored\n",
                    static_cast<unsigned long long>(d.incomplete));
    if (d.duplicates)
        std::printf("note: %llu duplicate collective records (same comm, function, seq and rank) ignored\n",
                    static_cast<unsigned long long>(d.duplicates));
    if (d.orphan_windows)
        std::printf("note: %llu telemetry windows without their path record ignored\n",
                    static_cast<unsigned long long>(d.orphan_windows));
    double dropped = 0;
    for (const auto &[k, v] : d.drops) dropped += v;
    if (dropped > 0) {
        std::printf("warning: the profiler dropped records (");
        const char *sep = "";
        for (const auto &[k, v] : d.drops)
            if (v > 0) std::printf("%s%s %.0f", sep, k.c_str(), v), sep = ", ";
        std::printf("): the numbers below are incomplete\n");
    }
}

/// The collectives, aligned and judged per communicator. Points into Data::colls.
struct CollResult {
    std::vector<const Coll *> all;
    std::map<std::string, std::vector<const Coll *>> by_comm;
    double first_us = 0; // the first arrival of all: time 0 of the plots
    uint64_t p2p = 0;
    std::vector<CommVerdict> verdicts;
    const CommVerdict *worst = nullptr; // the comm whose late rank costs the most, if any
};

void analyse_collectives(Data &d, CollResult *r)
{
    for (auto &[k, c] : d.colls) {
        derive(c, &d.duplicates);
        r->all.push_back(&c);
        r->by_comm[c.comm].push_back(&c);
        r->first_us = r->all.size() == 1 ? c.first_us : std::min(r->first_us, c.first_us);
    }
    for (const auto &[k, p] : d.p2p) {
        r->by_comm[k.comm]; // a comm with p2p only is still listed
        r->p2p += p.count;
    }
    // In time order, whatever the key's order (it groups a communicator's functions).
    auto by_time = [](const Coll *a, const Coll *b) { return a->first_us < b->first_us; };
    std::stable_sort(r->all.begin(), r->all.end(), by_time);
    for (auto &[comm, colls] : r->by_comm) std::stable_sort(colls.begin(), colls.end(), by_time);
    for (const auto &[comm, colls] : r->by_comm) r->verdicts.push_back(judge_comm(comm, colls, d));
    for (const CommVerdict &v : r->verdicts)
        if (v.stands_out && (r->worst == nullptr || v.mean_late * static_cast<double>(v.last) >
                                                        r->worst->mean_late * static_cast<double>(r->worst->last)))
            r->worst = &v;
}

void print_collectives(const CollResult &r, size_t top)
{
    std::printf("\n== ranks ==\n");
    if (r.verdicts.empty()) std::printf("slowest rank: none stands out (no collective records found)\n");
    for (const CommVerdict &v : r.verdicts) print_comm(v, top);
    print_top(r.all, top);
    std::vector<double> skews;
    size_t incomplete = 0;
    for (const Coll *c : r.all) {
        if (c->arrivals.size() >= 2) skews.push_back(c->skew_us);
        if (static_cast<int>(c->arrivals.size()) < c->nranks) ++incomplete;
    }
    std::printf("totals: %zu collectives in %zu comm(s), %zu missing ranks, %llu p2p records; arrival skew median "
                "%.1f us, p99 %.1f us\n",
                r.all.size(), r.by_comm.size(), incomplete, static_cast<unsigned long long>(r.p2p), median(skews),
                quantile(skews, 0.99));
}

/// Paths and NICs. The telemetry files name devices and peers, the profiler's net records
/// only device indices: those decide only when there is no telemetry. Points into Data.
struct NetResult {
    bool tele = false;
    const std::map<std::string, PathStat> *paths = nullptr; // the deciding source
    std::map<std::string, PathStat> nics;
    SlowVerdict link, nic;
};

void analyse_network(Data &d, NetResult *r)
{
    r->tele = !d.tele_paths.empty();
    r->paths = r->tele ? &d.tele_paths : &d.prof_paths;
    r->nics = nics_of(*r->paths);
    for (auto *m : {&d.tele_paths, &d.prof_paths, &r->nics})
        for (auto &[k, p] : *m) name_events(&p, d.events);
    std::vector<const PathStat *> pv, nv;
    for (const auto &[k, p] : *r->paths) pv.push_back(&p);
    for (const auto &[k, p] : r->nics) nv.push_back(&p);
    r->link = judge_slowest(pv, "path");
    r->nic = judge_slowest(nv, "nic");
}

void print_network(const NetResult &r, const Data &d, size_t top)
{
    std::printf("\n== network ==\n");
    if (!d.tele_paths.empty()) print_paths("paths (telemetry files)", "path", d.tele_paths, top);
    if (!d.prof_paths.empty()) print_paths("paths (profiler net windows)", "path", d.prof_paths, top);
    if (!r.nics.empty())
        print_paths(r.tele ? "nics (telemetry files)" : "nics (profiler net windows)", "nic", r.nics, top);
    print_slow("link", r.link, "path");
    print_slow("nic", r.nic, "nic");
    uint64_t degraded_windows = 0, degraded_paths = 0;
    for (const auto &[k, p] : *r.paths) degraded_windows += p.degraded, degraded_paths += p.degraded ? 1 : 0;
    auto count = [&](const char *e) {
        const auto it = d.event_counts.find(e);
        return static_cast<unsigned long long>(it == d.event_counts.end() ? 0 : it->second);
    };
    std::printf("degraded: %llu windows flagged on %llu path(s); verdict events: %llu degraded, %llu healthy\n",
                static_cast<unsigned long long>(degraded_windows), static_cast<unsigned long long>(degraded_paths),
                count("degraded"), count("healthy"));
    std::printf("events: %llu failover, %llu failback, %llu rebuild, %llu path_lost, %llu fatal, %llu signal\n",
                count("failover"), count("failback"), count("rebuild"), count("path_lost"), count("fatal"),
                count("signal"));
    size_t shown = 0;
    for (const EventRec &e : d.events) {
        if (e.event == "degraded" || e.event == "healthy") continue;
        if (shown++ == top) {
            std::printf("  ... more in report.json\n");
            break;
        }
        std::printf("  %s %s %s: %s\n", e.source.c_str(), e.host.c_str(), e.event.c_str(), e.text.c_str());
    }
}

json report_json(const std::vector<Input> &inputs, const Data &d, const CollResult &c, const NetResult &n)
{
    json rep;
    json files = json::array();
    for (const Input &in : inputs) files.push_back(in.path.string());
    rep["inputs"] = {{"files", files},
                     {"summaries", d.summaries},
                     {"traces", d.traces},
                     {"telemetry", d.telemetry},
                     {"bad_lines", d.bad.count},
                     {"unknown_records", d.unknown},
                     {"duplicate_records", d.duplicates},
                     {"profiler_drops", d.drops}};
    rep["first_start_us"] = c.first_us;
    rep["collectives"] = json::array();
    for (const Coll *x : c.all) rep["collectives"].push_back(coll_json(*x));
    rep["p2p_records"] = c.p2p;
    rep["comms"] = json::array();
    for (const CommVerdict &v : c.verdicts) rep["comms"].push_back(comm_json(v));
    rep["slowest_rank"] = c.worst ? comm_json(*c.worst)["slowest_rank"] : json(nullptr);
    rep["series"] = series_json(c.all, c.first_us, d);
    rep["path_source"] = n.tele ? "telemetry" : (d.prof_paths.empty() ? "none" : "profiler");
    rep["paths"] = json::array();
    for (const auto &[k, p] : d.tele_paths) rep["paths"].push_back(path_json(p));
    for (const auto &[k, p] : d.prof_paths) rep["paths"].push_back(path_json(p));
    rep["nics"] = json::array();
    for (const auto &[k, p] : n.nics) rep["nics"].push_back(path_json(p));
    rep["slowest_link"] = slow_json(n.link);
    rep["slowest_nic"] = slow_json(n.nic);
    rep["event_counts"] = d.event_counts;
    rep["events"] = json::array();
    for (const EventRec &e : d.events)
        rep["events"].push_back({{"source", e.source}, {"host", e.host}, {"event", e.event}, {"text", e.text}});
    rep["thresholds"] = {{"min_aligned", kMinAligned},  {"min_late_us", kMinLateUs},
                         {"noise_factor", kNoiseFactor}, {"majority", kMajority},
                         {"min_late_share_of_work", kMinLateShare},
                         {"over_chance", kOverChance},   {"dominance", kDominance},
                         {"together_frac", kTogetherFrac}, {"slow_ratio", kSlowRatio},
                         {"min_path_bytes", kMinPathBytes}, {"min_path_share", kMinPathShare}};
    return rep;
}

// Reads the inputs into *d, prints the report and returns the text of report.json.
std::string judge(const std::vector<Input> &inputs, size_t top, Data &d)
{
    for (const Input &in : inputs) {
        if (in.kind == Kind::kSummary) read_summary(in, d);
        else if (in.kind == Kind::kTelemetry) read_telemetry(in, d);
        else ++d.traces;
    }
    std::set<std::string> hosts; // profiler files: from their process record
    for (const auto &[stem, org] : d.process_of) hosts.insert(org.host);
    for (const Input &in : inputs) {
        const std::string stem = in.path.string().substr(0, in.path.string().size() - 11); // less ".trace.json"
        if (in.kind == Kind::kTelemetry || (in.kind == Kind::kTrace && !d.process_of.contains(stem)))
            hosts.insert(in.host);
    }
    CollResult colls;
    analyse_collectives(d, &colls);
    NetResult net;
    analyse_network(d, &net);
    print_inputs(d, hosts.size());
    print_collectives(colls, top);
    print_network(net, d, top);
    return dumps(report_json(inputs, d, colls, net), 1) + "\n";
}

const char *const kNoInput =
    "vigil report: no vigil-prof-*.jsonl, *.trace.json or vigil-*.jsonl file found\n";

int report(const Options &o)
{
    const std::vector<Input> inputs = find_inputs(o.inputs);
    if (inputs.empty()) {
        std::fputs(kNoInput, stderr);
        return 2;
    }
    Data d;
    const std::string report_text = judge(inputs, o.top, d);
    std::printf("\n== output ==\n");
    std::error_code ec;
    const fs::path out = o.out;
    fs::create_directories(out, ec);
    if (ec) {
        std::fprintf(stderr, "vigil report: cannot create %s: %s\n", out.c_str(), ec.message().c_str());
        return 1;
    }
    if (!write_file(out / "report.json", report_text)) return 1;
    size_t events = 0, traces = 0;
    std::ofstream merged(out / "merged.trace.json", std::ios::trunc);
    write_merged_trace(inputs, d, merged, &events, &traces);
    merged.close();
    if (!merged) {
        std::fprintf(stderr, "vigil report: cannot write %s: %s\n",
                     (out / "merged.trace.json").c_str(), std::strerror(errno));
        return 1;
    }
    std::printf("wrote %s, %s (%zu events from %zu traces)\n", (out / "report.json").c_str(),
                (out / "merged.trace.json").c_str(), events, traces);
    return o.plots ? run_plots(out) : 0;
}

} // namespace

namespace {

// Runs `f`; an exception becomes exit code 1 with its message.
template <class F> int guarded(F &&f)
{
    try {
        return f();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "vigil report: %s\n", e.what());
    } catch (...) {
        std::fprintf(stderr, "vigil report: unknown error\n");
    }
    return 1;
}

} // namespace

int run_report(int argc, char **argv)
{
    return guarded([&] {
        Options o;
        if (const int rc = parse_args(argc, argv, &o); rc != 0) return rc == 1 ? 0 : rc;
        return report(o);
    });
}

int report_from_memory(const std::vector<ReportFile> &files, size_t top, std::string *report,
                       std::string *merged)
{
    return guarded([&] {
        std::map<std::string, Input> found; // in name order, as find_inputs() gives them
        for (const ReportFile &f : files)
            if (auto in = classify(f.name)) {
                in->text = &f.text;
                found.emplace(f.name, *in);
            }
        std::vector<Input> inputs;
        for (auto &[name, in] : found) inputs.push_back(in);
        if (inputs.empty()) {
            std::fputs(kNoInput, stderr);
            return 2;
        }
        Data d;
        *report = judge(inputs, top, d);
        std::ostringstream m;
        size_t events = 0, traces = 0;
        write_merged_trace(inputs, d, m, &events, &traces);
        *merged = m.str();
        return 0;
    });
}

} // namespace vigil::telemetry
