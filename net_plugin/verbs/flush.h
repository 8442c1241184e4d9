// SPDX-License-Identifier: Apache-2.0
// NCCL's iflush on an HCA port: an RDMA READ through a QP connected to itself, ordered after
// the RDMA writes the port made into GPU memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "../fabric.h"
#include "cq.h"
#include "mr.h"
#include "qp.h"
#include "verbs_path.h"

namespace vigil::net::verbs_fabric {

/// One port's flusher (fabric.h: Flusher), as NCCL's IB transport flushes GDR writes
/// (net_ib, gpuFlush): an RC QP connected to itself, a CQ of its own, and 4 bytes of host
/// memory each flush reads into; a flush is a signaled RDMA READ of 4 bytes of the received
/// buffer (which must be registered with remote read on this port, as Hca::reg does). Reads
/// complete in order. Owned by a RecvComm; not thread-safe (used under its lock).
class VerbsFlusher final : public Flusher
{
public:
    /// Creates the QP on `port`'s HCA and connects it to itself, with the paths' timeout and
    /// retry count (`cfg`), so a read that never completes ends in an error. 0, or -errno
    /// with *why.
    static int create(const PortInfo &port, const QpConfig &cfg, std::unique_ptr<VerbsFlusher> *out,
                      std::string *why);
    ~VerbsFlusher() override;

    int start(const void *data, const FabricMr &mr, uint64_t *ticket) override;
    int progress(uint64_t *completed) override;

private:
    VerbsFlusher() = default;

    verbs::Cq cq_;
    verbs::Qp qp_;
    uint32_t host_[1] = {};
    verbs::Mr host_mr_;
    uint64_t started_ = 0;
    uint64_t completed_ = 0;
    int error_ = 0;
    std::string where_;
};

} // namespace vigil::net::verbs_fabric
