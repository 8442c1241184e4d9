// SPDX-License-Identifier: Apache-2.0
// `vigil`: reads the per-host telemetry registry of every process of this user.
//   vigil dump [--windows N] [--follow SECONDS]   JSONL: one "path" record per path, then its
//                                                 windows (newest N; --follow: new ones)
//   vigil top [--once] [--interval S]             live per-path table
//   vigil export [--listen ADDR:PORT] [--extra]   Prometheus text exposition over HTTP (paths
//                                                 and the profiler's collective counters)
//   vigil report [--out DIR] DIR...               straggler report over profiler/telemetry files
//   vigil tuner explain|fit ...                   the tuner's rules (tuner_cmd.h)
// `vigil --help` and `vigil CMD --help` print the usage; usage errors are one line (cli.h).
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "telemetry/prof_metrics.h"
#include "telemetry/registry.h"
#include "cli.h"
#include "report.h"
#include "tuner_cmd.h"

namespace {

using namespace vigil::telemetry;
namespace cli = vigil::cli;
using nlohmann::json;

struct Process {
    std::string file;
    std::unique_ptr<RegistryView> view;
};

std::vector<Process> open_all()
{
    reap_stale();
    std::vector<Process> out;
    for (const std::string &f : list_registries()) {
        auto v = std::make_unique<RegistryView>();
        std::string why;
        if (v->open(f, &why) != 0) {
            std::fprintf(stderr, "vigil: skipping %s: %s\n", f.c_str(), why.c_str());
            continue;
        }
        out.push_back({f, std::move(v)});
    }
    return out;
}

const char *state_name(int s)
{
    switch (s) {
    case kActive: return "active";
    case kStandby: return "standby";
    case kDead: return "dead";
    default: return "unused";
    }
}

json path_json(const RegistryHeader &h, uint32_t i, const PathEntry &e)
{
    return json{{"type", "path"},
                {"host", std::string(h.host, strnlen(h.host, sizeof(h.host)))},
                {"pid", h.pid},
                {"rank", h.rank},
                {"path", i},
                {"kind", e.kind == 0 ? "send" : "recv"},
                {"slot", e.slot == 0 ? "primary" : "backup"},
                {"device", std::string(e.dev_name, strnlen(e.dev_name, sizeof(e.dev_name)))},
                {"local", std::string(e.local, strnlen(e.local, sizeof(e.local)))},
                {"peer", std::string(e.peer, strnlen(e.peer, sizeof(e.peer)))},
                {"conn", e.conn_id},
                {"state", state_name(e.state.load())},
                {"degraded", e.degraded.load() != 0},
                {"generation", e.generation.load()},
                {"bytes_total", e.total_bytes.load()},
                {"ops_total", e.total_ops.load()},
                {"failovers_total", e.failovers.load()},
                {"windows", e.ring.head.load()},
                {"windows_dropped", e.ring.dropped.load()}};
}

json window_json(const RegistryHeader &h, uint32_t i, const WindowRecord &w)
{
    return json{{"type", "window"},       {"pid", h.pid},
                {"path", i},              {"seq", w.seq},
                {"start_ns", w.start_ns}, {"window_us", w.window_us},
                {"generation", w.generation}, {"bytes", w.bytes},
                {"ops", w.ops},           {"busy_ns", w.busy_ns},
                {"busy_bw_Bps", w.busy_bandwidth()}, {"lat_p50_ns", w.lat_p50_ns},
                {"lat_p99_ns", w.lat_p99_ns}, {"lat_max_ns", w.lat_max_ns},
                {"peak_inflight_bytes", w.peak_inflight_bytes}, {"replays", w.replays},
                {"errors", w.errors},     {"state", state_name(w.state)},
                {"degraded", w.degraded != 0}, {"baseline_Bps", w.baseline_bps},
                {"judged_Bps", w.judged_bps}, {"avg_queued_bytes", w.avg_queued_bytes}};
}

/// The counters of port entry `i` as JSON (-1: the device has no such counter).
json port_json(const RegistryHeader &h, const PortCounterEntry &e, const PortCounters &c)
{
    return json{{"type", "port"},
                {"host", std::string(h.host, strnlen(h.host, sizeof(h.host)))},
                {"pid", h.pid},
                {"device", std::string(e.name, strnlen(e.name, sizeof(e.name)))},
                {"sampled_ns", c.sampled_ns},
                {"retransmits", c.retransmits},
                {"seq_errors", c.seq_errors},
                {"out_of_sequence", c.out_of_sequence},
                {"duplicate_requests", c.duplicate_requests},
                {"rnr_naks", c.rnr_naks},
                {"retry_exceeded", c.retry_exceeded},
                {"link_downed", c.link_downed},
                {"tx_packets", c.tx_packets},
                {"rx_packets", c.rx_packets}};
}

int dump(int windows, double follow_s)
{
    auto procs = open_all();
    std::map<std::pair<int, uint32_t>, uint64_t> next; // (pid, path) -> next ring index
    for (Process &p : procs) {
        const RegistryHeader &h = p.view->header();
        for (uint32_t i = 0; i < p.view->ports(); ++i) {
            PortCounters c;
            if (read_port(h.ports[i], &c)) std::puts(port_json(h, h.ports[i], c).dump().c_str());
        }
        for (uint32_t i = 0; i < p.view->entries(); ++i) {
            const PathEntry &e = p.view->entry(i);
            if (e.in_use.load(std::memory_order_acquire) == 0) continue;
            std::puts(path_json(h, i, e).dump().c_str());
            const uint64_t head = e.ring.head.load(std::memory_order_acquire);
            const uint64_t from = head > static_cast<uint64_t>(windows) ? head - windows : 0;
            for (uint64_t k = from; k < head; ++k) {
                WindowRecord w;
                if (RegistryView::read(e, k, &w)) std::puts(window_json(h, i, w).dump().c_str());
            }
            next[{h.pid, i}] = head;
        }
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(follow_s);
    while (follow_s > 0 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        for (Process &p : procs) {
            const RegistryHeader &h = p.view->header();
            for (uint32_t i = 0; i < p.view->entries(); ++i) {
                const PathEntry &e = p.view->entry(i);
                if (e.in_use.load(std::memory_order_acquire) == 0) continue;
                uint64_t &k = next[{h.pid, i}];
                const uint64_t head = e.ring.head.load(std::memory_order_acquire);
                if (head - k > kRingCapacity) k = head - kRingCapacity; // fell behind: skip
                for (; k < head; ++k) {
                    WindowRecord w;
                    if (RegistryView::read(e, k, &w)) std::puts(window_json(h, i, w).dump().c_str());
                }
            }
        }
        std::fflush(stdout);
    }
    return 0;
}

/// Aggregate of a path's most recent windows (up to `span_ns` of them).
struct Recent {
    double bw = 0;      // busy-time bandwidth, bytes/s
    double rate = 0;    // bytes/s over the span
    uint64_t bytes = 0; // over the span
    uint64_t p99 = 0;
    uint64_t inflight = 0;
};
Recent recent(const PathEntry &e, uint64_t span_ns)
{
    Recent r;
    const uint64_t head = e.ring.head.load(std::memory_order_acquire);
    uint64_t bytes = 0, busy = 0, first = 0, last = 0;
    for (uint64_t k = head; k-- > 0 && head - k <= kRingCapacity;) {
        WindowRecord w;
        if (!RegistryView::read(e, k, &w)) break;
        if (last == 0) last = w.start_ns + w.window_us * 1000ull;
        if (last - w.start_ns > span_ns) break;
        first = w.start_ns;
        bytes += w.bytes;
        busy += w.busy_ns;
        r.p99 = std::max(r.p99, w.lat_p99_ns);
        r.inflight = std::max(r.inflight, w.peak_inflight_bytes);
    }
    r.bytes = bytes;
    if (busy) r.bw = static_cast<double>(bytes) * 1e9 / static_cast<double>(busy);
    if (last > first) r.rate = static_cast<double>(bytes) * 1e9 / static_cast<double>(last - first);
    return r;
}

/// Each in-use path's share of its connection's bytes (same process, connection and
/// direction) over the recent span: with multipath both paths carry, each its share; a hot
/// standby carries 0. -1 where the connection moved nothing in the span.
std::vector<double> shares(const RegistryView &v, uint64_t span_ns)
{
    std::vector<double> out(v.entries(), -1);
    std::map<std::pair<uint64_t, uint8_t>, uint64_t> total; // (conn, kind) -> bytes
    std::vector<uint64_t> bytes(v.entries(), 0);
    for (uint32_t i = 0; i < v.entries(); ++i) {
        const PathEntry &e = v.entry(i);
        if (e.in_use.load(std::memory_order_acquire) == 0) continue;
        bytes[i] = recent(e, span_ns).bytes;
        total[{e.conn_id, e.kind}] += bytes[i];
    }
    for (uint32_t i = 0; i < v.entries(); ++i) {
        const PathEntry &e = v.entry(i);
        if (e.in_use.load(std::memory_order_acquire) == 0) continue;
        const uint64_t t = total[{e.conn_id, e.kind}];
        if (t > 0) out[i] = static_cast<double>(bytes[i]) / static_cast<double>(t);
    }
    return out;
}

int top(bool once, double interval)
{
    std::map<std::string, PortCounters> port_prev; // "pid/port" -> the previous sample
    for (;;) {
        auto procs = open_all();
        if (!once) std::printf("\033[H\033[2J");
        std::printf("%-7s %-4s %-7s %-6s %-22s %-22s %-7s %3s %10s %10s %5s %9s %4s\n", "pid", "kind", "slot",
                    "dev", "local", "peer", "state", "gen", "MB/s", "busyMB/s", "share", "p99_us", "degr");
        for (Process &p : procs) {
            const RegistryHeader &h = p.view->header();
            const std::vector<double> sh = shares(*p.view, static_cast<uint64_t>(interval * 1e9));
            for (uint32_t i = 0; i < p.view->entries(); ++i) {
                const PathEntry &e = p.view->entry(i);
                if (e.in_use.load(std::memory_order_acquire) == 0) continue;
                const Recent r = recent(e, static_cast<uint64_t>(interval * 1e9));
                char share[16] = "-";
                if (i < sh.size() && sh[i] >= 0) std::snprintf(share, sizeof(share), "%.2f", sh[i]);
                std::printf("%-7d %-4s %-7s %-6.6s %-22.22s %-22.22s %-7s %3u %10.1f %10.1f %5s %9.1f %4s\n", h.pid,
                            e.kind == 0 ? "send" : "recv", e.slot == 0 ? "primary" : "backup", e.dev_name,
                            e.local, e.peer, state_name(e.state.load()), e.generation.load(), r.rate / 1e6,
                            r.bw / 1e6, share, static_cast<double>(r.p99) / 1e3, e.degraded.load() ? "YES" : "-");
            }
        }
        // Ports' hardware counters, as rates over the interval: a lossy link shows here first.
        bool ports = false;
        for (Process &p : procs) {
            const RegistryHeader &h = p.view->header();
            for (uint32_t i = 0; i < p.view->ports(); ++i) {
                PortCounters c;
                if (!read_port(h.ports[i], &c)) continue;
                if (!ports) std::printf("\n%-7s %-16s %12s %12s %12s %12s %12s\n", "pid", "port", "retrans/s",
                                        "seq_err/s", "out_of_seq/s", "retry_exc", "pkts/s");
                ports = true;
                const std::string key = std::to_string(h.pid) + "/" + h.ports[i].name;
                const PortCounters prev = port_prev[key];
                port_prev[key] = c;
                const double dt = prev.sampled_ns != 0 && c.sampled_ns > prev.sampled_ns
                                      ? static_cast<double>(c.sampled_ns - prev.sampled_ns) / 1e9 : 0;
                auto rate = [&](int64_t now, int64_t before) -> std::string {
                    if (now < 0) return "-";
                    if (dt <= 0 || before < 0) return "...";
                    char b[32];
                    std::snprintf(b, sizeof(b), "%.1f", static_cast<double>(now - before) / dt);
                    return b;
                };
                std::printf("%-7d %-16.16s %12s %12s %12s %12s %12s\n", h.pid, h.ports[i].name,
                            rate(c.retransmits, prev.retransmits).c_str(), rate(c.seq_errors, prev.seq_errors).c_str(),
                            rate(c.out_of_sequence, prev.out_of_sequence).c_str(),
                            c.retry_exceeded < 0 ? "-" : std::to_string(c.retry_exceeded).c_str(),
                            rate(c.tx_packets, prev.tx_packets).c_str());
            }
        }
        if (const std::string t = vigil::tool::tuner_top_text(); !t.empty()) std::printf("\n%s", t.c_str());
        std::fflush(stdout);
        if (once) return 0;
        std::this_thread::sleep_for(std::chrono::duration<double>(interval));
    }
}

std::string label_value(const char *s, size_t n)
{
    std::string out;
    for (size_t i = 0; i < n && s[i] != '\0'; ++i) {
        if (s[i] == '\\' || s[i] == '"') out += '\\';
        if (s[i] == '\n') {
            out += "\\n";
            continue;
        }
        out += s[i];
    }
    return out;
}

/// Appends one sample line of family `name` (labels already in braces) to the exposition.
void add_sample(std::map<std::string, std::string> &body, const char *name, const std::string &labels, double v)
{
    char num[64];
    std::snprintf(num, sizeof(num), "%.17g", v);
    body[name] += std::string(name) + labels + " " + num + "\n";
}

std::string metrics(bool extra)
{
    struct Family {
        const char *name, *type, *help;
    };
    std::vector<Family> fams = {
        {"vigil_path_bytes_total", "counter", "Bytes completed on the path."},
        {"vigil_path_failovers_total", "counter", "Times the path stopped carrying traffic because it failed."},
        {"vigil_path_state", "gauge", "1 active, 2 standby, 3 dead."},
        {"vigil_path_degraded", "gauge", "1 while the degraded-path detector flags the path."},
        {"vigil_path_busy_bandwidth_bytes", "gauge", "Bandwidth over busy time in the last second, bytes/s."},
        {"vigil_path_share", "gauge", "Fraction of its connection's bytes (same direction) on this path in the last second; 0 for a hot standby."},
        {"vigil_registry_windows_dropped_total", "counter", "Windows dropped because the ring's consumer fell behind."},
        {"vigil_port_retransmits_total", "counter", "The port's requests sent again (its hardware counters)."},
        {"vigil_port_seq_errors_total", "counter", "Sequence-error NAKs the port received."},
        {"vigil_port_out_of_sequence_total", "counter", "Packets the port received out of sequence."},
        {"vigil_port_retry_exceeded_total", "counter", "The port's requests that exhausted their retries."},
    };
    if (extra) {
        fams.push_back({"vigil_path_latency_p99_seconds", "gauge", "Worst window p99 completion latency in the last second."});
        fams.push_back({"vigil_path_generation", "gauge", "Connection generation (failovers and failbacks bump it)."});
        fams.push_back({"vigil_path_peak_inflight_bytes", "gauge", "Peak bytes in flight in the last second."});
    }
    std::map<std::string, std::string> body;
    for (Process &p : open_all()) {
        const RegistryHeader &h = p.view->header();
        const std::vector<double> sh = shares(*p.view, 1'000'000'000ull);
        for (uint32_t i = 0; i < p.view->entries(); ++i) {
            const PathEntry &e = p.view->entry(i);
            if (e.in_use.load(std::memory_order_acquire) == 0) continue;
            const std::string labels =
                "{host=\"" + label_value(h.host, sizeof(h.host)) + "\",pid=\"" + std::to_string(h.pid) +
                "\",path=\"" + std::to_string(i) + "\",device=\"" + label_value(e.dev_name, sizeof(e.dev_name)) + "\",peer=\"" +
                label_value(e.peer, sizeof(e.peer)) + "\",kind=\"" + (e.kind == 0 ? "send" : "recv") +
                "\",slot=\"" + (e.slot == 0 ? "primary" : "backup") + "\"}";
            const Recent r = recent(e, 1'000'000'000ull);
            auto put = [&](const char *name, double v) { add_sample(body, name, labels, v); };
            put("vigil_path_bytes_total", static_cast<double>(e.total_bytes.load()));
            put("vigil_path_failovers_total", static_cast<double>(e.failovers.load()));
            put("vigil_path_state", e.state.load());
            put("vigil_path_degraded", e.degraded.load());
            put("vigil_path_busy_bandwidth_bytes", r.bw);
            put("vigil_path_share", i < sh.size() ? std::max(0.0, sh[i]) : 0.0);
            put("vigil_registry_windows_dropped_total", static_cast<double>(e.ring.dropped.load()));
            if (extra) {
                put("vigil_path_latency_p99_seconds", static_cast<double>(r.p99) / 1e9);
                put("vigil_path_generation", e.generation.load());
                put("vigil_path_peak_inflight_bytes", static_cast<double>(r.inflight));
            }
        }
    }
    for (Process &p : open_all()) {
        const RegistryHeader &h = p.view->header();
        for (uint32_t i = 0; i < p.view->ports(); ++i) {
            PortCounters c;
            if (!read_port(h.ports[i], &c)) continue;
            const std::string labels = "{host=\"" + label_value(h.host, sizeof(h.host)) + "\",pid=\"" +
                                       std::to_string(h.pid) + "\",device=\"" +
                                       label_value(h.ports[i].name, sizeof(h.ports[i].name)) + "\"}";
            auto put = [&](const char *name, int64_t v) { // -1: the device has no such counter
                if (v >= 0) add_sample(body, name, labels, static_cast<double>(v));
            };
            put("vigil_port_retransmits_total", c.retransmits);
            put("vigil_port_seq_errors_total", c.seq_errors);
            put("vigil_port_out_of_sequence_total", c.out_of_sequence);
            put("vigil_port_retry_exceeded_total", c.retry_exceeded);
        }
    }
    // Collectives, from the profiler's counters segments.
    fams.push_back({"vigil_coll_total", "counter", "Collectives (and p2p operations) completed."});
    fams.push_back({"vigil_coll_bytes_total", "counter", "Bytes of completed collectives, as nccl-tests counts them."});
    fams.push_back({"vigil_coll_seconds_total", "counter", "Time from arrival to completion, summed over collectives."});
    fams.push_back({"vigil_coll_busbw_bytes", "gauge", "Bus bandwidth of the last timed collective, bytes/s (nccl-tests factors)."});
    fams.push_back({"vigil_profiler_events_total", "counter", "Profiler events recorded."});
    fams.push_back({"vigil_profiler_events_dropped_total", "counter", "Profiler events dropped (pools, rings or file bounds)."});
    reap_stale_segments(kProfStem);
    for (const std::string &file : list_segments(kProfStem)) {
        ProfView v;
        std::string why;
        if (v.open(file, &why) != 0) {
            std::fprintf(stderr, "vigil: skipping %s: %s\n", file.c_str(), why.c_str());
            continue;
        }
        const ProfHeader &h = v.header();
        const std::string proc = "host=\"" + label_value(h.host, sizeof(h.host)) + "\",pid=\"" + std::to_string(h.pid) + "\"";
        auto put = [&](const char *name, const std::string &labels, double val) {
            add_sample(body, name, "{" + labels + "}", val);
        };
        put("vigil_profiler_events_total", proc, static_cast<double>(h.events.load()));
        put("vigil_profiler_events_dropped_total", proc, static_cast<double>(h.dropped.load()));
        for (uint32_t i = 0; i < v.entries(); ++i) {
            const CommEntry &e = v.entry(i);
            if (e.in_use.load(std::memory_order_acquire) == 0) continue;
            char comm[24];
            std::snprintf(comm, sizeof(comm), "0x%016llx", static_cast<unsigned long long>(e.comm_hash));
            for (int t = 0; t < static_cast<int>(CollType::kCount); ++t) {
                const CollCounters &c = e.types[t];
                if (c.count.load() == 0) continue;
                const std::string labels = proc + ",comm=\"" + comm + "\",rank=\"" + std::to_string(e.rank) +
                                           "\",coll=\"" + coll_type_name(static_cast<CollType>(t)) + "\"";
                put("vigil_coll_total", labels, static_cast<double>(c.count.load()));
                put("vigil_coll_bytes_total", labels, static_cast<double>(c.bytes.load()));
                put("vigil_coll_seconds_total", labels, static_cast<double>(c.time_ns.load()) / 1e9);
                put("vigil_coll_busbw_bytes", labels, static_cast<double>(c.busbw_Bps.load()));
            }
        }
    }
    std::string out;
    for (const Family &f : fams) {
        out += std::string("# HELP ") + f.name + " " + f.help + "\n# TYPE " + f.name + " " + f.type + "\n";
        out += body[f.name];
    }
    out += vigil::tool::tuner_metrics_text();
    return out;
}

int serve(const std::string &listen, bool extra)
{
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos) {
        std::fprintf(stderr, "vigil export: --listen wants ADDR:PORT\n");
        return 2;
    }
    httplib::Server svr;
    svr.Get("/metrics", [extra](const httplib::Request &, httplib::Response &res) {
        res.set_content(metrics(extra), "text/plain; version=0.0.4; charset=utf-8");
    });
    const std::string host = listen.substr(0, colon);
    const int port = std::atoi(listen.c_str() + colon + 1);
    std::fprintf(stderr, "vigil export: serving http://%s:%d/metrics\n", host.c_str(), port);
    if (!svr.listen(host.c_str(), port)) {
        std::fprintf(stderr, "vigil export: cannot listen on %s\n", listen.c_str());
        return 1;
    }
    return 0;
}

constexpr const char *kUsage =
    "usage: vigil COMMAND [OPTIONS]   (vigil COMMAND --help: that command's options)\n"
    "  dump     JSONL of every path and its telemetry windows\n"
    "  top      live per-path table (and the tuner's agreed views)\n"
    "  export   Prometheus metrics over HTTP\n"
    "  report   straggler report over profiler and telemetry files\n"
    "  tuner    explain | fit: the tuner's rules\n"
    "dump, top and export read /dev/shm/vigil-<uid>-<pid>, the telemetry registry of every\n"
    "NCCL process of this user that loaded the Vigil net plugin.\n";

constexpr const char *kDumpUsage =
    "usage: vigil dump [--windows N] [--follow SECONDS]\n"
    "Prints JSONL: one \"path\" record per path of every process of this user that loaded the\n"
    "Vigil net plugin, each followed by its newest telemetry windows.\n"
    "  --windows N         windows per path printed at once (default 64; 0: none)\n"
    "  --follow SECONDS    then keep printing new windows for this long (default 0)\n";

constexpr const char *kTopUsage =
    "usage: vigil top [--once] [--interval SECONDS]\n"
    "Live per-path table (rate, busy-time bandwidth, p99 latency, degraded flag) of every\n"
    "process of this user that loaded the Vigil net plugin, and the tuner's agreed views.\n"
    "  --once              print the table once and exit\n"
    "  --interval SECONDS  refresh period and averaging span (default 1, at least 0.1)\n";

constexpr const char *kExportUsage =
    "usage: vigil export [--listen ADDR:PORT] [--extra]\n"
    "Serves Prometheus metrics at http://ADDR:PORT/metrics: per path, the profiler's\n"
    "collective counters and the tuner's views.\n"
    "  --listen ADDR:PORT  where to listen (default 127.0.0.1:9464)\n"
    "  --extra             also p99 latency, generation and peak bytes in flight per path\n";

/// Options of the registry readers (dump, top, export).
struct ReaderArgs {
    int windows = 64;
    double follow_s = 0;
    double interval_s = 1;
    bool once = false;
    bool extra = false;
    std::string listen = "127.0.0.1:9464";
};

/// Parses the options after `vigil CMD` for dump, top or export: `allowed` lists the options
/// CMD takes. Returns 0 to run, 1 after printing `usage` for --help, 2 after a one-line usage
/// error on stderr.
int parse_reader_args(const std::string &cmd, const char *usage,
                      std::initializer_list<std::string_view> allowed, int argc, char **argv,
                      ReaderArgs *o)
{
    const std::string prog = "vigil " + cmd;
    for (int i = 0; i < argc; ++i) {
        const std::string a = argv[i];
        if (cli::is_help(a)) {
            std::fputs(usage, stdout);
            return 1;
        }
        if (std::find(allowed.begin(), allowed.end(), a) == allowed.end()) {
            if (a.starts_with("-")) return cli::unknown_option(stderr, prog.c_str(), a);
            return cli::usage_error(stderr, prog.c_str(), "unexpected argument '" + a + "'");
        }
        if (a == "--once" || a == "--extra") {
            (a == "--once" ? o->once : o->extra) = true;
            continue;
        }
        if (i + 1 >= argc) return cli::usage_error(stderr, prog.c_str(), a + " wants a value");
        const std::string v = argv[++i];
        bool ok = true;
        if (a == "--windows") ok = cli::parse_int(v, 0, 1 << 30, &o->windows);
        else if (a == "--follow") ok = cli::parse_double(v, 0, 1e9, &o->follow_s);
        else if (a == "--interval") ok = cli::parse_double(v, 0.1, 1e6, &o->interval_s);
        else if (a == "--listen") {
            const size_t colon = v.rfind(':');
            int port = 0;
            ok = colon != std::string::npos && cli::parse_int(v.substr(colon + 1), 0, 65535, &port);
            if (ok) o->listen = v;
        }
        if (!ok) return cli::usage_error(stderr, prog.c_str(), "bad value '" + v + "' for " + a);
    }
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    if (argc < 2) {
        std::fputs(kUsage, stderr);
        return cli::kUsageError;
    }
    const std::string cmd = argv[1];
    if (cli::is_help(cmd)) {
        std::fputs(kUsage, stdout);
        return 0;
    }
    if (cmd == "report") return vigil::tool::run_report(argc - 2, argv + 2);
    if (cmd == "tuner") return vigil::tool::tuner_command(argc - 1, argv + 1);
    ReaderArgs o;
    int rc = -1;
    const int n = argc - 2;
    char **args = argv + 2;
    if (cmd == "dump") rc = parse_reader_args(cmd, kDumpUsage, {"--windows", "--follow"}, n, args, &o);
    else if (cmd == "top") rc = parse_reader_args(cmd, kTopUsage, {"--once", "--interval"}, n, args, &o);
    else if (cmd == "export") rc = parse_reader_args(cmd, kExportUsage, {"--listen", "--extra"}, n, args, &o);
    else if (cmd.starts_with("-")) return cli::unknown_option(stderr, "vigil", cmd);
    else return cli::usage_error(stderr, "vigil", "unknown command '" + cmd + "'");
    if (rc != 0) return rc == 1 ? 0 : rc;
    if (cmd == "dump") return dump(o.windows, o.follow_s);
    if (cmd == "top") return top(o.once, o.interval_s);
    return serve(o.listen, o.extra);
}
