// SPDX-License-Identifier: Apache-2.0
// The verbs fabric as a provider: one NCCL device per active selected HCA port
// (VIGIL_IB_HCA), RC QPs per path, memory registered on the HCA's PD through a cache
// (regIsGlobal), port events from one async-event thread per HCA.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../fabric.h"
#include "../rendezvous.h"
#include "devices.h"
#include "params.h"
#include "verbs_path.h"

namespace vigil::net::verbs_fabric {

/// Thread-safe after open(): devices are fixed, port state is the registry's (updated by its
/// event threads), listen/connect make independent objects.
class VerbsFabric final : public Fabric
{
public:
    /// Discovers the ports `params` select. Returns 0; -ENODEV when no active port is
    /// selected (not an error for VIGIL_FABRIC=auto); -ENOSYS without RDMA in the kernel;
    /// -EINVAL for a bad VIGIL_IB_* value; each with *why.
    static int open(const Params &params, std::unique_ptr<VerbsFabric> *out, std::string *why);
    ~VerbsFabric() override;

    const char *name() const override { return "verbs"; }
    const std::vector<DeviceProps> &devices() const override { return props_; }
    int listen(int dev, ListenHandle *handle, std::unique_ptr<Listener> *out) override;
    int connect(const ConnectPlan &plan, const ListenHandle &handle, std::unique_ptr<Connector> *out) override;
    /// Host memory, and GPU memory where the port supports it; cached per HCA.
    int reg_mr(int dev, void *data, size_t size, int type, std::shared_ptr<FabricMr> *out) override;
    int reg_mr_dmabuf(int dev, void *data, size_t size, int type, uint64_t offset, int fd,
                      std::shared_ptr<FabricMr> *out) override;
    int start_events(PortEventSink *sink) override;
    void stop_events() override;

    /// The port device `dev` uses now (its GID may have been chosen again).
    PortInfo port_info(int dev) const;
    /// True while device `dev`'s port is ACTIVE (as its async events tell).
    bool port_active(int dev) const { return registry_.port_active(dev); }
    /// The QP choices for a connection with NCCL's traffic class `tc` (-1: unset).
    QpConfig qp_config(int tc) const;
    /// Where the set-up socket of device `dev` listens (the IPv4 of its RoCE GID, else the
    /// host's first selected interface).
    const Endpoint &bootstrap(int dev) const { return boot_[static_cast<size_t>(dev)]; }
    const std::string &dev_name(int dev) const { return props_[static_cast<size_t>(dev)].name; }
    uint64_t connect_timeout_ns() const;
    uint64_t handshake_timeout_ns() const;
    /// The HCA of device `dev` (its PD and registration cache).
    Hca &hca(int dev) const { return *hca_of_[static_cast<size_t>(dev)]; }

    /// How often the ports' hardware counters are sampled into the telemetry registry.
    static constexpr uint64_t kCounterIntervalMs = 100;

private:
    VerbsFabric() = default;
    void on_event(const ib::PortEvent &ev);
    /// The counter sampler's thread: every kCounterIntervalMs, each port's hardware counters
    /// into its registry entry (telemetry/registry.h: PortCounterEntry), until stop_events().
    void sample_counters();

    Params params_;
    ib::PortRegistry registry_;
    std::vector<DeviceProps> props_;
    std::vector<Endpoint> boot_;
    std::vector<std::unique_ptr<Hca>> hcas_;
    std::vector<Hca *> hca_of_;
    std::atomic<PortEventSink *> sink_{nullptr};
    std::thread sampler_;
    std::mutex sampler_mu_;
    std::condition_variable sampler_cv_;
    bool sampler_stop_ = false;
    rendezvous::HubSlot hub_; // the set-up sockets' listeners every listener shares
};

/// make_fabric() for VIGIL_FABRIC=verbs (and the first choice of auto).
int make_fabric(const Params &params, std::unique_ptr<Fabric> *out, std::string *why);

} // namespace vigil::net::verbs_fabric
