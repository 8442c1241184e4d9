// SPDX-License-Identifier: Apache-2.0
// Net plugin core: global state (refcounted), devices, and the entry points.
#include "plugin.h"

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "comm.h"
#include "log.h"
#include "nccl_abi/net_common.h"
#include "progress.h"
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
};

Global &g()
{
    // Never destroyed: NCCL may call into the plugin from its own atexit paths.
    static Global *global = new Global;
    return *global;
}

struct ListenComm {
    std::unique_ptr<tcp::TcpListener> listener;
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
    return 0;
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
    if (int rc = ProgressEngine::instance().start(); rc != 0) {
        VLOG_WARN("cannot start the progress thread: %s", strerror(-rc));
        return rc;
    }
    ++st.refs;
    std::string devs;
    for (size_t i = 0; i < st.devices.size(); ++i) {
        const Device &d = st.devices[i];
        const std::string addr = d.addr.to_string(); // port 0: print the address alone
        devs += " [" + std::to_string(i) + "] " + d.name + " " + addr.substr(0, addr.rfind(':')) + " " +
                std::to_string(d.speed_mbps) + "Mb/s" + (d.pci_path.empty() ? " virtual" : "");
    }
    VLOG_INFO(NCCL_INIT | NCCL_NET, "vigil %s loaded, ncclNet v%d, fabric tcp, %zu devices:%s",
              kPluginVersion, api_version, st.devices.size(), devs.c_str());
    return 0;
}

void plugin_finalize()
{
    Global &st = g();
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.refs == 0) return;
    if (--st.refs > 0) return;
    st.connectors.clear();
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
    if (int rc = tcp::TcpListener::create(*d, dev, params(), &h, &lc->listener); rc != 0) return rc;
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
        auto owned = std::make_unique<tcp::TcpConnector>(*d, h, params());
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
    *send_comm = comm.release();
    return 0;
}

int accept(void *listen_comm, void **recv_comm)
{
    *recv_comm = nullptr;
    auto *lc = static_cast<ListenComm *>(listen_comm);
    std::unique_ptr<RecvComm> comm;
    if (int rc = lc->listener->accept(&comm); rc != 0) return rc;
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

int isend(void *send_comm, void *data, size_t size, int tag, void * /*mhandle*/, void **request)
{
    Request *r = nullptr;
    int rc = static_cast<SendComm *>(send_comm)->isend(data, size, tag, &r);
    *request = r;
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
    c->detach();
    delete c;
    return 0;
}

int close_recv(void *recv_comm)
{
    auto *c = static_cast<RecvComm *>(recv_comm);
    if (c == nullptr) return 0;
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
