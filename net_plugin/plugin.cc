// SPDX-License-Identifier: Apache-2.0
// Net plugin core: global state (refcounted), the fabric, and the entry points. Builds comms
// from the paths a fabric produces; never names a fabric.
#include "plugin.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sched.h>
#include <set>
#include <string_view>
#include <unistd.h>
#include <vector>

#include "clock.h"
#include "fabrics.h"
#include "injector.h"
#include "log.h"
#include "nccl_abi/net_common.h"
#include "path_plan.h"
#include "progress.h"
#include "recv_comm.h"
#include "send_comm.h"
#include "sockets/socket.h"
#include "telemetry/writer.h"
#include "version.h"

namespace vigil::net {
namespace {

/// Port events reach every live comm. They are only noted here (Comm::note_port_down,
/// note_port_up): each comm fails over, or starts its rebuilds, at its own next progress, so
/// telling thousands of them takes microseconds each on the event thread, which never waits
/// for a comm's lock.
class CommRegistry final : public PortEventSink
{
public:
    template <class C> void add(C *c)
    {
        std::lock_guard<std::mutex> lock(mu_);
        set_of(c).insert(c);
    }
    template <class C> void remove(C *c)
    {
        std::lock_guard<std::mutex> lock(mu_);
        set_of(c).erase(c);
    }
    void port_changed(int dev, bool up, const std::string &cause) override
    {
        std::lock_guard<std::mutex> lock(mu_);
        const uint64_t t0 = now_ns();
        if (up) {
            for (SendComm *c : send_) c->note_port_up(dev);
        } else {
            Comm::set_port_down_cause(dev, cause);
            for (SendComm *c : send_) c->note_port_down(dev);
            for (RecvComm *c : recv_) c->note_port_down(dev);
        }
        // One line per event at WARN for a port lost: each connection's own failover line
        // is bounded by its log::Burst.
        if (up)
            VLOG_INFO(NCCL_NET, "%s: %zu sending connections told in %.1f ms; each rebuilds its paths on "
                      "the port", cause.c_str(), send_.size(), static_cast<double>(now_ns() - t0) / 1e6);
        else
            VLOG_WARN("%s: %zu sending and %zu receiving connections told in %.1f ms; each leaves its "
                      "paths on the port", cause.c_str(), send_.size(), recv_.size(),
                      static_cast<double>(now_ns() - t0) / 1e6);
    }

private:
    std::set<SendComm *> &set_of(SendComm *) { return send_; }
    std::set<RecvComm *> &set_of(RecvComm *) { return recv_; }

    std::mutex mu_;
    std::set<SendComm *> send_;
    std::set<RecvComm *> recv_;
};

/// One NCCL connect() in progress: the fabric's connector and the plan it follows.
struct PendingConnect {
    std::unique_ptr<Connector> connector;
    ConnectPlan plan;
};

struct Global {
    std::mutex mu;
    int refs = 0;
    bool discovered = false;
    Params params;
    std::unique_ptr<Fabric> fabric;
    FailoverConfig failover;
    TelemetryConfig telemetry;
    BackupPlan backups;
    Injector injector;
    std::set<NetContext *> contexts;
    std::map<uint64_t, PendingConnect> connects;
    CommRegistry comms;
};

Global &g()
{
    // Never destroyed: NCCL may call into the plugin from its own atexit paths.
    static Global *global = new Global;
    return *global;
}

struct ListenComm {
    std::unique_ptr<Listener> listener;
};

// Engine threads per NUMA node. The TCP fabric: VIGIL_SOCKET_NTHREADS, 0 resolved from the
// cores this process may run on: one thread (all connections on the progress thread, the
// caller's test() moving bytes too) below 8 cores, where more threads would only compete with
// the application's own; above, a quarter of the cores up to 4 per NUMA node: the most helper
// threads NCCL's Socket transport picks by itself (4 on GCP's gVNIC;
// ncclNetSocketGetNsockNthread, src/transport/net_socket.cc). Verbs: one, the NIC moves the
// bytes and the engine only reaps completions.
int progress_threads(const Global &st)
{
    const Params &p = st.params;
    if (std::string_view(st.fabric->name()) != "tcp") return 1;
    if (p.socket_nthreads > 0) return static_cast<int>(p.socket_nthreads);
    cpu_set_t cpus;
    const int cores = sched_getaffinity(getpid(), sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
    return cores < 8 ? 1 : std::min(cores / 4, 4);
}

// The NUMA node of local device `dev` (-1: unknown, or no such device).
int numa_of(const Global &st, int dev)
{
    const std::vector<DeviceProps> &devs = st.fabric->devices();
    return dev >= 0 && static_cast<size_t>(dev) < devs.size() ? devs[static_cast<size_t>(dev)].numa_node : -1;
}

// connect() keeps its retry state in the handle's scratch area: a cookie and an id into
// g().connects. The listener writes zeros there; an id we do not know starts afresh.
constexpr uint32_t kScratchCookie = 0x53474c56; // "VLGS"

SendComm *as_send(void *p)
{
    return static_cast<SendComm *>(static_cast<Comm *>(p));
}
RecvComm *as_recv(void *p)
{
    return static_cast<RecvComm *>(static_cast<Comm *>(p));
}

int discover_locked(Global &st)
{
    ParamLoad load = load_params(environment_source());
    if (!report_params(load, ParamScope::Net)) return -EINVAL;
    st.params = load.values;
    std::string why;
    if (int rc = make_fabric(st.params, &st.fabric, &why); rc != 0) {
        VLOG_WARN("no fabric: %s", why.c_str());
        return rc;
    }
    const std::vector<DeviceProps> &devs = st.fabric->devices();
    if (!BackupPlan::parse(st.params.backup, devs, &st.backups, &why) ||
        !st.injector.arm(st.params.inject_fail, devs, &why)) {
        VLOG_WARN("%s", why.c_str());
        st.fabric.reset();
        return -EINVAL;
    }
    st.failover = failover_config(st.params);
    st.telemetry = telemetry_config(st.params, devs);
    return 0;
}

// Telemetry is observability: whatever fails here is said once and the plugin runs on.
void start_telemetry_locked(Global &st)
{
    if (!st.params.telemetry) return;
    const uint64_t window_ns = static_cast<uint64_t>(st.params.window_us) * 1000ull;
    if (int e = telemetry::Registry::instance().open(window_ns, -1); e != 0)
        VLOG_WARN("telemetry registry unavailable (%s); running without telemetry", strerror(-e));
    else
        VLOG_INFO(NCCL_INIT, "telemetry: %llu us windows in %s",
                  static_cast<unsigned long long>(st.params.window_us),
                  telemetry::Registry::instance().path().c_str());
    if (!st.params.telemetry_dir.empty() && telemetry::Registry::instance().is_open()) {
        std::string why;
        if (telemetry::start_writer(st.params.telemetry_dir,
                                    static_cast<uint64_t>(st.params.telemetry_max_bytes), &why) != 0)
            VLOG_WARN("VIGIL_TELEMETRY_DIR=\"%s\": %s; running on without telemetry files",
                      st.params.telemetry_dir.c_str(), why.c_str());
    }
}

std::string banner_devices(const Global &st)
{
    std::string out;
    const std::vector<DeviceProps> &devs = st.fabric->devices();
    for (size_t i = 0; i < devs.size(); ++i) {
        const DeviceProps &d = devs[i];
        out += " [" + std::to_string(i) + "] " + d.name + (d.address.empty() ? "" : " " + d.address) +
               " " + std::to_string(d.speed_mbps) + "Mb/s" + (d.pci_path.empty() ? " virtual" : "");
    }
    return out;
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
        raise_fd_limit(); // thousands of connections, several sockets each (docs/scale.md)
        if (int rc = discover_locked(st); rc != 0) return rc;
        st.discovered = true;
    }
    start_telemetry_locked(st);
    if (int e = ProgressEngine::instance().start(progress_threads(st)); e != 0) {
        VLOG_WARN("cannot start the progress thread: %s", strerror(-e));
        telemetry::stop_writer();
        return e;
    }
    PortPairs::process().start_sweeper(); // quiet comms park (port_pairs.h)
    if (int e = st.fabric->start_events(&st.comms); e != 0)
        VLOG_WARN("no port events (%s): port failures are found by the data path and the stall "
                  "watchdog only", strerror(-e));
    ++st.refs;
    VLOG_INFO(NCCL_INIT | NCCL_NET, "vigil %s loaded, ncclNet v%d, fabric %s, %zu devices:%s; "
              "backups %s", VIGIL_VERSION, api_version, st.fabric->name(),
              st.fabric->devices().size(), banner_devices(st).c_str(), st.params.backup.c_str());
    return 0;
}

void plugin_finalize()
{
    Global &st = g();
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.refs == 0) return;
    if (--st.refs > 0) return;
    st.connects.clear();
    st.fabric->stop_events();
    telemetry::stop_writer();
    PortPairs::process().stop_sweeper();
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

int context_traffic_class(void *ctx)
{
    std::lock_guard<std::mutex> lock(g().mu);
    auto it = g().contexts.find(static_cast<NetContext *>(ctx));
    return it == g().contexts.end() ? -1 : (*it)->traffic_class;
}

int device_count()
{
    std::lock_guard<std::mutex> lock(g().mu);
    return g().fabric ? static_cast<int>(g().fabric->devices().size()) : 0;
}

const DeviceProps *device(int dev)
{
    std::lock_guard<std::mutex> lock(g().mu);
    if (!g().fabric || dev < 0 || static_cast<size_t>(dev) >= g().fabric->devices().size()) return nullptr;
    return &g().fabric->devices()[static_cast<size_t>(dev)];
}

const Params &params()
{
    return g().params;
}

int listen(int dev, void *handle, void **listen_comm)
{
    *listen_comm = nullptr;
    const DeviceProps *d = device(dev);
    if (d == nullptr || handle == nullptr) {
        VLOG_WARN("listen on dev %d: %s", dev, d == nullptr ? "no such device" : "NULL handle");
        return -EINVAL;
    }
    ListenHandle h;
    auto lc = std::make_unique<ListenComm>();
    if (int rc = g().fabric->listen(dev, &h, &lc->listener); rc != 0) return rc;
    if (int rc = h.encode(static_cast<uint8_t *>(handle)); rc != 0) return rc;
    *listen_comm = lc.release();
    return 0;
}

int connect(int dev, void *handle, void **send_comm, int traffic_class)
{
    *send_comm = nullptr;
    const DeviceProps *d = device(dev);
    if (d == nullptr || handle == nullptr) {
        VLOG_WARN("connect from dev %d: %s", dev, d == nullptr ? "no such device" : "NULL handle");
        return -EINVAL;
    }
    Global &st = g();
    auto *bytes = static_cast<uint8_t *>(handle);
    uint8_t *scratch = bytes + ListenHandle::kScratchOffset;
    uint32_t cookie;
    uint64_t id;
    std::memcpy(&cookie, scratch, sizeof(cookie));
    std::memcpy(&id, scratch + 4, sizeof(id));
    PendingConnect *pc = nullptr;
    {
        std::lock_guard<std::mutex> lock(st.mu);
        auto it = cookie == kScratchCookie ? st.connects.find(id) : st.connects.end();
        if (it != st.connects.end()) pc = &it->second;
    }
    if (pc == nullptr) {
        ListenHandle h;
        std::string why;
        if (int rc = ListenHandle::decode(bytes, &h, &why); rc != 0) {
            VLOG_WARN("connect on dev %s: malformed handle: %s", d->name.c_str(), why.c_str());
            return -EINVAL;
        }
        PendingConnect fresh;
        fresh.plan = st.backups.plan(dev, h, traffic_class);
        if (int rc = st.fabric->connect(fresh.plan, h, &fresh.connector); rc != 0) return rc;
        do random_bytes(&id, sizeof(id));
        while (id == 0);
        std::lock_guard<std::mutex> lock(st.mu);
        pc = &st.connects.emplace(id, std::move(fresh)).first->second;
        cookie = kScratchCookie;
        std::memcpy(scratch, &cookie, sizeof(cookie));
        std::memcpy(scratch + 4, &id, sizeof(id));
    }
    SendPaths paths;
    int rc = pc->connector->progress(&paths);
    const ConnectPlan plan = pc->plan;
    if (rc != 0 || paths.paths[kPrimary]) {
        std::lock_guard<std::mutex> lock(st.mu);
        st.connects.erase(id);
        std::memset(scratch, 0, ListenHandle::kScratchSize);
    }
    if (rc != 0 || !paths.paths[kPrimary]) return rc;
    auto comm = std::make_unique<SendComm>(std::move(paths), plan.local_dev, st.failover, st.telemetry);
    if (int e = comm->attach(numa_of(st, plan.local_dev[kPrimary])); e != 0) {
        VLOG_WARN("connect: progress engine registration failed: %s", strerror(-e));
        return e;
    }
    VLOG_INFO(NCCL_NET | NCCL_INIT, "connected %s", comm->describe_paths().c_str());
    st.comms.add(comm.get());
    *send_comm = static_cast<Comm *>(comm.release());
    return 0;
}

int accept(void *listen_comm, void **recv_comm)
{
    *recv_comm = nullptr;
    auto *lc = static_cast<ListenComm *>(listen_comm);
    RecvPaths paths;
    if (int rc = lc->listener->accept(&paths); rc != 0) return rc;
    if (!paths.paths[kPrimary]) return 0;
    const std::array<int, kMaxPaths> devs = paths.devs;
    auto comm = std::make_unique<RecvComm>(std::move(paths), devs, g().failover, g().telemetry);
    if (int e = comm->attach(numa_of(g(), devs[kPrimary])); e != 0) {
        VLOG_WARN("accept: progress engine registration failed: %s", strerror(-e));
        return e;
    }
    VLOG_INFO(NCCL_NET | NCCL_INIT, "accepted %s", comm->describe_paths().c_str());
    g().comms.add(comm.get());
    *recv_comm = static_cast<Comm *>(comm.release());
    return 0;
}

namespace {

// Registers `data` on every device the comm's paths use, so a failover registers nothing.
template <class Reg> int register_region(void *comm, void *data, size_t size, int type, void **mhandle, Reg reg)
{
    *mhandle = nullptr;
    if (comm == nullptr) {
        VLOG_WARN("regMr with a NULL comm");
        return -EINVAL;
    }
    auto m = std::make_unique<MemRegion>();
    m->base = static_cast<const uint8_t *>(data);
    m->size = size;
    m->type = type;
    size_t k = 0;
    for (int dev : static_cast<Comm *>(comm)->devices()) {
        if (dev < 0 || m->on(dev) != nullptr) continue;
        bool seen = false;
        for (size_t j = 0; j < k; ++j) seen = seen || m->devs[j].dev == dev;
        if (seen) continue;
        std::shared_ptr<FabricMr> mr;
        if (int rc = reg(dev, &mr); rc != 0) return rc;
        m->devs[k++] = MemRegion::OnDevice{dev, std::move(mr)};
    }
    *mhandle = m.release();
    return 0;
}

} // namespace

int reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
    return register_region(comm, data, size, type, mhandle, [&](int dev, std::shared_ptr<FabricMr> *mr) {
        return g().fabric->reg_mr(dev, data, size, type, mr);
    });
}

int reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd, void **mhandle)
{
    return register_region(comm, data, size, type, mhandle, [&](int dev, std::shared_ptr<FabricMr> *mr) {
        return g().fabric->reg_mr_dmabuf(dev, data, size, type, offset, fd, mr);
    });
}

int dereg_mr(void * /*comm*/, void *mhandle)
{
    // Requests still in flight keep their own reference: the registration outlives them.
    MemRegion::unref(static_cast<MemRegion *>(mhandle));
    return 0;
}

void set_profiler_callback(ncclProfilerCallback_t cb)
{
    if (cb != nullptr) SendComm::set_profiler(cb);
}

int isend(void *send_comm, void *data, size_t size, int tag, void *mhandle, void **request,
          void *phandle)
{
    SendComm *c = as_send(send_comm);
    Request *r = nullptr;
    int rc = c->isend(data, size, tag, static_cast<MemRegion *>(mhandle), &r, phandle);
    *request = r;
    if (r != nullptr) g().injector.on_send(*c, size);
    return rc;
}

int irecv(void *recv_comm, int n, void **data, const size_t *sizes, const int *tags,
          void **mhandles, void **request)
{
    std::array<MemRegion *, kMaxRecvs> mrs{};
    if (mhandles != nullptr)
        for (int i = 0; i < n && i < kMaxRecvs; ++i) mrs[static_cast<size_t>(i)] = static_cast<MemRegion *>(mhandles[i]);
    Request *r = nullptr;
    int rc = as_recv(recv_comm)->irecv(n, data, sizes, tags, mrs.data(), &r);
    *request = r;
    return rc;
}

int iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request)
{
    std::array<MemRegion *, kMaxRecvs> mrs{};
    if (mhandles != nullptr)
        for (int i = 0; i < n && i < kMaxRecvs; ++i) mrs[static_cast<size_t>(i)] = static_cast<MemRegion *>(mhandles[i]);
    Request *r = nullptr;
    const int rc = as_recv(recv_comm)->iflush(std::min(n, kMaxRecvs), data, sizes, mrs.data(), &r);
    *request = r; // NULL: nothing to wait for (transport/net.cc treats it as done)
    return rc;
}

int test(void *request, int *done, int *sizes)
{
    auto *r = static_cast<Request *>(request);
    return r->comm->test(r, done, sizes);
}

int close_send(void *send_comm)
{
    if (send_comm == nullptr) return 0;
    SendComm *c = as_send(send_comm);
    g().comms.remove(c);
    c->close();
    delete c;
    return 0;
}

int close_recv(void *recv_comm)
{
    if (recv_comm == nullptr) return 0;
    RecvComm *c = as_recv(recv_comm);
    g().comms.remove(c);
    c->close();
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
