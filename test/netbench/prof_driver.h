// SPDX-License-Identifier: Apache-2.0
// Drives an NCCL profiler plugin the way NCCL's proxy does for network work
// (docs/nccl-abi.md, "Profiler calls and handles"): a Coll event per collective (started and
// stopped at enqueue), ProxyOps per channel and direction as its children, a ProxyStep per
// network transfer with NCCL's states, and the net plugin's own events forwarded through the
// profiler callback NCCL hands the net plugin
// (docs/nccl-abi.md, "Net plugin events in the profiler"). No GPU: no KernelCh events.
#pragma once

#include <cstdint>
#include <string>

#include "nccl_abi/profiler_v6.h"

namespace vigil::bench {

/// One profiler context (one communicator). Not thread-safe (the driver is single-threaded,
/// like one proxy thread); one instance per process (the net callback is global).
class ProfDriver
{
public:
    /// Finds ncclProfiler_v6, then _v5, in the library `lib` (a dlopen handle), or in
    /// `path` when `lib` is NULL. Returns an empty string or the reason.
    std::string load(void *lib, const std::string &path);
    /// init, as NCCL calls it for a communicator. Returns an empty string or the reason.
    std::string init(uint64_t comm_hash, int nranks, int rank);
    void finalize();
    /// For the net plugin's init (v10+): forwards its events like NCCL's callback.
    static ncclResult_t net_callback(void **eHandle, int type, void *pHandle, int64_t pluginId, void *extData);

    /// S+E Coll (enqueue); the returned handle parents the ProxyOps.
    void *coll(uint64_t seq, const char *func, size_t count, const char *datatype, int channels);
    void *op_start(void *coll, int channel, int peer, int nsteps, int chunk, bool send);
    void *step_start(void *op, int step);
    void state(void *h, int state, size_t trans_size);
    void stop(void *h);

private:
    ncclProfiler_v6_t *v6_ = nullptr;
    ncclProfiler_v5_t *v5_ = nullptr;
    void *ctx_ = nullptr;
    int mask_ = 0;
    int rank_ = 0;
    void *start(ncclProfilerEventDescr_v6_t &d);
};

} // namespace vigil::bench
