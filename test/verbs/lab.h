// SPDX-License-Identifier: Apache-2.0
// Helpers of the verbs suite that runs in the RDMA lab's guest (scripts/rxe): the lab's
// topology commands, and one end of an RC connection built from the common/verbs wrappers.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "cq.h"
#include "device.h"
#include "mr.h"
#include "qp.h"

namespace vigil::lab {

/// Runs `scripts/rxe/topo.sh ARGS` (path in VIGIL_RXE_TOPO); returns its exit status.
int topo(const std::string &args);

/// Reads a small integer file (sysfs counters); -1 when unreadable.
int64_t read_number(const std::string &path);

/// One end of an RC connection: the device, a PD, one CQ for both queues, an RC QP, a
/// page-aligned buffer and its MR (local write, remote write and read). Members are declared
/// in creation order so they are destroyed in reverse: MR before buffer before QP ... before
/// the device.
struct Side {
    struct Free {
        void operator()(uint8_t *p) const noexcept { std::free(p); }
    };
    verbs::Context ctx;
    verbs::Pd pd;
    verbs::Cq cq;
    verbs::Qp qp;
    std::unique_ptr<uint8_t[], Free> buf;
    size_t len = 0;
    verbs::Mr mr;
    int gid_index = -1;
    uint8_t gid[16] = {};
    uint32_t psn = 0;
};

/// Opens `device` and makes every object of a Side with a `len`-byte buffer. 0 or -errno.
[[nodiscard]] int make_side(const std::string &device, size_t len, Side *out);

/// Drives both QPs INIT -> RTR -> RTS towards each other with `path` (its gid_index is
/// replaced by each side's chosen GID). 0 or -errno.
[[nodiscard]] int connect_pair(Side &a, Side &b, const verbs::QpPathAttr &path);

/// Polls `cq` until one completion arrives or `timeout` passes: 1 with *wc, 0 on timeout,
/// -errno on a poll error.
int poll_one(const verbs::Cq &cq, ibv_wc *wc, std::chrono::milliseconds timeout);

/// Posts one signalled RDMA WRITE (or WRITE_WITH_IMM when `with_imm`) of `len` bytes from
/// `src` at `offset` to `dst` at the same offset, using `rkey`. 0 or -errno.
int post_write(const Side &src, const Side &dst, size_t offset, size_t len, uint32_t rkey,
               uint64_t wr_id, bool with_imm = false, uint32_t imm = 0);

} // namespace vigil::lab
