// SPDX-License-Identifier: Apache-2.0
// What test_comm.cc and test_comm_protocol.cc share: one connection over one fake lane
// (test/support/fake_fabric.h) with timeouts for a single path, and the helpers that post,
// test and fill through it. Test code only (Catch2's REQUIRE inside).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "fake_fabric.h"

namespace vigil::test::comm {

namespace vn = vigil::net;
using vn::OutMessage;
using vn::Request;
using vigil::test::fake::chunk_of;
using vigil::test::fake::FakeSendPath;
using vigil::test::fake::Lane;
using vigil::test::fake::Net;

// Timeouts for the single-path tests: a lost path fails the connection soon (the exact
// bound is test_failover.cc's business); no test here runs long enough to look stalled.
inline vn::FailoverConfig single_path_config()
{
    vn::FailoverConfig c;
    c.fatal_timeout_ns = 20'000'000ull;     // 20 ms
    c.stall_timeout_ns = 60'000'000'000ull; // 60 s
    return c;
}

// One connection over one lane.
struct Link {
    Net n{single_path_config(), false, false};
    Lane &w = n.primary();
    vn::SendComm &send = *n.send;
    vn::RecvComm &recv = *n.recv;
};

// isend that must be posted: retried while NULL (the CTS may still be on its way).
inline Request *must_isend(vn::SendComm &c, const void *data, size_t size, int tag)
{
    Request *r = nullptr;
    for (int i = 0; i < 1000 && r == nullptr; ++i) REQUIRE(c.isend(data, size, tag, nullptr, &r) == 0);
    REQUIRE(r != nullptr);
    return r;
}

// isend that must be answered NULL (rc 0).
inline void null_isend(vn::SendComm &c, const void *data, size_t size, int tag)
{
    Request *r = reinterpret_cast<Request *>(&c); // must be overwritten
    REQUIRE(c.isend(data, size, tag, nullptr, &r) == 0);
    REQUIRE(r == nullptr);
}

inline Request *must_irecv(vn::RecvComm &c, std::vector<void *> bufs, std::vector<size_t> sizes,
                    std::vector<int> tags)
{
    Request *r = nullptr;
    REQUIRE(c.irecv(static_cast<int>(bufs.size()), bufs.data(), sizes.data(), tags.data(), nullptr, &r) == 0);
    REQUIRE(r != nullptr);
    return r;
}

// test() that must succeed; returns whether `r` completed.
inline bool done(vn::Comm &c, Request *r, int *sizes = nullptr)
{
    int d = -1;
    REQUIRE(c.test(r, &d, sizes) == 0);
    REQUIRE((d == 0 || d == 1));
    return d == 1;
}

// test() that must fail; returns the error.
inline int test_error(vn::Comm &c, Request *r)
{
    int d = -1;
    const int rc = c.test(r, &d, nullptr);
    CHECK(d == 0);
    return rc;
}

// test() of a request whose connection lost its only path: it reports "not done" until the
// fatal timeout (single_path_config) and then fails; returns the error (0: never failed).
inline int eventual_error(vn::Comm &c, Request *r)
{
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < deadline) {
        int d = -1;
        const int rc = c.test(r, &d, nullptr);
        REQUIRE(d == 0);
        if (rc != 0) return rc;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return 0;
}

inline std::vector<uint8_t> bytes(size_t n, uint8_t seed)
{
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
    return v;
}

inline bool starts_with(const std::vector<uint8_t> &buf, const std::vector<uint8_t> &want)
{
    return buf.size() >= want.size() && std::equal(want.begin(), want.end(), buf.begin());
}

inline bool all_equal(const uint8_t *p, size_t n, uint8_t v)
{
    return std::all_of(p, p + n, [v](uint8_t x) { return x == v; });
}

// Frames of message m go to stream `pick(m)` whole.
inline void route(Lane &l, size_t nstreams, std::function<size_t(const OutMessage &)> pick)
{
    l.set_streams(nstreams);
    l.split = [pick](const OutMessage &m, Lane &lane) {
        FakeSendPath::write_to(lane, pick(m), chunk_of(m, 0, m.size, lane.gen));
    };
}

} // namespace vigil::test::comm
