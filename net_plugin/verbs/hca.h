// SPDX-License-Identifier: Apache-2.0
// Memory registration on the verbs fabric: one PD per HCA shared by every path, and the
// registration cache NCCL's regIsGlobal promises (net_ib's reg.cc does the same job).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "../fabric.h"
#include "device.h"
#include "mr.h"

namespace vigil::net::verbs_fabric {

/// Access flags of every registration and QP of the fabric: local write, remote write (the
/// peer's RDMA writes), remote read (the flush QP's read).
inline constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

/// An HCA as the fabric uses it: its open context (owned by the port registry), one PD for
/// every path and registration on it, and the registration cache (regIsGlobal: a buffer
/// registered once is found again, whole pages, while any user holds it). Thread-safe.
class Hca
{
public:
    /// Allocates the PD. 0 or -errno.
    int open(const verbs::Context *ctx, std::string name);
    const verbs::Context &ctx() const { return *ctx_; }
    const verbs::Pd &pd() const { return pd_; }
    const std::string &name() const { return name_; }
    /// A registration covering [data, data + size): a cached one, or a new one of the whole
    /// pages. 0 or -errno.
    int reg(void *data, size_t size, std::shared_ptr<FabricMr> *out);
    /// As reg() for a DMA-BUF (never cached). 0 or -errno (-EOPNOTSUPP where unsupported).
    int reg_dmabuf(void *data, size_t size, uint64_t offset, int fd, std::shared_ptr<FabricMr> *out);
    /// Registrations alive in the cache (tests).
    size_t cached() const;

private:
    struct Entry {
        uintptr_t begin, end;
        std::weak_ptr<FabricMr> mr;
    };
    const verbs::Context *ctx_ = nullptr;
    verbs::Pd pd_;
    std::string name_;
    mutable std::mutex mu_;
    std::vector<Entry> cache_;
};

/// A registration: the verbs MR behind a FabricMr.
struct VerbsMr final : FabricMr {
    verbs::Mr mr;
};

} // namespace vigil::net::verbs_fabric
