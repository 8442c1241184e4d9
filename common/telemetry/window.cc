// SPDX-License-Identifier: Apache-2.0
// Telemetry windows and the degraded-path detector.
#include "window.h"

#include <algorithm>
#include <cstring>

namespace vigil::telemetry {
namespace {

// now - t, or 0 when the caller's clock read predates t (two reads racing on one path).
uint64_t since_or_zero(uint64_t now, uint64_t t)
{
    return now > t ? now - t : 0;
}

} // namespace

uint64_t DegradeDetector::attribute_wait(uint64_t wait)
{
    const int k = std::clamp(cfg_.k, 1, kMaxK);
    for (int j = 1; j <= n_ && wait > 0; ++j) {
        const int i = (pos_ - j + k) % k;
        const uint64_t take = std::min(wait, busy_[i] - wait_[i]);
        wait_[i] += take;
        sum_wait_ += take;
        wait -= take;
    }
    return wait;
}

void DegradeDetector::open_slot(int k)
{
    if (n_ == k) { // the oldest slot leaves a full span
        sum_bytes_ -= bytes_[pos_];
        sum_busy_ -= busy_[pos_];
        sum_ops_ -= ops_[pos_];
        sum_wait_ -= wait_[pos_];
        sum_port_bytes_ -= port_bytes_[pos_];
    } else {
        ++n_;
    }
    bytes_[pos_] = busy_[pos_] = ops_[pos_] = wait_[pos_] = 0;
    share_[pos_] = port_bytes_[pos_] = 0;
    pos_ = (pos_ + 1) % k;
    ++since_change_;
    if (slow_for_ > 0) ++slow_for_;
    if (well_for_ > 0) ++well_for_;
}

void DegradeDetector::learn(int k, bool slow, double bw)
{
    // Only from clearly healthy aggregates (at least midway between the threshold and the
    // baseline), so a slide into degradation does not drag the baseline down.
    const bool healthy = healthy_seen_ < cfg_.warmup || bw >= (1 + cfg_.fraction) / 2 * baseline_;
    // What is learned keeps the end points' wait in: the wait idled the path too, and taken
    // out it would credit the burst after it to the path. On a busy host that makes the
    // baseline low, the detector less sensitive: never wrong in the other direction. And only
    // from spans of enough completions: with few, the span's bytes are lumps (a message
    // completes in one window after taking many) and its rate swings by several times either
    // way; the baseline's quick rise would follow the high swings.
    const bool smooth = sum_ops_ >= std::min<uint64_t>(cfg_.min_learn_ops, static_cast<uint64_t>(k));
    if (slow || !healthy || !smooth) return;
    // Over the whole busy time, not the path's share of its port: a path busy beside another
    // that moved nothing meanwhile had the port to itself, and its share would credit it
    // with twice what the port gave ("Sharing").
    const double x = alone();
    ++healthy_seen_;
    if (healthy_seen_ <= std::max(cfg_.warmup, 1)) {
        baseline_ += (x - baseline_) / healthy_seen_; // the mean of the first ones
    } else {
        const double a = x >= baseline_ ? cfg_.ewma_alpha : cfg_.ewma_alpha_down;
        baseline_ += a * (x - baseline_);
    }
    if (cfg_.link_bytes_per_s > 0) baseline_ = std::min(baseline_, cfg_.link_bytes_per_s);
}

double DegradeDetector::port_time() const
{
    // Sums kept from floats: what is left of a span that carried nothing (or of a path
    // without a port clock) is no evidence.
    if (sum_port_bytes_ < 1 || sum_bytes_ == 0) return -1;
    return static_cast<double>(sum_busy_) * static_cast<double>(sum_bytes_) /
           std::max(sum_port_bytes_, static_cast<double>(sum_bytes_));
}

double DegradeDetector::judged() const
{
    double share = 0;
    // Each slot's wait comes out of its share in the proportion it came out of its busy time.
    for (int i = 0; i < kMaxK; ++i) // unused slots are 0
        if (busy_[i] > 0)
            share += share_[i] * (1.0 - static_cast<double>(wait_[i]) / static_cast<double>(busy_[i]));
    // The port's time for the span's bytes, the wait taken out in the span's proportion.
    if (const double port = port_time(); port >= 0 && sum_busy_ > 0)
        share = std::min(share, port * (1.0 - static_cast<double>(sum_wait_) / static_cast<double>(sum_busy_)));
    return share <= 0 ? 0.0 : static_cast<double>(sum_bytes_) * 1e9 / share;
}

double DegradeDetector::judged_own() const
{
    const uint64_t own = sum_busy_ - sum_wait_;
    return own == 0 ? 0.0 : static_cast<double>(sum_bytes_) * 1e9 / static_cast<double>(own);
}

double DegradeDetector::alone() const
{
    return sum_busy_ == 0 ? 0.0 : static_cast<double>(sum_bytes_) * 1e9 / static_cast<double>(sum_busy_);
}

double DegradeDetector::raw() const
{
    double share = 0;
    for (int i = 0; i < kMaxK; ++i) share += share_[i];
    if (const double port = port_time(); port >= 0) share = std::min(share, port);
    return share <= 0 ? 0.0 : static_cast<double>(sum_bytes_) * 1e9 / share;
}

int DegradeDetector::feed(const WindowRecord &w, double share_ns, double port_bytes,
                          uint64_t early_bytes)
{
    const double window_ns = static_cast<double>(w.window_us) * 1e3;
    const uint64_t wait = static_cast<uint64_t>(w.wait_us) * 1000;
    const bool busy = static_cast<double>(w.busy_ns) >= cfg_.min_busy * window_ns; // else idle
    const bool queued = w.avg_queued_bytes >= cfg_.min_queued_bytes; // else latency-bound
    // The receiving application held the data, not the path.
    const bool loaded = busy && queued && !w.receiver_bound;
    // The end of a counted busy period: what kept the path busy in the loaded windows before
    // completes here, then the path goes idle (see "Tail" in window.h).
    const bool tail = !busy && queued && !w.receiver_bound && w.ops > 0 && n_ > 0 &&
                      loaded_run_ > cfg_.settle;
    loaded_run_ = loaded ? loaded_run_ + 1 : 0;
    // Where the windows that count began (this one's bytes are dated against it only after
    // it closed: while a first counted window is open, everything before it is early).
    if (loaded && loaded_run_ == cfg_.settle + 1) counted_since_ = w.start_ns;
    else if (!tail && loaded_run_ <= cfg_.settle) counted_since_ = UINT64_MAX;
    const int k = std::clamp(cfg_.k, 1, kMaxK);
    if (!tail) {
        if (!loaded || loaded_run_ <= cfg_.settle) {
            // Not loaded, or the start of a busy period (a path left idle moves it faster than
            // it sustains: a token-bucket shaper refilled meanwhile): no evidence itself, but
            // wait time it reports belongs to the loaded windows before (after its own busy
            // time, which is the part of the wait closest to the report).
            attribute_wait(wait - std::min(wait, w.busy_ns));
            return 0;
        }
        open_slot(k);
    }
    // The window's bytes, busy time and completions go to the newest slot (a tail's to the
    // loaded window before it), its wait to the newest slots that have busy time for it.
    const int i = (pos_ - 1 + k) % k;
    // Bytes that landed in a window that did not count do not count either ("Dated bytes").
    const uint64_t bytes = w.bytes - std::min(early_bytes, w.bytes);
    bytes_[i] += bytes;
    busy_[i] += w.busy_ns;
    share_[i] += static_cast<float>(std::clamp(share_ns, 0.0, static_cast<double>(w.busy_ns)));
    const float port_was = port_bytes_[i];
    port_bytes_[i] += static_cast<float>(std::max(port_bytes, 0.0));
    sum_port_bytes_ += static_cast<double>(port_bytes_[i]) - static_cast<double>(port_was); // exact
    const uint32_t ops_was = ops_[i];
    ops_[i] = static_cast<uint32_t>(std::min<uint64_t>(uint64_t{ops_was} + w.ops, UINT32_MAX));
    sum_bytes_ += bytes;
    sum_busy_ += w.busy_ns;
    sum_ops_ += ops_[i] - ops_was; // what the slot holds, so it leaves the sum exactly
    attribute_wait(wait);
    // A verdict needs a full span, a completion in this window (a stall without one may still
    // be reported as wait time) and enough of the path's own busy time to judge.
    if (n_ < k || w.ops == 0) return 0;
    if (static_cast<double>(sum_busy_ - sum_wait_) < cfg_.min_busy * window_ns) return 0;
    const double bw = judged();
    const bool slow = healthy_seen_ >= cfg_.warmup && bw < cfg_.fraction * baseline_;
    if (!slow) slow_for_ = 0;
    else if (slow_for_ == 0) slow_for_ = 1;
    // Clearly healthy: at least midway between the threshold and the baseline, with the end
    // points' wait left in, as the baseline was learned (learn()): taken out, a span whose
    // wait nearly covers its busy time reads as many times the port's rate (a cut port read
    // 1-3 GB/s, ten to thirty times its rate, on a saturated host). Recovery needs that on every
    // judgement of a span, not one judgement at the threshold (see "Verdict" in window.h).
    const bool well = !slow && raw() >= (1 + cfg_.fraction) / 2 * baseline_;
    if (!well) well_for_ = 0;
    else if (well_for_ == 0) well_for_ = 1;
    if (!degraded_) {
        // Slow on every judgement for a full span: a single stall nobody could report (the
        // kernel's own network processing held up on a saturated host, before any socket
        // timestamp) drags one span down; a slow path drags them all.
        if (slow && slow_for_ >= k && since_change_ >= k) {
            degraded_ = true;
            since_change_ = 0;
            slow_for_ = 0;
            well_for_ = 0;
            return +1;
        }
        learn(k, slow, bw);
        return 0;
    }
    if (well && well_for_ >= k && since_change_ >= k) {
        degraded_ = false;
        since_change_ = 0;
        well_for_ = 0;
        return -1;
    }
    return 0;
}

PathMeter::PathMeter(uint64_t window_ns, WindowSink *sink, const DetectorConfig &det, PortClock *port)
    : window_ns_(window_ns), sink_(sink), detector_(det), port_(port)
{
}

PathMeter::~PathMeter()
{
    if (entered_) port_->leave(last_change_); // the port's other paths no longer share with it
}

void PathMeter::busy_begin(uint64_t now)
{
    busy_since_ = now;
    if (port_ == nullptr) return;
    port_mark_ = port_->enter(now);
    port_bytes_mark_ = port_->carried_total();
    entered_ = true;
}

void PathMeter::busy_end(uint64_t now)
{
    const uint64_t from = std::max(busy_since_, start_);
    cur_.busy_ns += since_or_zero(now, from);
    share_until(now, from, true);
}

void PathMeter::share_until(uint64_t now, uint64_t from, bool leave)
{
    if (!entered_) {
        share_ns_ += static_cast<double>(since_or_zero(now, from));
        return;
    }
    const double v = leave ? port_->leave(now) : port_->read(now);
    share_ns_ += std::max(0.0, v - port_mark_);
    port_mark_ = v;
    const uint64_t carried = port_->carried_total();
    port_bytes_ += carried - std::min(carried, port_bytes_mark_);
    port_bytes_mark_ = carried;
    entered_ = !leave;
}

void PathMeter::advance(uint64_t now)
{
    if (!started_) {
        started_ = true;
        start_ = now - now % window_ns_;
        end_ = start_ + window_ns_;
        last_change_ = now;
        return;
    }
    while (now >= end_) {
        close_window();
        start_ = end_;
        end_ += window_ns_;
        // Nothing in flight and nothing recorded: skip the idle stretch in one step.
        if (inflight_ops_ == 0 && now >= end_) {
            start_ = now - now % window_ns_;
            end_ = start_ + window_ns_;
            last_change_ = start_;
        }
    }
}

void PathMeter::account(uint64_t now)
{
    if (now > last_change_) {
        queued_byte_ns_ += static_cast<double>(inflight_bytes_) * static_cast<double>(now - last_change_);
        last_change_ = now;
    }
}

void PathMeter::flush(uint64_t now)
{
    advance(now);
    if (!started_) return;
    end_ = std::max(now, start_);
    close_window();
    started_ = false;
}

void PathMeter::close_window()
{
    account(end_);
    if (inflight_ops_ > 0) {
        const uint64_t from = std::max(busy_since_, start_);
        cur_.busy_ns += end_ - from;
        share_until(end_, from, false);
        busy_since_ = end_;
    }
    const bool empty = cur_.ops == 0 && cur_.busy_ns == 0 && cur_.replays == 0 &&
                       cur_.errors == 0 && wait_ns_ == 0;
    if (!empty) {
        cur_.seq = seq_++;
        cur_.start_ns = start_;
        cur_.window_us = static_cast<uint32_t>(window_ns_ / 1000);
        cur_.generation = gen_;
        cur_.lat_p50_ns = hist_.percentile(0.5);
        cur_.lat_p99_ns = hist_.percentile(0.99);
        cur_.lat_max_ns = hist_.max();
        cur_.state = state_;
        cur_.avg_queued_bytes =
            cur_.busy_ns == 0 ? 0 : static_cast<uint64_t>(queued_byte_ns_ / static_cast<double>(cur_.busy_ns));
        cur_.wait_us = static_cast<uint32_t>(std::min<uint64_t>(wait_ns_ / 1000, UINT32_MAX));
        const int change = detector_.feed(cur_, share_ns_, static_cast<double>(port_bytes_), early_bytes_);
        cur_.degraded = detector_.degraded() ? 1 : 0;
        cur_.baseline_bps = detector_.armed() ? static_cast<uint64_t>(detector_.baseline()) : 0;
        cur_.judged_bps = static_cast<uint64_t>(detector_.judged_own());
        if (sink_ != nullptr) {
            // The verdict first: the registry keeps its evidence before the window's flag shows.
            if (change != 0) sink_->verdict(change > 0, cur_);
            sink_->push(cur_);
        }
    }
    std::memset(&cur_, 0, sizeof(cur_));
    cur_.peak_inflight_bytes = inflight_bytes_;
    cur_.receiver_bound = receiver_bound_ ? 1 : 0;
    queued_byte_ns_ = 0;
    share_ns_ = 0;
    port_bytes_ = 0;
    early_bytes_ = 0;
    wait_ns_ = 0;
    hist_.reset();
}

void PathMeter::on_post(uint64_t now, uint64_t bytes)
{
    advance(now);
    account(now);
    if (inflight_ops_++ == 0) busy_begin(now);
    inflight_bytes_ += bytes;
    cur_.peak_inflight_bytes = std::max(cur_.peak_inflight_bytes, inflight_bytes_);
}

void PathMeter::on_more(uint64_t now, uint64_t bytes)
{
    advance(now);
    account(now);
    inflight_bytes_ += bytes;
    cur_.peak_inflight_bytes = std::max(cur_.peak_inflight_bytes, inflight_bytes_);
}

void PathMeter::date(uint64_t landed_at, uint64_t bytes)
{
    // A landing dated in a window already closed counts only if that window counted.
    if (landed_at < start_ && landed_at < detector_.counted_since()) early_bytes_ += bytes;
}

void PathMeter::on_complete(uint64_t now, uint64_t posted_at, uint64_t bytes)
{
    advance(now);
    account(now);
    if (port_ != nullptr) port_->carried(bytes);
    cur_.bytes += bytes;
    ++cur_.ops;
    hist_.add(now > posted_at ? now - posted_at : 0);
    if (inflight_ops_ == 0) return; // completion of an op posted before this meter existed
    inflight_bytes_ -= std::min(bytes, inflight_bytes_);
    if (--inflight_ops_ == 0) busy_end(now);
}

void PathMeter::on_progress(uint64_t now, uint64_t bytes, uint64_t landed_at)
{
    advance(now);
    account(now);
    if (port_ != nullptr) port_->carried(bytes);
    cur_.bytes += bytes;
    date(landed_at, bytes);
    inflight_bytes_ -= std::min(bytes, inflight_bytes_);
}

void PathMeter::on_abandon(uint64_t now, uint64_t n, uint64_t bytes)
{
    advance(now);
    account(now);
    if (inflight_ops_ == 0) return;
    inflight_bytes_ -= std::min(bytes, inflight_bytes_);
    inflight_ops_ -= std::min(n, inflight_ops_);
    if (inflight_ops_ == 0) busy_end(now);
}

void PathMeter::set_receiver_bound(uint64_t now, bool bound)
{
    advance(now);
    receiver_bound_ = bound;
    if (bound) cur_.receiver_bound = 1;
}

void PathMeter::on_wait(uint64_t now, uint64_t ns)
{
    advance(now);
    wait_ns_ += ns;
}

void PathMeter::on_replay(uint64_t now, uint32_t n)
{
    advance(now);
    cur_.replays += n;
}

void PathMeter::on_error(uint64_t now)
{
    advance(now);
    ++cur_.errors;
}

void PathMeter::set_state(uint64_t now, PathState s, uint32_t generation)
{
    advance(now);
    state_ = s;
    gen_ = generation;
    if (sink_ != nullptr) sink_->state(s, generation);
}

} // namespace vigil::telemetry
