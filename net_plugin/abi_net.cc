// SPDX-License-Identifier: Apache-2.0
// extern "C" ncclNet_v8 ... ncclNet_v12 tables. Each entry point only translates types and
// guards: no exception crosses into NCCL, every -errno becomes an ncclResult_t through the one
// table in abi_guard.h, and *request / *comm outputs are always written. Logic lives in
// plugin.cc. Loader facts: reference nccl-plugin-abi.md sections 1.1-1.7.
#include <climits>
#include <cstdlib>

#include "abi_guard.h"
#include "comm.h"
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

template <class Props> ncclResult_t fill_common(int dev, Props *p)
{
    const net::Device *d = net::device(dev);
    if (d == nullptr || p == nullptr) {
        VLOG_WARN("getProperties for unknown dev %d", dev);
        return ncclInvalidArgument;
    }
    p->name = const_cast<char *>(d->name.c_str());
    p->pciPath = d->pci_path.empty() ? nullptr : const_cast<char *>(d->pci_path.c_str());
    p->guid = d->guid;
    p->ptrSupport = NCCL_PTR_HOST;
    p->regIsGlobal = 0;
    p->speed = d->speed_mbps;
    p->port = 0;
    p->latency = 0;
    p->maxComms = 65536;
    p->maxRecvs = static_cast<int>(net::params().max_recvs);
    p->netDeviceType = NCCL_NET_DEVICE_HOST;
    p->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
    return ncclSuccess;
}

// v9+: one physical device per vNIC; NCCL chunks p2p/collective traffic at these sizes (the
// same bounds NCCL's shims give v8 plugins, net_v8.cc:22-45).
template <class Props> ncclResult_t fill_v9(int dev, Props *p)
{
    ncclResult_t r = fill_common(dev, p);
    if (r != ncclSuccess) return r;
    p->forceFlush = 0;
    p->vProps.ndevs = 1;
    p->vProps.devs[0] = dev;
    p->maxP2pBytes = size_t{1} << 30;
    p->maxCollBytes = size_t{512} << 20;
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
// them alone (reference 1.7).
ncclResult_t connect_noctx(int dev, void *handle, void **send_comm, ncclNetDeviceHandle_t **)
{
    return GUARD("connect", net::connect(dev, handle, send_comm));
}

ncclResult_t connect_v10(int dev, ncclNetCommConfig_v10_t *, void *handle, void **send_comm,
                         ncclNetDeviceHandle_t **)
{
    return GUARD("connect", net::connect(dev, handle, send_comm));
}

ncclResult_t connect_ctx(void * /*ctx*/, int dev, void *handle, void **send_comm,
                         ncclNetDeviceHandle_t **)
{
    return GUARD("connect", net::connect(dev, handle, send_comm));
}

ncclResult_t accept(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_t **)
{
    return GUARD("accept", net::accept(listen_comm, recv_comm));
}

ncclResult_t reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
    return GUARD("regMr", net::reg_mr(comm, data, size, type, mhandle));
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
    *request = nullptr; // overwrites NCCL's (void*)0x1 pre-load (reference 1.7)
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
    if (n < 1 || n > vigil::net::kMaxRecvs) return ncclInvalidArgument;
    size_t wide[vigil::net::kMaxRecvs];
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
        // NCCL passes a stack variable: copy what we need, keep no pointer (reference 1.3).
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

} // namespace

extern "C" {

[[gnu::visibility("default")]] ncclNet_v8_t ncclNetPlugin_v8 = {
    net::kPluginName, init_v8, devices, props_v8, listen_noctx, connect_noctx, accept,
    reg_mr, nullptr, dereg_mr, isend_v8, irecv_v8, iflush, test, close_send, close_recv,
    close_listen, nullptr, nullptr,
};

[[gnu::visibility("default")]] ncclNet_v9_t ncclNetPlugin_v9 = {
    net::kPluginName, init_v9, devices, props_v9, listen_noctx, connect_noctx, accept,
    reg_mr, nullptr, dereg_mr, isend_v9, irecv_v9, iflush, test, close_send, close_recv,
    close_listen, nullptr, nullptr, nullptr,
};

[[gnu::visibility("default")]] ncclNet_v10_t ncclNetPlugin_v10 = {
    net::kPluginName, init_v10, devices, props_v9, listen_noctx, connect_v10, accept,
    reg_mr, nullptr, dereg_mr, isend_v10, irecv_v10, iflush, test, close_send, close_recv,
    close_listen, nullptr, nullptr, nullptr,
};

[[gnu::visibility("default")]] ncclNet_v11_t ncclNetPlugin_v11 = {
    net::kPluginName, init_ctx<11, ncclNetCommConfig_v11_t>, devices, props_v11, listen_ctx,
    connect_ctx, accept, reg_mr, nullptr, dereg_mr, isend_v10, irecv_v10, iflush, test,
    close_send, close_recv, close_listen, nullptr, nullptr, nullptr, finalize, nullptr,
};

[[gnu::visibility("default")]] ncclNet_v12_t ncclNetPlugin_v12 = {
    net::kPluginName, init_ctx<12, ncclNetCommConfig_v12_t>, devices, props_v12, listen_ctx,
    connect_ctx, accept, reg_mr, nullptr, dereg_mr, isend_v10, irecv_v10, iflush, test,
    close_send, close_recv, close_listen, nullptr, nullptr, nullptr, finalize, nullptr,
};

} // extern "C"
