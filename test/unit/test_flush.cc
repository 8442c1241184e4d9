// SPDX-License-Identifier: Apache-2.0
// NCCL's iflush in the receiving core: nothing to wait for unless the last buffer that got data
// is device memory on a device with a Flusher; then one read per such device, and the request
// completes when every read did, in order, or when a flusher failed.
#include <catch2/catch.hpp>

#include <vector>

#include "fake_fabric.h"
#include "nccl_abi/net_common.h"

namespace vn = vigil::net;
namespace tp = vigil::test::fake;

namespace {

// Reads start at once and complete when the test says so.
struct FakeFlusher final : vn::Flusher {
    struct Read {
        const void *data;
        uint32_t rkey;
    };
    std::vector<Read> &reads;
    uint64_t &completed;
    int &error;
    FakeFlusher(std::vector<Read> &r, uint64_t &c, int &e) : reads(r), completed(c), error(e) {}
    int start(const void *data, const vn::FabricMr &mr, uint64_t *ticket) override
    {
        *ticket = reads.size();
        reads.push_back({data, mr.rkey});
        return 0;
    }
    int progress(uint64_t *c) override
    {
        *c = completed;
        return error;
    }
};

struct FlushNet {
    std::deque<tp::Lane> lanes{2};
    std::array<std::vector<FakeFlusher::Read>, vn::kMaxPaths> reads;
    std::array<uint64_t, vn::kMaxPaths> completed{};
    std::array<int, vn::kMaxPaths> error{};
    std::unique_ptr<vn::RecvComm> recv;
    FlushNet(bool primary, bool backup)
    {
        vn::RecvPaths rp;
        const std::array<bool, vn::kMaxPaths> with{{primary, backup}};
        rp.devs = {{10, 11}};
        for (int s = 0; s < vn::kMaxPaths; ++s) {
            const size_t k = static_cast<size_t>(s);
            rp.paths[k] = std::make_unique<tp::FakeRecvPath>(lanes[k], s, rp.devs[k]);
            if (with[k]) rp.flushers[k] = std::make_unique<FakeFlusher>(reads[k], completed[k], error[k]);
        }
        recv = std::make_unique<vn::RecvComm>(std::move(rp), rp.devs, vn::FailoverConfig{}, vn::TelemetryConfig{});
    }
};

struct KeyMr final : vn::FabricMr {
    explicit KeyMr(uint32_t k) { rkey = k; }
};

// A region of `type` registered on devices 10 and 11 with rkeys 100 and 101.
vn::MemRegion *region(std::vector<uint8_t> &buf, int type)
{
    auto *m = new vn::MemRegion;
    m->base = buf.data();
    m->size = buf.size();
    m->type = type;
    m->devs[0] = {10, std::make_shared<KeyMr>(100)};
    m->devs[1] = {11, std::make_shared<KeyMr>(101)};
    return m;
}

bool done(vn::RecvComm &c, vn::Request *r)
{
    int d = -1;
    REQUIRE(c.test(r, &d, nullptr) == 0);
    return d == 1;
}

} // namespace

TEST_CASE("iflush: host memory, empty receives and devices without GPUDirect need no flush", "[flush]")
{
    FlushNet n(true, true);
    std::vector<uint8_t> a(64), b(64);
    vn::MemRegion *host = region(a, NCCL_PTR_HOST), *gpu = region(b, NCCL_PTR_CUDA);
    void *data[2] = {a.data(), b.data()};
    vn::MemRegion *mrs[2] = {host, gpu};
    vn::Request *r = reinterpret_cast<vn::Request *>(1);
    int sizes[2] = {64, 0}; // the device buffer got nothing
    REQUIRE(n.recv->iflush(2, data, sizes, mrs, &r) == 0);
    CHECK(r == nullptr);
    int sizes_host[1] = {64};
    REQUIRE(n.recv->iflush(1, data, sizes_host, mrs, &r) == 0);
    CHECK(r == nullptr);
    CHECK(n.reads[0].empty());
    CHECK(n.reads[1].empty());
    FlushNet none(false, false);
    int sizes_gpu[2] = {0, 64};
    REQUIRE(none.recv->iflush(2, data, sizes_gpu, mrs, &r) == 0);
    CHECK(r == nullptr);
    vn::MemRegion::unref(host);
    vn::MemRegion::unref(gpu);
}

TEST_CASE("iflush: one read of the last buffer with data on every device that flushes; done when "
          "all completed", "[flush]")
{
    FlushNet n(true, true);
    std::vector<uint8_t> a(64), b(64), c(64);
    vn::MemRegion *ma = region(a, NCCL_PTR_CUDA), *mb = region(b, NCCL_PTR_CUDA), *mc = region(c, NCCL_PTR_CUDA);
    void *data[3] = {a.data(), b.data(), c.data()};
    vn::MemRegion *mrs[3] = {ma, mb, mc};
    int sizes[3] = {64, 32, 0};
    vn::Request *r = nullptr;
    REQUIRE(n.recv->iflush(3, data, sizes, mrs, &r) == 0);
    REQUIRE(r != nullptr);
    REQUIRE(n.reads[0].size() == 1);
    REQUIRE(n.reads[1].size() == 1);
    CHECK(n.reads[0][0].data == b.data()); // buffer 1: the last one that received data
    CHECK(n.reads[0][0].rkey == 100);
    CHECK(n.reads[1][0].rkey == 101);
    CHECK_FALSE(done(*n.recv, r));
    n.completed[0] = 1;
    CHECK_FALSE(done(*n.recv, r));
    // A second flush in flight behind the first, on the same devices.
    vn::Request *r2 = nullptr;
    REQUIRE(n.recv->iflush(3, data, sizes, mrs, &r2) == 0);
    REQUIRE(r2 != nullptr);
    n.completed[1] = 1;
    CHECK(done(*n.recv, r));
    CHECK_FALSE(done(*n.recv, r2));
    n.completed = {{2, 2}};
    CHECK(done(*n.recv, r2));
    for (vn::MemRegion *m : {ma, mb, mc}) vn::MemRegion::unref(m);
}

TEST_CASE("iflush: a flusher that failed ends the flush; the data path reports the device", "[flush]")
{
    FlushNet n(true, false);
    std::vector<uint8_t> a(64);
    vn::MemRegion *m = region(a, NCCL_PTR_CUDA);
    void *data[1] = {a.data()};
    int sizes[1] = {64};
    vn::Request *r = nullptr;
    REQUIRE(n.recv->iflush(1, data, sizes, &m, &r) == 0);
    REQUIRE(r != nullptr);
    CHECK(n.reads[1].empty());
    CHECK_FALSE(done(*n.recv, r));
    n.error[0] = -EIO;
    CHECK(done(*n.recv, r));
    vn::MemRegion::unref(m);
}
