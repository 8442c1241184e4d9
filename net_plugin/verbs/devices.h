// SPDX-License-Identifier: Apache-2.0
// The verbs fabric's NCCL devices: one per active, selected HCA port, with its properties,
// its device's open context and a live view of its state driven by async events.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "async_events.h"
#include "device.h"
#include "gid.h"
#include "hca_select.h"
#include "port_props.h"

namespace vigil::net::ib {

/// What discovery is told (from VIGIL_IB_HCA and the GID variables). Plain data.
struct DiscoveryConfig {
    std::string hca; ///< NCCL_IB_HCA syntax; empty: every device
    GidPolicy gid;
};

/// An event as the registry delivers it, after updating its own view of the port.
/// Plain data.
struct PortEvent {
    int dev = -1;                     ///< NCCL device index; -1 for events of no port (QP, CQ, SRQ)
    std::string device;               ///< the HCA ("rxe_a0")
    AsyncEvent event;                 ///< the raw event (type, port, qp_num, qp_context, time)
    int old_state = 0, new_state = 0; ///< enum ibv_port_state around the event
    int old_speed_mbps = 0, new_speed_mbps = 0;
    int old_gid_index = -1, new_gid_index = -1; ///< re-chosen on GID_CHANGE and PORT_ACTIVE
    uint16_t old_lid = 0, new_lid = 0;
};

/// Owns the open contexts of the selected HCAs, one async-event thread per context, and the
/// properties of every NCCL device (one per active selected port, ordered by device name,
/// digits compared as numbers, then port). Thread-safe: props() and port_active() may be
/// called from any thread while events update them; the handler runs on the event threads
/// (one per HCA), never concurrently for one HCA. Open once per process (the fabric's init is
/// reference-counted); close() or the destructor stops the threads before closing devices.
class PortRegistry {
public:
    using Handler = std::function<void(const PortEvent &)>;

    PortRegistry() = default;
    ~PortRegistry();
    PortRegistry(const PortRegistry &) = delete;
    PortRegistry &operator=(const PortRegistry &) = delete;

    /// Discovers the devices, opens the selected ones and starts their event threads.
    /// `handler` (may be empty) receives every event after the registry's own update.
    /// Returns the number of NCCL devices (0: none selected or active; not an error), or
    /// -errno with *why: -ENOSYS no RDMA in the kernel, -EINVAL a bad selection.
    [[nodiscard]] int open(const DiscoveryConfig &config, Handler handler, std::string *why);
    /// Stops the event threads and closes the devices. Idempotent.
    void close() noexcept;

    int count() const noexcept { return static_cast<int>(ports_.size()); }
    /// A copy of device `dev`'s properties as of now. dev in [0, count()).
    PortProps props(int dev) const;
    /// True while the port is ACTIVE (PORT_ERR clears it, PORT_ACTIVE sets it).
    bool port_active(int dev) const;
    /// The open context of device `dev`'s HCA, shared by the ports of that HCA. The fabric
    /// makes its Pd, Cq, Qp and Mr from it and must destroy them before close().
    const verbs::Context &context(int dev) const noexcept;

private:
    struct Hca {
        std::string name;
        verbs::Context ctx;
        AsyncEventThread events;
        std::vector<int> devs; // NCCL devices on this HCA
    };
    struct Port {
        Hca *hca = nullptr;
        PortProps props;
    };
    void on_event(Hca *hca, const AsyncEvent &ev);
    // Re-queries port attributes (and, when `gids`, the GID table and choice) into p.
    void refresh(Port *p, bool gids);

    mutable std::mutex mu_;
    std::vector<std::unique_ptr<Hca>> hcas_;
    std::vector<Port> ports_;
    GidPolicy gid_policy_;
    Handler handler_;
};

/// Natural order of device names: "mlx5_2" < "mlx5_10". Pure.
bool device_name_less(const std::string &a, const std::string &b) noexcept;

} // namespace vigil::net::ib
