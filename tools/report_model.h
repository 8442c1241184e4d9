// SPDX-License-Identifier: Apache-2.0
// `vigil report`'s model, shared by its parts: the inputs, the data read from them, the
// verdicts, and the functions of each part (report_input.cc reads, report_colls.cc and
// report_paths.cc judge, report_print.cc prints, report_out.cc writes report.json, the merged
// trace and the plots; report.cc is the command). Internal to the tool.
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <istream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace vigil::tool::report {

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
constexpr double kMinLateShare = 0.10; // mean lateness below this share of the work is not
                                       // worth naming: the host's own jitter between
                                       // collectives. In the lab's 2-rank ring on 2 busy-polling
                                       // cores, both ranks ended each all-reduce within 70 us
                                       // of each other and one still called the next up to
                                       // 5 % of the work later (up to 12 % when the work was
                                       // 28 ms), from its own CPU time in between
constexpr double kSlowRatio = 0.7;     // busy bandwidth below this share of the others' median
constexpr double kMinPathBytes = 1 << 20; // a path is "loaded" with at least 1 MiB ...
constexpr double kMinPathShare = 0.01;    // ... and 1% of the busiest path's bytes

enum class Kind { kSummary, kTrace, kTelemetry };

struct Input {
    fs::path path;
    Kind kind;
    std::string host, pid;            // from the file name
    const std::string *text = nullptr; // the content, when held in memory (report_from_memory)
};

// ---- reading (report_input.cc) ------------------------------------------------------------

// The content of an input: its file, or the text it holds. Null when the file cannot be opened.
std::unique_ptr<std::istream> open_input(const Input &in);

bool has_num(const json &j, const char *k);

double num(const json &j, const char *k, double def = 0);

std::string str(const json &j, const char *k, const std::string &def = {});

// Numbers from files into integers, clamped: converting an out-of-range double is undefined.
int as_int(double x);

int64_t as_i64(double x);

bool truthy(const json &j, const char *k);

// Names from files may hold bytes that are not UTF-8: replace them rather than throw.
std::string dumps(const json &j, int indent = -1);

double median(std::vector<double> v);

double quantile(std::vector<double> v, double q);

std::optional<Input> classify(const fs::path &p);

// Every input file of the given directories (or files), each once, in name order. Prints why
// an argument gave nothing.
std::vector<Input> find_inputs(const std::vector<std::string> &args);

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

// ---- the data ----------------------------------------------------------------------------

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
    // Telemetry events already counted, by "host:pid mono_ns event": a rotated file starts
    // with the newest events again ("carried"), so one event can be in both files.
    std::set<std::string> seen_events;
    std::map<std::string, double> drops; // summed "dropped" counters of the stats records
    // The process record of each summary, by file name less ".jsonl": its trace has the same
    // stem, and the name alone is ambiguous ("vigil-prof-HOST-PID-SESSION", hosts with '-').
    std::map<std::string, Origin> process_of;
    uint64_t duplicates = 0, unknown = 0, incomplete = 0, orphan_windows = 0;
    BadLines bad;
    size_t summaries = 0, traces = 0, telemetry = 0;
};

void read_summary(const Input &in, Data &d);

void read_telemetry(const Input &in, Data &d);

// ---- verdicts (report_colls.cc, report_paths.cc) ------------------------------------------

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

/// The collectives, aligned and judged per communicator. Points into Data::colls.
struct CollResult {
    std::vector<const Coll *> all;
    std::map<std::string, std::vector<const Coll *>> by_comm;
    double first_us = 0; // the first arrival of all: time 0 of the plots
    uint64_t p2p = 0;
    std::vector<CommVerdict> verdicts;
    const CommVerdict *worst = nullptr; // the comm whose late rank costs the most, if any
};

/// The slowest of a set of paths or NICs, or why none is named.
struct SlowVerdict {
    const PathStat *who = nullptr; // set only when it stands out
    const PathStat *lowest = nullptr;
    double bw = 0, median_others = 0, ratio = 0;
    size_t loaded = 0;
    std::string why;
};

/// Paths and NICs. The telemetry files name devices and peers, the profiler's net records
/// only device indices: those decide only when there is no telemetry. Points into Data.
struct NetResult {
    bool tele = false;
    const std::map<std::string, PathStat> *paths = nullptr; // the deciding source
    std::map<std::string, PathStat> nics;
    SlowVerdict link, nic;
};

void analyse_collectives(Data &d, CollResult *r);

void analyse_network(Data &d, NetResult *r);

// ---- printing (report_print.cc) and outputs (report_out.cc) ------------------------------

void print_inputs(const Data &d, size_t hosts);

void print_collectives(const CollResult &r, size_t top);

void print_network(const NetResult &r, const Data &d, size_t top);

json report_json(const std::vector<Input> &inputs, const Data &d, const CollResult &c, const NetResult &n);

bool write_file(const fs::path &p, const std::string &text);

// Concatenates every trace into one; each (file, pid) gets a pid of its own so the ranks of
// different processes do not collide, and its process_name says where it came from.
void write_merged_trace(const std::vector<Input> &inputs, const Data &d, std::ostream &f,
                        size_t *events, size_t *traces);

// Runs the plot script with the first interpreter that can import matplotlib: $VIGIL_PYTHON,
// else python3 from PATH, then /usr/bin/python3 (a pyenv or venv python3 on PATH often lacks
// the distribution's python3-matplotlib). 0: plots written, or skipped for a missing python3 or
// matplotlib (said in one line); 1: the script failed.
int run_plots(const fs::path &out);

} // namespace vigil::tool::report
