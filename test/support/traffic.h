// SPDX-License-Identifier: Apache-2.0
// Traffic over one connection, made through NCCL's calls and checked exactly: sends are
// posted in order and retried while the plugin answers NULL (no CTS entry yet), as NCCL's
// proxy does; receives name the message each buffer must end up holding; every completion is
// checked (sizes, bytes, the canary past each buffer, no write after a receive was reported
// done, no send completed before the receiver held it). Works over any fabric: it only talks
// to the SendComm and RecvComm.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "clock.h"
#include "recv_comm.h"
#include "send_comm.h"

namespace vigil::test {

namespace vn = vigil::net;

inline constexpr uint8_t kFresh = 0xA5; // receive buffers before delivery
inline constexpr uint8_t kSpent = 0x5A; // ... after test() reported them done (canary)
inline constexpr uint8_t kReused = 0xC3; // send buffers after test() reported them done
inline constexpr size_t kTail = 32;     // bytes past each buffer's capacity that nobody may write

inline uint8_t pattern(uint64_t msg, uint64_t k)
{
    uint64_t x = (msg + 1) * 0x9E3779B97F4A7C15ULL ^ (k + 7) * 0xC2B2AE3D27D4EB4FULL;
    x ^= x >> 31;
    return static_cast<uint8_t>(x);
}

inline bool all_equal(const uint8_t *p, size_t n, uint8_t v)
{
    return std::all_of(p, p + n, [v](uint8_t x) { return x == v; });
}

inline void nap()
{
    std::this_thread::sleep_for(std::chrono::microseconds(200));
}

class Traffic
{
public:
    struct Msg {
        std::vector<uint8_t> src;  // the buffer isend() was given: kReused once done (NCCL
                                   // may fill it again as soon as the send completes)
        std::vector<uint8_t> sent; // what src held when it was sent
        int32_t tag = 0;
        vn::Request *req = nullptr; // null until posted
        vn::MemRegion *mr = nullptr; // from the registrar, if any
        bool posted = false;
        bool done = false;
        int recv = -1; // the irecv expected to hold it, and its buffer
        size_t buf = 0;
    };
    struct Recv {
        std::vector<std::vector<uint8_t>> bufs; // capacity + kTail each
        std::vector<size_t> caps;
        std::vector<int> tags;
        std::vector<int> expect; // message index per buffer
        std::vector<vn::MemRegion *> mrs; // from the registrar (all null without one)
        vn::Request *req = nullptr;
        bool done = false;
    };

    std::vector<Msg> msgs;
    std::vector<Recv> recvs;
    uint64_t null_sends = 0; // isend calls answered NULL
    uint64_t null_recvs = 0; // irecv calls answered NULL (the plugin's window was full)

    // `run_limit_ms`: how long run() waits by default. With `per_tag`, sends of different
    // tags are posted independently (each tag in order, as NCCL's proxies of several GPUs
    // sharing one connection do); otherwise strictly in order.
    Traffic(vn::SendComm &send, vn::RecvComm &recv, uint64_t run_limit_ms = 2000, bool per_tag = false)
        : send_(send), recv_(recv), run_limit_ms_(run_limit_ms), per_tag_(per_tag)
    {
        msgs.reserve(4096);
        recvs.reserve(4096);
    }
    ~Traffic()
    {
        for (Msg &m : msgs) vn::MemRegion::unref(m.mr);
        for (Recv &r : recvs)
            for (vn::MemRegion *m : r.mrs) vn::MemRegion::unref(m);
    }
    Traffic(const Traffic &) = delete;
    Traffic &operator=(const Traffic &) = delete;

    /// Registers a buffer as NCCL's regMr would: (address, bytes, true for a send buffer).
    /// Fabrics that write into remote memory (verbs) need it; others pass null handles.
    using Registrar = std::function<vn::MemRegion *(const void *, size_t, bool)>;
    void set_registrar(Registrar r) { reg_ = std::move(r); }

    // A new message: posted now if the receiver's CTS allows, else at a later poll (sends are
    // posted in order). Returns its index.
    int send(size_t size, int32_t tag)
    {
        const int id = static_cast<int>(msgs.size());
        Msg m;
        m.tag = tag;
        m.src.resize(size);
        for (size_t k = 0; k < size; ++k) m.src[k] = pattern(static_cast<uint64_t>(id), k);
        m.sent = m.src;
        if (reg_) m.mr = reg_(m.src.data(), m.src.size(), true);
        msgs.push_back(std::move(m));
        post_sends();
        return id;
    }

    // irecv of one group; expect[i] is the message (index of send()) buffer i must receive.
    // Posted now if the plugin takes it, else at a later poll (receives are posted in order,
    // and a NULL request means "retry", as NCCL's proxy does).
    int recv(std::vector<size_t> caps, std::vector<int> tags, std::vector<int> expect)
    {
        REQUIRE(caps.size() == tags.size());
        REQUIRE(caps.size() == expect.size());
        const int id = static_cast<int>(recvs.size());
        Recv r;
        r.caps = caps;
        r.tags = tags;
        r.expect = expect;
        for (size_t c : caps) r.bufs.emplace_back(c + kTail, kFresh);
        recvs.push_back(std::move(r));
        Recv &rr = recvs.back();
        for (auto &b : rr.bufs) rr.mrs.push_back(reg_ ? reg_(b.data(), b.size(), false) : nullptr);
        for (size_t i = 0; i < expect.size(); ++i) pending_bind_.push_back({expect[i], id, i});
        bind_late();
        post_recvs();
        return id;
    }
    void post_recvs()
    {
        for (; first_unposted_recv_ < recvs.size(); ++first_unposted_recv_) {
            Recv &r = recvs[first_unposted_recv_];
            std::vector<void *> ptrs;
            for (auto &b : r.bufs) ptrs.push_back(b.data());
            REQUIRE(recv_.irecv(static_cast<int>(r.caps.size()), ptrs.data(), r.caps.data(),
                                r.tags.data(), r.mrs.data(), &r.req) == 0);
            if (r.req == nullptr) {
                ++null_recvs;
                return;
            }
        }
    }

    // Posts what can be posted, then test() of every pending request, once. All must return
    // 0 (a path is alive). Each test() of a pending request also progresses its comm; both
    // comms get the progress engine's tick too (timers run at most every Comm::kTimerNs), as
    // in the plugin: isend() moves bytes but runs no timers, and NCCL may retry a NULL isend
    // with nothing in flight to test.
    void poll()
    {
        send_.on_tick();
        recv_.on_tick();
        post_recvs();
        post_sends();
        poll_recvs();
        poll_sends();
    }
    void post_sends()
    {
        std::vector<int32_t> blocked; // tags whose oldest unposted send got NULL
        for (size_t i = first_unposted_; i < msgs.size(); ++i) {
            Msg &m = msgs[i];
            if (m.posted || std::find(blocked.begin(), blocked.end(), m.tag) != blocked.end()) continue;
            REQUIRE(send_.isend(m.src.data(), m.src.size(), m.tag, m.mr, &m.req) == 0);
            if (m.req == nullptr) {
                ++null_sends;
                if (!per_tag_) break;
                blocked.push_back(m.tag);
                continue;
            }
            m.posted = true;
            ++nposted_;
        }
        while (first_unposted_ < msgs.size() && msgs[first_unposted_].posted) ++first_unposted_;
    }
    void poll_recvs()
    {
        bind_late();
        for (size_t i = 0; i < recvs.size(); ++i) {
            Recv &r = recvs[i];
            if (r.done || r.req == nullptr) continue;
            int d = -1;
            int sizes[vn::kMaxRecvs];
            std::fill(std::begin(sizes), std::end(sizes), -1);
            INFO("irecv " << i);
            REQUIRE(recv_.test(r.req, &d, sizes) == 0);
            REQUIRE((d == 0 || d == 1));
            if (d == 1) on_recv_done(i, sizes);
        }
    }
    void poll_sends()
    {
        bind_late();
        for (size_t i = 0; i < msgs.size(); ++i) {
            Msg &m = msgs[i];
            if (m.done || !m.posted) continue;
            int d = -1, size = -1;
            INFO("isend " << i);
            REQUIRE(send_.test(m.req, &d, &size) == 0);
            REQUIRE((d == 0 || d == 1));
            if (d == 1) {
                CHECK(size == static_cast<int>(m.src.size()));
                on_send_done(i);
            }
        }
    }

    bool all_posted() const { return nposted_ == msgs.size(); }
    // Where the traffic stands, for a failure's message.
    std::string state() const
    {
        size_t sd = 0, rp = 0, rd = 0;
        long first_open_send = -1, first_open_recv = -1;
        for (size_t i = 0; i < msgs.size(); ++i) {
            sd += msgs[i].done ? 1 : 0;
            if (!msgs[i].done && first_open_send < 0) first_open_send = static_cast<long>(i);
        }
        for (size_t i = 0; i < recvs.size(); ++i) {
            rp += recvs[i].req != nullptr ? 1 : 0;
            rd += recvs[i].done ? 1 : 0;
            if (!recvs[i].done && first_open_recv < 0) first_open_recv = static_cast<long>(i);
        }
        return std::to_string(msgs.size()) + " sends (" + std::to_string(nposted_) + " posted, " +
               std::to_string(sd) + " done, oldest open " + std::to_string(first_open_send) + "), " +
               std::to_string(recvs.size()) + " irecvs (" + std::to_string(rp) + " posted, " +
               std::to_string(rd) + " done, oldest open " + std::to_string(first_open_recv) + "), " +
               std::to_string(null_sends) + " NULL isends, " + std::to_string(null_recvs) + " NULL irecvs";
    }
    bool finished() const
    {
        return all_posted() &&
               std::all_of(msgs.begin(), msgs.end(), [](const Msg &m) { return m.done; }) &&
               std::all_of(recvs.begin(), recvs.end(), [](const Recv &r) { return r.done; });
    }

    // Polls until everything completed (within `limit_ms` of real time; by default the
    // constructor's run_limit_ms).
    void run() { run(run_limit_ms_); }
    void run(uint64_t limit_ms)
    {
        const uint64_t deadline = vigil::now_ns() + limit_ms * 1'000'000ull;
        while (!finished()) {
            INFO(state());
            REQUIRE(vigil::now_ns() < deadline);
            poll();
            if (!finished()) nap();
        }
        check_spent();
    }
    // Polls for `ms` milliseconds (or until finished).
    void run_for(uint64_t ms)
    {
        const uint64_t deadline = vigil::now_ns() + ms * 1'000'000ull;
        while (!finished() && vigil::now_ns() < deadline) {
            poll();
            nap();
        }
    }

    // No buffer was written after test() reported it done.
    void check_spent() const
    {
        for (size_t i = 0; i < recvs.size(); ++i) {
            if (!recvs[i].done) continue;
            for (size_t b = 0; b < recvs[i].bufs.size(); ++b) {
                INFO("irecv " << i << " buffer " << b << " written after it was reported done");
                CHECK(all_equal(recvs[i].bufs[b].data(), recvs[i].bufs[b].size(), kSpent));
            }
        }
    }

    bool recv_done(int id) const { return recvs[static_cast<size_t>(id)].done; }
    bool send_done(int id) const { return msgs[static_cast<size_t>(id)].done; }
    bool posted(int id) const { return msgs[static_cast<size_t>(id)].posted; }
    // Bytes of every message sent so far.
    uint64_t bytes() const
    {
        uint64_t b = 0;
        for (const Msg &m : msgs) b += m.src.size();
        return b;
    }
    int next_id() const { return static_cast<int>(msgs.size()); }

private:
    struct Bind {
        int msg, recv;
        size_t buf;
    };

    // Binds receive buffers to the messages they expect, once those messages exist.
    void bind_late()
    {
        for (auto it = pending_bind_.begin(); it != pending_bind_.end();) {
            if (static_cast<size_t>(it->msg) < msgs.size()) {
                msgs[static_cast<size_t>(it->msg)].recv = it->recv;
                msgs[static_cast<size_t>(it->msg)].buf = it->buf;
                it = pending_bind_.erase(it);
            } else {
                ++it;
            }
        }
    }

    void on_recv_done(size_t i, const int *sizes)
    {
        Recv &r = recvs[i];
        for (size_t b = 0; b < r.bufs.size(); ++b) {
            const Msg &m = msgs.at(static_cast<size_t>(r.expect[b]));
            const size_t size = m.sent.size();
            INFO("irecv " << i << " buffer " << b << " <- message " << r.expect[b]);
            REQUIRE(sizes[b] == static_cast<int>(size));
            REQUIRE(std::equal(m.sent.begin(), m.sent.end(), r.bufs[b].begin()));
            REQUIRE(all_equal(r.bufs[b].data() + size, r.bufs[b].size() - size, kFresh));
        }
        for (size_t b = r.bufs.size(); b < vn::kMaxRecvs; ++b) REQUIRE(sizes[b] == -1);
        for (auto &b : r.bufs) std::fill(b.begin(), b.end(), kSpent); // NCCL reuses them
        r.done = true;
    }

    void on_send_done(size_t i)
    {
        Msg &m = msgs[i];
        INFO("isend " << i << " completed");
        // Completion means the receiver holds the whole message (invariant 3).
        REQUIRE(m.recv >= 0);
        const Recv &r = recvs[static_cast<size_t>(m.recv)];
        if (!r.done) // (when done, on_recv_done checked the bytes before the canary)
            REQUIRE(std::equal(m.sent.begin(), m.sent.end(), r.bufs[m.buf].begin()));
        // NCCL may reuse the buffer now: a later replay of it would carry these bytes.
        std::fill(m.src.begin(), m.src.end(), kReused);
        m.done = true;
    }

    vn::SendComm &send_;
    vn::RecvComm &recv_;
    std::vector<Bind> pending_bind_;
    size_t first_unposted_ = 0;
    size_t first_unposted_recv_ = 0;
    size_t nposted_ = 0;
    uint64_t run_limit_ms_;
    bool per_tag_;
    Registrar reg_;
};

} // namespace vigil::test
