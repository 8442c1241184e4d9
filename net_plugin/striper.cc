// SPDX-License-Identifier: Apache-2.0
// Multipath's scheduler (striper.h): per-path rates and outstanding bytes, room, and the
// choice of the next piece.
#include "striper.h"

#include <algorithm>

#include "clock.h"

namespace vigil::net {
namespace {

// 2^-x for x >= 0, without libm (the plugins need no symbol newer than GLIBC_2.28, and
// exp2's is 2.29): 2^-n exactly times e^(-f ln 2) by its series (error below 1e-6).
double pow2_neg(double x) noexcept
{
    if (!(x < 64)) return 0;
    const int n = static_cast<int>(x);
    const double r = (x - n) * 0.6931471805599453;
    double e = 1 - r * (1 - r / 2 * (1 - r / 3 * (1 - r / 4 * (1 - r / 5 * (1 - r / 6 * (1 - r / 7))))));
    for (int k = 0; k < n; ++k) e *= 0.5;
    return e;
}

// Sorts the first n of `idx` by `key` (ascending, stable): a few paths, insertion sort (and
// no std::sort, whose unrolled threshold GCC's -Warray-bounds misreads for tiny arrays).
void sort_by(std::array<size_t, kMaxPaths> &idx, size_t n, const std::array<double, kMaxPaths> &key) noexcept
{
    for (size_t i = 1; i < n; ++i)
        for (size_t k = i; k > 0 && key[idx[k]] < key[idx[k - 1]]; --k) std::swap(idx[k], idx[k - 1]);
}

} // namespace

void PortCounters::add(int dev, int delta) noexcept
{
    if (dev >= 0 && dev < kDevs) n_[static_cast<size_t>(dev)].fetch_add(delta, std::memory_order_relaxed);
}

int PortCounters::carriers(int dev) const noexcept
{
    return dev >= 0 && dev < kDevs ? n_[static_cast<size_t>(dev)].load(std::memory_order_relaxed) : 0;
}

void PortCounters::lead(int dev, int delta) noexcept
{
    if (dev >= 0 && dev < kDevs) lead_[static_cast<size_t>(dev)].fetch_add(delta, std::memory_order_relaxed);
}

int PortCounters::leaders(int dev) const noexcept
{
    return dev >= 0 && dev < kDevs ? lead_[static_cast<size_t>(dev)].load(std::memory_order_relaxed) : 0;
}

void PortCounters::spill(int dev, int delta) noexcept
{
    if (dev >= 0 && dev < kDevs) spill_[static_cast<size_t>(dev)].fetch_add(delta, std::memory_order_relaxed);
}

int PortCounters::spillers(int dev) const noexcept
{
    return dev >= 0 && dev < kDevs ? spill_[static_cast<size_t>(dev)].load(std::memory_order_relaxed) : 0;
}

void PortCounters::lead_rate(int dev, double bytes_per_s) noexcept
{
    if (dev >= 0 && dev < kDevs && bytes_per_s >= 0)
        rate_[static_cast<size_t>(dev)].store(static_cast<uint64_t>(bytes_per_s), std::memory_order_relaxed);
}

double PortCounters::lead_rate(int dev) const noexcept
{
    return dev >= 0 && dev < kDevs ? static_cast<double>(rate_[static_cast<size_t>(dev)].load(std::memory_order_relaxed))
                                   : 0;
}

PortAccount &PortAccount::process() noexcept
{
    static PortCounters account;
    return account;
}

Striper::Striper(uint64_t piece_bytes, PortAccount *ports) noexcept
    : piece_(std::max<uint64_t>(piece_bytes, 1)), min_piece_(std::max<uint64_t>(piece_ / 4, 1)),
      align_(std::min<uint64_t>(4096, min_piece_)), ports_(ports)
{
}

Striper::~Striper()
{
    lead_on(-1);
    for (size_t i = 0; i < paths_.size(); ++i)
        if (paths_[i].carrying) set_carrying(static_cast<int>(i), paths_[i].dev, false, 0);
}

void Striper::set_carrying(int slot, int dev, bool carrying, uint64_t now) noexcept
{
    PathState &p = paths_[static_cast<size_t>(slot)];
    if (p.carrying == carrying) return;
    p.carrying = carrying;
    if (carrying) {
        p.dev = dev;
        p.last_post_ns = now; // its reprobe clock starts now
        if (dev >= 0) ports_->add(dev, +1);
    } else {
        if (slot == lead_slot_) lead_on(-1);
        if (wide_ == slot) wide_ = -1;
        p.out = 0;
        judge_spill(static_cast<size_t>(slot)); // leaves the spillers before dev is forgotten
        if (p.dev >= 0) ports_->add(p.dev, -1);
        p.dev = -1;
    }
}

void Striper::judge_spill(size_t i) noexcept
{
    PathState &p = paths_[i];
    const bool spilling = p.carrying && p.dev >= 0 && static_cast<int>(i) != lead_slot_ && p.out >= piece_;
    if (spilling == p.spilling) return;
    p.spilling = spilling;
    ports_->spill(p.dev, spilling ? +1 : -1);
}

void Striper::lead_on(int slot) noexcept
{
    const int dev = slot >= 0 ? paths_[static_cast<size_t>(slot)].dev : -1;
    const int was = lead_slot_;
    lead_slot_ = dev >= 0 ? slot : -1;
    if (was != lead_slot_) {
        if (was >= 0) judge_spill(static_cast<size_t>(was));
        if (lead_slot_ >= 0) judge_spill(static_cast<size_t>(lead_slot_));
    }
    if (dev == lead_dev_) return;
    if (lead_dev_ >= 0) ports_->lead(lead_dev_, -1);
    if (dev >= 0) ports_->lead(dev, +1);
    lead_dev_ = dev;
}

void Striper::judge_room(int prefer, const std::array<double, kMaxPaths> &r) noexcept
{
    wide_ = -1;
    const auto pi = static_cast<size_t>(prefer);
    const bool ok = prefer >= 0 && pi < paths_.size() && paths_[pi].carrying;
    lead_on(ok ? prefer : -1);
    if (!ok || paths_[pi].bytes_w <= 0) return;
    ports_->lead_rate(paths_[pi].dev, r[pi]);
    // Another connection spills onto this port: its pieces here must not wait behind ours.
    if (ports_->spillers(paths_[pi].dev) > 0) return;
    double others = 0; // the fastest other carrying path measured, or leader on its port
    bool measured = false;
    for (size_t i = 0; i < paths_.size(); ++i) {
        if (i == pi || !paths_[i].carrying) continue;
        // A port with time to spare (no other connection leads on it, or it is the preferred
        // path's own): spilling there costs nothing, and the room stays as it is.
        if (paths_[i].dev == paths_[pi].dev || ports_->leaders(paths_[i].dev) <= 0) return;
        if (paths_[i].bytes_w > 0) {
            measured = true;
            others = std::max({others, r[i], ports_->lead_rate(paths_[i].dev)});
        }
    }
    if (measured && r[pi] >= kSlowRatio * others) wide_ = prefer;
}

void Striper::account(PathState &p, uint64_t now) noexcept
{
    if (now <= p.mark_ns) return;
    const uint64_t dt = now - p.mark_ns;
    p.mark_ns = now;
    if (p.out == 0) return; // idle: no busy time, nothing decays
    const double d = pow2_neg(static_cast<double>(dt) / static_cast<double>(kHalfLifeNs));
    p.bytes_w *= d;
    p.busy_w = p.busy_w * d + static_cast<double>(dt);
}

void Striper::on_post(int slot, uint64_t bytes, uint64_t now) noexcept
{
    PathState &p = paths_[static_cast<size_t>(slot)];
    account(p, now);
    p.out += bytes;
    p.last_post_ns = now;
    judge_spill(static_cast<size_t>(slot));
}

void Striper::on_landed(int slot, uint64_t bytes, uint64_t now) noexcept
{
    PathState &p = paths_[static_cast<size_t>(slot)];
    if (p.reprobing) {
        // The reprobe piece alone, from its post on: its time holds the path's latency too,
        // so what it shows is a lower bound of the path's rate. Faster than the estimate: the
        // port healed, and the estimate starts afresh from it. Not faster: the estimate
        // (learned under load) stays, and the probe's latency-bound sample is left out.
        p.reprobing = false;
        const uint64_t took = since(now, p.last_post_ns);
        const double probe = took > 0 ? static_cast<double>(bytes) * 1e9 / static_cast<double>(took) : 0;
        const double known = p.busy_w > 0 ? p.bytes_w * 1e9 / p.busy_w : 0;
        if (probe > known) {
            p.bytes_w = p.busy_w = 0;
        } else {
            p.mark_ns = now;
            p.out -= std::min(p.out, bytes);
            judge_spill(static_cast<size_t>(slot));
            return;
        }
    }
    account(p, now);
    p.bytes_w += static_cast<double>(bytes);
    p.out -= std::min(p.out, bytes);
    judge_spill(static_cast<size_t>(slot));
}

void Striper::on_dropped(int slot, uint64_t bytes) noexcept
{
    PathState &p = paths_[static_cast<size_t>(slot)];
    p.out -= std::min(p.out, bytes);
    judge_spill(static_cast<size_t>(slot));
}

double Striper::rate(int slot, uint64_t now) const noexcept
{
    const PathState &p = paths_[static_cast<size_t>(slot)];
    if (p.bytes_w <= 0) return 0;
    // The open busy span counts: a path that stopped delivering looks slower at once.
    const double open = p.out > 0 && now > p.mark_ns ? static_cast<double>(now - p.mark_ns) : 0;
    const double busy = p.busy_w + open;
    return busy <= 0 ? 0 : p.bytes_w * 1e9 / busy;
}

std::array<double, kMaxPaths> Striper::rates(uint64_t now) const noexcept
{
    std::array<double, kMaxPaths> r{};
    double fastest = 0;
    for (size_t i = 0; i < r.size(); ++i) {
        if (!paths_[i].carrying) continue;
        r[i] = rate(static_cast<int>(i), now);
        fastest = std::max(fastest, r[i]);
    }
    for (size_t i = 0; i < r.size(); ++i) {
        const PathState &p = paths_[i];
        if (!p.carrying || r[i] > 0) continue;
        // Once another path of this connection was measured: what another connection's
        // preferred path last measured on this port says more of it than this connection's
        // own paths on other ports do (they may be degraded). None measured: all are equal.
        const double port = fastest > 0 && p.dev >= 0 ? ports_->lead_rate(p.dev) : 0;
        r[i] = port > 0 ? port : fastest > 0 ? fastest : 1.0;
        // Never measured and waiting: it cannot be faster than delivering what it holds in
        // the time it has waited.
        const uint64_t open = p.out > 0 ? since(now, p.mark_ns) : 0;
        if (open > 0) r[i] = std::min(r[i], static_cast<double>(p.out) * 1e9 / static_cast<double>(open));
    }
    return r;
}

uint64_t Striper::room_limit(int slot) const noexcept
{
    const PathState &p = paths_[static_cast<size_t>(slot)];
    // The port's bound of about four pieces, divided among the striped paths carrying on it
    // (two pieces each up to two paths, never below half a piece).
    const int n = p.dev >= 0 ? ports_->carriers(p.dev) : 0;
    const uint64_t x = slot == wide_ ? 4 : 1;
    if (n <= 2) return x * 2 * piece_;
    return x * std::max<uint64_t>(piece_ / 2, 4 * piece_ / static_cast<uint64_t>(n));
}

Striper::Pick Striper::next(uint64_t msg_left, uint64_t remaining,
                            const std::array<bool, kMaxPaths> &room, int prefer,
                            uint64_t now) noexcept
{
    const std::array<double, kMaxPaths> r = rates(now);
    // A message larger than a piece goes in pieces of at most an eighth of what remains
    // (down to a minimum piece), so that what is bound ends in pieces fine enough to share
    // out evenly; one that fits a piece stays whole.
    uint64_t whole = std::min(piece_, msg_left);
    if (msg_left > piece_) whole = std::min(whole, std::max(min_piece_, remaining / 8 / align_ * align_));
    // What each path still has to deliver: its outstanding bytes, less what it delivered at
    // its rate since its last landing was learned (landings are learned in lumps, a while
    // after they happened: without this a path that just finished looks loaded).
    std::array<double, kMaxPaths> out{};
    // Finish time of a whole piece on each carrying path, seconds.
    std::array<double, kMaxPaths> finish{};
    std::array<size_t, kMaxPaths> order{};
    size_t n = 0;
    for (size_t i = 0; i < paths_.size(); ++i) {
        const PathState &p = paths_[i];
        if (!p.carrying) continue;
        // (A path never measured has delivered nothing that anyone knows of.)
        const double open = p.out > 0 && p.bytes_w > 0 ? static_cast<double>(since(now, p.mark_ns)) / 1e9 : 0;
        out[i] = std::max(0.0, static_cast<double>(p.out) - r[i] * open);
        finish[i] = (out[i] + static_cast<double>(whole)) / r[i];
        order[n++] = i;
    }
    if (n == 0) return {};
    sort_by(order, n, finish);
    // The fluid finish time of everything remaining: water-filling over the drain times.
    double t_all = 0;
    {
        std::array<size_t, kMaxPaths> by_drain = order;
        std::array<double, kMaxPaths> drain{};
        for (size_t k = 0; k < n; ++k) drain[by_drain[k]] = out[by_drain[k]] / r[by_drain[k]];
        sort_by(by_drain, n, drain);
        double sum_r = 0, sum_out = 0;
        for (size_t k = 0; k < n; ++k) {
            sum_r += r[by_drain[k]];
            sum_out += out[by_drain[k]];
            t_all = (static_cast<double>(remaining) + sum_out) / sum_r;
            if (k + 1 == n || t_all <= drain[by_drain[k + 1]]) break;
        }
    }
    judge_room(prefer, r);
    // A path never measured while another was takes a minimum piece once it has waited
    // kReprobeNs: the rate it is assumed to have is a guess, and while its connection's
    // messages fit the preferred path's room it would never be given a piece that measures
    // it, however slow the preferred path became.
    // (Only for a message with a minimum piece to give: a few bytes would measure latency.)
    const bool measured = std::any_of(order.begin(), order.begin() + static_cast<long>(n),
                                      [&](size_t i) { return paths_[i].bytes_w > 0; });
    for (size_t k = 0; measured && whole >= min_piece_ && k < n; ++k) {
        const size_t i = order[k];
        PathState &p = paths_[i];
        if (!room[i] || p.bytes_w > 0 || p.out > 0 || since(now, p.last_post_ns) < kReprobeNs) continue;
        p.reprobing = true;
        return {static_cast<int>(i), min_piece_};
    }
    const size_t best = order[0]; // finishes a whole piece first
    double fastest = 0;
    for (size_t k = 0; k < n; ++k) fastest = std::max(fastest, r[order[k]]);
    // Greedy in the preferred path's favour: it first, then the others by finish time.
    const auto end = order.begin() + static_cast<long>(n);
    if (const auto pref = std::find(order.begin(), end, static_cast<size_t>(prefer)); pref != end)
        std::rotate(order.begin(), pref, pref + 1); // to the front, the others in order
    for (size_t k = 0; k < n; ++k) {
        const size_t i = order[k];
        PathState &p = paths_[i];
        if (!room[i]) continue;
        // The path that finishes it first, and any path about as fast as the fastest, take
        // whole pieces while they have room: each drains at its own pace, kept full (a path
        // fed less than its room runs latency-bound and would measure slower than it is).
        if (i == best || r[i] >= kSlowRatio * fastest) return {static_cast<int>(i), whole};
        // A clearly slower path: three quarters of its fluid share only, when worth a piece
        // (or, after kReprobeNs without one, whatever that is, to measure it again). Too
        // little costs the faster paths the rest at their rate; too much costs the step the
        // excess at this path's, several times more: rates and outstanding bytes are
        // estimates (a landing is learned a while after it happened), so the share is short.
        const double share = (r[i] * t_all - out[i]) * 0.75;
        if (share <= 0) continue;
        uint64_t len = whole;
        if (share < static_cast<double>(whole)) len = static_cast<uint64_t>(share) / align_ * align_;
        const bool reprobe = p.out == 0 && since(now, p.last_post_ns) >= kReprobeNs;
        // A reprobe takes at least a minimum piece: one much smaller would measure the
        // path's latency, not its rate.
        if (reprobe) len = std::max(len, std::min(min_piece_, whole));
        if (len < std::min(min_piece_, whole) || len == 0) continue;
        p.reprobing = reprobe;
        return {static_cast<int>(i), len};
    }
    return {};
}

} // namespace vigil::net
