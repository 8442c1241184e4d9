// SPDX-License-Identifier: Apache-2.0
// `vigil export`: the registries, profiler counters and tuner views of every process on the
// node as Prometheus metrics. One series per port and per path *group* (the paths of every
// connection between one local port and one peer address, in one direction and slot), not per
// connection: a node's series stay bounded by its ports and peers, whatever NCCL opens.
#include "export.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <httplib.h>

#include "cli.h"
#include "prom_text.h"
#include "registry_read.h"
#include "telemetry/health.h"
#include "telemetry/prof_metrics.h"
#include "tuner_cmd.h"
#include "version.h"

namespace vigil::tool {
namespace {

using namespace telemetry;

/// Label name and value pairs of one sample; an empty value leaves the label out (Prometheus
/// treats an empty label as absent).
using Labels = std::vector<std::pair<std::string, std::string>>;

struct Family {
    const char *name, *type, *help;
};

// Every family but the tuner's (tuner_cmd.h), in exposition order. docs/operations.md has the
// same table with the labels; test/ops/exposition.sh compares them.
constexpr Family kFamilies[] = {
    {"vigil_build_info", "gauge", "Always 1; the exporter's version in the label."},
    {"vigil_exporter_scrapes_total", "counter", "Scrapes served."},
    {"vigil_exporter_scrape_errors_total", "counter",
     "Segments found that could not be read (a layout of another build, or unreadable)."},
    {"vigil_exporter_segments", "gauge", "Segments read in this scrape, per kind."},
    {"vigil_exporter_segments_removed_total", "counter",
     "Segments of dead processes removed, per kind."},
    {"vigil_exporter_scrape_duration_seconds", "gauge", "Time the previous scrape took."},
    {"vigil_connections_without_path", "gauge",
     "Connections (send or receive halves) whose every path is dead: their requests fail after "
     "VIGIL_FATAL_TIMEOUT_MS."},
    {"vigil_port_bytes_total", "counter", "Bytes the port's paths completed."},
    {"vigil_port_failovers_total", "counter",
     "Paths on the port lost to a failure (traffic moved to another path)."},
    {"vigil_port_failbacks_total", "counter",
     "Times traffic moved back to a rebuilt primary path on the port."},
    {"vigil_port_degraded_total", "counter", "Degraded verdicts on the port's paths."},
    {"vigil_port_windows_dropped_total", "counter",
     "Telemetry windows of the port's paths dropped because the ring's consumer fell behind."},
    {"vigil_port_retransmits_total", "counter",
     "The port's requests sent again (RDMA hardware counter)."},
    {"vigil_port_seq_errors_total", "counter",
     "Sequence-error NAKs the port received (RDMA hardware counter)."},
    {"vigil_port_out_of_sequence_total", "counter",
     "Packets the port received out of sequence (RDMA hardware counter)."},
    {"vigil_port_retry_exceeded_total", "counter",
     "The port's requests that exhausted their retries (RDMA hardware counter)."},
    {"vigil_path_connections", "gauge",
     "Connections whose path in this group is in the state of the label."},
    {"vigil_path_degraded", "gauge", "Paths of the group the degraded-path detector flags now."},
    {"vigil_path_rate_bytes", "gauge",
     "Bytes/s the group carried over its newest windows (up to 1 s)."},
    {"vigil_path_busy_bandwidth_bytes", "gauge",
     "Bytes/s over busy time in the group's newest windows."},
    {"vigil_path_baseline_bandwidth_bytes", "gauge",
     "Busy-time bandwidth the detector learned as normal, bytes/s (mean over the group's paths "
     "that have one)."},
    {"vigil_path_share", "gauge",
     "Fraction of its connections' bytes (same direction) the group carried over the newest "
     "windows."},
    {"vigil_path_latency_p50_seconds", "gauge",
     "Worst window's median completion latency in the group's newest windows."},
    {"vigil_path_latency_p99_seconds", "gauge",
     "Worst window's p99 completion latency in the group's newest windows."},
    {"vigil_path_peak_inflight_bytes", "gauge",
     "Peak bytes in flight in the group's newest windows."},
    {"vigil_path_generation", "gauge",
     "Highest connection generation in the group (failovers and failbacks bump it)."},
    {"vigil_coll_total", "counter", "Collectives (and p2p operations) completed."},
    {"vigil_coll_bytes_total", "counter",
     "Bytes of completed collectives, as nccl-tests counts them."},
    {"vigil_coll_seconds_total", "counter",
     "Time from arrival to completion, summed over collectives."},
    {"vigil_coll_busbw_bytes", "gauge",
     "Bus bandwidth of the last timed collective, bytes/s (nccl-tests factors)."},
    {"vigil_profiler_events_total", "counter", "Profiler events recorded."},
    {"vigil_profiler_events_dropped_total", "counter",
     "Profiler events dropped (pools, rings or file bounds)."},
};

/// The samples of one scrape, grouped by family.
class Exposition
{
public:
    void add(const char *family, const Labels &labels, double v)
    {
        std::string &b = body_[family];
        b += family;
        char sep = '{';
        for (const auto &[k, val] : labels) {
            if (val.empty()) continue;
            b += sep;
            b += k + "=\"" + prom_label_value(val) + "\"";
            sep = ',';
        }
        if (sep == ',') b += '}';
        char num[64];
        std::snprintf(num, sizeof(num), " %.17g\n", v);
        b += num;
    }
    std::string text() const
    {
        std::string out;
        for (const Family &f : kFamilies) {
            out += std::string("# HELP ") + f.name + " " + f.help + "\n# TYPE " + f.name + " " +
                   f.type + "\n";
            if (auto it = body_.find(f.name); it != body_.end()) out += it->second;
        }
        return out;
    }

private:
    std::map<std::string, std::string> body_;
};

std::string text(const char *s, size_t n)
{
    return std::string(s, strnlen(s, n));
}

/// NCCL's device name as node_exporter labels NICs: "eth0" is device eth0; an RDMA port
/// "mlx5_0:1" is device mlx5_0, port 1 (node_exporter's infiniband collector).
Labels device_labels(const std::string &name)
{
    const size_t colon = name.rfind(':');
    if (colon != std::string::npos && colon + 1 < name.size() &&
        std::all_of(name.begin() + static_cast<std::ptrdiff_t>(colon) + 1, name.end(),
                    [](char c) { return c >= '0' && c <= '9'; }))
        return {{"device", name.substr(0, colon)}, {"port", name.substr(colon + 1)}};
    return {{"device", name}};
}

/// A path's remote endpoint without its TCP port (the port differs per connection): "a.b.c.d",
/// "[v6 address]" bare, a GID as it is.
std::string peer_address(const std::string &peer)
{
    const size_t colon = peer.rfind(':');
    if (colon == std::string::npos) return peer;
    const std::string host = peer.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
        return host.substr(1, host.size() - 2);
    return host.find(':') == std::string::npos ? host : peer;
}

Labels operator+(Labels a, const Labels &b)
{
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

/// The (pid, host) of a process and its launcher rank ("" when unknown), from its registry:
/// the profiler's and tuner's segments carry no rank of their own.
using RankMap = std::map<std::pair<int, std::string>, std::string>;

Labels process_labels(const RankMap &ranks, int pid, const std::string &host)
{
    const auto it = ranks.find({pid, host});
    return {{"pid", std::to_string(pid)}, {"rank", it == ranks.end() ? "" : it->second}};
}

/// One path group's sums over its live paths.
struct Group {
    uint64_t conns[3] = {}; // active, standby, dead
    uint64_t degraded = 0, bytes = 0, busy_ns = 0, share_bytes = 0, share_total = 0;
    uint64_t p50 = 0, p99 = 0, inflight = 0, generation = 0;
    double rate = 0, baseline_sum = 0;
    int baselines = 0;
};

constexpr uint64_t kSpanNs = 1'000'000'000ull;

void paths(Exposition &x, const RegistryView &v, const Labels &proc)
{
    const uint32_t n = v.entries();
    std::vector<Recent> rec(n);
    std::map<std::pair<uint64_t, uint8_t>, uint64_t> conn_bytes;            // (conn, kind) -> bytes
    std::map<std::pair<uint64_t, uint8_t>, std::pair<int, int>> conn_alive; // -> (alive, paths)
    for (uint32_t i = 0; i < n; ++i) {
        const PathEntry &e = v.entry(i);
        if (e.in_use.load(std::memory_order_acquire) != 1) continue;
        rec[i] = recent(e, kSpanNs);
        conn_bytes[{e.conn_id, e.kind}] += rec[i].bytes;
        auto &[alive, total] = conn_alive[{e.conn_id, e.kind}];
        const int s = e.state.load(std::memory_order_relaxed);
        alive += s == kActive || s == kStandby;
        ++total;
    }
    using Key = std::tuple<uint8_t, uint8_t, std::string, std::string>; // kind, slot, device, peer
    std::map<Key, Group> groups;
    for (uint32_t i = 0; i < n; ++i) {
        const PathEntry &e = v.entry(i);
        if (e.in_use.load(std::memory_order_acquire) != 1) continue;
        Group &g = groups[{e.kind, e.slot, text(e.dev_name, sizeof(e.dev_name)),
                           peer_address(text(e.peer, sizeof(e.peer)))}];
        const int s = e.state.load(std::memory_order_relaxed);
        if (s >= kActive && s <= kDead) ++g.conns[s - kActive];
        if (s != kDead && e.degraded.load(std::memory_order_relaxed) != 0) ++g.degraded;
        const Recent &r = rec[i];
        g.bytes += r.bytes;
        g.busy_ns += r.busy_ns;
        g.rate += r.rate;
        if (const uint64_t t = conn_bytes[{e.conn_id, e.kind}]; t > 0) {
            g.share_bytes += r.bytes;
            g.share_total += t;
        }
        if (r.baseline > 0 && s != kDead) {
            g.baseline_sum += static_cast<double>(r.baseline);
            ++g.baselines;
        }
        g.p50 = std::max(g.p50, r.p50);
        g.p99 = std::max(g.p99, r.p99);
        g.inflight = std::max(g.inflight, r.inflight);
        g.generation =
            std::max<uint64_t>(g.generation, e.generation.load(std::memory_order_relaxed));
    }
    for (const auto &[key, g] : groups) {
        const auto &[kind, slot, dev, peer] = key;
        const Labels l = proc + device_labels(dev) +
                         Labels{{"peer", peer},
                                {"kind", kind == 0 ? "send" : "recv"},
                                {"slot", slot == 0 ? "primary" : "backup"}};
        for (int s = kActive; s <= kDead; ++s)
            x.add("vigil_path_connections", l + Labels{{"state", state_name(s)}},
                  static_cast<double>(g.conns[s - kActive]));
        x.add("vigil_path_degraded", l, static_cast<double>(g.degraded));
        x.add("vigil_path_rate_bytes", l, g.rate);
        // Measures a fabric does not take (a receiver's busy time and latencies over TCP: its
        // windows count bytes only) are left out, not shown as 0.
        if (g.busy_ns > 0)
            x.add("vigil_path_busy_bandwidth_bytes", l,
                  static_cast<double>(g.bytes) * 1e9 / static_cast<double>(g.busy_ns));
        if (g.baselines > 0)
            x.add("vigil_path_baseline_bandwidth_bytes", l, g.baseline_sum / g.baselines);
        // Connections that moved nothing have no share: the series pauses rather than say 0.
        if (g.share_total > 0)
            x.add("vigil_path_share", l,
                  static_cast<double>(g.share_bytes) / static_cast<double>(g.share_total));
        if (g.p99 > 0) {
            x.add("vigil_path_latency_p50_seconds", l, static_cast<double>(g.p50) / 1e9);
            x.add("vigil_path_latency_p99_seconds", l, static_cast<double>(g.p99) / 1e9);
        }
        x.add("vigil_path_peak_inflight_bytes", l, static_cast<double>(g.inflight));
        x.add("vigil_path_generation", l, static_cast<double>(g.generation));
    }
    int pathless = 0;
    for (const auto &[conn, c] : conn_alive)
        pathless += c.first == 0;
    x.add("vigil_connections_without_path", proc, pathless);
}

void ports(Exposition &x, const RegistryView &v, const Labels &proc)
{
    const RegistryHeader &h = v.header();
    for (uint32_t d = 0; d < v.devices(); ++d) {
        const DeviceTotals &t = h.devices[d];
        if (t.name[0] == '\0') continue;
        const Labels l = proc + device_labels(text(t.name, sizeof(t.name)));
        auto get = [](const std::atomic<uint64_t> &a) {
            return static_cast<double>(a.load(std::memory_order_relaxed));
        };
        for (int k = 0; k < 2; ++k) {
            const Labels lk = l + Labels{{"kind", k == 0 ? "send" : "recv"}};
            x.add("vigil_port_bytes_total", lk, get(t.bytes[k]));
            x.add("vigil_port_degraded_total", lk, get(t.degraded[k]));
        }
        x.add("vigil_port_failovers_total", l, get(t.failovers));
        x.add("vigil_port_failbacks_total", l, get(t.failbacks));
        x.add("vigil_port_windows_dropped_total", l, get(t.windows_dropped));
    }
    for (uint32_t i = 0; i < v.ports(); ++i) {
        PortCounters c;
        if (!read_port(h.ports[i], &c)) continue;
        const Labels l = proc + device_labels(text(h.ports[i].name, sizeof(h.ports[i].name)));
        auto put = [&](const char *name, int64_t val) { // -1: the device has no such counter
            if (val >= 0) x.add(name, l, static_cast<double>(val));
        };
        put("vigil_port_retransmits_total", c.retransmits);
        put("vigil_port_seq_errors_total", c.seq_errors);
        put("vigil_port_out_of_sequence_total", c.out_of_sequence);
        put("vigil_port_retry_exceeded_total", c.retry_exceeded);
    }
}

void collectives(Exposition &x, const ProfView &v, const Labels &proc)
{
    const ProfHeader &h = v.header();
    x.add("vigil_profiler_events_total", proc, static_cast<double>(h.events.load()));
    x.add("vigil_profiler_events_dropped_total", proc, static_cast<double>(h.dropped.load()));
    for (uint32_t i = 0; i < v.entries(); ++i) {
        const CommEntry &e = v.entry(i);
        if (e.in_use.load(std::memory_order_acquire) == 0) continue;
        char comm[24];
        std::snprintf(comm, sizeof(comm), "0x%016llx",
                      static_cast<unsigned long long>(e.comm_hash));
        for (int t = 0; t < static_cast<int>(CollType::kCount); ++t) {
            const CollCounters &c = e.types[t];
            if (c.count.load() == 0) continue;
            const Labels l = proc + Labels{{"comm", comm},
                                           {"comm_rank", std::to_string(e.rank)},
                                           {"coll", coll_type_name(static_cast<CollType>(t))}};
            x.add("vigil_coll_total", l, static_cast<double>(c.count.load()));
            x.add("vigil_coll_bytes_total", l, static_cast<double>(c.bytes.load()));
            x.add("vigil_coll_seconds_total", l, static_cast<double>(c.time_ns.load()) / 1e9);
            x.add("vigil_coll_busbw_bytes", l, static_cast<double>(c.busbw_Bps.load()));
        }
    }
}

} // namespace

std::string Exporter::scrape()
{
    std::lock_guard<std::mutex> g(mu_);
    const auto t0 = std::chrono::steady_clock::now();
    Exposition x;
    uint64_t segments[kKinds] = {};
    auto refused = [&](const std::string &file, const std::string &why) {
        ++errors_;
        if (warned_.insert(file).second)
            std::fprintf(stderr, "vigil export: skipping %s: %s\n", file.c_str(), why.c_str());
    };

    OpenStats st;
    RankMap ranks;
    const std::vector<Process> procs = open_all(opts_.all_users, &st, false);
    removed_[kRegistry] += static_cast<uint64_t>(st.removed);
    for (const auto &[file, why] : st.refused)
        refused(file, why);
    for (const Process &p : procs) {
        const RegistryHeader &h = p.view->header();
        const std::string host = text(h.host, sizeof(h.host));
        ranks[{h.pid, host}] = h.rank >= 0 ? std::to_string(h.rank) : "";
        const Labels proc = process_labels(ranks, h.pid, host);
        paths(x, *p.view, proc);
        ports(x, *p.view, proc);
        ++segments[kRegistry];
    }

    removed_[kProfiler] += static_cast<uint64_t>(reap_stale_segments(kProfStem, opts_.all_users));
    for (const std::string &file : list_segments(kProfStem, opts_.all_users)) {
        ProfView v;
        std::string why;
        if (v.open(file, &why) != 0) {
            if (segment_settled(file)) refused(file, why);
            continue;
        }
        const ProfHeader &h = v.header();
        collectives(x, v, process_labels(ranks, h.pid, text(h.host, sizeof(h.host))));
        ++segments[kProfiler];
    }

    removed_[kTuner] +=
        static_cast<uint64_t>(reap_stale_segments(kTunerStatusStem, opts_.all_users));
    TunerScrape ts;
    const std::string tuner = tuner_metrics_text(
        opts_.all_users,
        [&ranks](int pid, const std::string &host) {
            const auto it = ranks.find({pid, host});
            return it == ranks.end() ? std::string() : it->second;
        },
        &ts);
    segments[kTuner] = static_cast<uint64_t>(ts.segments);
    errors_ += static_cast<uint64_t>(ts.refused);

    ++scrapes_;
    x.add("vigil_build_info", {{"version", VIGIL_VERSION}}, 1);
    x.add("vigil_exporter_scrapes_total", {}, static_cast<double>(scrapes_));
    x.add("vigil_exporter_scrape_errors_total", {}, static_cast<double>(errors_));
    constexpr const char *kKindName[kKinds] = {"registry", "profiler", "tuner"};
    for (int k = 0; k < kKinds; ++k) {
        x.add("vigil_exporter_segments", {{"kind", kKindName[k]}},
              static_cast<double>(segments[k]));
        x.add("vigil_exporter_segments_removed_total", {{"kind", kKindName[k]}},
              static_cast<double>(removed_[k]));
    }
    x.add("vigil_exporter_scrape_duration_seconds", {}, last_duration_s_);
    last_duration_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return x.text() + tuner;
}

namespace {

constexpr const char *kExportUsage =
    "usage: vigil export [--listen ADDR:PORT] [--all-users] [--once]\n"
    "Serves Prometheus metrics at http://ADDR:PORT/metrics: per port and per path group of\n"
    "every process that loaded the Vigil net plugin, the profiler's collective counters, the\n"
    "tuner's agreed views and the exporter's own health (docs/operations.md).\n"
    "  --listen ADDR:PORT  where to listen (default 127.0.0.1:9464; :9464 for every address,\n"
    "                      as the vigil-exporter service does)\n"
    "  --all-users         read every user's processes, not only this user's (a node-wide\n"
    "                      service: needs CAP_DAC_READ_SEARCH, and CAP_FOWNER to remove\n"
    "                      segments of dead processes)\n"
    "  --once              print the exposition once on stdout and exit\n";

} // namespace

int export_command(int argc, char **argv)
{
    const char *prog = "vigil export";
    std::string listen = "127.0.0.1:9464";
    ExportOptions o;
    bool once = false;
    for (int i = 0; i < argc; ++i) {
        const std::string a = argv[i];
        if (cli::is_help(a)) {
            std::fputs(kExportUsage, stdout);
            return 0;
        }
        if (a == "--all-users")
            o.all_users = true;
        else if (a == "--once")
            once = true;
        else if (a == "--listen") {
            if (i + 1 >= argc) return cli::usage_error(stderr, prog, a + " wants a value");
            const std::string v = argv[++i];
            const size_t colon = v.rfind(':');
            int port = 0;
            if (colon == std::string::npos || !cli::parse_int(v.substr(colon + 1), 0, 65535, &port))
                return cli::usage_error(stderr, prog, "bad value '" + v + "' for " + a);
            listen = v;
        } else if (a.starts_with("-"))
            return cli::unknown_option(stderr, prog, a);
        else
            return cli::usage_error(stderr, prog, "unexpected argument '" + a + "'");
    }
    Exporter exporter(o);
    if (once) {
        std::fputs(exporter.scrape().c_str(), stdout);
        return 0;
    }
    const size_t colon = listen.rfind(':');
    std::string host = listen.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
    if (host.empty()) host = "0.0.0.0";
    const int port = std::atoi(listen.c_str() + colon + 1);
    httplib::Server svr;
    svr.Get("/metrics", [&exporter](const httplib::Request &, httplib::Response &res) {
        res.set_content(exporter.scrape(), "text/plain; version=0.0.4; charset=utf-8");
    });
    svr.Get("/", [](const httplib::Request &, httplib::Response &res) {
        res.set_content("<html><body><a href=\"/metrics\">Vigil metrics</a></body></html>\n",
                        "text/html");
    });
    std::fprintf(stderr, "vigil export: serving http://%s:%d/metrics%s\n", host.c_str(), port,
                 o.all_users ? " (every user's processes)" : "");
    if (!svr.listen(host.c_str(), port)) {
        std::fprintf(stderr, "vigil export: cannot listen on %s\n", listen.c_str());
        return 1;
    }
    return 0;
}

} // namespace vigil::tool
