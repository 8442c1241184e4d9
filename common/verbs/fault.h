// SPDX-License-Identifier: Apache-2.0
// Fault injection at the verbs seam (ops.h): failures rxe cannot produce on demand (an error
// completion of a chosen status on the Nth completion, a failing post, modify or
// registration), laid over the real verbs, so RC semantics stay real.
#pragma once

#include <cerrno>
#include <cstdint>
#include <mutex>
#include <set>
#include <vector>

#include "ops.h"

namespace vigil::verbs {

/// One fault. Plain data.
struct Fault {
    enum class Verb { PostSend, PostRecv, PollCq, ModifyQp, RegMr };
    Verb verb = Verb::PollCq;
    /// Fires on the nth matching call, 1-based. For PollCq a "call" is one completion
    /// returned by the CQ (a completion count is deterministic; a poll count is not).
    uint64_t nth = 1;
    /// Consecutive matches that fire from the nth on; 0 = every one from the nth on.
    uint64_t count = 1;
    /// PostSend, PostRecv, ModifyQp, RegMr: the negative errno returned, never 0 (the real
    /// verb is not called; *bad_wr is set to the first WR, *mr to null).
    int error = -EIO;
    /// PollCq: the status given to the completion (its wr_id and qp_num are kept).
    int wc_status = IBV_WC_RETRY_EXC_ERR;
    uint32_t vendor_err = 0;
    /// Only work of this QP number (0: any QP). RegMr ignores it.
    uint32_t qp_num = 0;
    /// ModifyQp: only transitions to this ibv_qp_state (-1: any).
    int qp_state = -1;
    /// PollCq: afterwards every completion of the same QP becomes IBV_WC_WR_FLUSH_ERR, as
    /// real hardware reports the rest of the work of a QP that went to the error state.
    bool flush_after = true;
};

/// Installs a verbs table that injects the faults added to it, over the table that was in
/// force, and restores that table when destroyed. At most one injector lives at a time.
/// Construct and destroy it while no data path runs; add() and fired() are thread-safe
/// (one mutex, taken on every verb while the injector is installed: a test-only cost).
class FaultInjector {
public:
    FaultInjector();
    ~FaultInjector();
    FaultInjector(const FaultInjector &) = delete;
    FaultInjector &operator=(const FaultInjector &) = delete;

    /// Adds a fault; returns its id for fired().
    int add(const Fault &fault);
    /// How many times fault `id` fired.
    uint64_t fired(int id) const;

private:
    struct Rule {
        Fault fault;
        uint64_t seen = 0;
        uint64_t fired = 0;
    };
    // Returns the rule that fires for this call, or nullptr (caller holds mu_).
    Rule *match(Fault::Verb verb, uint32_t qp_num, int qp_state);
    // Counts the call; returns the error of the fault that fires, or 0 (takes mu_).
    int check(Fault::Verb verb, uint32_t qp_num, int qp_state);

    static int post_send(ibv_qp *qp, ibv_send_wr *wr, ibv_send_wr **bad) noexcept;
    static int post_recv(ibv_qp *qp, ibv_recv_wr *wr, ibv_recv_wr **bad) noexcept;
    static int poll_cq(ibv_cq *cq, int n, ibv_wc *wc) noexcept;
    static int modify_qp(ibv_qp *qp, ibv_qp_attr *attr, int mask) noexcept;
    static int reg_mr(ibv_pd *pd, void *addr, size_t len, int access, ibv_mr **mr) noexcept;
    static int reg_dmabuf_mr(ibv_pd *pd, uint64_t off, size_t len, uint64_t iova, int fd,
                             int access, ibv_mr **mr) noexcept;

    mutable std::mutex mu_;
    std::vector<Rule> rules_;
    std::set<uint32_t> flushed_qps_;
    const Ops *next_ = nullptr;
    Ops table_{};
};

} // namespace vigil::verbs
