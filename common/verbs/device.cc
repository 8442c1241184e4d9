// SPDX-License-Identifier: Apache-2.0
// Device list, Context and Pd.
#include "device.h"
#include "lib.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "log.h"
#include "ops.h"

namespace vigil::verbs {

int DeviceList::get(DeviceList *out) noexcept
{
    if (library() == nullptr) return -ENOSYS; // no libibverbs.so.1 on this host
    int n = 0;
    errno = 0;
    ibv_device **l = lib().get_device_list(&n);
    if (l == nullptr) return errno > 0 ? -errno : -ENOSYS;
    out->list_.reset(l);
    out->count_ = n;
    return 0;
}

ibv_device *DeviceList::find(std::string_view name) const noexcept
{
    for (int i = 0; i < count_; ++i)
        if (name == lib().get_device_name(list_.get()[i])) return list_.get()[i];
    return nullptr;
}

void Context::Close::operator()(ibv_context *c) const noexcept
{
    const int rc = lib().close_device(c);
    if (rc != 0) VLOG_WARN("ibv_close_device: %s", strerror(-errno_rc(rc)));
}

int Context::open(ibv_device *dev, Context *out) noexcept
{
    errno = 0;
    ibv_context *c = lib().open_device(dev);
    if (c == nullptr) return errno > 0 ? -errno : -ENODEV;
    out->ctx_.reset(c);
    return 0;
}

int Context::open(std::string_view name, Context *out) noexcept
{
    DeviceList list;
    if (int rc = DeviceList::get(&list); rc != 0) return rc;
    ibv_device *dev = list.find(name);
    return dev != nullptr ? open(dev, out) : -ENODEV;
}

int Context::query_device(ibv_device_attr *attr) const noexcept
{
    return errno_rc(lib().query_device(ctx_.get(), attr));
}

int Context::query_port(uint8_t port, ibv_port_attr *attr) const noexcept
{
    return errno_rc(verbs::query_port(ctx_.get(), port, attr));
}

namespace {

bool zero_gid(const uint8_t raw[16])
{
    for (int i = 0; i < 16; ++i)
        if (raw[i] != 0) return false;
    return true;
}

// The type of a GID as /sys/class/infiniband/DEV/ports/P/gid_attrs/types/I says it; the
// file is unreadable (EINVAL) for empty slots on some kernels.
int sysfs_gid_type(const char *dev, int port, int index)
{
    char path[256];
    std::snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev,
                  port, index);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return IBV_GID_TYPE_IB;
    char text[32] = {};
    const ssize_t n = ::read(fd, text, sizeof text - 1);
    ::close(fd);
    if (n <= 0) return IBV_GID_TYPE_IB;
    if (std::strncmp(text, "RoCE v2", 7) == 0) return IBV_GID_TYPE_ROCE_V2;
    if (std::strncmp(text, "IB/RoCE v1", 10) == 0 || std::strncmp(text, "RoCE v1", 7) == 0)
        return IBV_GID_TYPE_ROCE_V1;
    return IBV_GID_TYPE_IB;
}

} // namespace

int Context::query_gids(uint8_t port, int gid_tbl_len, std::vector<GidEntry> *out) const
{
    out->clear();
    if (gid_tbl_len <= 0) return 0;
    if (lib().query_gid_table == nullptr) return query_gids_one_by_one(port, gid_tbl_len, out);
    // The table call returns every valid entry of every port of the device: room for all.
    ibv_device_attr da{};
    if (int rc = query_device(&da); rc != 0) return rc;
    size_t max = 0;
    for (int p = 1; p <= da.phys_port_cnt; ++p) {
        ibv_port_attr pa{};
        if (int rc = query_port(static_cast<uint8_t>(p), &pa); rc != 0) return rc;
        max += static_cast<size_t>(pa.gid_tbl_len);
    }
    std::vector<ibv_gid_entry> entries(max);
    const ssize_t n =
        lib().query_gid_table(ctx_.get(), entries.data(), entries.size(), 0, sizeof entries[0]);
    if (n < 0) return static_cast<int>(n);
    for (ssize_t i = 0; i < n; ++i) {
        const ibv_gid_entry &e = entries[static_cast<size_t>(i)];
        if (e.port_num != port || zero_gid(e.gid.raw)) continue;
        GidEntry g;
        g.index = e.gid_index;
        std::memcpy(g.raw, e.gid.raw, 16);
        g.type = static_cast<int>(e.gid_type);
        out->push_back(g);
    }
    std::sort(out->begin(), out->end(),
              [](const GidEntry &a, const GidEntry &b) { return a.index < b.index; });
    return 0;
}

int Context::query_gids_one_by_one(uint8_t port, int gid_tbl_len, std::vector<GidEntry> *out) const
{
    for (int i = 0; i < gid_tbl_len; ++i) {
        ibv_gid gid{};
        if (lib().query_gid(ctx_.get(), port, i, &gid) != 0 || zero_gid(gid.raw)) continue;
        GidEntry g;
        g.index = static_cast<uint32_t>(i);
        std::memcpy(g.raw, gid.raw, 16);
        g.type = sysfs_gid_type(name(), port, i);
        out->push_back(g);
    }
    return 0;
}

void Pd::Dealloc::operator()(ibv_pd *p) const noexcept
{
    // EBUSY here means an MR, QP or CQ of this PD is still alive: an ownership bug.
    const int rc = lib().dealloc_pd(p);
    if (rc != 0) VLOG_WARN("ibv_dealloc_pd: %s", strerror(-errno_rc(rc)));
}

int Pd::alloc(const Context &ctx, Pd *out) noexcept
{
    errno = 0;
    ibv_pd *p = lib().alloc_pd(ctx.get());
    if (p == nullptr) return errno > 0 ? -errno : -ENOMEM;
    out->pd_.reset(p);
    return 0;
}

} // namespace vigil::verbs
