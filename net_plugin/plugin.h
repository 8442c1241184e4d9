// SPDX-License-Identifier: Apache-2.0
// The net plugin's C++ core API, one function per ncclNet entry point, in NCCL's terms but
// free of NCCL's versioned types. The ABI shims (abi_net.cc) translate every ncclNet_vN onto
// this; nothing here throws to the caller except std::bad_alloc (caught by the shims' guard).
// The comms handed to NCCL are `Comm*` (regMr/deregMr take either kind).
#pragma once

#include <cstddef>
#include <cstdint>

#include "fabric.h"
#include "nccl_abi/nccl_common.h"
#include "params.h"

namespace vigil::net {

/// Plugin name NCCL matches NCCL_NET against.
inline constexpr const char *kPluginName = "vigil";

/// Per-communicator context handed out by v11+ init().
struct NetContext {
    uint64_t comm_id = 0;
    int traffic_class = -1;
};

/// Global (process-wide) set-up, reference-counted: the first call loads VIGIL_* variables,
/// opens the fabric (VIGIL_FABRIC) and its devices, starts the progress engine and port
/// events and logs the banner naming `api_version`; later calls only count. Returns 0, or
/// -EINVAL (bad variable, no device) after WARNs. Thread-safe.
int plugin_init(ncclDebugLogger_t logger, int api_version);
/// Remembers NCCL's profiler callback (v10+ init) for net-plugin events; NULL is ignored.
void set_profiler_callback(ncclProfilerCallback_t cb);
/// Drops one reference; the last one stops the progress engine. Thread-safe.
void plugin_finalize();

/// v11+ contexts. make_context returns nullptr when global init fails. drop_context accepts
/// any pointer: one it never made (NCCL 2.28.9 calls finalize after a failed init) is ignored.
NetContext *make_context(uint64_t comm_id, int traffic_class, ncclDebugLogger_t logger,
                         int api_version, int *rc);
void drop_context(void *ctx);
/// Traffic class of a v11+ context (-1: unset, or not a context of ours).
int context_traffic_class(void *ctx);

/// Devices of the fabric opened by the first init (stable afterwards). device() returns
/// nullptr when out of range.
int device_count();
const DeviceProps *device(int dev);
const Params &params();

/// Entry points; return 0 or -errno (mapped by to_nccl_result at the boundary).
int listen(int dev, void *handle, void **listen_comm);
/// `traffic_class`: NCCL's per-communicator value (v10 connect config, v11+ context), -1: unset.
int connect(int dev, void *handle, void **send_comm, int traffic_class = -1);
int accept(void *listen_comm, void **recv_comm);
int reg_mr(void *comm, void *data, size_t size, int type, void **mhandle);
int reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                  void **mhandle);
int dereg_mr(void *comm, void *mhandle);
int isend(void *send_comm, void *data, size_t size, int tag, void *mhandle, void **request,
          void *phandle = nullptr);
int irecv(void *recv_comm, int n, void **data, const size_t *sizes, const int *tags,
          void **mhandles, void **request);
int iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles, void **request);
int test(void *request, int *done, int *sizes);
int close_send(void *send_comm);
int close_recv(void *recv_comm);
int close_listen(void *listen_comm);

/// True once VIGIL_ABORT_ON_ERROR asked entry points to abort() on error.
bool abort_on_error();

} // namespace vigil::net
