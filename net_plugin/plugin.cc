// SPDX-License-Identifier: Apache-2.0
// Net plugin core: global state (refcounted), devices, and the entry points.
#include "plugin.h"

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "comm.h"
#include "log.h"
#include "nccl_abi/net_common.h"
#include "progress.h"
#include "tcp/link_monitor.h"
#include "telemetry/writer.h"
#include "tcp/tcp_setup.h"

namespace vigil::net {
namespace {

struct Global {
    std::mutex mu;
    int refs = 0;
    bool discovered = false;
    Params params;
    std::vector<Device> devices;
    std::set<NetContext *> contexts;
    std::map<uint64_t, std::unique_ptr<tcp::TcpConnector>> connectors;
    // VIGIL_BACKUP: per primary device, its backup candidates (nearest first) and a
    // round-robin cursor; or, for fixed pairs, exactly one candidate.
    std::vector<std::vector<int>> backup_candidates;
    std::vector<size_t> backup_next;
    // Live comms, for port events. Own lock: the link monitor calls in from the engine thread.
    std::mutex comms_mu;
    std::set<SendComm *> send_comms;
    std::set<RecvComm *> recv_comms;
    tcp::LinkMonitor links;
};

/// VIGIL_INJECT_FAIL: break the active path on one device after a count of messages or
/// bytes, once per process. `armed` is the only thing the data path reads when it is off.
struct Injector {
    std::atomic<bool> armed{false};
    int dev = -1;
    bool by_bytes = false;
    uint64_t limit = 0;
    std::atomic<uint64_t> count{0};
};
Injector g_inject;

Global &g()
{
    // Never destroyed: NCCL may call into the plugin from its own atexit paths.
    static Global *global = new Global;
    return *global;
}

struct ListenComm {
    std::shared_ptr<tcp::TcpListener> listener; // shared with the RecvComm it produces
};

/// Registered memory. TCP needs no registration; the handle records what NCCL registered so
/// misuse (device memory) is caught once, at registration.
struct Mr {
    void *base;
    size_t size;
};

// connect() keeps its retry state in the handle's scratch area: a cookie and an id into
// g().connectors. The listener writes zeros there; an id we do not know starts afresh.
constexpr uint32_t kScratchCookie = 0x53474c56; // "VLGS"

int common_prefix(const std::string &a, const std::string &b)
{
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return static_cast<int>(n);
}

// Builds the backup candidates of every device from VIGIL_BACKUP. Returns false after a WARN
// on a bad value.
bool plan_backups(Global &st)
{
    const std::string &spec = st.params.backup;
    const size_t n = st.devices.size();
    st.backup_candidates.assign(n, {});
    st.backup_next.assign(n, 0);
    if (spec == "off") return true;
    if (spec == "spread") {
        for (size_t d = 0; d < n; ++d) {
            std::vector<int> c;
            for (size_t o = 0; o < n; ++o)
                if (o != d) c.push_back(static_cast<int>(o));
            // Nearest first: same NUMA node, then the longest shared PCI path (same switch).
            const Device &me = st.devices[d];
            std::stable_sort(c.begin(), c.end(), [&](int a, int b) {
                const Device &x = st.devices[static_cast<size_t>(a)], &y = st.devices[static_cast<size_t>(b)];
                const bool xn = x.numa_node == me.numa_node, yn = y.numa_node == me.numa_node;
                if (xn != yn) return xn;
                return common_prefix(x.pci_path, me.pci_path) > common_prefix(y.pci_path, me.pci_path);
            });
            st.backup_candidates[d] = std::move(c);
        }
        return true;
    }
    auto index_of = [&](std::string_view name) {
        for (size_t i = 0; i < n; ++i)
            if (st.devices[i].name == name) return static_cast<int>(i);
        return -1;
    };
    std::string_view rest = spec;
    while (!rest.empty()) {
        size_t comma = rest.find(',');
        std::string_view pair = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        size_t colon = pair.find(':');
        int a = colon == std::string_view::npos ? -1 : index_of(pair.substr(0, colon));
        int b = colon == std::string_view::npos ? -1 : index_of(pair.substr(colon + 1));
        if (a < 0 || b < 0 || a == b) {
            VLOG_WARN("bad VIGIL_BACKUP entry \"%.*s\": expected spread, off, or pairs "
                      "DEV:BACKUPDEV of two different selected devices",
                      static_cast<int>(pair.size()), pair.data());
            return false;
        }
        st.backup_candidates[static_cast<size_t>(a)] = {b};
    }
    return true;
}

// Parses VIGIL_INJECT_FAIL ("eth0:msgs=100", "eth1:bytes=1G"). Returns false after a WARN.
bool arm_injector(const Global &st)
{
    const std::string &spec = st.params.inject_fail;
    if (spec.empty()) return true;
    const size_t colon = spec.find(':'), eq = spec.find('=');
    int dev = -1;
    for (size_t i = 0; i < st.devices.size(); ++i)
        if (colon != std::string::npos && st.devices[i].name == spec.substr(0, colon)) dev = static_cast<int>(i);
    const std::string what = colon == std::string::npos || eq == std::string::npos
                                 ? "" : spec.substr(colon + 1, eq - colon - 1);
    ParamSpec count{"VIGIL_INJECT_FAIL", ParamType::Bytes, "", 1, INT64_MAX, ""};
    int64_t limit = 0;
    if (dev < 0 || (what != "msgs" && what != "bytes") ||
        !parse_number(count, std::string_view(spec).substr(eq + 1), &limit).empty()) {
        VLOG_WARN("bad VIGIL_INJECT_FAIL \"%s\": expected DEV:msgs=N or DEV:bytes=N with DEV "
                  "one of the selected devices", spec.c_str());
        return false;
    }
    g_inject.dev = dev;
    g_inject.by_bytes = what == "bytes";
    g_inject.limit = static_cast<uint64_t>(limit);
    g_inject.armed.store(true);
    VLOG_INFO(NCCL_INIT | NCCL_NET, "fault injection armed: dev %s fails after %llu %s",
              st.devices[static_cast<size_t>(dev)].name.c_str(),
              static_cast<unsigned long long>(limit), what.c_str());
    return true;
}

int discover_locked(Global &st)
{
    ParamLoad load = load_params(environment_source());
    if (!report_params(load)) return -EINVAL;
    st.params = load.values;
    std::vector<IfaceInfo> ifaces;
    if (int rc = list_interfaces(&ifaces); rc != 0) {
        VLOG_WARN("getifaddrs failed: %s", strerror(-rc));
        return rc;
    }
    std::string why;
    std::vector<Device> devs;
    if (select_devices(ifaces, st.params.socket_ifname, st.params.socket_family, &devs, &why) != 0) {
        VLOG_WARN("bad interface selection: %s", why.c_str());
        return -EINVAL;
    }
    if (devs.empty()) {
        VLOG_WARN("no network interface matches VIGIL_SOCKET_IFNAME=\"%s\"",
                  st.params.socket_ifname.c_str());
        return -EINVAL;
    }
    for (Device &d : devs) read_sysfs(&d, static_cast<int>(st.params.speed_mbps));
    st.devices = std::move(devs);
    if (!plan_backups(st) || !arm_injector(st)) return -EINVAL;
    return 0;
}

// Port events from the link monitor (engine thread): every comm leaves paths on a dead port.
void on_link_change(int dev, bool up)
{
    Global &st = g();
    if (up) {
        std::lock_guard<std::mutex> lock(st.comms_mu);
        for (SendComm *c : st.send_comms) c->port_up(dev);
        return;
    }
    const std::string cause = "port " + st.devices[static_cast<size_t>(dev)].name + " down (netlink)";
    std::lock_guard<std::mutex> lock(st.comms_mu);
    for (SendComm *c : st.send_comms) c->port_down(dev, cause);
    for (RecvComm *c : st.recv_comms) c->port_down(dev, cause);
}

} // namespace

int plugin_init(ncclDebugLogger_t logger, int api_version)
{
    if (logger != nullptr) log::set_logger(logger);
    Global &st = g();
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.refs > 0) {
        ++st.refs;
        return 0;
    }
    if (!st.discovered) {
        if (int rc = discover_locked(st); rc != 0) return rc;
        st.discovered = true;
    }
    // Telemetry first: a bad VIGIL_TELEMETRY_DIR fails init before any thread starts.
    if (st.params.telemetry) {
        const uint64_t window_ns = static_cast<uint64_t>(st.params.window_us) * 1000ull;
        if (int rc = telemetry::Registry::instance().open(window_ns, -1); rc != 0)
            VLOG_WARN("telemetry registry unavailable (%s); running without telemetry", strerror(-rc));
        else
            VLOG_INFO(NCCL_INIT, "telemetry: %llu us windows in %s",
                      static_cast<unsigned long long>(st.params.window_us),
                      telemetry::Registry::instance().path().c_str());
        if (!st.params.telemetry_dir.empty() && telemetry::Registry::instance().is_open()) {
            if (int rc = telemetry::start_writer(st.params.telemetry_dir,
                                                 static_cast<uint64_t>(st.params.telemetry_max_bytes));
                rc != 0) {
                VLOG_WARN("bad VIGIL_TELEMETRY_DIR=\"%s\": %s", st.params.telemetry_dir.c_str(),
                          strerror(-rc));
                return -EINVAL;
            }
        }
    }
    if (int rc = ProgressEngine::instance().start(); rc != 0) {
        VLOG_WARN("cannot start the progress thread: %s", strerror(-rc));
        telemetry::stop_writer();
        return rc;
    }
    std::vector<std::string> names;
    for (const Device &d : st.devices) names.push_back(d.name);
    if (int rc = st.links.start(names, on_link_change); rc != 0)
        VLOG_WARN("no link monitor (%s): port failures are found by the data path and the stall "
                  "watchdog only", strerror(-rc));
    ++st.refs;
    std::string devs;
    for (size_t i = 0; i < st.devices.size(); ++i) {
        const Device &d = st.devices[i];
        const std::string addr = d.addr.to_string(); // port 0: print the address alone
        devs += " [" + std::to_string(i) + "] " + d.name + " " + addr.substr(0, addr.rfind(':')) + " " +
                std::to_string(d.speed_mbps) + "Mb/s" + (d.pci_path.empty() ? " virtual" : "");
    }
    VLOG_INFO(NCCL_INIT | NCCL_NET, "vigil %s loaded, ncclNet v%d, fabric tcp, %zu devices:%s; "
              "backups %s", kPluginVersion, api_version, st.devices.size(), devs.c_str(),
              st.params.backup.c_str());
    return 0;
}

void plugin_finalize()
{
    Global &st = g();
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.refs == 0) return;
    if (--st.refs > 0) return;
    st.connectors.clear();
    st.links.stop();
    telemetry::stop_writer();
    ProgressEngine::instance().stop();
}

NetContext *make_context(uint64_t comm_id, int traffic_class, ncclDebugLogger_t logger,
                         int api_version, int *rc)
{
    *rc = plugin_init(logger, api_version);
    if (*rc != 0) return nullptr;
    auto *ctx = new NetContext{comm_id, traffic_class};
    std::lock_guard<std::mutex> lock(g().mu);
    g().contexts.insert(ctx);
    return ctx;
}

void drop_context(void *ctx)
{
    {
        std::lock_guard<std::mutex> lock(g().mu);
        auto it = g().contexts.find(static_cast<NetContext *>(ctx));
        if (it == g().contexts.end()) return; // never ours, or init failed: nothing to undo
        g().contexts.erase(it);
    }
    delete static_cast<NetContext *>(ctx);
    plugin_finalize();
}

int device_count()
{
    std::lock_guard<std::mutex> lock(g().mu);
    return static_cast<int>(g().devices.size());
}

const Device *device(int dev)
{
    std::lock_guard<std::mutex> lock(g().mu);
    if (dev < 0 || static_cast<size_t>(dev) >= g().devices.size()) return nullptr;
    return &g().devices[static_cast<size_t>(dev)];
}

const Params &params()
{
    return g().params;
}

int listen(int dev, void *handle, void **listen_comm)
{
    *listen_comm = nullptr;
    const Device *d = device(dev);
    if (d == nullptr || handle == nullptr) {
        VLOG_WARN("listen on dev %d: %s", dev, d == nullptr ? "no such device" : "NULL handle");
        return -EINVAL;
    }
    ListenHandle h;
    auto lc = std::make_unique<ListenComm>();
    if (int rc = tcp::TcpListener::create(g().devices, dev, params(), &h, &lc->listener); rc != 0)
        return rc;
    if (int rc = h.encode(static_cast<uint8_t *>(handle)); rc != 0) return rc;
    *listen_comm = lc.release();
    return 0;
}

int connect(int dev, void *handle, void **send_comm)
{
    *send_comm = nullptr;
    const Device *d = device(dev);
    if (d == nullptr || handle == nullptr) {
        VLOG_WARN("connect from dev %d: %s", dev, d == nullptr ? "no such device" : "NULL handle");
        return -EINVAL;
    }
    auto *bytes = static_cast<uint8_t *>(handle);
    uint8_t *scratch = bytes + ListenHandle::kScratchOffset;
    uint32_t cookie;
    uint64_t id;
    std::memcpy(&cookie, scratch, sizeof(cookie));
    std::memcpy(&id, scratch + 4, sizeof(id));
    tcp::TcpConnector *c = nullptr;
    {
        std::lock_guard<std::mutex> lock(g().mu);
        auto it = cookie == kScratchCookie ? g().connectors.find(id) : g().connectors.end();
        if (it != g().connectors.end()) c = it->second.get();
    }
    if (c == nullptr) {
        ListenHandle h;
        std::string why;
        if (int rc = ListenHandle::decode(bytes, &h, &why); rc != 0) {
            VLOG_WARN("connect on dev %s: malformed handle: %s", d->name.c_str(), why.c_str());
            return -EINVAL;
        }
        std::array<tcp::PathPlan, kMaxPaths> plan;
        plan[kPrimary] = {dev, h.addrs[0]};
        {
            // Backup: the next candidate device in turn, to the listener's address on the same
            // device index (rail-aligned), else on any of its other devices.
            std::lock_guard<std::mutex> lock(g().mu);
            const auto &cands = g().backup_candidates[static_cast<size_t>(dev)];
            if (!cands.empty() && h.addrs.size() > 1) {
                const int b = cands[g().backup_next[static_cast<size_t>(dev)]++ % cands.size()];
                size_t pick = 0;
                for (size_t i = 1; i < h.addrs.size(); ++i)
                    if (h.addr_devs[i] == b || (pick == 0 && h.addr_devs[i] != h.addr_devs[0]))
                        pick = h.addr_devs[i] == b || pick == 0 ? i : pick;
                if (pick != 0) plan[kBackup] = {b, h.addrs[pick]};
            }
        }
        auto owned = std::make_unique<tcp::TcpConnector>(g().devices, plan, h, params());
        c = owned.get();
        do random_bytes(&id, sizeof(id));
        while (id == 0);
        std::lock_guard<std::mutex> lock(g().mu);
        g().connectors.emplace(id, std::move(owned));
        cookie = kScratchCookie;
        std::memcpy(scratch, &cookie, sizeof(cookie));
        std::memcpy(scratch + 4, &id, sizeof(id));
    }
    std::unique_ptr<SendComm> comm;
    int rc = c->progress(&comm);
    if (rc != 0 || comm) {
        std::lock_guard<std::mutex> lock(g().mu);
        g().connectors.erase(id);
        std::memset(scratch, 0, ListenHandle::kScratchSize);
    }
    if (rc != 0) return rc;
    if (comm) {
        std::lock_guard<std::mutex> lock(g().comms_mu);
        g().send_comms.insert(comm.get());
    }
    *send_comm = comm.release();
    return 0;
}

int accept(void *listen_comm, void **recv_comm)
{
    *recv_comm = nullptr;
    auto *lc = static_cast<ListenComm *>(listen_comm);
    std::unique_ptr<RecvComm> comm;
    if (int rc = lc->listener->accept(&comm); rc != 0) return rc;
    if (comm) {
        std::lock_guard<std::mutex> lock(g().comms_mu);
        g().recv_comms.insert(comm.get());
    }
    *recv_comm = comm.release();
    return 0;
}

int reg_mr(void * /*comm*/, void *data, size_t size, int type, void **mhandle)
{
    *mhandle = nullptr;
    if (type != NCCL_PTR_HOST) {
        VLOG_WARN("regMr of %zu bytes with type %d: the tcp fabric supports host memory only",
                  size, type);
        return -EINVAL;
    }
    *mhandle = new Mr{data, size};
    return 0;
}

int dereg_mr(void * /*comm*/, void *mhandle)
{
    delete static_cast<Mr *>(mhandle);
    return 0;
}

void set_profiler_callback(ncclProfilerCallback_t cb)
{
    if (cb != nullptr) SendComm::set_profiler(cb);
}

int isend(void *send_comm, void *data, size_t size, int tag, void * /*mhandle*/, void **request,
          void *phandle)
{
    auto *c = static_cast<SendComm *>(send_comm);
    Request *r = nullptr;
    int rc = c->isend(data, size, tag, &r, phandle);
    *request = r;
    if (g_inject.armed.load(std::memory_order_relaxed) && r != nullptr &&
        c->active_dev() == g_inject.dev) {
        const uint64_t n = g_inject.count.fetch_add(g_inject.by_bytes ? size : 1) +
                           (g_inject.by_bytes ? size : 1);
        if (n >= g_inject.limit && g_inject.armed.exchange(false)) {
            VLOG_WARN("fault injection: failing dev %s now (after %llu %s)",
                      g().devices[static_cast<size_t>(g_inject.dev)].name.c_str(),
                      static_cast<unsigned long long>(n), g_inject.by_bytes ? "bytes" : "messages");
            c->fail_path(kPrimary, "injected failure (VIGIL_INJECT_FAIL)", true);
        }
    }
    return rc;
}

int irecv(void *recv_comm, int n, void **data, const size_t *sizes, const int *tags,
          void ** /*mhandles*/, void **request)
{
    Request *r = nullptr;
    int rc = static_cast<RecvComm *>(recv_comm)->irecv(n, data, sizes, tags, &r);
    *request = r;
    return rc;
}

int iflush(void * /*recv_comm*/, int /*n*/, void ** /*data*/, int * /*sizes*/,
           void ** /*mhandles*/, void **request)
{
    // Host memory only: received data is already visible; NULL tells NCCL there is nothing
    // to wait for (transport/net.cc:1577-1579).
    *request = nullptr;
    return 0;
}

int test(void *request, int *done, int *sizes)
{
    auto *r = static_cast<Request *>(request);
    return r->comm->test(r, done, sizes);
}

int close_send(void *send_comm)
{
    auto *c = static_cast<SendComm *>(send_comm);
    if (c == nullptr) return 0;
    {
        std::lock_guard<std::mutex> lock(g().comms_mu);
        g().send_comms.erase(c);
    }
    c->detach();
    delete c;
    return 0;
}

int close_recv(void *recv_comm)
{
    auto *c = static_cast<RecvComm *>(recv_comm);
    if (c == nullptr) return 0;
    {
        std::lock_guard<std::mutex> lock(g().comms_mu);
        g().recv_comms.erase(c);
    }
    c->detach();
    delete c;
    return 0;
}

int close_listen(void *listen_comm)
{
    delete static_cast<ListenComm *>(listen_comm);
    return 0;
}

bool abort_on_error()
{
    return g().params.abort_on_error;
}

} // namespace vigil::net
