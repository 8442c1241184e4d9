// SPDX-License-Identifier: Apache-2.0
// The part of a comm both halves share: test(), the progress engine hook-up, close, the sticky
// error, and path identities.
#include "comm.h"

#include <array>
#include <cstring>
#include <mutex>
#include <string>

#include "clock.h"
#include "log.h"
#include "telemetry/writer.h"

#include <unistd.h>

namespace vigil::net {

std::string PathIdentity::describe() const
{
    std::string d = slot == kPrimary ? "primary" : "backup";
    d += " dev " + dev_name;
    if (!local.empty() || !peer.empty()) d += " " + local + " -> " + peer;
    if (!detail.empty()) d += " (" + detail + ")";
    return d;
}

const char *host_name()
{
    static const std::string name = [] {
        char h[256] = "?";
        gethostname(h, sizeof(h) - 1);
        return std::string(h);
    }();
    return name.c_str();
}

int Comm::test(Request *r, int *done, int *sizes) noexcept
{
    *done = 0;
    // The application polls: at the next timer tick the engine stops waking for this comm's
    // fds (on_tick). Every call counts, whether or not it progressed the comm: counting only
    // the calls that did left the engine taking every completion of a verbs ping-pong (the
    // caller's test() calls met requests the engine had finished), a thread hand-off per
    // message (docs/benchmarks.md, the verbs latency regression of 11-25).
    if (!polled_.load(std::memory_order_relaxed)) polled_.store(true, std::memory_order_relaxed);
    if (r->state.load(std::memory_order_acquire) != Request::kDone) {
        // Progress inline when nobody else is (cuts a thread hand-off from latency); the
        // engine thread covers the case where NCCL polls slowly or not at all.
        log::Deferral defer; // what the progress logs, after the unlock
        if (mu_.try_lock()) {
            progress_locked();
            settle_timer_locked();
            mu_.unlock();
            take_kicks();
        }
        if (r->state.load(std::memory_order_acquire) != Request::kDone)
            return error_.load(std::memory_order_acquire);
    }
    if (sizes != nullptr) {
        if (r->is_send) {
            sizes[0] = static_cast<int>(r->size);
        } else {
            const auto *rr = static_cast<const RecvRequest *>(r); // what !is_send says it is
            for (int i = 0; i < rr->n; ++i) sizes[i] = static_cast<int>(rr->msg_size[i]);
        }
    }
    *done = 1;
    r->state.store(Request::kFree, std::memory_order_release);
    return 0;
}

int Comm::attach(int numa_node) noexcept
{
    ProgressEngine &engine = ProgressEngine::instance();
    engine.bind(this, numa_node);
    int rc = 0;
    {
        // Locked: an fd added with data already queued is reported at once, and an engine
        // thread that finds mu_ taken leaves a kick for us.
        Locked g(*this);
        for (size_t i = 0; i < nfds() && rc == 0; ++i) {
            rc = engine.add(fd(i), this);
            if (rc != 0)
                for (size_t k = 0; k < i; ++k) engine.remove(fd(k), this);
        }
        if (rc != 0) detached_ = true; // a callback fetched before the removal does nothing
    }
    if (rc != 0) {
        engine.quiesce(); // without mu_: the engine may be waiting for it
        engine.unbind(this);
        return rc;
    }
    // Last: from here on the engine may call in (callers must not hold locks the comm's
    // progress takes, such as a listener's).
    ProgressEngine::instance().add_ticker(this);
    return 0;
}

void Comm::close() noexcept
{
    // Before taking mu_: the engine holds its ticker lock only while copying the list.
    ProgressEngine::instance().remove_ticker(this);
    {
        log::Deferral defer;
        std::lock_guard<std::mutex> g(mu_);
        if (!detached_) goodbye_locked();
        detached_ = true;
        if (parked_) unpark_locked(); // no sweep calls it from here on
        for (size_t i = 0; i < nfds(); ++i) ProgressEngine::instance().remove(fd(i), this);
    }
    ProgressEngine::instance().quiesce();
    ProgressEngine::instance().unbind(this);
}

void Comm::on_ready() noexcept
{
    if (ProgressEngine::instance().threads() > 1) {
        // Never wait behind the application's test(): whoever holds the lock takes the kick
        // when it lets go (take_kicks), and this thread serves its other comms meanwhile.
        kick_.store(true, std::memory_order_relaxed);
        take_kicks(); // its fence orders the kick before the try_lock
        return;
    }
    log::Deferral defer;
    std::lock_guard<std::mutex> g(mu_);
    if (detached_) return;
    engine_progress_locked();
    settle_timer_locked();
}

void Comm::take_kicks() noexcept
{
    if (ProgressEngine::instance().threads() == 1) return; // nobody kicks

    // Store buffering, a seq_cst fence on both sides: a kicker fences between its kick and its
    // try_lock, a holder between its unlock and this load, so either the kicker's try_lock saw
    // mu_ free or the holder sees the kick.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!kick_.load(std::memory_order_relaxed)) return;
    log::Deferral defer;
    while (kick_.load(std::memory_order_relaxed)) {
        if (!mu_.try_lock()) return; // the holder takes it
        kick_.store(false, std::memory_order_relaxed);
        if (!detached_) {
            engine_progress_locked();
            settle_timer_locked();
        }
        mu_.unlock();
        std::atomic_thread_fence(std::memory_order_seq_cst);
    }
}

void Comm::engine_progress_locked() noexcept
{
    rearm_locked(wake_);
    progress_locked();
}

void Comm::on_tick() noexcept
{
    const uint64_t now = now_ns();
    if (now < next_timer_ns_.load(std::memory_order_relaxed)) return;
    next_timer_ns_.store(now + kTimerNs, std::memory_order_relaxed);
    const bool polled = polled_.exchange(false, std::memory_order_relaxed);
    Locked g(*this);
    if (detached_) return;
    if (parked_) unpark_locked(); // woken: by the sweep, or a settle that raced this tick
    // With one engine thread, an application that polls moves the bytes itself and the engine
    // sleeps; with several, the engine threads move each connection's bytes on their own cores
    // whether or not the application polls (it still helps when it finds the comm unlocked).
    const bool wake = !polled || ProgressEngine::instance().threads() > 1;
    if (wake_ != wake) {
        wake_ = wake;
        for (size_t i = 0; i < nfds(); ++i) ProgressEngine::instance().interest(fd(i), this, wake_);
    }
    // A quiet comm's fds wake the engine for whatever arrives (wake_ is set: nobody polls
    // it), so its tick is only its timers: no I/O pass over its paths.
    probed_ = false;
    // A port event noted for it (note_port_down) takes the full pass, which acts on it first.
    if (wake_ && quiet_locked() && !port_events_noted()) quiet_tick_locked(now);
    else engine_progress_locked();
    // A quiet comm's next timer work is a probe interval away if it probes a port pair; else
    // it parks, and the sweep wakes it for its pairs' probes and silence (port_pairs.h). A
    // post makes it busy: it then wakes itself (settle_timer_locked()). Where it cannot park,
    // its pairs' silence check every quiet_period().
    if (quiet_locked()) {
        const bool park = !probed_ && wake_ && park_locked();
        // On the engine's grid, as the engine will run it: a tick moved earlier must find
        // itself due (ProgressEngine::coalesced).
        next_timer_ns_.store(park ? kParked : ProgressEngine::coalesced(now + quiet_period_ns(probed_), now),
                             std::memory_order_relaxed);
    }
}

bool Comm::park_locked() noexcept
{
    if (!PortPairs::process().sweeping()) return false;
    std::array<PairUse, kMaxPaths> uses;
    const int n = pair_uses_locked(&uses);
    if (n == 0) return false; // nothing to wake it for a verdict: keep the timer
    for (int i = 0; i < n; ++i)
        if (!uses[static_cast<size_t>(i)].pair || !uses[static_cast<size_t>(i)].pair->shared) return false;
    const FailoverConfig &cfg = failover_config();
    for (int i = 0; i < n; ++i) {
        const PairUse &u = uses[static_cast<size_t>(i)];
        u.pair->sleep(this, cfg.probe_interval_ns, cfg.stall_timeout_ns, u.on_silence, u.heard_ns);
        parked_on_[static_cast<size_t>(i)] = u.pair;
    }
    parked_ = true;
    return true;
}

void Comm::unpark_locked() noexcept
{
    for (std::shared_ptr<PortPairs::Pair> &p : parked_on_) {
        if (p) p->unsleep(this);
        p.reset();
    }
    parked_ = false;
}

void Comm::settle_timer_locked() noexcept
{
    if (!parked_ || quiet_locked()) return;
    unpark_locked();
    // As an unparked quiet comm's timer would: the application's test() calls and the fds
    // serve a busy comm (test() runs the watchdogs), so its own timer is a backstop, and a
    // comm busy for a moment (a message each round) parks again before it without a tick.
    const uint64_t now = now_ns();
    const uint64_t at = ProgressEngine::coalesced(now + quiet_period_ns(false), now);
    next_timer_ns_.store(at, std::memory_order_relaxed);
    ProgressEngine::instance().wake(this, at);
}

namespace {

// Devices a port event can name: the bits of Comm::ports_down_.
constexpr int kNotedDevs = 64;
// What took each device down, for the failovers note_port_down() leads to.
std::mutex g_cause_mu;
std::array<std::string, kNotedDevs> g_causes;

} // namespace

void Comm::set_port_down_cause(int dev, const std::string &cause)
{
    if (dev < 0 || dev >= kNotedDevs) return;
    std::lock_guard<std::mutex> g(g_cause_mu);
    g_causes[static_cast<size_t>(dev)] = cause;
}

void Comm::note_port_down(int dev) noexcept
{
    if (dev < 0 || dev >= kNotedDevs) return;
    ports_down_.fetch_or(uint64_t{1} << dev, std::memory_order_release);
    wake_timer();
}

void Comm::note_port_up(int dev) noexcept
{
    if (dev < 0 || dev >= kNotedDevs) return;
    ports_up_.fetch_or(uint64_t{1} << dev, std::memory_order_release);
    wake_timer();
}

void Comm::take_port_events_locked() noexcept
{
    if (!port_events_noted()) return;
    uint64_t m = ports_down_.exchange(0, std::memory_order_acquire);
    while (m != 0) {
        const int dev = __builtin_ctzll(m);
        m &= m - 1;
        std::string cause;
        {
            std::lock_guard<std::mutex> g(g_cause_mu);
            cause = g_causes[static_cast<size_t>(dev)];
        }
        if (cause.empty()) cause = "port down (dev " + std::to_string(dev) + ")";
        port_down_locked(dev, cause);
    }
    // After the downs: a port that went down and came back between two passes is left, then
    // rebuilt at once.
    for (uint64_t up = ports_up_.exchange(0, std::memory_order_acquire); up != 0; up &= up - 1)
        port_up_locked(__builtin_ctzll(up));
}

void Comm::wake_timer() noexcept
{
    next_timer_ns_.store(0, std::memory_order_relaxed);
    ProgressEngine::instance().wake(this, 0);
}

void Comm::wake_from_pair() noexcept
{
    // The pair's lock is held: only the timer moves; on_tick() leaves the other pairs.
    wake_timer();
}

void Comm::fail_locked(int err, const std::string &what) noexcept
{
    if (error_.load(std::memory_order_relaxed) != 0) return;
    error_.store(err, std::memory_order_release);
    telemetry::record_event(telemetry::EventType::kFatal, what + " (" + strerror(-err) + ")");
    telemetry::flush_writer(); // the last windows and the failover history reach the disk now
    VLOG_WARN("host %s: connection failed: %s (%s); pending requests fail", host_name(),
              what.c_str(), strerror(-err));
}

} // namespace vigil::net
