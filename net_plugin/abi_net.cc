// SPDX-License-Identifier: Apache-2.0
// extern "C" ncclNet_v8 ... ncclNet_v12 tables. Each entry point only translates types and
// guards: no exception crosses into NCCL, every -errno becomes an ncclResult_t through the one
// table in abi_guard.h, and *request / *comm outputs are always written. Logic lives in
// plugin.cc. Loader facts: docs/nccl-abi.md, "Net plugin: loader and calls" and
// "Net plugin semantics NCCL relies on".
#include <climits>
#include <cstdlib>

#include "abi_guard.h"
#include "log.h"
#include "nccl_abi/net_v10.h"
#include "nccl_abi/net_v11.h"
#include "nccl_abi/net_v12.h"
#include "nccl_abi/net_v8.h"
#include "nccl_abi/net_v9.h"
#include "plugin.h"

namespace {

using namespace vigil;

ncclResult_t result(const char *fn, int rc)
{
    if (rc == 0) return ncclSuccess;
    ncclResult_t r = to_nccl_result(rc);
    if (net::abort_on_error()) {
        VLOG_WARN("%s failed (%d); VIGIL_ABORT_ON_ERROR is set: aborting", fn, static_cast<int>(r));
        std::abort();
    }
    return r;
}

#define GUARD(fn, expr) abi_guard(fn, [&]() -> ncclResult_t { return result(fn, (expr)); })

// ---- properties (common to every version, then per-version tails) ------------------------

// Everything is the fabric's decision (fabric.h DeviceProps); the shim only copies.
template <class Props> ncclResult_t fill_common(int dev, Props *p)
{
    const net::DeviceProps *d = net::device(dev);
    if (d == nullptr || p == nullptr) {
        VLOG_WARN("getProperties for unknown dev %d", dev);
        return ncclInvalidArgument;
    }
    p->name = const_cast<char *>(d->name.c_str());
    p->pciPath = d->pci_path.empty() ? nullptr : const_cast<char *>(d->pci_path.c_str());
    p->guid = d->guid;
    p->ptrSupport = d->ptr_support;
    p->regIsGlobal = d->reg_is_global ? 1 : 0;
    p->speed = d->speed_mbps;
    p->port = d->port;
    p->latency = d->latency_us;
    p->maxComms = d->max_comms;
    p->maxRecvs = d->max_recvs;
    p->netDeviceType = NCCL_NET_DEVICE_HOST;
    p->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
    return ncclSuccess;
}

// v9+: one physical device per vNIC, and the fabric's chunking bounds.
template <class Props> ncclResult_t fill_v9(int dev, Props *p)
{
    ncclResult_t r = fill_common(dev, p);
    if (r != ncclSuccess) return r;
    const net::DeviceProps *d = net::device(dev);
    p->forceFlush = d->force_flush ? 1 : 0;
    p->vProps.ndevs = 1;
    p->vProps.devs[0] = dev;
    p->maxP2pBytes = static_cast<size_t>(d->max_p2p_bytes);
    p->maxCollBytes = static_cast<size_t>(d->max_coll_bytes);
    return ncclSuccess;
}

// ---- entry points shared by several versions --------------------------------------------

ncclResult_t devices(int *ndev)
{
    return abi_guard("devices", [&] {
        *ndev = net::device_count();
        return ncclSuccess;
    });
}

ncclResult_t listen_noctx(int dev, void *handle, void **listen_comm)
{
    return GUARD("listen", net::listen(dev, handle, listen_comm));
}

ncclResult_t listen_ctx(void * /*ctx*/, int dev, void *handle, void **listen_comm)
{
    return GUARD("listen", net::listen(dev, handle, listen_comm));
}

// sendDevComm/recvDevComm may be NULL (GDR self-test) or point at NULL; a host plugin leaves
// them alone (docs/nccl-abi.md, "Net plugin semantics NCCL relies on").
ncclResult_t connect_noctx(int dev, void *handle, void **send_comm, ncclNetDeviceHandle_t **)
{
    return GUARD("connect", net::connect(dev, handle, send_comm, NCCL_NET_TRAFFIC_CLASS_UNDEF));
}

ncclResult_t connect_v10(int dev, ncclNetCommConfig_v10_t *config, void *handle, void **send_comm,
                         ncclNetDeviceHandle_t **)
{
    const int tc = config != nullptr ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF;
    return GUARD("connect", net::connect(dev, handle, send_comm, tc));
}

ncclResult_t connect_ctx(void *ctx, int dev, void *handle, void **send_comm, ncclNetDeviceHandle_t **)
{
    return GUARD("connect", net::connect(dev, handle, send_comm, net::context_traffic_class(ctx)));
}

ncclResult_t accept(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **)
{
    return GUARD("accept", net::accept(listen_comm, recv_comm));
}

ncclResult_t reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
    return GUARD("regMr", net::reg_mr(comm, data, size, type, mhandle));
}

ncclResult_t reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                           void **mhandle)
{
    return GUARD("regMrDmaBuf", net::reg_mr_dmabuf(comm, data, size, type, offset, fd, mhandle));
}

ncclResult_t dereg_mr(void *comm, void *mhandle)
{
    return GUARD("deregMr", net::dereg_mr(comm, mhandle));
}

ncclResult_t isend_v9(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                      void **request)
{
    *request = nullptr;
    return GUARD("isend", net::isend(send_comm, data, size, tag, mhandle, request));
}

ncclResult_t isend_v10(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                       void *phandle, void **request)
{
    *request = nullptr;
    return GUARD("isend", net::isend(send_comm, data, size, tag, mhandle, request, phandle));
}

ncclResult_t irecv_v9(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                      void **mhandles, void **request)
{
    // Overwrites NCCL's (void*)0x1 pre-load
    // (docs/nccl-abi.md, "Net plugin semantics NCCL relies on").
    *request = nullptr;
    return GUARD("irecv", net::irecv(recv_comm, n, data, sizes, tags, mhandles, request));
}

ncclResult_t irecv_v10(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                       void **mhandles, void ** /*phandles*/, void **request)
{
    *request = nullptr;
    return GUARD("irecv", net::irecv(recv_comm, n, data, sizes, tags, mhandles, request));
}

ncclResult_t iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                    void **request)
{
    *request = nullptr;
    return GUARD("iflush", net::iflush(recv_comm, n, data, sizes, mhandles, request));
}

ncclResult_t test(void *request, int *done, int *sizes)
{
    *done = 0;
    if (request == nullptr) return ncclInternalError;
    return GUARD("test", net::test(request, done, sizes));
}

ncclResult_t close_send(void *c) { return GUARD("closeSend", net::close_send(c)); }
ncclResult_t close_recv(void *c) { return GUARD("closeRecv", net::close_recv(c)); }
ncclResult_t close_listen(void *c) { return GUARD("closeListen", net::close_listen(c)); }

// ---- v8: int sizes ----------------------------------------------------------------------

ncclResult_t init_v8(ncclDebugLogger_t logger) { return GUARD("init", net::plugin_init(logger, 8)); }
ncclResult_t props_v8(int dev, ncclNetProperties_v8_t *p) { return abi_guard("getProperties", [&] { return fill_common(dev, p); }); }

ncclResult_t isend_v8(void *send_comm, void *data, int size, int tag, void *mhandle, void **request)
{
    *request = nullptr;
    if (size < 0) return ncclInvalidArgument;
    return GUARD("isend", net::isend(send_comm, data, static_cast<size_t>(size), tag, mhandle, request));
}

ncclResult_t irecv_v8(void *recv_comm, int n, void **data, int *sizes, int *tags,
                      void **mhandles, void **request)
{
    *request = nullptr;
    if (n < 1 || n > net::kMaxRecvs) return ncclInvalidArgument;
    size_t wide[net::kMaxRecvs];
    for (int i = 0; i < n; ++i) {
        if (sizes[i] < 0) return ncclInvalidArgument;
        wide[i] = static_cast<size_t>(sizes[i]);
    }
    return GUARD("irecv", net::irecv(recv_comm, n, data, wide, tags, mhandles, request));
}

// ---- v9, v10 ----------------------------------------------------------------------------

ncclResult_t init_v9(ncclDebugLogger_t logger) { return GUARD("init", net::plugin_init(logger, 9)); }
ncclResult_t props_v9(int dev, ncclNetProperties_v9_t *p) { return abi_guard("getProperties", [&] { return fill_v9(dev, p); }); }
ncclResult_t init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
    net::set_profiler_callback(prof);
    return GUARD("init", net::plugin_init(logger, 10));
}

// ---- v11, v12: per-communicator init with a context --------------------------------------

template <int V, class Config>
ncclResult_t init_ctx(void **ctx, uint64_t comm_id, Config *config, ncclDebugLogger_t logger,
                      ncclProfilerCallback_t prof)
{
    return abi_guard("init", [&] {
        *ctx = nullptr;
        net::set_profiler_callback(prof);
        int rc = 0;
        // NCCL passes a stack variable: copy what we need, keep no pointer
        // (docs/nccl-abi.md, "Net plugin: loader and calls").
        int tc = config != nullptr ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF;
        *ctx = net::make_context(comm_id, tc, logger, V, &rc);
        return result("init", rc);
    });
}

ncclResult_t finalize(void *ctx)
{
    return abi_guard("finalize", [&] {
        net::drop_context(ctx);
        return ncclSuccess;
    });
}

ncclResult_t props_v11(int dev, ncclNetProperties_v11_t *p)
{
    return abi_guard("getProperties", [&] {
        ncclResult_t r = fill_v9(dev, p);
        if (r == ncclSuccess) p->maxMultiRequestSize = 1;
        return r;
    });
}

ncclResult_t props_v12(int dev, ncclNetProperties_v12_t *p)
{
    return abi_guard("getProperties", [&] {
        ncclResult_t r = fill_v9(dev, p);
        if (r == ncclSuccess) {
            p->maxMultiRequestSize = 1;
            p->railId = NCCL_NET_ID_UNDEF;
            p->planeId = NCCL_NET_ID_UNDEF;
        }
        return r;
    });
}

// v11 and v12 share every entry point but init and getProperties (docs/nccl-abi.md,
// "Net plugin: loader and calls").
template <class Net, class Init, class Props> constexpr Net ctx_table(Init init, Props props)
{
    Net n{};
    n.name = net::kPluginName;
    n.init = init;
    n.devices = devices;
    n.getProperties = props;
    n.listen = listen_ctx;
    n.connect = connect_ctx;
    n.accept = accept;
    n.regMr = reg_mr;
    n.regMrDmaBuf = reg_mr_dmabuf;
    n.deregMr = dereg_mr;
    n.isend = isend_v10;
    n.irecv = irecv_v10;
    n.iflush = iflush;
    n.test = test;
    n.closeSend = close_send;
    n.closeRecv = close_recv;
    n.closeListen = close_listen;
    n.getDeviceMr = nullptr;   // host plugin: no device-side networking
    n.irecvConsumed = nullptr; // ditto
    n.makeVDevice = nullptr;   // physical devices only: each port fails over on its own
    n.finalize = finalize;
    n.setNetAttr = nullptr;    // NCCL checks for NULL (v2.28.9-1:src/transport/net.cc:212-218)
    return n;
}

} // namespace

extern "C" {

[[gnu::visibility("default")]] ncclNet_v8_t ncclNetPlugin_v8 = {
    .name = net::kPluginName,
    .init = init_v8,
    .devices = devices,
    .getProperties = props_v8,
    .listen = listen_noctx,
    .connect = connect_noctx,
    .accept = accept,
    .regMr = reg_mr,
    .regMrDmaBuf = reg_mr_dmabuf,
    .deregMr = dereg_mr,
    .isend = isend_v8,
    .irecv = irecv_v8,
    .iflush = iflush,
    .test = test,
    .closeSend = close_send,
    .closeRecv = close_recv,
    .closeListen = close_listen,
    .getDeviceMr = nullptr,   // host plugin: no device-side networking
    .irecvConsumed = nullptr, // ditto
};

[[gnu::visibility("default")]] ncclNet_v9_t ncclNetPlugin_v9 = {
    .name = net::kPluginName,
    .init = init_v9,
    .devices = devices,
    .getProperties = props_v9,
    .listen = listen_noctx,
    .connect = connect_noctx,
    .accept = accept,
    .regMr = reg_mr,
    .regMrDmaBuf = reg_mr_dmabuf,
    .deregMr = dereg_mr,
    .isend = isend_v9,
    .irecv = irecv_v9,
    .iflush = iflush,
    .test = test,
    .closeSend = close_send,
    .closeRecv = close_recv,
    .closeListen = close_listen,
    .getDeviceMr = nullptr,
    .irecvConsumed = nullptr,
    .makeVDevice = nullptr, // physical devices only: each port fails over on its own
};

[[gnu::visibility("default")]] ncclNet_v10_t ncclNetPlugin_v10 = {
    .name = net::kPluginName,
    .init = init_v10,
    .devices = devices,
    .getProperties = props_v9,
    .listen = listen_noctx,
    .connect = connect_v10,
    .accept = accept,
    .regMr = reg_mr,
    .regMrDmaBuf = reg_mr_dmabuf,
    .deregMr = dereg_mr,
    .isend = isend_v10,
    .irecv = irecv_v10,
    .iflush = iflush,
    .test = test,
    .closeSend = close_send,
    .closeRecv = close_recv,
    .closeListen = close_listen,
    .getDeviceMr = nullptr,
    .irecvConsumed = nullptr,
    .makeVDevice = nullptr,
};

[[gnu::visibility("default")]] constinit ncclNet_v11_t ncclNetPlugin_v11 =
    ctx_table<ncclNet_v11_t>(init_ctx<11, ncclNetCommConfig_v11_t>, props_v11);

[[gnu::visibility("default")]] constinit ncclNet_v12_t ncclNetPlugin_v12 =
    ctx_table<ncclNet_v12_t>(init_ctx<12, ncclNetCommConfig_v12_t>, props_v12);

} // extern "C"
