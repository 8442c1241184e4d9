// SPDX-License-Identifier: Apache-2.0
// The TCP fabric provider: devices, listen/connect, (no) memory registration, link events.
#include "tcp_fabric.h"

#include <cerrno>
#include <cstring>

#include "log.h"
#include "nccl_abi/net_common.h"
#include "tcp_setup.h"

namespace vigil::net::tcp {

int TcpFabric::open(const Params &params, std::unique_ptr<Fabric> *out, std::string *why)
{
    std::vector<IfaceInfo> ifaces;
    if (int rc = list_interfaces(&ifaces); rc != 0) {
        *why = std::string("getifaddrs failed: ") + strerror(-rc);
        return rc;
    }
    std::vector<Device> devs;
    std::string bad;
    if (select_devices(ifaces, params.socket_ifname, params.socket_family, &devs, &bad) != 0) {
        *why = "bad interface selection: " + bad;
        return -EINVAL;
    }
    if (devs.empty()) {
        *why = "no network interface matches VIGIL_SOCKET_IFNAME=\"" + params.socket_ifname + "\"";
        return -EINVAL;
    }
    std::unique_ptr<TcpFabric> f(new TcpFabric);
    f->params_ = params;
    for (Device &d : devs) {
        read_sysfs(&d, static_cast<int>(params.speed_mbps));
        DeviceProps p;
        p.name = d.name;
        p.pci_path = d.pci_path;
        p.guid = d.guid;
        p.ptr_support = NCCL_PTR_HOST; // NCCL stages GPU buffers in host memory for us
        p.reg_is_global = false;
        p.force_flush = false;
        p.speed_mbps = d.speed_mbps;
        p.port = 0;
        p.latency_us = 0;
        p.max_comms = 65536;
        p.max_recvs = static_cast<int>(params.max_recvs);
        // NCCL chunks p2p/collective traffic at these sizes (the bounds NCCL's shims give v8
        // plugins, net_v8.cc:22-45).
        p.max_p2p_bytes = uint64_t{1} << 30;
        p.max_coll_bytes = uint64_t{512} << 20;
        p.numa_node = d.numa_node;
        const std::string addr = d.addr.to_string(); // port 0: keep the address alone
        p.address = addr.substr(0, addr.rfind(':'));
        f->props_.push_back(std::move(p));
    }
    f->devs_ = std::move(devs);
    *out = std::move(f);
    return 0;
}

int TcpFabric::listen(int dev, ListenHandle *handle, std::unique_ptr<Listener> *out)
{
    std::shared_ptr<rendezvous::Listening> l;
    std::shared_ptr<rendezvous::ListenHub> hub =
        hub_.get([this] { return accept_side(devs_, params_); });
    if (int rc = rendezvous::Listening::create(std::move(hub), dev, handle, &l); rc != 0) return rc;
    *out = std::make_unique<rendezvous::ListenComm>(std::move(l));
    return 0;
}

int TcpFabric::connect(const ConnectPlan &plan, const ListenHandle &handle, std::unique_ptr<Connector> *out)
{
    std::array<PathPlan, kMaxPaths> pp;
    for (int k = 0; k < kMaxPaths; ++k) {
        const size_t s = static_cast<size_t>(k);
        if (plan.local_dev[s] < 0 || plan.remote[s] < 0 ||
            static_cast<size_t>(plan.remote[s]) >= handle.addrs.size())
            continue;
        pp[s] = PathPlan{plan.local_dev[s], handle.addrs[static_cast<size_t>(plan.remote[s])]};
    }
    if (pp[kPrimary].local_dev < 0) return -EINVAL;
    auto side = std::make_shared<TcpConnectSide>(devs_, pp, params_);
    *out = std::make_unique<rendezvous::Connecting>(std::move(side), handle.nonce);
    return 0;
}

int TcpFabric::reg_mr(int dev, void * /*data*/, size_t size, int type, std::shared_ptr<FabricMr> *out)
{
    out->reset();
    if (type != NCCL_PTR_HOST) {
        VLOG_WARN("regMr of %zu bytes with type %d on dev %s: the tcp fabric supports host "
                  "memory only", size, type, props_[static_cast<size_t>(dev)].name.c_str());
        return -EINVAL;
    }
    return 0;
}

int TcpFabric::reg_mr_dmabuf(int dev, void * /*data*/, size_t size, int /*type*/, uint64_t /*offset*/,
                             int /*fd*/, std::shared_ptr<FabricMr> *out)
{
    out->reset();
    VLOG_WARN("regMrDmaBuf of %zu bytes on dev %s: the tcp fabric supports host memory only", size,
              props_[static_cast<size_t>(dev)].name.c_str());
    return -EOPNOTSUPP;
}

int TcpFabric::start_events(PortEventSink *sink)
{
    std::vector<std::string> names;
    for (const Device &d : devs_) names.push_back(d.name);
    return links_.start(names, [this, sink](int dev, bool up) {
        sink->port_changed(dev, up, "port " + devs_[static_cast<size_t>(dev)].name +
                                        (up ? " up" : " down") + " (netlink)");
    });
}

void TcpFabric::stop_events()
{
    links_.stop();
}

int make_fabric(const Params &params, std::unique_ptr<Fabric> *out, std::string *why)
{
    return TcpFabric::open(params, out, why);
}

} // namespace vigil::net::tcp
