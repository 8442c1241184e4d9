// SPDX-License-Identifier: Apache-2.0
// Memory region.
#include "mr.h"
#include "lib.h"

#include <cerrno>
#include <cstring>

#include "log.h"
#include "ops.h"

namespace vigil::verbs {

void Mr::Dereg::operator()(ibv_mr *m) const noexcept
{
    const int rc = lib().dereg_mr(m);
    if (rc != 0) VLOG_WARN("ibv_dereg_mr: %s", strerror(-errno_rc(rc)));
}

int Mr::reg(const Pd &pd, void *addr, size_t length, int access, Mr *out) noexcept
{
    if (length == 0) return -EINVAL;
    ibv_mr *m = nullptr;
    if (int rc = ops().reg_mr(pd.get(), addr, length, access, &m); rc != 0) return rc;
    out->mr_.reset(m);
    return 0;
}

int Mr::reg_dmabuf(const Pd &pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access,
                   Mr *out) noexcept
{
    if (length == 0) return -EINVAL;
    ibv_mr *m = nullptr;
    if (int rc = ops().reg_dmabuf_mr(pd.get(), offset, length, iova, fd, access, &m); rc != 0)
        return rc;
    out->mr_.reset(m);
    return 0;
}

} // namespace vigil::verbs
