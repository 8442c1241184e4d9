// SPDX-License-Identifier: Apache-2.0
// The net plugin's profiler events: emitted as children of NCCL's proxy-step handle with our
// versioned descriptor, never with a NULL parent, failovers included.
#include <catch2/catch.hpp>

#include <algorithm>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "clock.h"
#include "nccl_abi/profiler_net_vigil.h"
#include "send_comm.h"
#include "telemetry/registry.h"

namespace {

namespace vn = vigil::net;

// A send path whose messages are acked as soon as progress() runs, and whose receiver keeps
// two single-buffer CTS groups (tag 0, 1 MiB) ahead of the sends.
class InstantPath final : public vn::SendPath
{
public:
    InstantPath(int slot, int dev)
    {
        id_.slot = slot;
        id_.dev = dev;
        id_.dev_name = "fake" + std::to_string(dev);
        id_.local = "a:1";
        id_.peer = "b:2";
    }
    const vn::PathIdentity &identity() const override { return id_; }
    void begin(uint64_t first_seq, uint32_t, int, uint64_t) override { next_ = first_seq; }
    void post(const vn::OutMessage &m) override
    {
        next_ = std::max(next_, m.seq + 1);
        queued_ += m.length;
    }
    /// With `stripes`: takes pieces; what was posted waits, not yet on the wire, until the
    /// next progress.
    bool stripes_ = false;
    bool stripes() const override { return stripes_; }
    bool can_post(uint64_t limit) const override { return queued_ < limit; }
    bool idle() const override { return true; }
    void probe() override {}
    void goodbye() override {}
    void sabotage() override {}
    vn::PathStatus progress(vn::SendSink &sink) override
    {
        queued_ = 0;
        sink.acked(next_);
        for (; groups_ < next_ + 2; ++groups_) {
            vn::CtsGroup g;
            g.index = g.first_seq = groups_;
            g.n = 1;
            g.entries[0].size = 1 << 20;
            REQUIRE(sink.cts(g) == 0);
        }
        vn::PathStatus st;
        st.heard = true;
        return st;
    }
    int fd(size_t) const override { return -1; }
    size_t nfds() const override { return 0; }

private:
    vn::PathIdentity id_;
    uint64_t next_ = 0;
    uint64_t groups_ = 0;
    uint64_t queued_ = 0;
};

struct Call {
    int type;
    void *parent;
    int64_t id;
    vigilNetProfDescr_v1_t descr;
};
std::vector<Call> g_calls;
bool g_give_handle = true;
int g_handle_token;
// With g_probe: at each start, whether another thread can take g_probe's lock meanwhile.
vn::SendComm *g_probe = nullptr;
int g_lock_free = 0, g_lock_held = 0;

ncclResult_t fake_profiler(void **eHandle, int type, void *pHandle, int64_t pluginId, void *extData)
{
    Call c{type, pHandle, pluginId, {}};
    if (type == 0) {
        c.descr = *static_cast<vigilNetProfDescr_v1_t *>(extData);
        if (g_give_handle) *eHandle = &g_handle_token;
        if (g_probe != nullptr) {
            // stats() takes the comm's lock: it must be free while NCCL's code runs.
            auto f = std::async(std::launch::async, [] { return g_probe->stats().alive_paths; });
            if (f.wait_for(std::chrono::seconds(2)) == std::future_status::ready) ++g_lock_free;
            else ++g_lock_held;
        }
    } else {
        REQUIRE(*eHandle == &g_handle_token); // stop only for an event we were given
    }
    g_calls.push_back(c);
    return ncclSuccess;
}

/// With `multipath`, both paths stripe and a 4 KiB message is 4 pieces of 1 KiB, which the
/// Striper deals over both (equally fast) paths. Windows of `window_ns`.
std::unique_ptr<vn::SendComm> make_comm(bool multipath = false, uint64_t window_ns = 20'000)
{
    vn::TelemetryConfig t;
    t.window_ns = window_ns;
    vn::SendPaths p;
    auto a = std::make_unique<InstantPath>(vn::kPrimary, 3);
    auto b = std::make_unique<InstantPath>(vn::kBackup, 4);
    a->stripes_ = b->stripes_ = multipath;
    p.paths[vn::kPrimary] = std::move(a);
    p.paths[vn::kBackup] = std::move(b);
    vn::FailoverConfig cfg;
    cfg.multipath = multipath;
    cfg.piece_bytes = 1024;
    return std::make_unique<vn::SendComm>(std::move(p), std::array<int, vn::kMaxPaths>{{3, 4}}, cfg, t);
}

/// `n` sends of 4 KiB, each tested to completion, `gap` apart.
void send_some(vn::SendComm &c, void *phandle, int n,
               std::chrono::microseconds gap = std::chrono::microseconds(50))
{
    static uint8_t buf[4096];
    for (int i = 0; i < n; ++i) {
        vn::Request *r = nullptr;
        for (int k = 0; k < 100 && r == nullptr; ++k) REQUIRE(c.isend(buf, sizeof(buf), 0, nullptr, &r, phandle) == 0);
        REQUIRE(r != nullptr);
        int done = 0;
        while (!done) REQUIRE(c.test(r, &done, nullptr) == 0);
        std::this_thread::sleep_for(gap);
    }
}

struct Fixture {
    Fixture()
    {
        REQUIRE(vigil::telemetry::Registry::instance().open(20'000, -1) == 0);
        g_calls.clear();
        g_give_handle = true;
        g_probe = nullptr;
        g_lock_free = g_lock_held = 0;
        vn::SendComm::set_profiler(fake_profiler);
    }
    ~Fixture()
    {
        vn::SendComm::set_profiler(nullptr);
        g_probe = nullptr;
    }
};

} // namespace

TEST_CASE("net events are children of the proxy-step handle, with our descriptor", "[profiler]")
{
    Fixture f;
    auto c = make_comm();
    int step = 0;
    send_some(*c, &step, 40);
    int windows = 0, starts = 0, stops = 0;
    for (const Call &k : g_calls) {
        if (k.type == 0) {
            ++starts;
            CHECK(k.parent == &step);
            CHECK(k.id == VIGIL_PROFILER_NET_ID);
            CHECK((k.id & 0xffff) == VIGIL_PROFILER_NET_VERSION);
            if (k.descr.type == vigilNetProfWindow) {
                ++windows;
                CHECK(k.descr.dev == 3);
                CHECK(k.descr.slot == vn::kPrimary);
                CHECK(k.descr.window_us == 20);
                CHECK(k.descr.generation == 1);
            }
        } else {
            ++stops;
            CHECK(k.type == 1);
        }
    }
    CHECK(windows > 0);
    CHECK(stops == starts); // every started event is stopped
}

TEST_CASE("with multipath each carrying path's window comes with its share", "[profiler][multipath]")
{
    Fixture f;
    // Windows of 2 ms, sends 5 ms apart: each send's completions on both paths fall in one
    // window per path, which the next send's completions close (the meter closes windows on
    // its next event past their end) and the send after that emits, both paths' together.
    // Nothing depends on how long a send takes (a sanitizer's slowness only stretches it).
    auto c = make_comm(true, 2'000'000);
    int step = 0;
    send_some(*c, &step, 40, std::chrono::milliseconds(5));
    // A window counts the bytes completed in it: one with posts only has a share of 0.
    int windows[vn::kMaxPaths] = {}, sharing[vn::kMaxPaths] = {};
    for (const Call &k : g_calls) {
        if (k.type != 0 || k.descr.type != vigilNetProfWindow) continue;
        REQUIRE(k.descr.slot < vn::kMaxPaths);
        ++windows[k.descr.slot];
        CHECK(k.descr.dev == (k.descr.slot == vn::kPrimary ? 3 : 4));
        CHECK(k.descr.share_permille <= 1000);
        if (k.descr.share_permille > 0 && k.descr.share_permille < 1000) ++sharing[k.descr.slot];
    }
    CHECK(windows[vn::kPrimary] > 0);
    CHECK(windows[vn::kBackup] > 0);
    CHECK(sharing[vn::kPrimary] + sharing[vn::kBackup] > 0); // both carried in one emission
    CHECK(c->stats().pieces > 0);
}

TEST_CASE("no net event without a parent handle", "[profiler]")
{
    Fixture f;
    auto c = make_comm();
    send_some(*c, nullptr, 40);
    CHECK(g_calls.empty());
}

TEST_CASE("a failover is reported as a net event; stop only follows a started event", "[profiler]")
{
    Fixture f;
    g_give_handle = false; // as when the profiler's NetPlugin bit is off
    auto c = make_comm();
    int step = 0;
    send_some(*c, &step, 3);
    c->fail_path(vn::kPrimary, "test", false);
    send_some(*c, &step, 3);
    bool failover = false;
    for (const Call &k : g_calls) {
        CHECK(k.type == 0); // no stop: start gave no handle
        if (k.descr.type == vigilNetProfFailover) {
            failover = true;
            CHECK(k.descr.slot == vn::kPrimary);
            CHECK(k.descr.dev == 3);
            CHECK(k.descr.generation == 2);
        }
    }
    CHECK(failover);
}

TEST_CASE("NCCL's profiler callback runs without the comm's lock held", "[profiler]")
{
    Fixture f;
    auto c = make_comm();
    g_probe = c.get();
    int step = 0;
    send_some(*c, &step, 10);
    c->fail_path(vn::kPrimary, "test", false);
    send_some(*c, &step, 10);
    CHECK(g_lock_free > 0);
    CHECK(g_lock_held == 0);
}
