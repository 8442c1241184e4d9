// SPDX-License-Identifier: Apache-2.0
// `vigil`: reads the per-host telemetry registry of every process of this user.
//   vigil dump [--windows N] [--follow SECONDS]   JSONL: one "path" record per path, then its
//                                                 windows (newest N; --follow: new ones)
//   vigil top [--once] [--interval S]             live per-path table
//   vigil export [--listen ADDR:PORT] [--all-users] [--once]
//                                                 Prometheus metrics over HTTP (export.h)
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

#include <nlohmann/json.hpp>

#include "telemetry/registry.h"
#include "cli.h"
#include "export.h"
#include "registry_read.h"
#include "report.h"
#include "tuner_cmd.h"

namespace {

using namespace vigil::telemetry;
using namespace vigil::tool;
namespace cli = vigil::cli;
using nlohmann::json;

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

/// Options of the registry readers (dump, top).
struct ReaderArgs {
    int windows = 64;
    double follow_s = 0;
    double interval_s = 1;
    bool once = false;
};

/// Parses the options after `vigil CMD` for dump or top: `allowed` lists the options
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
        if (a == "--once") {
            o->once = true;
            continue;
        }
        if (i + 1 >= argc) return cli::usage_error(stderr, prog.c_str(), a + " wants a value");
        const std::string v = argv[++i];
        bool ok = true;
        if (a == "--windows") ok = cli::parse_int(v, 0, 1 << 30, &o->windows);
        else if (a == "--follow") ok = cli::parse_double(v, 0, 1e9, &o->follow_s);
        else if (a == "--interval") ok = cli::parse_double(v, 0.1, 1e6, &o->interval_s);
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
    if (cmd == "export") return vigil::tool::export_command(argc - 2, argv + 2);
    ReaderArgs o;
    int rc = -1;
    const int n = argc - 2;
    char **args = argv + 2;
    if (cmd == "dump") rc = parse_reader_args(cmd, kDumpUsage, {"--windows", "--follow"}, n, args, &o);
    else if (cmd == "top") rc = parse_reader_args(cmd, kTopUsage, {"--once", "--interval"}, n, args, &o);
    else if (cmd.starts_with("-")) return cli::unknown_option(stderr, "vigil", cmd);
    else return cli::usage_error(stderr, "vigil", "unknown command '" + cmd + "'");
    if (rc != 0) return rc == 1 ? 0 : rc;
    if (cmd == "dump") return dump(o.windows, o.follow_s);
    return top(o.once, o.interval_s);
}
