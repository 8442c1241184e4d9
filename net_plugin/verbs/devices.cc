// SPDX-License-Identifier: Apache-2.0
// Discovery of the verbs fabric's NCCL devices and their live state.
#include "devices.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"
#include "names.h"
#include "verbs_config.h"

namespace vigil::net::ib {

bool device_name_less(const std::string &a, const std::string &b) noexcept
{
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        const bool da = a[i] >= '0' && a[i] <= '9', db = b[j] >= '0' && b[j] <= '9';
        if (da && db) {
            size_t ie = i, je = j;
            while (ie < a.size() && a[ie] >= '0' && a[ie] <= '9') ++ie;
            while (je < b.size() && b[je] >= '0' && b[je] <= '9') ++je;
            // Compare the numbers by length without leading zeros, then digit by digit.
            size_t is = i, js = j;
            while (is + 1 < ie && a[is] == '0') ++is;
            while (js + 1 < je && b[js] == '0') ++js;
            if (ie - is != je - js) return ie - is < je - js;
            const int c = a.compare(is, ie - is, b, js, je - js);
            if (c != 0) return c < 0;
            i = ie, j = je;
        } else {
            if (a[i] != b[j]) return a[i] < b[j];
            ++i, ++j;
        }
    }
    return a.size() - i < b.size() - j;
}

PortRegistry::~PortRegistry()
{
    close();
}

void PortRegistry::close() noexcept
{
    for (auto &h : hcas_) h->events.stop();
    std::lock_guard lock(mu_);
    ports_.clear();
    hcas_.clear();
}

namespace {

// The device accepts DMA-BUF registration: the probe NCCL uses (a registration of fd -1 fails
// with EBADF-like errors when the verb exists, EOPNOTSUPP/EPROTONOSUPPORT when it does not).
bool probe_dmabuf(const verbs::Context &ctx)
{
    if (verbs::lib().reg_dmabuf_mr == nullptr) return false; // rdma-core older than 34
    verbs::Pd pd;
    if (verbs::Pd::alloc(ctx, &pd) != 0) return false;
    errno = 0;
    ibv_mr *mr = verbs::lib().reg_dmabuf_mr(pd.get(), 0, 0, 0, -1, 0);
    const int err = errno;
    if (mr != nullptr) {
        verbs::lib().dereg_mr(mr);
        return true;
    }
    return err != EOPNOTSUPP && err != EPROTONOSUPPORT;
}

} // namespace

void PortRegistry::refresh(Port *p, bool gids)
{
    ibv_port_attr pa{};
    if (p->hca->ctx.query_port(static_cast<uint8_t>(p->props.port), &pa) != 0) return;
    PortProps &pp = p->props;
    pp.state = pa.state;
    pp.active_mtu = pa.active_mtu;
    pp.mtu_bytes = verbs::mtu_bytes(pa.active_mtu);
    pp.lid = pa.lid;
    pp.infiniband = pa.link_layer == IBV_LINK_LAYER_INFINIBAND;
    uint32_t speed = pa.active_speed;
#if VIGIL_HAVE_ACTIVE_SPEED_EX
    if (pa.active_speed_ex != 0) speed = pa.active_speed_ex;
#endif
    pp.width_lanes = width_lanes(pa.active_width);
    pp.lane_mbps = lane_mbps(speed);
    pp.speed_mbps = port_speed_mbps(pa.active_width, speed);
    if (!gids) return;
    std::vector<verbs::GidEntry> table;
    if (p->hca->ctx.query_gids(static_cast<uint8_t>(pp.port), pa.gid_tbl_len, &table) != 0)
        table.clear();
    const GidChoice c = choose_gid(table, pp.infiniband, gid_policy_);
    pp.gid_index = c.index;
    pp.gid_preferred = c.preferred;
    pp.gid_reason = c.reason;
    std::memset(pp.gid, 0, sizeof pp.gid);
    for (const verbs::GidEntry &e : table)
        if (static_cast<int>(e.index) == c.index) std::memcpy(pp.gid, e.raw, 16);
}

int PortRegistry::open(const DiscoveryConfig &config, Handler handler, std::string *why)
{
    close();
    HcaSelector sel;
    if (!HcaSelector::parse(config.hca, &sel, why)) {
        if (why) *why = "VIGIL_IB_HCA: " + *why;
        return -EINVAL;
    }
    gid_policy_ = config.gid;
    handler_ = std::move(handler);
    std::string lib_why;
    if (verbs::library(&lib_why) == nullptr) {
        if (why) *why = "no RDMA library (" + lib_why + ")";
        return -ENOSYS;
    }
    verbs::DeviceList list;
    if (int rc = verbs::DeviceList::get(&list); rc != 0) {
        if (why) *why = std::string("ibv_get_device_list: ") + strerror(-rc);
        return rc;
    }
    const PlatformCaps caps = detect_platform_caps();
    std::vector<Port> found;
    std::vector<std::unique_ptr<Hca>> hcas;
    for (int i = 0; i < list.size(); ++i) {
        auto hca = std::make_unique<Hca>();
        hca->name = list.name(i);
        bool any_selected = false;
        for (int port = 1; port <= 255; ++port)
            any_selected = any_selected || sel.matches(hca->name, port);
        if (!any_selected) continue;
        if (int rc = verbs::Context::open(list[i], &hca->ctx); rc != 0) {
            VLOG_WARN("dev %s: cannot open: %s", hca->name.c_str(), strerror(-rc));
            continue;
        }
        ibv_device_attr da{};
        if (int rc = hca->ctx.query_device(&da); rc != 0) {
            VLOG_WARN("dev %s: ibv_query_device: %s", hca->name.c_str(), strerror(-rc));
            continue;
        }
        const bool dmabuf = probe_dmabuf(hca->ctx);
        std::string pci, pci_why;
        pci_path(hca->name, &pci, &pci_why);
        for (int port = 1; port <= da.phys_port_cnt; ++port) {
            if (!sel.matches(hca->name, port)) continue;
            Port p;
            p.hca = hca.get();
            p.props.device = hca->name;
            p.props.port = port;
            p.props.name = hca->name + ":" + std::to_string(port);
            refresh(&p, true);
            if (p.props.state != IBV_PORT_ACTIVE) {
                VLOG_INFO(NCCL_INIT | NCCL_NET, "dev %s:%d: skipped, port state %s",
                          hca->name.c_str(), port, verbs::port_state_name(p.props.state));
                continue;
            }
            p.props.pci_path = pci;
            p.props.pci_path_why = pci_why;
            p.props.numa_node = numa_node(hca->name);
            p.props.guid = be64toh(da.node_guid);
            p.props.max_qp = da.max_qp;
            p.props.max_qp_wr = da.max_qp_wr;
            p.props.device_dmabuf = dmabuf;
            p.props.ptr_support = ptr_support(caps, dmabuf);
            found.push_back(std::move(p));
        }
        hcas.push_back(std::move(hca));
    }
    std::stable_sort(found.begin(), found.end(), [](const Port &a, const Port &b) {
        if (a.props.device != b.props.device)
            return device_name_less(a.props.device, b.props.device);
        return a.props.port < b.props.port;
    });
    {
        std::lock_guard lock(mu_);
        ports_ = std::move(found);
        hcas_.clear();
        for (auto &h : hcas) {
            for (size_t d = 0; d < ports_.size(); ++d)
                if (ports_[d].hca == h.get()) h->devs.push_back(static_cast<int>(d));
            if (!h->devs.empty()) hcas_.push_back(std::move(h));
        }
    }
    for (size_t d = 0; d < ports_.size(); ++d) {
        const PortProps &pp = ports_[d].props;
        VLOG_INFO(NCCL_INIT | NCCL_NET,
                  "dev %zu %s: %s, %d Mbit/s (%dx %d), mtu %d, gid %d %s, pci %s, numa %d", d,
                  pp.name.c_str(), pp.infiniband ? "InfiniBand" : "RoCE", pp.speed_mbps,
                  pp.width_lanes, pp.lane_mbps, pp.mtu_bytes, pp.gid_index, pp.gid_reason.c_str(),
                  pp.pci_path.empty() ? pp.pci_path_why.c_str() : pp.pci_path.c_str(),
                  pp.numa_node);
    }
    for (auto &h : hcas_) {
        Hca *raw = h.get();
        if (int rc = h->events.start(h->ctx.get(), h->name,
                                     [this, raw](const AsyncEvent &ev) { on_event(raw, ev); });
            rc != 0) {
            if (why) *why = "dev " + h->name + ": cannot start its event thread: " + strerror(-rc);
            close();
            return rc;
        }
    }
    return count();
}

void PortRegistry::on_event(Hca *hca, const AsyncEvent &ev)
{
    std::vector<PortEvent> out;
    {
        std::lock_guard lock(mu_);
        for (int d : hca->devs) {
            Port &p = ports_[static_cast<size_t>(d)];
            const bool fatal = ev.type == IBV_EVENT_DEVICE_FATAL;
            if (!fatal && (ev.port == 0 || ev.port != p.props.port)) continue;
            PortEvent pe;
            pe.dev = d;
            pe.device = hca->name;
            pe.event = ev;
            pe.old_state = p.props.state;
            pe.old_speed_mbps = p.props.speed_mbps;
            pe.old_gid_index = p.props.gid_index;
            pe.old_lid = p.props.lid;
            if (fatal) {
                p.props.state = IBV_PORT_DOWN;
            } else {
                // The GID table changes with addresses, and a port that comes back may have
                // been given new ones: re-choose on both.
                refresh(&p, ev.type == IBV_EVENT_GID_CHANGE || ev.type == IBV_EVENT_PORT_ACTIVE);
                // The event is newer than a query racing with it: trust it for the state.
                if (ev.type == IBV_EVENT_PORT_ERR) p.props.state = IBV_PORT_DOWN;
            }
            pe.new_state = p.props.state;
            pe.new_speed_mbps = p.props.speed_mbps;
            pe.new_gid_index = p.props.gid_index;
            pe.new_lid = p.props.lid;
            out.push_back(std::move(pe));
        }
        if (ev.port == 0 && ev.type != IBV_EVENT_DEVICE_FATAL) {
            PortEvent pe;
            pe.device = hca->name;
            pe.event = ev;
            out.push_back(std::move(pe));
        }
    }
    for (const PortEvent &pe : out) {
        if (pe.dev >= 0)
            VLOG_INFO(NCCL_NET,
                      "dev %s:%d: %s, state %s -> %s, speed %d -> %d Mbit/s, gid %d -> %d",
                      pe.device.c_str(), pe.event.port, verbs::event_type_name(pe.event.type),
                      verbs::port_state_name(pe.old_state), verbs::port_state_name(pe.new_state),
                      pe.old_speed_mbps, pe.new_speed_mbps, pe.old_gid_index, pe.new_gid_index);
        if (handler_) handler_(pe);
    }
}

PortProps PortRegistry::props(int dev) const
{
    std::lock_guard lock(mu_);
    return ports_.at(static_cast<size_t>(dev)).props;
}

bool PortRegistry::port_active(int dev) const
{
    std::lock_guard lock(mu_);
    return ports_.at(static_cast<size_t>(dev)).props.state == IBV_PORT_ACTIVE;
}

const verbs::Context &PortRegistry::context(int dev) const noexcept
{
    return ports_[static_cast<size_t>(dev)].hca->ctx;
}

} // namespace vigil::net::ib
