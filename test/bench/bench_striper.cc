// SPDX-License-Identifier: Apache-2.0
// vigil-stripebench: what a degraded port costs one ring step under each way of striping a
// message over a fast and a slow path, side by side in one run, on a model of the two paths
// (each delivers what it was given in order at its own rate; a landing is known a fixed
// report delay later). A ring step waits for its slowest piece, so the step's time is the
// time its message takes. Per cut of the slow port (f of the fast port's rate):
//   queue      the rule before the Striper: a path takes the next piece while fewer than two
//              pieces are outstanding on it, the active (slow) path first
//   striper    the Striper (net_plugin/striper.h), as the net plugin runs it
//   + resend   the Striper, and once nothing is left to post, a path with nothing
//              outstanding sends again the newest piece still outstanding on the other; the
//              piece counts when its first copy lands (what a receiver that places every
//              copy could do over TCP; over RDMA a late copy would write into a buffer that
//              may be NCCL's again, so the net plugin does not)
//   standby    the slow path carries nothing (as if the port were dead)
// Each is printed as the step's throughput over the capacity bound (1 + f) x the fast rate,
// after the rates were learned. Not a test: scripts/bench_degraded.sh ring runs the real thing.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <vector>

#include "striper.h"

namespace vn = vigil::net;

namespace {

constexpr uint64_t kPiece = 256 * 1024;
constexpr uint64_t kStep = 10'000;          // ns of model time per tick
constexpr uint64_t kReportNs = 200'000;     // a landing is known this long after it happened
constexpr double kFast = 37.5e6;            // bytes/s: a 300 Mbit/s port

enum class Policy { kQueue, kStriper, kResend, kStandby };

struct Piece {
    uint64_t id, len;
    double left;                 // bytes still to deliver on this path
};

// One connection with two paths; sends messages of `bytes` one at a time.
class Conn
{
public:
    Conn(double slow, Policy p) : rate_{slow, kFast}, policy_(p), s_(kPiece, &ports_)
    {
        s_.set_carrying(0, 0, true, now_); // the active path is on the slow port
        s_.set_carrying(1, 1, true, now_);
    }
    // Time the message takes, ns.
    uint64_t send(uint64_t bytes)
    {
        const uint64_t t0 = now_;
        uint64_t left = bytes;
        done_.assign(bytes / 4096 + 2, false); // pieces are at least 4 KiB
        next_id_ = 0;
        uint64_t landed = 0;
        while (landed < bytes) {
            left = post(left);
            if (policy_ == Policy::kResend && left == 0) resend();
            now_ += kStep;
            for (int i = 0; i < 2; ++i) landed += deliver(i);
            for (auto it = reports_.begin(); it != reports_.end();) {
                if (it->at > now_) {
                    ++it;
                    continue;
                }
                s_.on_landed(it->path, it->len, now_);
                it = reports_.erase(it);
            }
        }
        // What is still outstanding (a re-sent copy, or the original of one) is abandoned.
        for (int i = 0; i < 2; ++i) {
            for (const Piece &p : q_[static_cast<size_t>(i)]) s_.on_dropped(i, p.len);
            q_[static_cast<size_t>(i)].clear();
        }
        return now_ - t0;
    }

private:
    struct Report {
        int path;
        uint64_t len, at;
    };
    uint64_t post(uint64_t left)
    {
        while (left > 0) {
            const uint64_t n = std::min(left, kPiece);
            int to = -1;
            uint64_t len = n;
            switch (policy_) {
            case Policy::kQueue:
                for (int i = 0; i < 2 && to < 0; ++i)
                    if (room(i)) to = i;
                break;
            case Policy::kStandby:
                if (room(1)) to = 1;
                break;
            default: {
                const vn::Striper::Pick p = s_.next(left, left, {room(0), room(1)}, 0, now_);
                to = p.slot;
                len = p.len;
            }
            }
            if (to < 0) break;
            add(to, next_id_++, len);
            left -= len;
        }
        return left;
    }
    // Path i holds less than its room limit undelivered.
    bool room(int i) const
    {
        double held = 0;
        for (const Piece &p : q_[static_cast<size_t>(i)]) held += p.left;
        return held < static_cast<double>(s_.room_limit(i));
    }
    void add(int path, uint64_t id, uint64_t len)
    {
        s_.on_post(path, len, now_);
        q_[static_cast<size_t>(path)].push_back({id, len, static_cast<double>(len)});
    }
    // Re-sends the newest piece outstanding on the other path from an idle one.
    void resend()
    {
        for (int i = 0; i < 2; ++i) {
            auto &mine = q_[static_cast<size_t>(i)], &other = q_[static_cast<size_t>(1 - i)];
            if (!mine.empty() || other.empty()) continue;
            const Piece &p = other.back();
            if (p.id < resent_floor_) continue; // already a copy of a copy
            resent_floor_ = p.id + 1;
            add(i, p.id, p.len);
        }
    }
    // Delivers one tick on path i; returns the message bytes newly complete.
    uint64_t deliver(int i)
    {
        auto &q = q_[static_cast<size_t>(i)];
        double c = rate_[static_cast<size_t>(i)] * static_cast<double>(kStep) / 1e9;
        uint64_t got = 0;
        while (!q.empty() && c > 0) {
            Piece &p = q.front();
            const double take = std::min(c, p.left);
            p.left -= take;
            c -= take;
            if (p.left > 0) break;
            reports_.push_back({i, p.len, now_ + kReportNs});
            if (p.id < done_.size() && !done_[p.id]) {
                done_[p.id] = true;
                got += p.len;
            }
            q.pop_front();
        }
        return got;
    }

    std::array<double, 2> rate_;
    Policy policy_;
    vn::PortCounters ports_;
    vn::Striper s_;
    uint64_t now_ = 1'000'000'000;
    std::array<std::deque<Piece>, 2> q_;
    std::deque<Report> reports_;
    std::vector<bool> done_;
    uint64_t next_id_ = 0, resent_floor_ = 0;
};

double kept_over_bound(double f, Policy p, uint64_t bytes)
{
    Conn c(kFast * f, p);
    for (int k = 0; k < 6; ++k) c.send(bytes); // rates learned
    uint64_t t = 0;
    for (int k = 0; k < 6; ++k) t += c.send(bytes);
    const double bound_ns = static_cast<double>(bytes) / (kFast * (1 + f)) * 1e9;
    return bound_ns / (static_cast<double>(t) / 6);
}

} // namespace

int main()
{
    for (const uint64_t bytes : {uint64_t{1} << 20, uint64_t{4} << 20}) {
        std::printf("# one ring step of %llu KiB over a 300 Mbit/s path and one cut to f; step "
                    "throughput over the bound (1 + f) x 300 Mbit/s\n",
                    static_cast<unsigned long long>(bytes >> 10));
        std::printf("%6s %8s %8s %9s %8s %11s\n", "f", "queue", "striper", "+ resend", "standby", "dead/bound");
        for (const double f : {0.75, 0.5, 0.25, 0.1, 0.05, 0.02}) {
            std::printf("%6.2f %8.2f %8.2f %9.2f %8.2f %11.2f\n", f, kept_over_bound(f, Policy::kQueue, bytes),
                        kept_over_bound(f, Policy::kStriper, bytes), kept_over_bound(f, Policy::kResend, bytes),
                        kept_over_bound(f, Policy::kStandby, bytes), 1 / (1 + f));
        }
    }
    return 0;
}
