// SPDX-License-Identifier: Apache-2.0
// Helpers of the verbs suite.
#include "lab.h"

#include <arpa/inet.h>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sys/wait.h>
#include <thread>
#include <vector>

#include "gid.h"

namespace vigil::lab {

int topo(const std::string &args)
{
    const char *script = std::getenv("VIGIL_RXE_TOPO");
    if (script == nullptr) return 127;
    const std::string cmd = std::string(script) + " " + args;
    const int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

int64_t read_number(const std::string &path)
{
    std::ifstream f(path);
    int64_t v = -1;
    f >> v;
    return f ? v : -1;
}

int make_side(const std::string &device, size_t len, Side *out)
{
    if (int rc = verbs::Context::open(device, &out->ctx); rc != 0) return rc;
    if (int rc = verbs::Pd::alloc(out->ctx, &out->pd); rc != 0) return rc;
    if (int rc = verbs::Cq::create(out->ctx, 256, nullptr, nullptr, &out->cq); rc != 0) return rc;
    verbs::QpCaps caps;
    caps.max_send_wr = 64;
    caps.max_recv_wr = 64;
    if (int rc = verbs::Qp::create_rc(out->pd, out->cq, out->cq, caps, out, &out->qp); rc != 0)
        return rc;
    out->buf.reset(static_cast<uint8_t *>(std::aligned_alloc(4096, (len + 4095) / 4096 * 4096)));
    if (!out->buf) return -ENOMEM;
    out->len = len;
    std::memset(out->buf.get(), 0, len);
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (int rc = verbs::Mr::reg(out->pd, out->buf.get(), len, access, &out->mr); rc != 0) return rc;
    ibv_port_attr pa{};
    if (int rc = out->ctx.query_port(1, &pa); rc != 0) return rc;
    std::vector<verbs::GidEntry> table;
    if (int rc = out->ctx.query_gids(1, pa.gid_tbl_len, &table); rc != 0) return rc;
    const net::ib::GidChoice c = net::ib::choose_gid(table, false, net::ib::GidPolicy{});
    if (c.index < 0) return -ENODATA;
    out->gid_index = c.index;
    for (const verbs::GidEntry &e : table)
        if (static_cast<int>(e.index) == c.index) std::memcpy(out->gid, e.raw, 16);
    out->psn = (out->qp.num() * 7919u) & 0xffffff; // any 24-bit value; distinct per QP
    return 0;
}

int connect_pair(Side &a, Side &b, const verbs::QpPathAttr &path)
{
    const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    Side *sides[2] = {&a, &b};
    for (int i = 0; i < 2; ++i) {
        Side &me = *sides[i], &peer = *sides[1 - i];
        verbs::QpPathAttr p = path;
        p.gid_index = static_cast<uint8_t>(me.gid_index);
        verbs::QpEndpoint remote;
        remote.qpn = peer.qp.num();
        remote.psn = peer.psn;
        std::memcpy(remote.gid, peer.gid, 16);
        if (int rc = me.qp.to_init(1, access); rc != 0) return rc;
        if (int rc = me.qp.to_rtr(p, remote); rc != 0) return rc;
        if (int rc = me.qp.to_rts(p, me.psn); rc != 0) return rc;
    }
    return 0;
}

int poll_one(const verbs::Cq &cq, ibv_wc *wc, std::chrono::milliseconds timeout)
{
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        const int n = cq.poll(1, wc);
        if (n != 0) return n;
        if (std::chrono::steady_clock::now() > deadline) return 0;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
}

int post_write(const Side &src, const Side &dst, size_t offset, size_t len, uint32_t rkey,
               uint64_t wr_id, bool with_imm, uint32_t imm)
{
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(src.buf.get() + offset);
    sge.length = static_cast<uint32_t>(len);
    sge.lkey = src.mr.lkey();
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = with_imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(imm);
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(dst.buf.get() + offset);
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr *bad = nullptr;
    return src.qp.post_send(&wr, &bad);
}

} // namespace vigil::lab
