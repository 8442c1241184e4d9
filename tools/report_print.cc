// SPDX-License-Identifier: Apache-2.0
// `vigil report`: what it prints.
#include "report_model.h"

#include <algorithm>
#include <cstdio>

namespace vigil::tool::report {
namespace {

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

} // namespace

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

} // namespace vigil::tool::report
