// SPDX-License-Identifier: Apache-2.0
// Per-path telemetry windows: a path's meter timestamps every post and completion and closes
// fixed windows (VIGIL_WINDOW_US) of bytes, ops, busy time, completion-latency percentiles,
// peak in-flight bytes, replays and errors, plus the degraded/healthy verdict of the path.
#pragma once

#include <cstdint>

#include "histogram.h"
#include "port_clock.h"

namespace vigil::telemetry {

/// One closed window, as stored in the shared-memory ring. Layout version kRecordVersion;
/// 128 bytes, little-endian, naturally aligned; readers check the registry's version first.
struct WindowRecord {
    uint64_t seq;           ///< window sequence number on this path (ring slot check)
    uint64_t start_ns;      ///< CLOCK_MONOTONIC start of the window
    uint32_t window_us;     ///< window length
    uint32_t generation;    ///< connection generation at close
    uint64_t bytes;         ///< bytes that arrived in the window (completed, or reported landed)
    uint64_t ops;           ///< operations completed
    uint64_t busy_ns;       ///< time with >= 1 operation in flight
    uint64_t lat_p50_ns;    ///< completion latency percentiles (post -> completion)
    uint64_t lat_p99_ns;
    uint64_t lat_max_ns;
    uint64_t peak_inflight_bytes;
    uint32_t replays;       ///< messages replayed onto this path (failover/failback)
    uint32_t errors;        ///< path errors observed
    uint8_t state;          ///< PathState
    uint8_t degraded;       ///< 1 while the detector says degraded
    uint8_t receiver_bound; ///< 1 when the receiving application, not the path, held data back
    uint8_t pad[1];
    /// Time this path's data waited at the end points, not on the path (us; reported with the
    /// completion that ended the wait, so it may belong to the busy time of earlier windows):
    /// the detector takes it out of the busy time it judges (DegradeDetector, "wait time").
    /// Was zero padding before; the layout version did not change.
    uint32_t wait_us;
    uint64_t baseline_bps;  ///< detector baseline (bytes/s over busy time); 0 during its warm-up
    uint64_t reserved[1];   ///< ring index (set by the registry)
    /// The detector's aggregate over its last k loaded windows: bytes over the path's own
    /// busy time, wait taken out (DegradeDetector::judged_own(); the verdict itself is taken
    /// on the path's share of its port, which only reads higher)
    uint64_t judged_bps;
    uint64_t avg_queued_bytes; ///< mean bytes in flight while busy

    /// Bandwidth over busy time, bytes/s (0 when the path was idle).
    double busy_bandwidth() const
    {
        return busy_ns == 0 ? 0.0 : static_cast<double>(bytes) * 1e9 / static_cast<double>(busy_ns);
    }
};
static_assert(sizeof(WindowRecord) == 128, "WindowRecord layout is part of the registry ABI");
inline constexpr uint32_t kRecordVersion = 1;

enum PathState : uint8_t { kUnused = 0, kActive = 1, kStandby = 2, kDead = 3 };

/// Degraded-path detector (design: "Telemetry windows"). Not thread-safe (one owner).
///
/// Evidence. Only *loaded* windows count: at least `min_busy` of the window had data in flight
/// and, while busy, at least `min_queued_bytes` were queued on average, so neither idleness nor
/// latency-bound traffic (a ping-pong keeps one small message in flight half the time) is
/// mistaken for slowness. The first `settle` loaded windows of each busy period (after a
/// window that was not loaded) do not count either: a path left idle moves them faster than
/// it sustains (a token-bucket shaper refills its bucket meanwhile; the lab's tbf holds 10 ms
/// of traffic), and the baseline must be what the path sustains. The judged value is the busy-time bandwidth aggregated over the last
/// `k` loaded windows: their bytes over their busy time minus their wait time (single short
/// windows are too lumpy when a message takes longer than a window).
///
/// Tail. A busy period ends in a window that is mostly idle: the messages that kept the path
/// busy through the loaded windows before complete early in it, and the path then has nothing
/// to carry. That window is not loaded, but its bytes are what the busy time before it
/// produced: it is added to the newest loaded window it follows (bytes and busy time; a
/// verdict may be taken on it). Dropped, as it once was, a span of large messages (a 4 MiB
/// NCCL step takes tens of 1 ms windows) lost the bytes of every busy period's last
/// completions while keeping the busy time that carried them, and a healthy path looked
/// several times slower than it was (the 4-rank demo's false alarms on a 2-core host).
///
/// Wait time (busy host). On a host whose CPUs are saturated, the sender's progress or the
/// receiver's reader may not run for milliseconds (its thread waits for a CPU, or for a lock
/// held by a preempted thread). Data then sits in a socket buffer, or an ack sits unread, while
/// the path is idle and the busy clock runs: to the bandwidth that looks exactly like a slow
/// path. The comm measures that time (WindowRecord::wait_us; what counts is explained in
/// net_plugin/comm_telemetry.cc) and reports it with the completion that ends it, so it
/// belongs to the busy time of the windows before: the detector takes it out of the newest
/// loaded windows it holds, newest first, each at most down to zero. The verdict is therefore
/// taken only on a window in which an operation completed: until a completion arrives, a stall
/// whose wait time is still unreported cannot be told from a slow path. A span with less than
/// `min_busy` of a window of the path's own busy time (busy minus wait) is no evidence.
///
/// Sharing. The verdict and recovery take bandwidth over the path's share of its port's busy
/// time (PortClock: half of a span during which another path of this process was busy on the
/// same port, all of it while alone), not its whole busy time: under multipath each port
/// carries paths of several connections at once, and a path that moves half its port's bytes
/// beside another is as healthy as one that moves them all alone. A port's queue is first in,
/// first out, not fair: a path with one piece behind another's megabytes gets far less than
/// its half for that time. So a path is charged the lesser of its fair share and the time the
/// port needed for its bytes at the rate the port carried everything while the path was busy
/// on it (its busy time, over the bytes the port carried meanwhile: PortClock::carried_total()
/// summed over the span; a window's own figures are lumps, a message landing in one window
/// after taking several). A path is then judged slow only when its port, over
/// the same span, also carried less than the threshold: a port that moved everything at its
/// rate is not degraded, however its queue shared it out (on the 4 × 2 labs, a path of an uncut
/// port flagged at a quarter to a third of its baseline in about one job in 40). The price: a
/// path slow beyond a healthy port (the peer's port cut) while the same port carries other
/// peers at full rate is not flagged here; the peer flags its own port. The baseline learns over
/// the whole busy time: a path "busy" beside one that moved nothing (its data waited for the
/// receiver) had the port to itself, and its share would credit it with up to n times what
/// the port gave; learned so, the baseline would rise far above the port's rate (on the
/// 4-rank lab, to 3 times it) and ordinary spans would look degraded. Sharing therefore only
/// ever makes a path look faster against its baseline, never slower. Whether a window is
/// loaded, and whether a span has enough busy time to judge, go by the path's own busy time;
/// its wait time counts in the same proportion as the busy time it came out of.
///
/// Baseline. The mean of the first `warmup` healthy aggregates (nothing is flagged before),
/// then an asymmetric EWMA of each healthy aggregate x: baseline += a (x - baseline), with
/// a = `ewma_alpha` when x is above it and a = `ewma_alpha_down` (20 times smaller) when below.
/// A faster path is learned within ~1/ewma_alpha windows, but a path that declines a little
/// per window cannot drag its baseline down with it: the baseline lags a decline of r per
/// window by about r / ewma_alpha_down, and once the lag leaves the healthy band it stops
/// moving. With the defaults (fraction 0.5), any decline steeper than ~0.07 % per loaded
/// window is flagged, and one of 0.1 % per window or more before the rate is below 40 % of
/// what it was. Slower declines (at 1 ms windows, over more than a few seconds of load) are
/// followed, as a change of workload must be; noise around a steady rate only biases the
/// baseline a little upwards. It learns the spans judged healthy (at least midway between
/// the threshold and the baseline, (1 + fraction) / 2 x baseline), with the wait time left
/// in (the wait idled the path too). On a busy host the baseline is then low and the detector
/// less sensitive, never the other way round: the verdict takes the wait out, the baseline
/// does not. Nothing else, and nothing while degraded, feeds the baseline. It never exceeds
/// the device's link speed when that is known.
///
/// Lumpy spans. A span of fewer than `min_learn_ops` (or `k`) completions (messages that take
/// several windows: 4 MiB steps on a 2 Gbit/s port) is judged, but teaches the baseline
/// nothing: its bytes arrive in lumps, so its rate swings by several times either way, and
/// the quick rise above would carry the baseline up to the high swings (on the 4-rank demo,
/// to 1.6-1.8x what the port sustains), after which an ordinary low swing looks degraded.
/// A workload that only ever makes such spans leaves the detector unarmed (no verdict): one
/// message in flight at a time, each taking more than k / 5 windows (6.4 ms at the defaults:
/// 4 MiB below ~5 Gbit/s, 512 KiB below ~0.7 Gbit/s). A path that becomes that slow after the
/// baseline was learned is still judged, and flagged.
///
/// Dated bytes. A fabric may learn that bytes landed some time after they did (TCP: the
/// receiver's landed reports ride its back channel, late by as long as its reader and this
/// end's took to run), so the window in which the news arrives is not the one in which the
/// path moved them. Skipping a busy period's first `settle` windows dropped their busy time,
/// but the news of what the path moved in them arrived in the windows after and counted
/// there. On the 4-rank ring of a 2-core host (pieces of a few windows each, ports shaped to
/// 100 MB/s with a 1 ms bucket), the send paths' baselines read 1.3 to 1.75 times what the
/// ports carry, and the threshold, half the baseline, came near the ports' own rate. A
/// landing is therefore dated (PathMeter::on_progress's `landed_at`), and bytes that landed
/// in a window that did not count (one of the first `settle`, or one that was not loaded)
/// do not count where their news arrives either: the same baselines read 0.9 to 1.15. A
/// date later than the truth only keeps such bytes in (a fabric that cannot tell dates them
/// at their arrival): it can leave a span looking faster, never slower.
///
/// Verdict. Degraded when the aggregate has been below `fraction` x baseline at every
/// judgement for `k` loaded windows: a stall no end point can see (the kernel's own network
/// processing held up on a saturated host, before any socket timestamp) drags one span down, a
/// slow path all of them. Healthy again when the aggregate has been clearly healthy (at least
/// midway between the threshold and the baseline, as for learning, and with the wait left in,
/// as the baseline was learned) at every judgement for `k` loaded windows: one judgement at
/// the threshold was enough before, and under multipath a degraded path's aggregate swings
/// above it whenever the striper leaves it only a few pieces (it then carries them at its
/// burst rate), so its verdict, and the tuner's view with it, flapped every few blocks while
/// the port stayed cut. A verdict holds for at least `k` loaded windows.
struct DetectorConfig {
    double fraction = 0.5;
    int k = 8;
    double min_busy = 0.5;
    uint64_t min_queued_bytes = 64 * 1024;
    double ewma_alpha = 0.05;        ///< baseline rise per healthy aggregate above it
    double ewma_alpha_down = 0.0025; ///< baseline fall per healthy aggregate below it
    int warmup = 16;                 ///< healthy loaded windows before a verdict is possible
    uint64_t min_learn_ops = 5;      ///< completions a span needs to teach the baseline (at most k)
    int settle = 8;                  ///< loaded windows at the start of a busy period ignored
    double link_bytes_per_s = 0;     ///< 0: no cap
};

class DegradeDetector
{
public:
    explicit DegradeDetector(const DetectorConfig &cfg = {}) : cfg_(cfg) {}
    /// Feeds one closed window; returns +1 when the path just became degraded, -1 when it
    /// just became healthy again, 0 otherwise. `share_ns` (<= w.busy_ns): the path's share
    /// of its port over the window's busy time, and `port_bytes` the bytes every path of the
    /// port carried meanwhile (PortClock::carried_total(); 0: not known) ("Sharing"); the
    /// one-argument form: all of it, the port not known.
    /// `early_bytes` (<= w.bytes): bytes of the window that landed in an earlier window that
    /// did not count ("Dated bytes"; see counted_since()); they are not counted.
    int feed(const WindowRecord &w, double share_ns, double port_bytes = 0, uint64_t early_bytes = 0);
    int feed(const WindowRecord &w) { return feed(w, static_cast<double>(w.busy_ns)); }
    bool degraded() const { return degraded_; }
    /// Start (CLOCK_MONOTONIC ns) of the first window of the busy period that counts, as of
    /// the last window fed; UINT64_MAX while no window counts (idle, the first `settle`
    /// windows of a busy period): bytes that landed before it count nowhere.
    uint64_t counted_since() const { return counted_since_; }
    double baseline() const { return baseline_; }
    /// True once the warm-up is over: the baseline is judged against from now on.
    bool armed() const { return healthy_seen_ >= cfg_.warmup; }
    /// Bandwidth over the path's share of the busy time of the last k loaded windows, wait
    /// time taken out (what the verdict is based on), bytes/s; 0 before any loaded window.
    double judged() const;
    /// The same aggregate with the wait left in (what recovery is judged on), bytes/s; 0
    /// before any loaded window.
    double raw() const;
    /// Bytes over the whole busy time of the span, wait left in, the port's sharing not
    /// taken out (what the baseline learns), bytes/s; 0 before any loaded window.
    double alone() const;
    /// Bytes over the span's own busy time, wait taken out, the port's sharing not taken out
    /// (what the windows publish, and a degraded NIC's fraction is read from: in the same
    /// terms as the baseline; the share of a port whose other path moved nothing meanwhile
    /// credits up to n times what the port gave, and a cut port read 0.43 of its baseline
    /// where it had 0.25), bytes/s; 0 before any loaded window.
    double judged_own() const;

private:
    static constexpr int kMaxK = 64;
    /// Takes `wait` ns out of the ring's newest windows first; returns what found no room.
    uint64_t attribute_wait(uint64_t wait);
    /// A counted loaded window: a new (empty) newest slot of the span of `k`.
    void open_slot(int k);
    /// Teaches the baseline the span's aggregate when it is clearly healthy (`slow`, `bw`:
    /// this judgement's verdict and busy-time bandwidth, bytes/s) and smooth.
    void learn(int k, bool slow, double bw);
    DetectorConfig cfg_;
    double baseline_ = 0;
    int healthy_seen_ = 0;
    int since_change_ = 0; // loaded windows since the last verdict change
    int slow_for_ = 0;     // loaded windows since the aggregate was first judged slow (0: it
                           // was last judged not slow)
    int well_for_ = 0;     // loaded windows since the aggregate was first judged clearly
                           // healthy (0: it was last judged below that)
    int loaded_run_ = 0;   // loaded windows since the last one that was not
    uint64_t counted_since_ = UINT64_MAX; // counted_since()
    bool degraded_ = false;
    uint64_t bytes_[kMaxK] = {}, busy_[kMaxK] = {}, wait_[kMaxK] = {}; // wait_[i] <= busy_[i]
    uint32_t ops_[kMaxK] = {}; // completions of a slot (saturating: a window holds thousands)
    float share_[kMaxK] = {}; // the same busy time, as the path's share of its port
                              // ("Sharing"; float: 256 bytes per path, 24 bits are plenty)
    float port_bytes_[kMaxK] = {}; // the port's bytes over the same busy time (0: not known)
    uint64_t sum_bytes_ = 0, sum_busy_ = 0, sum_wait_ = 0, sum_ops_ = 0;
    double sum_port_bytes_ = 0;
    /// The time the port needed for the span's bytes at the rate it carried everything while
    /// the path was busy on it (ns); -1 when the span's port carried nothing known.
    double port_time() const;
    int n_ = 0, pos_ = 0; // pos_: next slot to write (the newest is pos_ - 1)
};

/// Where closed windows go (the registry ring, or a test's vector).
class WindowSink
{
public:
    virtual void push(const WindowRecord &w) noexcept = 0;
    /// A verdict change, for the log and the registry entry.
    virtual void verdict(bool degraded, const WindowRecord &w) noexcept = 0;
    /// The path's state or generation changed (published at once, not with the next window).
    virtual void state(PathState, uint32_t /*generation*/) noexcept {}

protected:
    ~WindowSink() = default;
};

/// The hot-path side of one path's telemetry. Single writer (the comm, under its lock);
/// on_post/on_complete are a clock comparison and counter updates: no lock, no allocation,
/// no system call (the clock is read by the caller, vDSO). Windows close lazily on the next
/// event or tick past their end; windows in which nothing happened are not emitted.
class PathMeter
{
public:
    /// `port`: the fair-share clock of the path's local port (nullptr: the path is judged as
    /// if alone on it); outlives the meter.
    PathMeter(uint64_t window_ns, WindowSink *sink, const DetectorConfig &det = {},
              PortClock *port = nullptr);
    ~PathMeter();
    PathMeter(const PathMeter &) = delete;
    PathMeter &operator=(const PathMeter &) = delete;

    void on_post(uint64_t now, uint64_t bytes);
    /// `bytes` more of an operation already posted (a further piece of one message).
    void on_more(uint64_t now, uint64_t bytes);
    /// An operation completed at `now`; `bytes` of it not yet counted by on_progress() count
    /// in this window.
    void on_complete(uint64_t now, uint64_t posted_at, uint64_t bytes);
    /// `bytes` of an operation in flight arrived at `now` (it has not completed): they count
    /// in this window, not in the one where the operation completes. A message of many
    /// windows credited whole at its completion put its bytes in the window of its end and
    /// its busy time in all the windows before: spans that began after it did (the detector
    /// skips a busy period's first windows) read several times the port's rate, and the
    /// baseline learned them.
    /// `landed_at` (<= now; CLOCK_MONOTONIC ns): when they landed, as far as the fabric can
    /// tell; bytes that landed in a window that did not count are not judged
    /// (DegradeDetector, "Dated bytes"), though the window still reports them.
    void on_progress(uint64_t now, uint64_t bytes, uint64_t landed_at);
    void on_progress(uint64_t now, uint64_t bytes) { on_progress(now, bytes, now); }
    /// `n` operations in flight were abandoned on this path (failover away) without
    /// completing here.
    void on_abandon(uint64_t now, uint64_t n, uint64_t bytes);
    void on_replay(uint64_t now, uint32_t n);
    void on_error(uint64_t now);
    void set_state(uint64_t now, PathState s, uint32_t generation);
    /// The receiver reports whether data waits for a receive it has not posted yet; windows
    /// touched by that are the application's, not the path's, and the detector skips them.
    void set_receiver_bound(uint64_t now, bool bound);
    /// This path's data waited `ns` at the end points before the completion at `now`, or
    /// the completion's news did on its way back (the path was idle meanwhile: see
    /// DegradeDetector, "wait time"). Counted in the window of
    /// `now`; the detector takes it out of the busy time of that window and earlier ones.
    void on_wait(uint64_t now, uint64_t ns);
    /// Closes every window that ended before `now`.
    void advance(uint64_t now);
    /// Closes the current window at `now` too, however short (the path is going away).
    void flush(uint64_t now);
    bool degraded() const { return detector_.degraded(); }
    /// Operations posted and neither completed nor abandoned.
    uint64_t inflight_ops() const { return inflight_ops_; }

private:
    void close_window();

    uint64_t window_ns_;
    WindowSink *sink_;
    DegradeDetector detector_;
    uint64_t start_ = 0, end_ = 0, seq_ = 0;
    uint64_t inflight_ops_ = 0, inflight_bytes_ = 0, busy_since_ = 0;
    uint64_t last_change_ = 0;      // last time inflight_bytes_ changed (or a window closed)
    double queued_byte_ns_ = 0;     // integral of inflight_bytes_ over time in this window
    // The port's fair-share clock: its reading when this path's share was last counted (while
    // busy, entered_), and the share of the current window's busy time.
    PortClock *port_;
    bool entered_ = false;
    double port_mark_ = 0;
    double share_ns_ = 0;
    // The port's carried_total() when last read while busy (entered_), and what it carried
    // while this path was busy on it in the current window.
    uint64_t port_bytes_mark_ = 0;
    uint64_t port_bytes_ = 0;
    /// The path becomes busy at `now` (its busy time, and its share of the port, count from
    /// here), or stops being busy at `now` (both are counted up to `now`).
    void busy_begin(uint64_t now);
    void busy_end(uint64_t now);
    /// Counts the path's share of the port from `from` up to `now` (the path stops being busy
    /// there: `leave`; no port clock: the real time since `from`).
    void share_until(uint64_t now, uint64_t from, bool leave);
    uint64_t wait_ns_ = 0;          // wait time reported in this window
    uint64_t early_bytes_ = 0;      // bytes of this window that landed in one that did not count
    /// Counts `bytes` that landed at `landed_at` as early when that was in a closed window
    /// that did not count.
    void date(uint64_t landed_at, uint64_t bytes);
    void account(uint64_t now);     // adds inflight_bytes_ x (now - last_change_)
    WindowRecord cur_{};
    LatencyHistogram hist_;
    PathState state_ = kActive;
    uint32_t gen_ = 1;
    bool receiver_bound_ = false;
    bool started_ = false;
};

} // namespace vigil::telemetry
