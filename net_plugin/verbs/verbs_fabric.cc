// SPDX-License-Identifier: Apache-2.0
// The verbs fabric provider: devices from the port registry, listen/connect, registration,
// port events.
#include "verbs_fabric.h"

#include <cerrno>
#include <cstring>
#include <sys/socket.h>

#include "../sockets/interfaces.h"
#include "clock.h"
#include "gid.h"
#include "hw_counters.h"
#include "log.h"
#include "names.h"
#include "nccl_abi/net_common.h"
#include "telemetry/registry.h"
#include "verbs_setup.h"

namespace vigil::net::verbs_fabric {

VerbsFabric::~VerbsFabric()
{
    stop_events();
    // Protection domains before their devices: ibv_dealloc_pd on a closed context fails and
    // leaves the PD behind.
    hca_of_.clear();
    hcas_.clear();
    registry_.close();
}

int VerbsFabric::open(const Params &params, std::unique_ptr<VerbsFabric> *out, std::string *why)
{
    ib::DiscoveryConfig cfg;
    cfg.hca = params.ib_hca;
    if (!ib::GidPolicy::parse(static_cast<int>(params.ib_gid_index), params.ib_addr_family, params.ib_addr_range,
                              static_cast<int>(params.ib_roce_version_num), &cfg.gid, why))
        return -EINVAL;
    std::unique_ptr<VerbsFabric> f(new VerbsFabric);
    f->params_ = params;
    VerbsFabric *self = f.get();
    const int n = f->registry_.open(cfg, [self](const ib::PortEvent &ev) { self->on_event(ev); }, why);
    if (n < 0) return n;
    if (n == 0) {
        *why = "no active RDMA port matches VIGIL_IB_HCA=\"" + params.ib_hca + "\"";
        return -ENODEV;
    }
    // The set-up sockets need an address per device: the IPv4 of its RoCE GID, else the
    // host's first selected interface (InfiniBand ports have no IP of their own).
    Endpoint fallback;
    {
        std::vector<IfaceInfo> ifaces;
        std::vector<Device> devs;
        std::string bad;
        if (list_interfaces(&ifaces) == 0 &&
            select_devices(ifaces, params.socket_ifname, params.socket_family, &devs, &bad) == 0 && !devs.empty())
            fallback = devs[0].addr;
    }
    for (int d = 0; d < n; ++d) {
        const ib::PortProps p = f->registry_.props(d);
        DeviceProps dp;
        dp.name = p.name;
        dp.pci_path = p.pci_path;
        dp.guid = p.guid;
        dp.ptr_support = p.ptr_support;
        dp.reg_is_global = p.reg_is_global;
        dp.force_flush = false;
        dp.speed_mbps = p.speed_mbps > 0 ? p.speed_mbps : 10000;
        dp.port = p.port;
        dp.latency_us = p.latency_us;
        dp.max_comms = p.max_qp > 0 ? p.max_qp : 65536;
        dp.max_recvs = std::min<int>(p.max_recvs, static_cast<int>(params.max_recvs));
        // Messages stay below test()'s int sizes: NCCL chunks at these bounds.
        dp.max_p2p_bytes = uint64_t{1} << 30;
        dp.max_coll_bytes = uint64_t{512} << 20;
        dp.numa_node = p.numa_node;
        dp.address = p.gid_index >= 0 ? verbs::gid_to_string(p.gid) : "no GID";
        if (p.pci_path.empty())
            VLOG_INFO(NCCL_INIT | NCCL_NET, "dev %s: no PCI path (%s); NCCL places it next to CPU 0",
                      p.name.c_str(), p.pci_path_why.c_str());
        if (p.speed_mbps <= 0)
            VLOG_INFO(NCCL_INIT | NCCL_NET, "dev %s: the port does not say its speed; reporting 10000 Mb/s",
                      p.name.c_str());
        Endpoint boot = fallback;
        if (p.gid_index >= 0 && ib::gid_is_ipv4(p.gid)) {
            boot = Endpoint{};
            boot.family = AF_INET;
            std::memcpy(boot.addr.data(), p.gid + 12, 4);
        }
        if (boot.family == 0) {
            *why = "dev " + p.name + " has no IPv4 RoCE GID and no interface selected by VIGIL_SOCKET_IFNAME for "
                   "its set-up socket";
            return -EINVAL;
        }
        // One Hca (PD, registration cache) per open device, shared by its ports.
        const verbs::Context *ctx = &f->registry_.context(d);
        Hca *hca = nullptr;
        for (auto &h : f->hcas_)
            if (&h->ctx() == ctx) hca = h.get();
        if (hca == nullptr) {
            auto h = std::make_unique<Hca>();
            if (int rc = h->open(ctx, p.device); rc != 0) {
                *why = "dev " + p.device + ": cannot allocate a protection domain: " + strerror(-rc);
                return rc;
            }
            hca = h.get();
            f->hcas_.push_back(std::move(h));
        }
        f->hca_of_.push_back(hca);
        f->props_.push_back(std::move(dp));
        f->boot_.push_back(boot);
    }
    *out = std::move(f);
    return 0;
}

PortInfo VerbsFabric::port_info(int dev) const
{
    const ib::PortProps p = registry_.props(dev);
    PortInfo pi;
    pi.hca = hca_of_[static_cast<size_t>(dev)];
    pi.port = static_cast<uint8_t>(p.port);
    pi.gid_index = p.gid_index < 0 ? 0 : p.gid_index;
    std::memcpy(pi.gid.data(), p.gid, 16);
    pi.lid = p.lid;
    pi.active_mtu = p.active_mtu > 0 ? p.active_mtu : IBV_MTU_1024;
    pi.infiniband = p.infiniband;
    return pi;
}

QpConfig VerbsFabric::qp_config(int tc) const
{
    QpConfig c;
    c.nqps = static_cast<int>(params_.ib_qps_per_conn);
    c.timeout = static_cast<uint8_t>(params_.ib_timeout);
    c.retry_cnt = static_cast<uint8_t>(params_.ib_retry_cnt);
    c.sl = static_cast<uint8_t>(params_.ib_sl < 0 ? 0 : params_.ib_sl);
    c.traffic_class = static_cast<uint8_t>(params_.ib_tc >= 0 ? params_.ib_tc : (tc >= 0 ? tc : 0));
    return c;
}

uint64_t VerbsFabric::connect_timeout_ns() const
{
    return static_cast<uint64_t>(params_.connect_timeout_ms) * 1'000'000ull;
}

uint64_t VerbsFabric::handshake_timeout_ns() const
{
    return static_cast<uint64_t>(params_.handshake_timeout_ms) * 1'000'000ull;
}

int VerbsFabric::listen(int dev, ListenHandle *handle, std::unique_ptr<Listener> *out)
{
    std::shared_ptr<rendezvous::Listening> l;
    std::shared_ptr<rendezvous::ListenHub> hub =
        hub_.get([this] { return verbs_fabric::accept_side(*this); });
    if (int rc = rendezvous::Listening::create(std::move(hub), dev, handle, &l); rc != 0) return rc;
    *out = std::make_unique<rendezvous::ListenComm>(std::move(l));
    return 0;
}

int VerbsFabric::connect(const ConnectPlan &plan, const ListenHandle &handle, std::unique_ptr<Connector> *out)
{
    std::array<VerbsPlan, kMaxPaths> vp;
    for (int k = 0; k < kMaxPaths; ++k) {
        const size_t s = static_cast<size_t>(k);
        if (plan.local_dev[s] < 0 || plan.remote[s] < 0 || static_cast<size_t>(plan.remote[s]) >= handle.addrs.size())
            continue;
        vp[s].local_dev = plan.local_dev[s];
        vp[s].remote = handle.addrs[static_cast<size_t>(plan.remote[s])];
        vp[s].peer_dev = handle.addr_devs[static_cast<size_t>(plan.remote[s])];
        vp[s].traffic_class = plan.traffic_class;
    }
    if (vp[kPrimary].local_dev < 0) return -EINVAL;
    auto side = std::make_shared<VerbsConnectSide>(*this, vp);
    *out = std::make_unique<rendezvous::Connecting>(std::move(side), handle.nonce);
    return 0;
}

int VerbsFabric::reg_mr(int dev, void *data, size_t size, int type, std::shared_ptr<FabricMr> *out)
{
    out->reset();
    const DeviceProps &d = props_[static_cast<size_t>(dev)];
    if (type != NCCL_PTR_HOST && !(type == NCCL_PTR_CUDA && (d.ptr_support & NCCL_PTR_CUDA) != 0)) {
        VLOG_WARN("regMr of %zu bytes with type %d on dev %s: this port supports pointer types 0x%x only", size,
                  type, d.name.c_str(), d.ptr_support);
        return -EINVAL;
    }
    if (int rc = hca(dev).reg(data, size, out); rc != 0) {
        VLOG_WARN("regMr of %zu bytes at %p on dev %s failed: %s", size, data, d.name.c_str(), strerror(-rc));
        return rc;
    }
    return 0;
}

int VerbsFabric::reg_mr_dmabuf(int dev, void *data, size_t size, int /*type*/, uint64_t offset, int fd,
                               std::shared_ptr<FabricMr> *out)
{
    out->reset();
    const DeviceProps &d = props_[static_cast<size_t>(dev)];
    if ((d.ptr_support & NCCL_PTR_DMABUF) == 0) {
        VLOG_WARN("regMrDmaBuf of %zu bytes on dev %s: the port does not support DMA-BUF", size, d.name.c_str());
        return -EOPNOTSUPP;
    }
    if (int rc = hca(dev).reg_dmabuf(data, size, offset, fd, out); rc != 0) {
        VLOG_WARN("regMrDmaBuf of %zu bytes on dev %s failed: %s", size, d.name.c_str(), strerror(-rc));
        return rc;
    }
    return 0;
}

int VerbsFabric::start_events(PortEventSink *sink)
{
    sink_.store(sink, std::memory_order_release);
    // The ports' hardware counters, next to the paths' windows, when telemetry is on.
    if (telemetry::Registry::instance().is_open() && !sampler_.joinable()) {
        sampler_stop_ = false;
        sampler_ = std::thread([this] { sample_counters(); });
    }
    return 0;
}

void VerbsFabric::stop_events()
{
    sink_.store(nullptr, std::memory_order_release);
    if (sampler_.joinable()) {
        {
            std::lock_guard<std::mutex> g(sampler_mu_);
            sampler_stop_ = true;
        }
        sampler_cv_.notify_all();
        sampler_.join();
    }
}

void VerbsFabric::sample_counters()
{
    struct Port {
        ib::HwCounterReader reader;
        telemetry::PortCounterEntry *entry = nullptr;
    };
    std::vector<Port> ports;
    for (size_t d = 0; d < props_.size(); ++d) {
        Port p;
        const ib::PortProps pp = registry_.props(static_cast<int>(d));
        if (p.reader.open(pp.device, pp.port) != 0) {
            VLOG_INFO(NCCL_NET, "dev %s: no hardware counters to sample", props_[d].name.c_str());
            continue;
        }
        p.entry = telemetry::Registry::instance().port(props_[d].name);
        if (p.entry != nullptr) ports.push_back(std::move(p));
    }
    std::unique_lock<std::mutex> lock(sampler_mu_);
    while (!ports.empty() && !sampler_stop_) {
        lock.unlock();
        for (Port &p : ports) {
            const ib::PortCounters c = p.reader.read_summary();
            telemetry::PortCounters v;
            v.sampled_ns = now_ns();
            v.retransmits = c.retransmits;
            v.seq_errors = c.seq_errors;
            v.out_of_sequence = c.out_of_sequence;
            v.duplicate_requests = c.duplicate_requests;
            v.rnr_naks = c.rnr_naks;
            v.retry_exceeded = c.retry_exceeded;
            v.link_downed = c.link_downed;
            v.tx_packets = c.tx_packets;
            v.rx_packets = c.rx_packets;
            telemetry::write_port(*p.entry, v);
        }
        lock.lock();
        sampler_cv_.wait_for(lock, std::chrono::milliseconds(kCounterIntervalMs), [this] { return sampler_stop_; });
    }
}

void VerbsFabric::on_event(const ib::PortEvent &ev)
{
    PortEventSink *sink = sink_.load(std::memory_order_acquire);
    const char *what = verbs::event_type_name(ev.event.type);
    switch (ev.event.type) {
    case IBV_EVENT_PORT_ERR:
        if (sink != nullptr && ev.dev >= 0)
            sink->port_changed(ev.dev, false, "port " + props_[static_cast<size_t>(ev.dev)].name + " down (" + what + ")");
        return;
    case IBV_EVENT_PORT_ACTIVE:
        if (sink != nullptr && ev.dev >= 0)
            sink->port_changed(ev.dev, true, "port " + props_[static_cast<size_t>(ev.dev)].name + " up (" + what + ")");
        return;
    case IBV_EVENT_DEVICE_FATAL:
        VLOG_WARN("dev %s: %s: every port of the device is lost", ev.device.c_str(), what);
        if (sink != nullptr)
            for (size_t d = 0; d < hca_of_.size(); ++d)
                if (hca_of_[d]->name() == ev.device)
                    sink->port_changed(static_cast<int>(d), false, "device " + ev.device + " fatal (" + what + ")");
        return;
    case IBV_EVENT_GID_CHANGE:
        if (ev.dev >= 0)
            VLOG_INFO(NCCL_NET, "dev %s: %s: GID index %d -> %d; new paths use the new one",
                      props_[static_cast<size_t>(ev.dev)].name.c_str(), what, ev.old_gid_index, ev.new_gid_index);
        return;
    default:
        if (ev.dev >= 0 && ev.old_speed_mbps != ev.new_speed_mbps)
            VLOG_INFO(NCCL_NET, "dev %s: %s: speed %d -> %d Mb/s", props_[static_cast<size_t>(ev.dev)].name.c_str(),
                      what, ev.old_speed_mbps, ev.new_speed_mbps);
        return;
    }
}

int make_fabric(const Params &params, std::unique_ptr<Fabric> *out, std::string *why)
{
    std::unique_ptr<VerbsFabric> f;
    const int rc = VerbsFabric::open(params, &f, why);
    if (rc == 0) *out = std::move(f);
    return rc;
}

} // namespace vigil::net::verbs_fabric
