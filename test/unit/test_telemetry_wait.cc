// SPDX-License-Identifier: Apache-2.0
// Telemetry: wait time over real TCP (kernel receive timestamps, ack delay, the comm's drain rule).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "recv_comm.h"
#include "send_comm.h"
#include "tcp/stream_io.h"
#include "tcp/tcp_path.h"
#include "telemetry/registry.h"
#include "telemetry/window.h"
#include "telemetry_support.h"

using vt::kRingCapacity;
using vt::PathEntry;
using vt::RegistryView;
using vt::WindowRecord;

// =========================================================================================
// Wait time over real TCP: kernel receive timestamps, the ack delay, the comm's drain rule
// =========================================================================================

namespace {

namespace vn = vigil::net;
namespace vtcp = vigil::net::tcp;

// A connected pair of non-blocking TCP sockets over loopback: [0] connects, [1] accepted.
std::array<vigil::net::UniqueFd, 2> tcp_pair()
{
    vigil::net::UniqueFd l(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(l.get() >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    REQUIRE(bind(l.get(), reinterpret_cast<sockaddr *>(&a), len) == 0);
    REQUIRE(listen(l.get(), 1) == 0);
    REQUIRE(getsockname(l.get(), reinterpret_cast<sockaddr *>(&a), &len) == 0);
    vigil::net::UniqueFd c(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    REQUIRE(connect(c.get(), reinterpret_cast<sockaddr *>(&a), len) == 0);
    vigil::net::UniqueFd s(accept4(l.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    REQUIRE(s.get() >= 0);
    REQUIRE(fcntl(c.get(), F_SETFL, fcntl(c.get(), F_GETFL) | O_NONBLOCK) == 0);
    const int one = 1;
    for (int fd : {c.get(), s.get()}) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return {std::move(c), std::move(s)};
}

// The two halves of one TCP path with `n` streams over loopback.
struct TcpPath {
    std::unique_ptr<vtcp::TcpSendPath> send;
    std::unique_ptr<vtcp::TcpRecvPath> recv;
    explicit TcpPath(int n)
    {
        std::vector<vigil::net::UniqueFd> a, b;
        for (int i = 0; i < n; ++i) {
            auto p = tcp_pair();
            a.push_back(std::move(p[0]));
            b.push_back(std::move(p[1]));
        }
        vn::PathIdentity id;
        id.id = 77;
        id.dev = 0;
        id.dev_name = "lo";
        send = std::make_unique<vtcp::TcpSendPath>(std::move(a), id, 64 * 1024);
        recv = std::make_unique<vtcp::TcpRecvPath>(std::move(b), id);
        rx_timestamps_on();
    }
    // The kernel turns receive timestamps on for the first socket that asks through a
    // deferred work item (segments that arrive before it ran carry none), and off again with
    // the last one: keep a socket that asks open for the whole test process, and wait until
    // its segments come stamped.
    static void rx_timestamps_on()
    {
        static const bool on = [] {
            static std::array<vigil::net::UniqueFd, 2> keep = tcp_pair();
            const int one = 1;
            REQUIRE(setsockopt(keep[1].get(), SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one)) == 0);
            for (int i = 0; i < 5000; ++i) {
                const char c = 'x';
                REQUIRE(::send(keep[0].get(), &c, 1, 0) == 1);
                char b[16];
                alignas(cmsghdr) char ctl[64];
                iovec iov{b, sizeof(b)};
                msghdr m{};
                m.msg_iov = &iov;
                m.msg_iovlen = 1;
                m.msg_control = ctl;
                m.msg_controllen = sizeof(ctl);
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
                if (recvmsg(keep[1].get(), &m, MSG_DONTWAIT) > 0 && CMSG_FIRSTHDR(&m) != nullptr)
                    return true;
            }
            return false;
        }();
        REQUIRE(on);
    }
};

// Receives whole messages into one buffer and acks each at once (what RecvComm does).
struct AckingSink final : vn::RecvSink {
    vn::RecvPath *path = nullptr;
    std::vector<uint8_t> buf = std::vector<uint8_t>(1 << 20);
    std::map<uint64_t, uint64_t> got; // seq -> bytes landed
    std::map<uint64_t, uint64_t> size;
    uint64_t floor = 0;
    vn::Placement locate(uint32_t, uint64_t seq, int32_t, uint64_t sz, int) override
    {
        size[seq] = sz;
        return vn::Placement{vn::Placement::kPlace, buf.data(), 0};
    }
    bool still_wanted(uint32_t, uint64_t) override { return true; }
    int landed(uint64_t seq, uint64_t len, uint32_t gen) override
    {
        got[seq] += len;
        while (got.count(floor) != 0 && got[floor] == size[floor]) ++floor;
        path->ack(floor, gen);
        return 0;
    }
    void generation(uint32_t, uint64_t, int, uint64_t) override {}
    int whole(uint32_t, uint64_t, int32_t, uint64_t, int) override { return -EPROTO; } // TCP: none
    int whole_short(uint32_t, uint64_t, int, uint64_t, int) override { return -EPROTO; }
    int piece(uint32_t, uint64_t, int, uint64_t, int) override { return -EPROTO; }
    int piece_last(uint32_t, uint64_t, int32_t, uint64_t, int, uint64_t) override
    {
        return -EPROTO;
    }
};

struct AckSink final : vn::SendSink {
    uint64_t newest = 0;
    void acked(uint64_t seq) override { newest = std::max(newest, seq); }
    void held(uint64_t) override {}
    void landed(uint64_t, uint64_t, uint32_t, uint64_t) override {}
    int cts(const vn::CtsGroup &) override { return 0; }
};

vn::OutMessage message(uint64_t seq, const uint8_t *data, size_t size)
{
    vn::OutMessage m;
    m.seq = seq;
    m.tag = 1;
    m.data = data;
    m.size = size;
    m.length = size; // the whole message
    m.dest.size = size;
    return m;
}

void sleep_ms(int ms)
{
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

constexpr uint64_t kMsNs = 1'000'000;

} // namespace

TEST_CASE("return delay: how much longer than its floor a report took on the way back",
          "[telemetry][wait]")
{
    constexpr uint64_t kS = 1'000'000'000;
    vtcp::ReturnDelay d;
    // The receiver's clock 500 ns ahead of this one: differences are negative, and fine.
    CHECK(d.sample(10'000, 9'500, 0) == 0); // the first sets the floor
    CHECK(d.sample(20'000, 19'600, kS) == 100);
    CHECK(d.sample(30'000, 29'000, 2 * kS) == 0); // a shorter trip: the new floor
    CHECK(d.sample(40'000, 39'300, 3 * kS) == 300);
    // A new bucket keeps the one before: the floor holds for another bucket ...
    CHECK(d.sample(50'000, 49'800, 6 * kS) == 800);
    // ... and then is forgotten: the least of the bucket before and this one counts.
    CHECK(d.sample(60'000, 59'900, 11 * kS) == 100);
    // After more than two buckets without a report the floor starts afresh.
    CHECK(d.sample(70'000, 70'400, 30 * kS) == 0);
    CHECK(d.sample(80'000, 80'500, 31 * kS) == 100);
    // A 64-bit wall clock far from the other end's: only the difference matters.
    vtcp::ReturnDelay far;
    CHECK(far.sample(UINT64_MAX - 50, 1'000, 0) == 0);
    CHECK(far.sample(UINT64_MAX - 50, 1'700, kS) == 700);
}

namespace {

// Records what each landed report said about its trip back.
struct LateSink final : vn::SendSink {
    std::vector<uint64_t> late; // per landing, ns
    void acked(uint64_t) override {}
    void held(uint64_t) override {}
    void landed(uint64_t, uint64_t, uint32_t, uint64_t late_ns) override { late.push_back(late_ns); }
    int cts(const vn::CtsGroup &) override { return 0; }
};

} // namespace

TEST_CASE("tcp path: a landed report says how much longer than its floor it took on the way back",
          "[telemetry][wait]")
{
    // The receiver's half is played by hand: its reports are written to the back channel
    // with a chosen stamp, as if queued that much earlier (or later) on the receiver's clock.
    auto pair = tcp_pair();
    std::vector<vigil::net::UniqueFd> fds;
    fds.push_back(std::move(pair[0]));
    vn::PathIdentity id;
    id.id = 78;
    id.dev = 0;
    id.dev_name = "lo";
    vtcp::TcpSendPath send(std::move(fds), id, 64 * 1024);
    TcpPath::rx_timestamps_on();
    LateSink sink;
    auto report = [&](uint64_t stamp) {
        using vtcp::BackHeader;
        const vtcp::Landed l{0, 100, 1};
        std::array<uint8_t, BackHeader::kMaxBytes> msg{};
        BackHeader h;
        vtcp::encode_landed(&l, 1, stamp, &h, msg.data() + BackHeader::kSize);
        h.encode(msg.data());
        const size_t n = BackHeader::kSize + h.payload();
        REQUIRE(::send(pair[1].get(), msg.data(), n, 0) == static_cast<ssize_t>(n));
        const size_t before = sink.late.size();
        for (int i = 0; i < 2000 && sink.late.size() == before; ++i) {
            REQUIRE(send.progress(sink).error == 0);
            if (sink.late.size() == before) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        REQUIRE(sink.late.size() == before + 1);
        return sink.late.back();
    };
    CHECK(report(vtcp::realtime_ns()) == 0); // the floor: loopback's trip
    // Queued 30 ms before it was sent (behind the receiver's own data, in effect).
    uint64_t late = report(vtcp::realtime_ns() - 30 * kMsNs);
    INFO("late " << late / 1e6 << " ms");
    CHECK(late >= 29 * kMsNs);
    CHECK(late < 30 * kMsNs + 1000 * kMsNs);
    // The receiver's clock stepped 20 ms ahead: a new floor at once ...
    CHECK(report(vtcp::realtime_ns() + 20 * kMsNs) == 0);
    // ... against which a report stamped as before looks 20 ms late: what the callers bound.
    late = report(vtcp::realtime_ns());
    CHECK(late >= 19 * kMsNs);
    // An unstamped report (a receiver before the stamp) is not late.
    CHECK(report(0) == 0);
}

namespace {

// Counts every frame's bytes as they land (so the path reports them) and acks each message.
struct CountingSink final : vn::RecvSink {
    vn::RecvPath *path = nullptr;
    std::vector<uint8_t> buf = std::vector<uint8_t>(1 << 20);
    vn::Placement locate(uint32_t, uint64_t, int32_t, uint64_t, int) override
    {
        return vn::Placement{vn::Placement::kPlace, buf.data(), 0};
    }
    bool still_wanted(uint32_t, uint64_t) override { return true; }
    int landed(uint64_t seq, uint64_t len, uint32_t gen) override
    {
        path->ack(seq + 1, gen);
        return static_cast<int>(len);
    }
    void generation(uint32_t, uint64_t, int, uint64_t) override {}
    int whole(uint32_t, uint64_t, int32_t, uint64_t, int) override { return -EPROTO; }
    int whole_short(uint32_t, uint64_t, int, uint64_t, int) override { return -EPROTO; }
    int piece(uint32_t, uint64_t, int, uint64_t, int) override { return -EPROTO; }
    int piece_last(uint32_t, uint64_t, int32_t, uint64_t, int, uint64_t) override { return -EPROTO; }
};

} // namespace

TEST_CASE("tcp path: a landing is dated when its bytes reached the host, not when the receiver "
          "read them",
          "[telemetry][wait]")
{
    // A receiving process kept off the CPU (a busy host) reads late; that is not the path's
    // time. The landed report carries the kernel's receive stamp of its newest byte, so the
    // sender counts the reader's delay as the report's lateness and dates the landing earlier.
    TcpPath p(1);
    CountingSink rs;
    rs.path = p.recv.get();
    LateSink ss;
    const std::vector<uint8_t> data(8192, 0x5a); // fits the socket buffers: written at once
    auto deliver = [&](uint64_t seq, int read_after_ms) {
        p.send->post(message(seq, data.data(), data.size()));
        REQUIRE(p.send->progress(ss).error == 0);
        REQUIRE(p.send->idle());
        sleep_ms(read_after_ms); // the data waits in the receiver's socket
        REQUIRE(p.recv->progress(rs).error == 0);
        const size_t before = ss.late.size();
        for (int i = 0; i < 2000 && ss.late.size() == before; ++i) {
            REQUIRE(p.send->progress(ss).error == 0);
            if (ss.late.size() == before) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        REQUIRE(ss.late.size() == before + 1);
        return ss.late.back();
    };
    CHECK(deliver(0, 0) < 20 * kMsNs); // read at once: about the floor
    const uint64_t late = deliver(1, 60);
    INFO("late " << late / 1e6 << " ms");
    CHECK(late >= 55 * kMsNs); // the 60 ms the bytes waited for their reader
    CHECK(late < 60 * kMsNs + 2000 * kMsNs);
}

TEST_CASE("tcp path: acks carry how long the data waited for its reader", "[telemetry][wait]")
{
    TcpPath p(2);
    AckingSink rs;
    rs.path = p.recv.get();
    AckSink ss;
    const std::vector<uint8_t> data(8192, 0x5a); // fits the socket buffers: written at once

    p.send->post(message(0, data.data(), data.size()));
    REQUIRE(p.send->progress(ss).error == 0);
    REQUIRE(p.send->idle());
    sleep_ms(60); // the data waits in the receiver's socket
    REQUIRE(p.recv->progress(rs).error == 0);
    REQUIRE(rs.floor == 1);
    sleep_ms(40); // the ack waits in the sender's socket
    vn::PathStatus st = p.send->progress(ss);
    REQUIRE(st.error == 0);
    CHECK(ss.newest == 1);
    CHECK(st.wait_ack == 1);
    INFO("wait " << st.wait_ns / 1e6 << " ms");
    CHECK(st.wait_ns >= 100 * kMsNs); // both waits, measured by the kernel's timestamps
    CHECK(st.wait_ns < 100 * kMsNs + 2000 * kMsNs);

    // A heartbeat repeats the ack without its delay: its own unread time only.
    p.recv->heartbeat();
    REQUIRE(p.recv->progress(rs).error == 0);
    st = p.send->progress(ss);
    CHECK(st.wait_ack == 1);
    CHECK(st.wait_ns < 60 * kMsNs);

    // A probe that waited does not date the ack of data that did not.
    p.send->probe();
    sleep_ms(60);
    p.send->post(message(1, data.data(), data.size()));
    REQUIRE(p.send->progress(ss).error == 0);
    REQUIRE(p.recv->progress(rs).error == 0);
    REQUIRE(rs.floor == 2);
    st = p.send->progress(ss);
    CHECK(st.wait_ack == 2);
    CHECK(st.wait_ns < 60 * kMsNs);
}

namespace {

// Sum of wait_us over every window the registry holds for the send path of `comm`.
uint64_t charged_wait_us(const vn::SendComm *comm)
{
    RegistryView v;
    std::string why;
    REQUIRE(v.open(vt::Registry::instance().path(), &why) == 0);
    const PathEntry *e = find_entry(v, reinterpret_cast<uintptr_t>(comm));
    REQUIRE(e != nullptr);
    uint64_t sum = 0;
    const uint64_t head = e->ring.head.load();
    for (uint64_t k = head > kRingCapacity ? head - kRingCapacity : 0; k < head; ++k) {
        WindowRecord w;
        if (RegistryView::read(*e, k, &w)) sum += w.wait_us;
    }
    return sum;
}

// A sendComm and recvComm over one TCP loopback path, telemetry on (1 ms windows).
struct TcpConn {
    std::unique_ptr<vn::SendComm> send;
    std::unique_ptr<vn::RecvComm> recv;
    TcpConn()
    {
        registry();
        TcpPath p(1);
        vn::SendPaths sp;
        vn::RecvPaths rp;
        sp.paths[vn::kPrimary] = std::move(p.send);
        rp.paths[vn::kPrimary] = std::move(p.recv);
        rp.devs = {{0, -1}};
        vn::TelemetryConfig tc;
        tc.window_ns = kW;
        send = std::make_unique<vn::SendComm>(std::move(sp), rp.devs, vn::FailoverConfig{}, tc);
        const std::array<int, vn::kMaxPaths> devs{{0, -1}};
        recv = std::make_unique<vn::RecvComm>(std::move(rp), devs, vn::FailoverConfig{}, tc);
    }
    vn::Request *post_recv(std::vector<uint8_t> &buf)
    {
        void *d = buf.data();
        const size_t sz = buf.size();
        const int tag = 1;
        vn::MemRegion *mr = nullptr;
        vn::Request *r = nullptr;
        REQUIRE(recv->irecv(1, &d, &sz, &tag, &mr, &r) == 0);
        REQUIRE(r != nullptr);
        return r;
    }
    vn::Request *post_send(const std::vector<uint8_t> &buf)
    {
        vn::Request *r = nullptr;
        for (int i = 0; i < 1000 && r == nullptr; ++i) {
            REQUIRE(send->isend(buf.data(), buf.size(), 1, nullptr, &r) == 0);
            if (r == nullptr) sleep_ms(1);
        }
        REQUIRE(r != nullptr);
        return r;
    }
    static void wait_done(vn::Comm &c, vn::Request *r)
    {
        int done = 0;
        for (int i = 0; i < 5000 && done == 0; ++i) {
            REQUIRE(c.test(r, &done, nullptr) == 0);
            if (done == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        REQUIRE(done == 1);
    }
    // Lets the send path's windows close: the progress engine's tick a little later (its
    // first on this comm runs the timers at once).
    void close_windows()
    {
        sleep_ms(3);
        send->on_tick();
    }
};

} // namespace

TEST_CASE("send comm: the end points' wait reported with an ack counts, whatever else is in flight",
          "[telemetry][wait]")
{
    std::vector<uint8_t> data(8192, 0x33), in1(8192), in2(8192);
    SECTION("the ack of the last message in flight: charged")
    {
        TcpConn c;
        vn::Request *rr = c.post_recv(in1);
        vn::Request *sr = c.post_send(data);
        sleep_ms(100); // nothing reads the data
        TcpConn::wait_done(*c.recv, rr);
        TcpConn::wait_done(*c.send, sr);
        c.close_windows();
        const uint64_t w = charged_wait_us(c.send.get());
        INFO("charged " << w << " us");
        CHECK(w >= 100'000);
        CHECK(w < 100'000 + 2'000'000);
    }
    SECTION("an ack read while another message is in flight: charged too (a reader that does not "
            "run stalls the path however much is queued)")
    {
        TcpConn c;
        vn::Request *rr1 = c.post_recv(in1);
        vn::Request *rr2 = c.post_recv(in2);
        vn::Request *sr1 = c.post_send(data);
        sleep_ms(100);
        TcpConn::wait_done(*c.recv, rr1); // acks message 0 with a 100 ms delay ...
        vn::Request *sr2 = c.post_send(data); // ... read when message 1 is already posted
        TcpConn::wait_done(*c.send, sr1);
        TcpConn::wait_done(*c.recv, rr2);
        TcpConn::wait_done(*c.send, sr2);
        c.close_windows();
        const uint64_t w = charged_wait_us(c.send.get());
        INFO("charged " << w << " us");
        CHECK(w >= 100'000);
        CHECK(w < 100'000 + 2'000'000);
    }
    SECTION("acks read at once: nothing charged")
    {
        TcpConn c;
        for (int i = 0; i < 4; ++i) {
            vn::Request *rr = c.post_recv(in1);
            vn::Request *sr = c.post_send(data);
            TcpConn::wait_done(*c.recv, rr);
            TcpConn::wait_done(*c.send, sr);
        }
        c.close_windows();
        const uint64_t w = charged_wait_us(c.send.get());
        INFO("charged " << w << " us");
        CHECK(w < 50'000);
    }
}
