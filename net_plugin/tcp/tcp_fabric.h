// SPDX-License-Identifier: Apache-2.0
// The TCP fabric as a provider: one NCCL device per selected network interface
// (VIGIL_SOCKET_IFNAME, NCCL's syntax), host memory only, paths of VIGIL_NSTREAMS streams,
// port events from an rtnetlink link monitor.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "../fabric.h"
#include "../rendezvous.h"
#include "../sockets/interfaces.h"
#include "link_monitor.h"
#include "params.h"

namespace vigil::net::tcp {

/// Thread-safe after construction (devices are immutable; listen/connect make independent
/// objects; the link monitor is started and stopped by the plugin's global set-up).
class TcpFabric final : public Fabric
{
public:
    /// Discovers the devices `params` select. Returns 0, or -errno with *why (bad selection,
    /// no interface, getifaddrs failure).
    static int open(const Params &params, std::unique_ptr<Fabric> *out, std::string *why);

    const char *name() const override { return "tcp"; }
    const std::vector<DeviceProps> &devices() const override { return props_; }
    int listen(int dev, ListenHandle *handle, std::unique_ptr<Listener> *out) override;
    int connect(const ConnectPlan &plan, const ListenHandle &handle, std::unique_ptr<Connector> *out) override;
    /// Host memory needs no registration (*out stays null); any other type is -EINVAL.
    int reg_mr(int dev, void *data, size_t size, int type, std::shared_ptr<FabricMr> *out) override;
    int reg_mr_dmabuf(int dev, void *data, size_t size, int type, uint64_t offset, int fd,
                      std::shared_ptr<FabricMr> *out) override;
    int start_events(PortEventSink *sink) override;
    void stop_events() override;

private:
    TcpFabric() = default;

    Params params_;
    std::vector<Device> devs_;
    std::vector<DeviceProps> props_;
    LinkMonitor links_;
    rendezvous::HubSlot hub_; // the listening sockets every listener shares
};

/// make_fabric() for VIGIL_FABRIC=tcp.
int make_fabric(const Params &params, std::unique_ptr<Fabric> *out, std::string *why);

} // namespace vigil::net::tcp
