// SPDX-License-Identifier: Apache-2.0
// HCA port selection in NCCL_IB_HCA syntax (VIGIL_IB_HCA).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace vigil::net::ib {

/// A parsed HCA list in NCCL's NCCL_IB_HCA syntax (NCCL src/misc/utils.cc parseStringList /
/// matchIfList and the ncclIbInit prefixes; NCCL's user guide examples):
///   `mlx5`                  every port of every device whose name starts with mlx5
///   `=mlx5_0:1,mlx5_1:1`    port 1 of exactly mlx5_0 and mlx5_1
///   `^=mlx5_1,mlx5_4`       every device except exactly mlx5_1 and mlx5_4
/// A leading `^` makes it an exclusion list; a `=` after it (or leading) makes names exact,
/// else each name is a prefix (so `mlx5_1` also selects mlx5_10..mlx5_19). `NAME:PORT`
/// restricts an entry to one port; an entry without a port matches every port. An empty
/// list selects everything. Plain value type.
///
/// Stricter than NCCL where NCCL silently misreads: a port that is not a number from 1 to
/// 255, an empty name before `:`, `=` before `^`, a `^` or `=` with no names, names of 64
/// characters or more, more than 32 entries (NCCL's MAX_IB_DEVS) and characters outside
/// [A-Za-z0-9_.-] are errors.
struct HcaSelector {
    struct Entry {
        std::string name;
        int port = -1; ///< -1: any port
    };
    bool exclude = false;
    bool exact = false;
    std::vector<Entry> entries;

    /// Parses `spec`; on error returns false with a one-line reason in *why (may be null).
    static bool parse(std::string_view spec, HcaSelector *out, std::string *why);
    /// True when port `port` of device `device` is selected.
    bool matches(std::string_view device, int port) const noexcept;
};

} // namespace vigil::net::ib
