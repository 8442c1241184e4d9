// SPDX-License-Identifier: Apache-2.0
// `vigil report`: collectives aligned across ranks, and the verdict on each communicator.
#include "report_model.h"

#include <algorithm>
#include <cmath>

namespace vigil::tool::report {
namespace {

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

} // namespace

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

} // namespace vigil::tool::report
