// SPDX-License-Identifier: Apache-2.0
// `vigil report`: report.json, the merged trace and the plots.
#include "report_model.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

namespace vigil::tool::report {
namespace {

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

} // namespace

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

} // namespace vigil::tool::report
