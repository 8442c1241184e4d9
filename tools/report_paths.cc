// SPDX-License-Identifier: Apache-2.0
// `vigil report`: paths and NICs, and the slowest of them.
#include "report_model.h"

#include <algorithm>

namespace vigil::tool::report {
namespace {

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

} // namespace

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

} // namespace vigil::tool::report
