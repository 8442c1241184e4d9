// SPDX-License-Identifier: Apache-2.0
// RAII over a memory region.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include <infiniband/verbs.h>

#include "device.h"

namespace vigil::verbs {

/// A registered memory region. Owns it; move-only; deregister (destroy) it before its PD.
/// Registration goes through the fault seam (ops.h). The keys are plain values, safe to read
/// from any thread while the Mr lives.
class Mr {
public:
    Mr() = default;
    /// Registers [addr, addr+length) of host (or peer-mapped GPU) memory with `access` flags
    /// (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | ...). 0 or -errno.
    [[nodiscard]] static int reg(const Pd &pd, void *addr, size_t length, int access,
                                 Mr *out) noexcept;
    /// Registers `length` bytes at `offset` of the DMA-BUF `fd`, mapped at `iova` in the
    /// address space the peer uses. 0 or -errno (-EOPNOTSUPP: kernel or device cannot).
    [[nodiscard]] static int reg_dmabuf(const Pd &pd, uint64_t offset, size_t length, uint64_t iova,
                                        int fd, int access, Mr *out) noexcept;

    ibv_mr *get() const noexcept { return mr_.get(); }
    explicit operator bool() const noexcept { return mr_ != nullptr; }
    uint32_t lkey() const noexcept { return mr_->lkey; }
    uint32_t rkey() const noexcept { return mr_->rkey; }
    void *addr() const noexcept { return mr_->addr; }
    size_t length() const noexcept { return mr_->length; }

private:
    struct Dereg {
        void operator()(ibv_mr *m) const noexcept;
    };
    std::unique_ptr<ibv_mr, Dereg> mr_;
};

} // namespace vigil::verbs
