// SPDX-License-Identifier: Apache-2.0
// vigil-netbench's workloads: latency ping-pong, bandwidth sweep, ring all-reduce, multi-recv,
// fanout.
#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <dirent.h>
#include <sys/resource.h>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "bench.h"

namespace vigil::bench {

namespace {

// Fills/validates message `k` of `n` bytes with a position- and message-dependent pattern,
// so lost, duplicated, misplaced or stale bytes all show.
uint64_t pattern_word(uint64_t k, uint64_t j)
{
    return (k << 40) ^ (j * 0x9E3779B97F4A7C15ull) ^ 0x5A5A5A5A5A5A5A5Aull;
}
void fill(uint8_t *p, size_t n, uint64_t k)
{
    size_t words = n / 8;
    for (size_t j = 0; j < words; ++j) {
        uint64_t w = pattern_word(k, j);
        std::memcpy(p + 8 * j, &w, 8);
    }
    uint64_t w = pattern_word(k, words);
    std::memcpy(p + 8 * words, &w, n % 8);
}
size_t count_bad(const uint8_t *p, size_t n, uint64_t k)
{
    size_t bad = 0, words = n / 8;
    for (size_t j = 0; j < words; ++j) {
        uint64_t w = pattern_word(k, j), got;
        std::memcpy(&got, p + 8 * j, 8);
        bad += got != w;
    }
    uint64_t w = pattern_word(k, words);
    bad += std::memcmp(p + 8 * words, &w, n % 8) != 0;
    return bad;
}

// The q-quantile (0..1) of ascending `sorted`, nearest rank below; 0 when it is empty.
double percentile(const std::vector<double> &sorted, double q)
{
    if (sorted.empty()) return 0;
    return sorted[static_cast<size_t>(q * static_cast<double>(sorted.size() - 1))];
}

} // namespace

// Ping-pong between ranks 0 and 1; rank 0 times each round trip and reports half of it.
// With --recv-ahead 1 each rank keeps a receive posted ahead of the message it waits for, in
// two buffers, as NCCL's proxy posts the receives of its next steps as soon as their slots
// are free: a receiver-driven plugin's clear-to-send for the next message then travels while
// the rank waits, not between a message and its answer. Rank 0 posts the receive of answer
// it+1 right after sending ping it; rank 1 reposts a buffer right after answering from it.
// With 0, the plain ping-pong: each receive is posted once the previous message is in, rank 0
// before its next ping and rank 1 after its answer.
void Bench::latency()
{
    if (o_.nranks != 2) die("latency needs --nranks 2");
    const size_t size = static_cast<size_t>(o_.bytes < 0 ? 8 : o_.bytes);
    const int iters = o_.iters < 0 ? 20000 : o_.iters;
    const int warmup = o_.warmup < 0 ? 1000 : o_.warmup;
    const int total = warmup + iters;
    Buffer sb;
    std::array<Buffer, 2> rb;
    reg(sb, size);
    for (Buffer &b : rb) reg(b, size);
    std::vector<double> rtt;
    rtt.reserve(static_cast<size_t>(iters));
    int tag = 1 - o_.rank;
    std::array<void *, 2> rreq{};
    auto post = [&](int it) { // the receive of message `it` (into buffer it % 2)
        Buffer &b = rb[static_cast<size_t>(it % 2)];
        void *d = b.mem.data();
        size_t sz = size;
        rreq[static_cast<size_t>(it % 2)] = post_recv(1, &d, &sz, &tag, &b.mh_recv[0]);
    };
    const bool ahead = o_.recv_ahead;
    post(0);
    if (ahead && o_.rank == 1 && total > 1) post(1);
    for (int it = 0; it < total; ++it) {
        if (o_.check) fill(sb.mem.data(), size, static_cast<uint64_t>(it * 2 + o_.rank));
        const Buffer &in = rb[static_cast<size_t>(it % 2)];
        int got = 0;
        if (o_.rank == 0) {
            const double t = now_s();
            void *sreq = post_send(sb.mem.data(), size, sb.mh_send[0]);
            if (ahead && it + 1 < total) post(it + 1);
            wait(rreq[static_cast<size_t>(it % 2)], &got);
            const double dt = now_s() - t;
            if (it >= warmup) rtt.push_back(dt);
            if (o_.check) errors_ += count_bad(in.mem.data(), size, static_cast<uint64_t>(it * 2 + 1));
            if (!ahead && it + 1 < total) post(it + 1);
            wait(sreq, nullptr);
        } else {
            wait(rreq[static_cast<size_t>(it % 2)], &got);
            if (o_.check) errors_ += count_bad(in.mem.data(), size, static_cast<uint64_t>(it * 2));
            void *sreq = post_send(sb.mem.data(), size, sb.mh_send[0]);
            if (const int next = it + (ahead ? 2 : 1); next < total) post(next);
            wait(sreq, nullptr);
        }
        if (static_cast<size_t>(got) != size) ++errors_;
        bytes_sent_ += size;
    }
    if (o_.rank == 0) {
        std::sort(rtt.begin(), rtt.end());
        double sum = 0;
        for (double d : rtt) sum += d;
        lat_p50_us_ = rtt[rtt.size() / 2] * 1e6 / 2;
        lat_p99_us_ = rtt[rtt.size() * 99 / 100] * 1e6 / 2;
        seconds_ = sum;
        std::printf("# latency: %zu-byte ping-pong, %d iterations (half round trip)\n", size, iters);
        std::printf("%12s %10s %10s %10s %10s\n", "bytes", "avg_us", "p50_us", "p99_us", "max_us");
        std::printf("%12zu %10.2f %10.2f %10.2f %10.2f\n", size, sum / static_cast<double>(rtt.size()) * 1e6 / 2,
                    lat_p50_us_, lat_p99_us_, rtt.back() * 1e6 / 2);
    }
    dereg(sb);
    for (Buffer &b : rb) dereg(b);
}

// Unidirectional stream rank 0 -> rank 1 with `window` requests in flight per channel, for
// each size. With --channels C, message k goes over connection k mod C (NCCL's channels: one
// connection each, the run ends with the slowest); each buffer stays on one channel.
void Bench::bandwidth()
{
    if (o_.nranks != 2) die("bandwidth needs --nranks 2");
    std::vector<size_t> sizes;
    if (o_.bytes >= 0) sizes.push_back(static_cast<size_t>(o_.bytes));
    else {
        if (o_.min_bytes == 0) sizes.push_back(0);
        for (int64_t s = std::max<int64_t>(o_.min_bytes, 1); s <= o_.max_bytes; s *= o_.factor)
            sizes.push_back(static_cast<size_t>(s));
    }
    const bool sender = o_.rank == 0;
    const int nch = static_cast<int>(send_comms_.size());
    if (sender) {
        std::printf("# bandwidth: rank 0 -> rank 1, %d channel%s, window %d per channel%s\n", nch,
                    nch == 1 ? "" : "s", o_.window, o_.check ? ", checked" : "");
        std::printf("%12s %8s %12s %10s %10s\n", "bytes", "iters", "time_us", "GB/s", "us/msg");
    }
    double best = 0;
    for (size_t size : sizes) {
        // Up to 1 GiB of buffers per side; each buffer carries one message in flight. Buffer b
        // is channel b mod nch's, so the requests in flight are a whole number per channel.
        const size_t per_ch = std::clamp<size_t>(size ? (1ull << 30) / size / static_cast<size_t>(nch) : o_.window,
                                                 1, static_cast<size_t>(o_.window));
        const int nbuf = static_cast<int>(per_ch) * nch;
        int iters = o_.iters;
        if (iters < 0) iters = static_cast<int>(std::clamp<uint64_t>(size ? (2ull << 30) / size : 2000, 8, 20000));
        int warmup = o_.warmup < 0 ? std::min(iters / 10 + 1, 50) : o_.warmup;
        // Whole rounds over the channels, so every channel carries the same number of messages.
        iters = (iters + nch - 1) / nch * nch;
        warmup = (warmup + nch - 1) / nch * nch;
        std::vector<Buffer> bufs(static_cast<size_t>(nbuf));
        for (Buffer &b : bufs) reg(b, size);
        std::vector<void *> reqs(static_cast<size_t>(nbuf), nullptr);
        std::vector<int64_t> msg_of(static_cast<size_t>(nbuf), -1);
        // Per channel, the k-th send meets the k-th receive: both ends number a channel's
        // messages k * nch + channel, which is what the sender writes and the receiver checks.
        std::vector<int64_t> next_msg(static_cast<size_t>(nch));
        for (int c = 0; c < nch; ++c) next_msg[static_cast<size_t>(c)] = c;
        const int total = warmup + iters;
        int posted = 0, completed = 0;
        double t0 = 0;
        int tag = 0; // the sender's rank
        if (std::string e = rdv_.barrier(); !e.empty()) die(e);
        while (completed < total) {
            const int before = posted + completed;
            for (int b = 0; b < nbuf; ++b) {
                const size_t bi = static_cast<size_t>(b);
                const int ch = b % nch;
                int64_t &k = next_msg[static_cast<size_t>(ch)];
                // The timed part starts with an empty pipe: post past the warm-up only once
                // every warm-up message completed.
                const bool drain = posted == warmup && completed < warmup;
                if (reqs[bi] == nullptr && k < total && posted - completed < nbuf && !drain) {
                    Buffer &buf = bufs[bi];
                    if (sender) {
                        if (o_.check && msg_of[bi] != k) fill(buf.mem.data(), size, static_cast<uint64_t>(k));
                        msg_of[bi] = k;
                        reqs[bi] = try_send(buf.mem.data(), size, buf.mh_send[static_cast<size_t>(ch)], ch);
                    } else {
                        void *d = buf.mem.data();
                        size_t sz = size;
                        msg_of[bi] = k;
                        reqs[bi] = try_recv(1, &d, &sz, &tag, &buf.mh_recv[static_cast<size_t>(ch)], ch);
                    }
                    if (reqs[bi] != nullptr) {
                        ++posted;
                        k += nch;
                    }
                }
                if (reqs[bi] != nullptr) {
                    int got = 0;
                    if (poll(reqs[bi], &got, sender ? 1 : 0, ch)) {
                        reqs[bi] = nullptr;
                        if (static_cast<size_t>(got) != size) ++errors_;
                        if (!sender && o_.check)
                            errors_ += count_bad(bufs[bi].mem.data(), size, static_cast<uint64_t>(msg_of[bi]));
                        if (sender && msg_of[bi] >= warmup) bytes_sent_ += size;
                        if (++completed == warmup) t0 = now_s();
                    }
                }
            }
            if (o_.yield && posted + completed == before) std::this_thread::yield();
        }
        const double dt = now_s() - t0;
        if (std::string e = rdv_.barrier(); !e.empty()) die(e);
        for (Buffer &b : bufs) dereg(b);
        if (sender) {
            const double gbps = static_cast<double>(size) * iters / dt / 1e9;
            best = std::max(best, gbps);
            seconds_ += dt;
            std::printf("%12zu %8d %12.1f %10.3f %10.2f\n", size, iters, dt * 1e6, gbps, dt * 1e6 / iters);
            std::fflush(stdout);
        }
    }
    gbps_ = best;
}

// Ring all-reduce (reduce-scatter then all-gather) of float32 sums, validated exactly.
void Bench::allreduce()
{
    const size_t bytes = static_cast<size_t>(o_.bytes < 0 ? (64 << 20) : o_.bytes);
    const size_t count = bytes / sizeof(float);
    const int iters = o_.iters < 0 ? (o_.loop ? INT_MAX : 5) : o_.iters;
    const int n = o_.nranks, r = o_.rank;
    const int prev = (r + n - 1) % n, next = (r + 1) % n;
    auto chunk_begin = [&](int c) { return count * static_cast<size_t>(c) / static_cast<size_t>(n); };
    if (o_.loop && count < static_cast<size_t>(n))
        die("--loop needs --bytes of at least 4 bytes per rank");
    size_t max_chunk = 0;
    for (int c = 0; c < n; ++c) max_chunk = std::max(max_chunk, chunk_begin(c + 1) - chunk_begin(c));
    Buffer data, tmp;
    reg(data, count * sizeof(float));
    reg(tmp, max_chunk * sizeof(float));
    auto *x = reinterpret_cast<float *>(data.mem.data());
    auto *t = reinterpret_cast<float *>(tmp.mem.data());
    // Integer-valued inputs keep every partial sum exact in float32 (|sum| < 2^24).
    auto value = [](int rank, size_t i, int it) {
        return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13 + static_cast<size_t>(it) * 5) % 1024) - 512);
    };
    const size_t slice = static_cast<size_t>(o_.slice) / sizeof(float) * sizeof(float);
    if (r == 0) {
        std::printf("# allreduce: ring of %d ranks, %zu bytes per rank, slice %zu, window %d, %zu channels\n", n,
                    count * sizeof(float), slice, o_.window, send_comms_.size());
        std::printf("%6s %12s %12s %10s %10s %10s %12s\n", "iter", "bytes", "time_us", "algbw", "busbw", "errors",
                    "end_mono_s");
    }
    // One ring step: send [sptr, +slen) to next, receive into [rptr, +rlen) from prev, both
    // cut into slices with up to `window` requests in flight per direction.
    // Profiler: per iteration one ProxyOp per channel and direction; step numbers run on
    // across the ring steps of the iteration, like NCCL's per-op step counter.
    std::vector<void *> op_send(send_comms_.size(), nullptr), op_recv(recv_comms_.size(), nullptr);
    std::vector<int> nstep_send(send_comms_.size(), 0), nstep_recv(recv_comms_.size(), 0);
    auto step = [&](float *sptr, size_t scount, float *rptr, size_t rcount, bool reduce) {
        const size_t sbytes = scount * sizeof(float), rbytes = rcount * sizeof(float);
        const size_t ns = sbytes ? (sbytes + slice - 1) / slice : 0, nr = rbytes ? (rbytes + slice - 1) / slice : 0;
        std::vector<void *> sreq(ns, nullptr), rreq(nr, nullptr);
        std::vector<void *> sstep(ns, nullptr), rstep(nr, nullptr); // profiler ProxyStep handles
        size_t s_posted = 0, r_posted = 0, s_done = 0, r_done = 0;
        uint8_t *dst = reinterpret_cast<uint8_t *>(reduce ? t : rptr);
        int tag = prev;
        waiting_since_ = now_s();
        while (s_done < ns || r_done < nr) {
            size_t moved = 0; // requests posted or completed in this pass
            while (r_posted < nr && r_posted - r_done < static_cast<size_t>(o_.window)) {
                void *d = dst + r_posted * slice;
                size_t sz = std::min(slice, rbytes - r_posted * slice);
                const int ch = static_cast<int>(r_posted % recv_comms_.size());
                const auto c = static_cast<size_t>(ch);
                // NCCL starts the step before each irecv attempt, so a NULL request leaves a
                // started step behind that is never stopped
                // (docs/nccl-abi.md, "Profiler calls and handles").
                if (profiling_) rstep[r_posted] = prof_.step_start(op_recv[c], nstep_recv[c]);
                rreq[r_posted] = try_recv(1, &d, &sz, &tag, reduce ? &tmp.mh_recv[c] : &data.mh_recv[c], ch,
                                          &rstep[r_posted]);
                if (rreq[r_posted] == nullptr) break;
                if (profiling_) prof_.state(rstep[r_posted], ncclProfilerProxyStepRecvWait, 0);
                ++moved;
                ++nstep_recv[c];
                ++r_posted;
            }
            while (s_posted < ns && s_posted - s_done < static_cast<size_t>(o_.window)) {
                const size_t sz = std::min(slice, sbytes - s_posted * slice);
                const int ch = static_cast<int>(s_posted % send_comms_.size());
                const auto c = static_cast<size_t>(ch);
                if (profiling_ && sstep[s_posted] == nullptr) { // kept across NULL-request retries
                    sstep[s_posted] = prof_.step_start(op_send[c], nstep_send[c]);
                    prof_.state(sstep[s_posted], ncclProfilerProxyStepSendGPUWait, 0);
                }
                if (profiling_) prof_.state(sstep[s_posted], ncclProfilerProxyStepSendPeerWait_v4, 0);
                sreq[s_posted] = try_send(reinterpret_cast<uint8_t *>(sptr) + s_posted * slice, sz,
                                          data.mh_send[c], ch, sstep[s_posted]);
                if (sreq[s_posted] == nullptr) break;
                if (profiling_) prof_.state(sstep[s_posted], ncclProfilerProxyStepSendWait, sz);
                ++moved;
                ++nstep_send[c];
                ++s_posted;
                bytes_sent_ += sz;
            }
            for (size_t i = r_done; i < r_posted; ++i) {
                if (rreq[i] == nullptr) continue;
                int got = 0;
                const int ch = static_cast<int>(i % recv_comms_.size());
                if (!poll(rreq[i], &got, prev, ch)) continue;
                rreq[i] = nullptr;
                ++moved;
                if (o_.progress) progressed(now_s());
                const size_t expect = std::min(slice, rbytes - i * slice);
                if (static_cast<size_t>(got) != expect) ++errors_;
                if (profiling_) {
                    prof_.state(rstep[i], ncclProfilerProxyStepRecvFlushWait, static_cast<size_t>(got));
                    prof_.state(rstep[i], ncclProfilerProxyStepRecvGPUWait, 0);
                }
                if (reduce) {
                    const size_t f0 = i * slice / sizeof(float), nf = expect / sizeof(float);
                    for (size_t k = 0; k < nf; ++k) rptr[f0 + k] += t[f0 + k];
                }
                if (profiling_) prof_.stop(rstep[i]);
            }
            while (r_done < r_posted && rreq[r_done] == nullptr) ++r_done;
            for (size_t i = s_done; i < s_posted; ++i) {
                const int ch = static_cast<int>(i % send_comms_.size());
                if (sreq[i] != nullptr && poll(sreq[i], nullptr, next, ch)) {
                    sreq[i] = nullptr;
                    ++moved;
                    if (o_.progress) progressed(now_s());
                    if (profiling_) prof_.stop(sstep[i]);
                }
            }
            while (s_done < s_posted && sreq[s_done] == nullptr) ++s_done;
            if (o_.yield && moved == 0) std::this_thread::yield();
        }
        waiting_since_ = 0;
    };
    double total_time = 0;
    // --loop: the last element carries each rank's stop vote instead of data; its sum tells
    // every rank the same thing after the same iteration.
    const size_t vote_at = o_.loop ? count - 1 : count;
    for (int it = 0; it < iters; ++it) {
        for (size_t i = 0; i < count; ++i) x[i] = value(r, i, it);
        const float my_vote = g_stop_requested ? 1.0f : 0.0f;
        if (o_.loop) x[vote_at] = my_vote;
        if (r == o_.delay_rank && o_.delay_us > 0) usleep(static_cast<useconds_t>(o_.delay_us));
        if (tuning_) { // NCCL asks the tuner at enqueue, before the collective runs
            const auto d = tuner_.collective(4 /* ncclFuncAllReduce */, count * sizeof(float),
                                             static_cast<int>(send_comms_.size()));
            for (uint64_t v : {static_cast<uint64_t>(it), static_cast<uint64_t>(d.algo + 1),
                               static_cast<uint64_t>(d.proto + 1), static_cast<uint64_t>(d.channels), d.chunk})
                tuner_digest_ = (tuner_digest_ ^ v) * 0x100000001b3ull;
            std::printf("# tuner rank %d iter %d: allreduce %zu B -> algo %d proto %d channels %d chunk %llu\n", r, it,
                        count * sizeof(float), d.algo, d.proto, d.channels, static_cast<unsigned long long>(d.chunk));
        }
        // The rank "arrives" (calls the collective) before it can know whether the others
        // have: the Coll event starts here, before the barrier, as NCCL's starts at enqueue.
        void *coll = profiling_ ? prof_.coll(static_cast<uint64_t>(it), "AllReduce", count, "ncclFloat32",
                                             static_cast<int>(send_comms_.size()))
                                : nullptr;
        if (!o_.loop)
            if (std::string e = rdv_.barrier(); !e.empty()) die(e);
        const double t0 = now_s();
        if (profiling_) {
            const int per_ch = static_cast<int>(2 * (n - 1) * ((max_chunk * sizeof(float) + slice - 1) / slice) /
                                                send_comms_.size()) + 1;
            for (size_t c = 0; c < send_comms_.size(); ++c) {
                op_send[c] = prof_.op_start(coll, static_cast<int>(c), (r + 1) % n, per_ch, static_cast<int>(slice), true);
                op_recv[c] = prof_.op_start(coll, static_cast<int>(c), prev, per_ch, static_cast<int>(slice), false);
                nstep_send[c] = nstep_recv[c] = 0;
            }
        }
        for (int s = 0; s < n - 1; ++s) { // reduce-scatter
            const int sc = (r - s + n) % n, rc = (r - s - 1 + 2 * n) % n;
            step(x + chunk_begin(sc), chunk_begin(sc + 1) - chunk_begin(sc),
                 x + chunk_begin(rc), chunk_begin(rc + 1) - chunk_begin(rc), true);
        }
        for (int s = 0; s < n - 1; ++s) { // all-gather
            const int sc = (r + 1 - s + n) % n, rc = (r - s + n) % n;
            step(x + chunk_begin(sc), chunk_begin(sc + 1) - chunk_begin(sc),
                 x + chunk_begin(rc), chunk_begin(rc + 1) - chunk_begin(rc), false);
        }
        const double dt = now_s() - t0;
        total_time += dt;
        for (size_t c = 0; profiling_ && c < send_comms_.size(); ++c) {
            prof_.stop(op_send[c]);
            prof_.stop(op_recv[c]);
        }
        uint64_t bad = 0;
        for (size_t i = 0; i < vote_at; ++i) {
            float expect = 0;
            for (int k = 0; k < n; ++k) expect += value(k, i, it);
            bad += x[i] != expect;
        }
        bool stop = false;
        if (o_.loop) { // a sum of 0/1 votes that includes ours
            const float v = x[vote_at];
            const bool integral = v == static_cast<float>(static_cast<int>(v));
            bad += !(v >= my_vote && v <= static_cast<float>(n) && integral);
            stop = v >= 1.0f;
        }
        errors_ += bad;
        iters_done_ = it + 1;
        bytes_verified_ += count * sizeof(float);
        if (o_.progress) {
            std::printf("{\"type\":\"progress\",\"rank\":%d,\"iter\":%d,\"mono_s\":%.6f,"
                        "\"msgs\":%" PRIu64 ",\"bytes_verified\":%" PRIu64 ",\"wrong\":%" PRIu64
                        ",\"stall_s\":%.6f,\"stall_from_s\":%.6f,\"stall_max_s\":%.6f,"
                        "\"stall_max_from_s\":%.6f,\"null_retries\":%" PRIu64 "}\n",
                        r, it, now_s(), msgs_, bytes_verified_, errors_, stall_iter_s_,
                        stall_iter_from_s_, stall_max_s_, stall_from_s_, null_retries_);
            std::fflush(stdout);
        }
        stall_iter_s_ = stall_iter_from_s_ = 0;
        if (r == 0) {
            const double algbw = static_cast<double>(count * sizeof(float)) / dt / 1e9;
            timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts); // same clock as the plugin's log timestamps
            // GB/s to 1e-5: a lab ring at 100 Mbit/s a port moves about 0.012 GB/s, and three
            // decimals printed it in steps of 8 Mbit/s.
            std::printf("%6d %12zu %12.1f %10.5f %10.5f %10" PRIu64 " %12.6f\n", it, count * sizeof(float), dt * 1e6,
                        algbw, algbw * 2.0 * (n - 1) / n, bad,
                        static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9);
            std::fflush(stdout);
        }
        if (stop) break;
    }
    seconds_ = total_time;
    gbps_ = static_cast<double>(count * sizeof(float)) * iters_done_ / total_time / 1e9;
    busbw_ = gbps_ * 2.0 * (n - 1) / n;
    dereg(data);
    dereg(tmp);
}

// Rank 1 posts irecv(n = maxRecvs) with tags, rank 0 sends n messages; every message must
// land in the buffer its tag selects (distinct tags, reversed order) or, with equal tags,
// in sequence order. Sizes differ per message so test()'s sizes are checked too.
void Bench::multirecv()
{
    if (o_.nranks != 2) die("multirecv needs --nranks 2");
    const int k = std::min(max_recvs_, 8);
    const int iters = o_.iters < 0 ? 200 : o_.iters;
    const size_t cap = static_cast<size_t>(o_.bytes < 0 ? 64 * 1024 : o_.bytes) + 64 * 8;
    std::vector<Buffer> bufs(static_cast<size_t>(k));
    for (Buffer &b : bufs) reg(b, cap);
    if (o_.rank == 0) std::printf("# multirecv: %d receives per irecv, %d iterations\n", k, iters);
    for (int it = 0; it < iters; ++it) {
        const bool same_tags = it % 2 == 1;
        auto msg_size = [&](int j) { return cap - 64 * 8 + static_cast<size_t>((j * 37 + it) % 64) * 8; };
        if (o_.rank == 0) {
            std::vector<void *> reqs;
            for (int j = 0; j < k; ++j) {
                Buffer &b = bufs[static_cast<size_t>(j)];
                fill(b.mem.data(), msg_size(j), static_cast<uint64_t>(it * 16 + j));
                void *req = nullptr;
                const int tag = same_tags ? 7 : j;
                for (;;) {
                    check_nccl(net_.isend(send_comms_[0], b.mem.data(), msg_size(j), tag, b.mh_send[0], &req), "isend");
                    if (req) break;
                    ++null_retries_;
                }
                reqs.push_back(req);
                bytes_sent_ += msg_size(j);
            }
            for (void *req : reqs) wait(req, nullptr);
        } else {
            std::vector<void *> data(static_cast<size_t>(k));
            std::vector<size_t> sizes(static_cast<size_t>(k), cap);
            std::vector<int> tags(static_cast<size_t>(k));
            std::vector<void *> mhs(static_cast<size_t>(k));
            for (int i = 0; i < k; ++i) {
                data[static_cast<size_t>(i)] = bufs[static_cast<size_t>(i)].mem.data();
                mhs[static_cast<size_t>(i)] = bufs[static_cast<size_t>(i)].mh_recv[0];
                tags[static_cast<size_t>(i)] = same_tags ? 7 : k - 1 - i; // buffer i wants message k-1-i
            }
            void *req = post_recv(k, data.data(), sizes.data(), tags.data(), mhs.data());
            int got[NCCL_PROXY_MAX_SUBS] = {};
            wait(req, got);
            for (int i = 0; i < k; ++i) {
                const int j = same_tags ? i : k - 1 - i;
                if (static_cast<size_t>(got[i]) != msg_size(j)) ++errors_;
                errors_ += count_bad(bufs[static_cast<size_t>(i)].mem.data(), msg_size(j), static_cast<uint64_t>(it * 16 + j));
            }
        }
        if (std::string e = rdv_.barrier(); !e.empty()) die(e);
    }
    for (Buffer &b : bufs) dereg(b);
}

} // namespace vigil::bench

namespace vigil::bench {

uint64_t Bench::rss_kib()
{
    unsigned long long size = 0, resident = 0;
    FILE *f = std::fopen("/proc/self/statm", "r");
    if (f == nullptr) return 0;
    const int got = std::fscanf(f, "%llu %llu", &size, &resident);
    std::fclose(f);
    return got == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) / 1024 : 0;
}

uint64_t Bench::open_fds()
{
    DIR *d = opendir("/proc/self/fd");
    if (d == nullptr) return 0;
    uint64_t n = 0;
    while (const dirent *e = readdir(d))
        if (e->d_name[0] != '.') ++n;
    closedir(d);
    return n > 0 ? n - 1 : 0; // less the directory's own fd
}

double Bench::cpu_s()
{
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru); // the whole process: the plugin's threads too
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

uint64_t Bench::sleeps()
{
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<uint64_t>(ru.ru_nvcsw);
}

// Fanout: rank 0 holds C send comms to rank 1, which holds their C receive comms (an
// all-to-all at scale opens one connection per remote peer and channel, most of them idle
// most of the time). --warmup + --iters rounds, each one --bytes message on every connection
// at once, every byte checked; then --idle seconds with every connection open and nothing
// posted. Each rank measures its own process: set-up time, memory and fds over what it had
// before the first listen, the CPU it spends idle. Rank 0 prints one line
// {"type":"fanout","conns",...,"send":{...},"recv":{...}} before the summary.
void Bench::fanout_run()
{
    const bool sender = o_.rank == 0;
    const size_t size = static_cast<size_t>(o_.bytes < 0 ? 64 * 1024 : o_.bytes);
    const int iters = o_.iters < 0 ? 20 : o_.iters;
    const int warmup = o_.warmup < 0 ? 2 : o_.warmup;
    std::vector<void *> &comms = sender ? send_comms_ : recv_comms_;
    const size_t n = comms.size();
    const uint64_t setup_rss = rss_kib(), setup_fds = open_fds();
    // One buffer per connection, registered on its own comm only.
    std::vector<uint8_t> mem(std::max<size_t>(n * size, 1));
    std::vector<void *> mh(n, nullptr);
    for (size_t c = 0; c < n; ++c) {
        uint8_t *p = mem.data() + c * size;
        check_nccl(net_.reg_mr(comms[c], p, std::max<size_t>(size, 1), &mh[c]), "regMr", sender ? 1 : 0,
                   static_cast<int>(c));
    }
    if (sender) {
        std::printf("# fanout: %zu connections up in %.3f s, rounds of %zu bytes on each\n", n, setup_s_, size);
        std::fflush(stdout);
    }
    std::vector<double> rounds;
    std::vector<void *> req(n, nullptr);
    std::vector<char> done(n, 0);
    // Each connection's completion time in the current round and in the slowest round (from
    // the round's start, this rank's view).
    std::vector<double> took(n, 0), worst_took;
    double worst = -1, worst_at = 0, first_round = 0;
    int tag = 0; // the sender's rank
    // --duration: rounds until the time is up, the ranks agreeing at each round's barrier.
    const double t_end = now_s() + o_.duration_s;
    for (int it = 0; o_.duration_s > 0 || it < warmup + iters; ++it) {
        if (o_.duration_s > 0 && it >= warmup) {
            uint8_t go = now_s() < t_end ? 1 : 0;
            std::vector<uint8_t> votes;
            if (std::string e = rdv_.allgather(&go, 1, &votes); !e.empty()) die(e);
            if (votes[0] == 0) break; // rank 0 decides
        }
        const uint64_t k0 = static_cast<uint64_t>(it) * n;
        if (sender)
            for (size_t c = 0; c < n; ++c) fill(mem.data() + c * size, size, k0 + c);
        if (std::string e = rdv_.barrier(); !e.empty()) die(e);
        std::fill(done.begin(), done.end(), 0);
        size_t left = n;
        const double t = now_s();
        while (left > 0) {
            for (size_t c = 0; c < n; ++c) {
                if (done[c]) continue;
                const int ch = static_cast<int>(c);
                if (req[c] == nullptr) {
                    if (sender) {
                        req[c] = try_send(mem.data() + c * size, size, mh[c], ch);
                    } else {
                        void *d = mem.data() + c * size;
                        size_t sz = size;
                        req[c] = try_recv(1, &d, &sz, &tag, &mh[c], ch);
                    }
                    if (req[c] == nullptr) continue;
                }
                int got = 0;
                if (!poll(req[c], &got, sender ? 1 : 0, ch)) continue;
                req[c] = nullptr;
                done[c] = 1;
                took[c] = now_s() - t;
                --left;
                if (static_cast<size_t>(got) != size) ++errors_;
            }
            if (o_.yield) std::this_thread::yield();
        }
        const double dt = now_s() - t;
        if (it >= warmup) rounds.push_back(dt);
        if (o_.duration_s > 0 && it >= warmup && !sender) {
            // Each timed round for the record (bench_scale.sh finds the rounds a port cut and
            // its restore fell in): its start on CLOCK_MONOTONIC, which every process of the
            // host shares, and its connections' completion times.
            std::vector<double> sorted = took;
            std::sort(sorted.begin(), sorted.end());
            std::printf("# round %d at %.6f took %.3f ms, connections p50 %.3f p99 %.3f ms\n", it, t,
                        dt * 1e3, percentile(sorted, 0.5) * 1e3, percentile(sorted, 0.99) * 1e3);
            // Every connection's completion time, ms from the round's start, in connection
            // order: bench_scale.sh times each one from a port cut that fell in the round.
            std::printf("# took %d", it);
            for (double x : took) std::printf(" %.3f", x * 1e3);
            std::printf("\n");
        }
        if (it == warmup) first_round = t;
        if (it >= warmup && dt > worst) {
            worst = dt;
            worst_at = t - first_round;
            worst_took = took;
        }
        if (sender) bytes_sent_ += size * n;
        else
            for (size_t c = 0; c < n; ++c) errors_ += count_bad(mem.data() + c * size, size, k0 + c);
    }
    // What the plugin holds once every connection carried: the workload's own buffers aside.
    const uint64_t used_rss = rss_kib() - std::min<uint64_t>(rss_kib(), n * size / 1024);
    // Idle: every connection open, nothing posted, no plugin call from this thread.
    if (std::string e = rdv_.barrier(); !e.empty()) die(e);
    if (sender && o_.idle_s > 0) {
        std::printf("# fanout: idle for %.1f s\n", o_.idle_s);
        std::fflush(stdout);
    }
    // Over the whole idle phase, and over its second half alone: the first second still has
    // every connection that carried the last round settle (a last timer, then it parks).
    const double c0 = cpu_s(), w0 = now_s();
    std::this_thread::sleep_for(std::chrono::duration<double>(o_.idle_s / 2));
    const double c1 = cpu_s(), w1 = now_s();
    const uint64_t s1 = sleeps();
    std::this_thread::sleep_for(std::chrono::duration<double>(o_.idle_s / 2));
    const double idle_cpu = cpu_s() - c0, idle_wall = now_s() - w0;
    const double steady_cpu = cpu_s() - c1, steady_wall = now_s() - w1;
    // The plugin's wake-ups (this thread's one sleep aside): what it controls, where the CPU
    // figure also holds what each wake-up costs on this host.
    const uint64_t steady_sleeps = sleeps() - s1;
    for (size_t c = 0; c < n; ++c) check_nccl(net_.dereg_mr(comms[c], mh[c]), "deregMr");

    std::sort(rounds.begin(), rounds.end());
    std::sort(worst_took.begin(), worst_took.end());
    auto pct = [&](double q) { return percentile(worst_took, q); };
    struct Side {
        double setup_s, round_p50_s, round_max_s, idle_cpu_pct, steady_cpu_pct, steady_wakes_per_s,
            worst_p50_s, worst_p99_s, worst_at_s;
        uint64_t nrounds;
        uint64_t base_rss_kib, setup_rss_kib, used_rss_kib, base_fds, setup_fds;
    } mine{setup_s_,
           rounds.empty() ? 0 : rounds[rounds.size() / 2],
           rounds.empty() ? 0 : rounds.back(),
           idle_wall > 0 ? idle_cpu / idle_wall * 100 : 0,
           steady_wall > 0 ? steady_cpu / steady_wall * 100 : 0,
           steady_wall > 0 ? static_cast<double>(steady_sleeps - std::min<uint64_t>(steady_sleeps, 1)) / steady_wall : 0,
           pct(0.5),
           pct(0.99),
           worst_at,
           rounds.size(),
           base_rss_kib_, setup_rss, used_rss, base_fds_, setup_fds};
    std::vector<uint8_t> all;
    if (std::string e = rdv_.allgather(&mine, sizeof(mine), &all); !e.empty()) die(e);
    if (!sender) return;
    std::string sides;
    for (int r = 0; r < 2; ++r) {
        Side x;
        std::memcpy(&x, all.data() + static_cast<size_t>(r) * sizeof(x), sizeof(x));
        const double per = static_cast<double>(std::max<size_t>(n, 1));
        char buf[1024];
        std::snprintf(buf, sizeof(buf),
                      "%s\"%s\":{\"setup_s\":%.3f,\"round_p50_us_per_conn\":%.2f,\"round_max_us_per_conn\":%.2f,"
                      "\"idle_cpu_pct\":%.2f,\"idle_steady_cpu_pct\":%.2f,\"idle_steady_wakes_per_s\":%.1f,\"rss_kib_per_conn\":%.1f,\"rss_used_kib_per_conn\":%.1f,"
                      "\"fds_per_conn\":%.2f,\"base_rss_kib\":%" PRIu64 ",\"base_fds\":%" PRIu64 ","
                      "\"rounds\":%" PRIu64 ",\"worst_round_ms\":%.2f,\"worst_round_conn_p50_ms\":%.2f,"
                      "\"worst_round_conn_p99_ms\":%.2f,\"worst_round_at_s\":%.3f}",
                      r == 0 ? "" : ",", r == 0 ? "send" : "recv", x.setup_s, x.round_p50_s * 1e6 / per,
                      x.round_max_s * 1e6 / per, x.idle_cpu_pct, x.steady_cpu_pct, x.steady_wakes_per_s,
                      static_cast<double>(x.setup_rss_kib - std::min(x.setup_rss_kib, x.base_rss_kib)) / per,
                      static_cast<double>(x.used_rss_kib - std::min(x.used_rss_kib, x.base_rss_kib)) / per,
                      static_cast<double>(x.setup_fds - std::min(x.setup_fds, x.base_fds)) / per, x.base_rss_kib,
                      x.base_fds, x.nrounds, x.round_max_s * 1e3, x.worst_p50_s * 1e3, x.worst_p99_s * 1e3,
                      x.worst_at_s);
        sides += buf;
    }
    std::printf("{\"type\":\"fanout\",\"conns\":%zu,\"bytes\":%zu,\"idle_s\":%.1f,%s}\n", n, size, o_.idle_s,
                sides.c_str());
    seconds_ = rounds.empty() ? 0 : rounds[rounds.size() / 2];
}

} // namespace vigil::bench
