// SPDX-License-Identifier: Apache-2.0
// The verbs seam without hardware: a fake table under the fault injector, the normalised
// return conventions, completion-status names and classes.
#include <catch2/catch.hpp>

#include <cstring>

#include "fault.h"
#include "names.h"
#include "ops.h"

using namespace vigil::verbs;

namespace {

// A CQ that always returns `pending` successful completions, alternating QPs 7 and 9.
struct FakeState {
    int polls = 0, posts = 0, recvs = 0, modifies = 0, regs = 0;
    uint64_t next_wr_id = 0;
};
FakeState g_fake;

int fake_post_send(ibv_qp *, ibv_send_wr *, ibv_send_wr **) noexcept
{
    return ++g_fake.posts, 0;
}
int fake_post_recv(ibv_qp *, ibv_recv_wr *, ibv_recv_wr **) noexcept
{
    return ++g_fake.recvs, 0;
}
int fake_poll_cq(ibv_cq *, int n, ibv_wc *wc) noexcept
{
    ++g_fake.polls;
    for (int i = 0; i < n; ++i) {
        std::memset(&wc[i], 0, sizeof wc[i]);
        wc[i].wr_id = g_fake.next_wr_id++;
        wc[i].qp_num = (wc[i].wr_id % 2) == 0 ? 7 : 9;
        wc[i].status = IBV_WC_SUCCESS;
        wc[i].opcode = IBV_WC_RDMA_WRITE;
    }
    return n;
}
int fake_modify_qp(ibv_qp *, ibv_qp_attr *, int) noexcept
{
    return ++g_fake.modifies, 0;
}
int fake_reg_mr(ibv_pd *, void *, size_t, int, ibv_mr **mr) noexcept
{
    static ibv_mr fake{};
    ++g_fake.regs;
    *mr = &fake;
    return 0;
}
int fake_reg_dmabuf(ibv_pd *, uint64_t, size_t, uint64_t, int, int, ibv_mr **mr) noexcept
{
    *mr = nullptr;
    return -EOPNOTSUPP;
}
constexpr Ops kFake = {fake_post_send, fake_post_recv, fake_poll_cq,
                       fake_modify_qp, fake_reg_mr,    fake_reg_dmabuf};

// Installs the fake table for one test and restores the real one.
struct FakeVerbs {
    FakeVerbs()
    {
        g_fake = {};
        prev = install_ops(&kFake);
    }
    ~FakeVerbs() { install_ops(prev); }
    const Ops *prev;
};

ibv_qp fake_qp(uint32_t num)
{
    ibv_qp q{};
    q.qp_num = num;
    return q;
}

} // namespace

TEST_CASE("seam: the default table is libibverbs, install/restore swaps it", "[seam]")
{
    CHECK(&ops() == &default_ops());
    {
        FakeVerbs fake;
        CHECK(&ops() == &kFake);
        ibv_wc wc[3];
        CHECK(poll_cq(nullptr, 3, wc) == 3);
        CHECK(g_fake.polls == 1);
    }
    CHECK(&ops() == &default_ops());
    CHECK(install_ops(nullptr) == &default_ops()); // nullptr restores the defaults
}

TEST_CASE("seam: errno_rc normalises verbs' mixed return conventions", "[seam]")
{
    CHECK(errno_rc(0) == 0);
    CHECK(errno_rc(ENOMEM) == -ENOMEM);
    errno = EAGAIN;
    CHECK(errno_rc(-1) == -EAGAIN);
    errno = 0;
    CHECK(errno_rc(-1) == -EIO);
}

TEST_CASE("fault: the Nth completion gets the status, the rest of its QP is flushed", "[seam]")
{
    FakeVerbs fake;
    FaultInjector inj;
    Fault f;
    f.verb = Fault::Verb::PollCq;
    f.nth = 3;
    f.qp_num = 7;
    f.wc_status = IBV_WC_RETRY_EXC_ERR;
    f.vendor_err = 0x81;
    const int id = inj.add(f);
    ibv_wc wc[8];
    REQUIRE(poll_cq(nullptr, 8, wc) == 8);
    // QP 7 owns wr_id 0, 2, 4, 6: its third completion is wr_id 4.
    for (int i = 0; i < 4; ++i) CHECK(wc[i].status == IBV_WC_SUCCESS);
    CHECK(wc[4].status == IBV_WC_RETRY_EXC_ERR);
    CHECK(wc[4].vendor_err == 0x81);
    CHECK(wc[4].wr_id == 4);
    CHECK(wc[4].qp_num == 7);
    CHECK(wc[5].status == IBV_WC_SUCCESS);      // QP 9 is untouched
    CHECK(wc[6].status == IBV_WC_WR_FLUSH_ERR); // QP 7 after the error
    CHECK(inj.fired(id) == 1);
    REQUIRE(poll_cq(nullptr, 2, wc) == 2);
    CHECK(wc[0].status == IBV_WC_WR_FLUSH_ERR);
    CHECK(wc[1].status == IBV_WC_SUCCESS);
    CHECK(inj.fired(id) == 1);
}

TEST_CASE("fault: count 0 fires on every match from the Nth on, without flush", "[seam]")
{
    FakeVerbs fake;
    FaultInjector inj;
    Fault f;
    f.verb = Fault::Verb::PollCq;
    f.nth = 2;
    f.count = 0;
    f.flush_after = false;
    f.wc_status = IBV_WC_REM_ACCESS_ERR;
    const int id = inj.add(f);
    ibv_wc wc[4];
    REQUIRE(poll_cq(nullptr, 4, wc) == 4);
    CHECK(wc[0].status == IBV_WC_SUCCESS);
    for (int i = 1; i < 4; ++i) CHECK(wc[i].status == IBV_WC_REM_ACCESS_ERR);
    CHECK(inj.fired(id) == 3);
}

TEST_CASE("fault: a failing post returns the errno and names the first WR", "[seam]")
{
    FakeVerbs fake;
    FaultInjector inj;
    Fault f;
    f.verb = Fault::Verb::PostSend;
    f.nth = 2;
    f.error = -ENOMEM;
    f.qp_num = 5;
    const int id = inj.add(f);
    ibv_qp q5 = fake_qp(5), q6 = fake_qp(6);
    ibv_send_wr wr{}, *bad = nullptr;
    CHECK(post_send(&q5, &wr, &bad) == 0);
    CHECK(post_send(&q6, &wr, &bad) == 0); // another QP does not count
    CHECK(post_send(&q5, &wr, &bad) == -ENOMEM);
    CHECK(bad == &wr);
    CHECK(post_send(&q5, &wr, &bad) == 0);
    CHECK(g_fake.posts == 3);
    CHECK(inj.fired(id) == 1);

    Fault r;
    r.verb = Fault::Verb::PostRecv;
    r.error = -EAGAIN;
    inj.add(r);
    ibv_recv_wr rwr{}, *rbad = nullptr;
    CHECK(post_recv(&q6, &rwr, &rbad) == -EAGAIN);
    CHECK(rbad == &rwr);
    CHECK(g_fake.recvs == 0);
}

TEST_CASE("fault: modify_qp fails only for the chosen target state", "[seam]")
{
    FakeVerbs fake;
    FaultInjector inj;
    Fault f;
    f.verb = Fault::Verb::ModifyQp;
    f.qp_state = IBV_QPS_RTR;
    f.error = -ETIMEDOUT;
    const int id = inj.add(f);
    ibv_qp q = fake_qp(11);
    ibv_qp_attr init{}, rtr{};
    init.qp_state = IBV_QPS_INIT;
    rtr.qp_state = IBV_QPS_RTR;
    CHECK(modify_qp(&q, &init, IBV_QP_STATE) == 0);
    CHECK(modify_qp(&q, &rtr, IBV_QP_STATE) == -ETIMEDOUT);
    CHECK(modify_qp(&q, &rtr, IBV_QP_STATE) == 0); // count 1: once
    CHECK(inj.fired(id) == 1);
    CHECK(g_fake.modifies == 2);
}

TEST_CASE("fault: reg_mr fails on the Nth registration", "[seam]")
{
    FakeVerbs fake;
    FaultInjector inj;
    Fault f;
    f.verb = Fault::Verb::RegMr;
    f.nth = 2;
    f.error = -ENOMEM;
    inj.add(f);
    ibv_mr *mr = nullptr;
    CHECK(ops().reg_mr(nullptr, nullptr, 8, 0, &mr) == 0);
    CHECK(mr != nullptr);
    CHECK(ops().reg_mr(nullptr, nullptr, 8, 0, &mr) == -ENOMEM);
    CHECK(mr == nullptr);
    CHECK(g_fake.regs == 1);
}

TEST_CASE("fault: one injector at a time; destroying it restores the table", "[seam]")
{
    FakeVerbs fake;
    {
        FaultInjector inj;
        CHECK(&ops() != &kFake);
        CHECK_THROWS_AS(FaultInjector(), std::logic_error);
    }
    CHECK(&ops() == &kFake);
}

TEST_CASE("names: completion statuses by their enum names", "[names]")
{
    CHECK(std::string(wc_status_name(IBV_WC_SUCCESS)) == "IBV_WC_SUCCESS");
    CHECK(std::string(wc_status_name(IBV_WC_RETRY_EXC_ERR)) == "IBV_WC_RETRY_EXC_ERR");
    CHECK(std::string(wc_status_name(IBV_WC_REM_ACCESS_ERR)) == "IBV_WC_REM_ACCESS_ERR");
    CHECK(std::string(wc_status_name(999)) == "IBV_WC_UNKNOWN");
    CHECK(std::string(event_type_name(IBV_EVENT_PORT_ERR)) == "IBV_EVENT_PORT_ERR");
    CHECK(std::string(event_type_name(IBV_EVENT_GID_CHANGE)) == "IBV_EVENT_GID_CHANGE");
    CHECK(std::string(port_state_name(IBV_PORT_ACTIVE)) == "ACTIVE");
}

TEST_CASE("names: path errors fail over, protection errors fail the connection", "[names]")
{
    for (int s : {IBV_WC_RETRY_EXC_ERR, IBV_WC_WR_FLUSH_ERR, IBV_WC_LOC_QP_OP_ERR,
                  IBV_WC_RNR_RETRY_EXC_ERR})
        CHECK(classify_wc_status(s) == WcClass::Path);
    for (int s : std::initializer_list<int>{IBV_WC_REM_ACCESS_ERR, IBV_WC_LOC_PROT_ERR,
                                            IBV_WC_REM_INV_REQ_ERR, IBV_WC_MW_BIND_ERR,
                                            IBV_WC_LOC_LEN_ERR, 999})
        CHECK(classify_wc_status(s) == WcClass::Protection);
    CHECK(classify_wc_status(IBV_WC_SUCCESS) == WcClass::Success);
}

TEST_CASE("names: MTU enum and bytes", "[names]")
{
    CHECK(mtu_bytes(IBV_MTU_1024) == 1024);
    CHECK(mtu_bytes(IBV_MTU_4096) == 4096);
    CHECK(mtu_bytes(0) == 0);
    CHECK(mtu_from_bytes(2048) == IBV_MTU_2048);
    CHECK(mtu_from_bytes(1500) == 0);
    const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 10, 0, 1};
    CHECK(gid_to_string(gid) == "::ffff:10.10.0.1");
}
