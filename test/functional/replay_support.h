// SPDX-License-Identifier: Apache-2.0
// The fork harness of the profiler replay (test_profiler_replay*.cc): runs a scenario in a
// forked child, parses the files the plugin wrote, and the checks several scenarios share.
#pragma once

#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "replay_nccl.h"
#include "replay_threads.h"

extern char **environ;

namespace fs = std::filesystem;

namespace replay {

// ---- the fork harness ------------------------------------------------------------------

using Env = std::vector<std::pair<std::string, std::string>>;

struct Outcome {
    std::string tag, dir;
    int status = -1;
    json drv;
    std::string drv_error;
    std::vector<std::string> summaries, traces; // paths
    std::vector<json> lines;
    std::vector<std::string> bad_lines;
    json trace;
    std::string trace_error;
    uintmax_t trace_bytes = 0, summary_bytes = 0;

    std::vector<json> of(const std::string &type) const
    {
        std::vector<json> v;
        for (const json &l : lines)
            if (l.is_object() && l.value("type", "") == type) v.push_back(l);
        return v;
    }
    json stats() const
    {
        json s;
        for (const json &l : of("stats")) s = l;
        return s;
    }
    json process() const
    {
        auto v = of("process");
        return v.empty() ? json() : v.front();
    }
    std::vector<json> events(const std::string &ph, const std::string &name = "") const
    {
        std::vector<json> v;
        if (!trace.is_object() || !trace.contains("traceEvents")) return v;
        for (const json &e : trace["traceEvents"])
            if (e.value("ph", "") == ph && (name.empty() || e.value("name", "") == name)) v.push_back(e);
        return v;
    }
    /// The tid of the track named `name` (null if there is none).
    json tid_of(const std::string &name) const
    {
        for (const json &e : events("M", "thread_name"))
            if (e["args"].value("name", "") == name) return e["tid"];
        return json();
    }
    std::set<std::string> thread_names() const
    {
        std::set<std::string> s;
        for (const json &e : events("M", "thread_name")) s.insert(e["args"].value("name", ""));
        return s;
    }
};

inline std::string describe_status(int st)
{
    if (WIFEXITED(st)) return "exited with " + std::to_string(WEXITSTATUS(st));
    if (WIFSIGNALED(st)) return std::string("killed by signal ") + std::to_string(WTERMSIG(st)) + " (" +
                                strsignal(WTERMSIG(st)) + ")";
    return "status " + std::to_string(st);
}

/// A summary record as the plugin wrote it: the line `r` was parsed from, or `r` itself as
/// JSON when it kept no line.
inline std::string raw(const json &r)
{
    return r.is_object() && r.contains("__raw") ? r["__raw"].get<std::string>() : r.dump();
}

/// The exact value of a "%lld.%03lld" microsecond field of a raw summary line, in ns (a
/// double cannot hold epoch microseconds to the nanosecond).
inline int64_t exact_ns(const json &r, const std::string &key)
{
    const std::string line = raw(r);
    const std::string pat = "\"" + key + "\":";
    const size_t at = line.find(pat);
    if (at == std::string::npos) throw std::runtime_error("no " + key + " in " + line);
    size_t i = at + pat.size();
    int64_t whole = 0, frac = 0;
    int digits = 0;
    for (; i < line.size() && std::isdigit(static_cast<unsigned char>(line[i])); ++i) whole = whole * 10 + (line[i] - '0');
    if (i < line.size() && line[i] == '.')
        for (++i; i < line.size() && std::isdigit(static_cast<unsigned char>(line[i])) && digits < 3; ++i, ++digits)
            frac = frac * 10 + (line[i] - '0');
    for (; digits < 3; ++digits) frac *= 10;
    return whole * 1000 + frac;
}

inline std::string plugin_path()
{
    const char *p = std::getenv("PROFILER_REPLAY_SO");
    return p ? p : "";
}
inline std::string net_plugin_path()
{
    const char *p = std::getenv("PROFILER_REPLAY_NET_SO");
    return p ? p : "";
}

/// Parses one summary (every line) and one trace (as a whole) into `o`.
inline void load_files(Outcome &o, const std::string &summary, const std::string &trace)
{
    o.lines.clear();
    o.bad_lines.clear();
    o.trace = json();
    o.trace_error.clear();
    o.summary_bytes = fs::file_size(summary);
    {
        std::ifstream f(summary);
        std::string line;
        while (std::getline(f, line)) {
            try {
                json j = json::parse(line);
                if (j.is_object()) j["__raw"] = line; // exact decimals of the *_us fields
                o.lines.push_back(std::move(j));
            } catch (const std::exception &e) {
                o.bad_lines.push_back(line.substr(0, 300) + "  <- " + e.what());
            }
        }
    }
    o.trace_bytes = fs::file_size(trace);
    try {
        std::ifstream f(trace);
        o.trace = json::parse(f);
    } catch (const std::exception &e) {
        o.trace_error = e.what();
    }
}

/// Runs `body` in a forked child with `env` (VIGIL_PROFILE_DIR defaults to a fresh
/// directory) and collects what it and the plugin wrote.
inline Outcome run_child(const std::string &tag, const Env &env,
                         const std::function<void(Child &)> &body)
{
    Outcome o;
    o.tag = tag;
    std::string tmpl = g_base + "/" + tag + "-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) {
        o.drv_error = std::string("mkdtemp: ") + std::strerror(errno);
        return o;
    }
    o.dir = buf.data();
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0); // its own group: whatever it leaves behind is ended with it (below)
        alarm(120);    // a hang is reported as SIGALRM
        std::vector<std::string> names;
        for (char **e = environ; e && *e; ++e)
            if (std::strncmp(*e, "VIGIL_", 6) == 0) {
                const char *eq = std::strchr(*e, '=');
                names.emplace_back(*e, eq ? static_cast<size_t>(eq - *e) : std::strlen(*e));
            }
        for (const std::string &n : names) unsetenv(n.c_str());
        setenv("VIGIL_PROFILE_DIR", o.dir.c_str(), 1);
        for (const auto &[k, v] : env) setenv(k.c_str(), v.c_str(), 1);
        int rc = 0;
        auto *c = new Child; // never destroyed: _exit below
        c->dir = o.dir;
        try {
            body(*c);
        } catch (const std::exception &e) {
            c->errors.push_back(std::string("exception: ") + e.what());
            rc = 3;
        }
        json &out = c->out;
        out["errors"] = c->errors;
        out["started"] = c->p.started.load();
        out["proxy_log"] = c->proxy_log;
        {
            std::lock_guard<std::mutex> g(g_warn_mu);
            out["warns"] = g_warns;
        }
        std::ofstream f(o.dir + "/driver.json");
        f << out.dump(1) << "\n";
        f.close();
        if (!f) rc = 4;
        _exit(rc);
    }
    if (pid < 0) {
        o.drv_error = std::string("fork: ") + std::strerror(errno);
        return o;
    }
    // A process the scenario forked and left hanging would hold the test's output pipe open
    // (and meson waiting for it) long after the scenario failed: the group is ended while the
    // child is still a zombie, whose pid (the group's id) cannot be reused meanwhile.
    siginfo_t si{};
    while (waitid(P_PID, static_cast<id_t>(pid), &si, WEXITED | WNOWAIT) < 0 && errno == EINTR) {
    }
    kill(-pid, SIGKILL);
    while (waitpid(pid, &o.status, 0) < 0 && errno == EINTR) {
    }
    try {
        std::ifstream f(o.dir + "/driver.json");
        if (!f) throw std::runtime_error("no driver.json");
        o.drv = json::parse(f);
    } catch (const std::exception &e) {
        o.drv_error = e.what();
    }
    for (const auto &de : fs::directory_iterator(o.dir)) {
        const std::string n = de.path().filename().string();
        if (n.rfind("vigil-prof-", 0) != 0) continue;
        if (n.size() > 6 && n.compare(n.size() - 6, 6, ".jsonl") == 0) o.summaries.push_back(de.path().string());
        if (n.size() > 11 && n.compare(n.size() - 11, 11, ".trace.json") == 0) o.traces.push_back(de.path().string());
    }
    std::sort(o.summaries.begin(), o.summaries.end());
    std::sort(o.traces.begin(), o.traces.end());
    if (o.summaries.size() == 1 && o.traces.size() == 1) load_files(o, o.summaries[0], o.traces[0]);
    return o;
}

/// The child exited cleanly and reported no failure of its own.
#define REQUIRE_CHILD_OK(o)                                                                   \
    do {                                                                                      \
        INFO("scenario " << (o).tag << " in " << (o).dir << ": child " << describe_status((o).status)); \
        REQUIRE((o).drv_error == "");                                                         \
        INFO("child-side failures: " << (o).drv["errors"].dump(1));                          \
        CHECK((o).drv["errors"].empty());                                                    \
        REQUIRE(WIFEXITED((o).status));                                                       \
        REQUIRE(WEXITSTATUS((o).status) == 0);                                                \
    } while (0)

/// Both files exist, every summary line and the whole trace parse, and the trace's framing
/// and the last stats record are there.
#define REQUIRE_FILES_OK(o)                                                                   \
    do {                                                                                      \
        INFO("scenario " << (o).tag << " in " << (o).dir);                                    \
        REQUIRE((o).summaries.size() == 1);                                                   \
        REQUIRE((o).traces.size() == 1);                                                      \
        INFO("unparsable summary lines: " << json((o).bad_lines).dump(1));                   \
        REQUIRE((o).bad_lines.empty());                                                       \
        INFO("trace parse error: " << (o).trace_error);                                       \
        REQUIRE((o).trace_error == "");                                                       \
        REQUIRE((o).trace.is_object());                                                       \
        REQUIRE((o).trace["traceEvents"].is_array());                                         \
        REQUIRE((o).lines.size() >= 2);                                                       \
        REQUIRE((o).lines.front().value("type", "") == "process");                            \
        REQUIRE((o).lines.back().value("type", "") == "stats");                               \
    } while (0)

#define REQUIRE_NO_DROPS(st)                                                                  \
    do {                                                                                      \
        INFO("stats " << raw(st));                                                        \
        CHECK((st)["dropped_pool"] == 0);                                                     \
        CHECK((st)["dropped_ring"] == 0);                                                     \
        CHECK((st)["dropped_threads"] == 0);                                                  \
    } while (0)

inline void load_or_fail(Child &c, const std::string &path, int newest)
{
    const std::string why = c.p.load(path, newest);
    if (!why.empty()) throw std::runtime_error(why);
    c.out["version"] = c.p.version;
    c.out["name"] = c.p.name();
    c.out["symbols"] = {{"v4", dlsym(c.p.lib, "ncclProfiler_v4") != nullptr},
                        {"v5", dlsym(c.p.lib, "ncclProfiler_v5") != nullptr},
                        {"v6", dlsym(c.p.lib, "ncclProfiler_v6") != nullptr},
                        {"v7", dlsym(c.p.lib, "ncclProfiler_v7") != nullptr}};
}

inline void init_or_fail(Child &c, Comm &comm)
{
    const ncclResult_t rc = c.p.init(comm);
    if (rc != ncclSuccess) throw std::runtime_error("init returned " + std::to_string(rc));
    if (comm.ctx == nullptr) throw std::runtime_error("init gave a NULL context");
}

/// The last finalize closes the files; NCCL 2.30.7 then dlcloses the library.
inline void finalize_all(Child &c, std::initializer_list<Comm *> comms)
{
    for (Comm *m : comms) c.check(c.p.finalize(m->ctx) == ncclSuccess, "finalize failed");
    dlclose(c.p.lib);
}

inline json task_log(const Task &t)
{
    return {{"comm", hex(t.comm->hash)}, {"seq", t.seq}, {"count", t.count}, {"t0", t.t0}, {"t1", t.t1},
            {"api", t.api != nullptr && !t.captured}, {"api_t0", t.api_t0}, {"api_t1", t.api_t1}, {"func", t.func},
            {"peer", t.peer}};
}

/// A coll/p2p summary record's numbers are consistent: bytes/duration = algbw, busbw =
/// algbw x the bus factor (nccl-tests), all within the printed rounding.
inline void check_bandwidth(const json &r, double factor)
{
    INFO("record " << raw(r));
    const double dur = r["duration_us"].get<double>();
    const double bytes = r["bytes"].get<double>();
    const double alg = r["algbw_GBps"].get<double>();
    REQUIRE(dur > 0);
    CHECK(alg > 0);
    const double expect_alg = bytes / (dur * 1e3);
    CHECK(std::fabs(alg - expect_alg) <= 1e-4 + expect_alg * (0.0006 / dur + 1e-9));
    if (r.contains("busbw_GBps")) CHECK(std::fabs(r["busbw_GBps"].get<double>() - alg * factor) <= 2e-4);
}

/// The kernel-timed duration of a collective is the longest channel's GPU time, and its
/// kernel span the first channel start to the last channel stop, from the GPU timers the
/// replay gave (NCCL Inspector's definition; docs/profiler.md).
inline void check_kernel_duration(const json &r, const json &task, const json &plog)
{
    INFO("record " << raw(r) << "\ntask " << task.dump() << "\nproxy " << plog.dump());
    const auto &g0 = plog["gpu_start"], &g1 = plog["gpu_stop"];
    REQUIRE(g0.size() == g1.size());
    uint64_t longest = 0, first = UINT64_MAX, last = 0;
    for (size_t ch = 0; ch < g0.size(); ++ch) {
        const uint64_t a = g0[ch].get<uint64_t>(), b = g1[ch].get<uint64_t>();
        longest = std::max(longest, b - a);
        first = std::min(first, a);
        last = std::max(last, b);
    }
    CHECK(r["timing"] == "kernel_gpu");
    CHECK(std::fabs(r["duration_us"].get<double>() - static_cast<double>(longest) / 1e3) <= 0.0011);
    CHECK(std::fabs(r["kernel_us"].get<double>() - static_cast<double>(last - first) / 1e3) <= 0.0011);
    CHECK(r["channels_timed"] == g0.size());
}

/// start_us is the enqueue: the user's call (CollApi/P2pApi start) when the profiler got
/// one, else S(Coll/P2p).
inline void check_start_us(const json &r, const json &task, int64_t m2r)
{
    INFO("record " << raw(r) << "\ntask " << task.dump() << "\nmono_to_realtime_ns " << m2r);
    const int64_t s = exact_ns(r, "start_us");
    const bool api = task.value("api", false);
    CHECK(s >= task[api ? "api_t0" : "t0"].get<int64_t>() + m2r);
    CHECK(s <= task[api ? "api_t1" : "t1"].get<int64_t>() + m2r);
}

// ---- the net plugin's records (scenarios 1 and 12) ---------------------------------------

inline vigilNetProfDescr_v1_t window_descr(int seq, int slot, uint32_t gen)
{
    vigilNetProfDescr_v1_t d{};
    d.type = vigilNetProfWindow;
    d.slot = static_cast<uint8_t>(slot);
    d.degraded = seq % 5 == 4;
    d.state = 1;
    d.generation = gen;
    d.dev = 0;
    d.window_us = 1000;
    d.start_ns = mono_ns() - 1'000'000;
    d.bytes = 1048576 + static_cast<uint64_t>(seq);
    d.busy_ns = 500'000 + static_cast<uint64_t>(seq);
    d.lat_p99_ns = 55'100 + static_cast<uint64_t>(seq);
    return d;
}

} // namespace replay
