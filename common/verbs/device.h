// SPDX-License-Identifier: Apache-2.0
// RAII over libibverbs, device level: the device list, an open device (Context) and a
// protection domain (Pd). Control path: setup code, never the data path.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <infiniband/verbs.h>

#include "lib.h"

namespace vigil::verbs {

/// One GID table entry as the device reports it. Plain data.
struct GidEntry {
    uint32_t index = 0;
    uint8_t raw[16] = {};
    /// IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V1 or IBV_GID_TYPE_ROCE_V2.
    int type = IBV_GID_TYPE_IB;
};

/// The host's RDMA devices (ibv_get_device_list). Owns the list; move-only. The ibv_device
/// pointers stay valid while the list lives. Not thread-safe; the list is a snapshot.
class DeviceList {
public:
    DeviceList() = default;
    /// Fills *out. Returns 0, or -errno (-ENOSYS: libibverbs cannot be loaded, see
    /// library(), or no RDMA support in the kernel; an empty list is success with
    /// size() == 0).
    [[nodiscard]] static int get(DeviceList *out) noexcept;

    int size() const noexcept { return count_; }
    ibv_device *operator[](int i) const noexcept { return list_.get()[i]; }
    /// The device's kernel name ("mlx5_0", "rxe_a0").
    const char *name(int i) const noexcept { return lib().get_device_name(list_.get()[i]); }
    /// The device named exactly `name`, or nullptr.
    ibv_device *find(std::string_view name) const noexcept;

private:
    struct Free {
        void operator()(ibv_device **l) const noexcept { lib().free_device_list(l); }
    };
    std::unique_ptr<ibv_device *[], Free> list_;
    int count_ = 0;
};

/// An open device (ibv_context). Owns it; move-only; closing it releases what the process
/// holds of the device, so every Pd, Cq, Qp and Mr made from it must be gone first (their
/// owners declare them after the Context). Queries are thread-safe (the kernel serialises).
class Context {
public:
    Context() = default;
    /// Opens `dev`. Returns 0 or -errno.
    [[nodiscard]] static int open(ibv_device *dev, Context *out) noexcept;
    /// Opens the device named exactly `name`: -ENODEV when there is none.
    [[nodiscard]] static int open(std::string_view name, Context *out) noexcept;

    ibv_context *get() const noexcept { return ctx_.get(); }
    explicit operator bool() const noexcept { return ctx_ != nullptr; }
    const char *name() const noexcept { return lib().get_device_name(ctx_->device); }

    /// ibv_query_device. 0 or -errno.
    [[nodiscard]] int query_device(ibv_device_attr *attr) const noexcept;
    /// ibv_query_port for port `port` (1-based). 0 or -errno.
    [[nodiscard]] int query_port(uint8_t port, ibv_port_attr *attr) const noexcept;
    /// The port's valid GID entries, lowest index first, with their types. Uses
    /// ibv_query_gid_table where the loaded rdma-core has it, else ibv_query_gid plus the
    /// sysfs type files (as NCCL does). Empty slots (all-zero GIDs) are left out. 0 or
    /// -errno; may throw std::bad_alloc.
    [[nodiscard]] int query_gids(uint8_t port, int gid_tbl_len, std::vector<GidEntry> *out) const;

private:
    [[nodiscard]] int query_gids_one_by_one(uint8_t port, int gid_tbl_len,
                                            std::vector<GidEntry> *out) const;

private:
    struct Close {
        void operator()(ibv_context *c) const noexcept;
    };
    std::unique_ptr<ibv_context, Close> ctx_;
};

/// A protection domain. Owns it; move-only. Thread-safe to use from several threads (the
/// verbs that take a PD are).
class Pd {
public:
    Pd() = default;
    [[nodiscard]] static int alloc(const Context &ctx, Pd *out) noexcept;
    ibv_pd *get() const noexcept { return pd_.get(); }
    explicit operator bool() const noexcept { return pd_ != nullptr; }

private:
    struct Dealloc {
        void operator()(ibv_pd *p) const noexcept;
    };
    std::unique_ptr<ibv_pd, Dealloc> pd_;
};

} // namespace vigil::verbs
