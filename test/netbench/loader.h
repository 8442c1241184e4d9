// SPDX-License-Identifier: Apache-2.0
// Loads an ncclNet plugin exactly as NCCL does (name resolution, newest symbol first) and
// presents every version behind one C++ interface, so workloads are written once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "nccl_abi/net_v10.h"
#include "nccl_abi/net_v11.h"
#include "nccl_abi/net_v12.h"
#include "nccl_abi/net_v8.h"
#include "nccl_abi/net_v9.h"

namespace vigil::bench {

/// Properties common to every version, as the driver prints them.
struct DevProps {
    std::string name;
    std::string pci_path;
    int speed_mbps = 0;
    int max_recvs = 1;
    int ptr_support = 0;
};

/// A loaded plugin. Not thread-safe (the driver is single-threaded, like one NCCL proxy).
class NetPlugin
{
public:
    /// dlopen()s `spec` like NCCL's plugin_open.cc: verbatim first, then
    /// libnccl-net-<spec>.so when spec has no '/' and is not lib*.so; then dlsym()s
    /// ncclNetPlugin_v12 .. _v8 (or only _v<force_version> when force_version > 0).
    /// Returns an empty string on success, else the reason.
    std::string load(const std::string &spec, int force_version);

    int version() const { return version_; }
    const char *name() const;
    std::string path() const { return path_; }

    /// The dlopen() handle (to find other plugin symbols in the same library).
    void *handle() const { return lib_; }
    /// The profiler callback given to init (v10+), as NCCL passes its own; NULL: none.
    void set_profiler_callback(ncclProfilerCallback_t cb) { prof_cb_ = cb; }
    ncclResult_t init(uint64_t comm_id);
    ncclResult_t finalize();
    /// dlclose()s the library, as NCCL does when a plugin's last user is gone (2.22-2.25,
    /// 2.28 for a non-default plugin, 2.30); the object is unusable until the next load().
    void unload();
    ncclResult_t devices(int *n);
    ncclResult_t properties(int dev, DevProps *p);
    ncclResult_t listen(int dev, void *handle, void **lc);
    ncclResult_t connect(int dev, void *handle, void **sc);
    ncclResult_t accept(void *lc, void **rc);
    ncclResult_t reg_mr(void *comm, void *data, size_t size, void **mh);
    ncclResult_t dereg_mr(void *comm, void *mh);
    /// `phandle`/`phandles`: profiler proxy-step handles (v10+; ignored before).
    ncclResult_t isend(void *sc, void *data, size_t size, int tag, void *mh, void **req,
                       void *phandle = nullptr);
    ncclResult_t irecv(void *rc, int n, void **data, size_t *sizes, int *tags, void **mhs,
                       void **req, void **phandles = nullptr);
    ncclResult_t test(void *req, int *done, int *sizes);
    ncclResult_t close_send(void *sc);
    ncclResult_t close_recv(void *rc);
    ncclResult_t close_listen(void *lc);

private:
    void *lib_ = nullptr;
    int version_ = 0;
    std::string path_;
    void *ctx_ = nullptr;
    ncclProfilerCallback_t prof_cb_ = nullptr;
    ncclNet_v8_t *v8_ = nullptr;
    ncclNet_v9_t *v9_ = nullptr;
    ncclNet_v10_t *v10_ = nullptr;
    ncclNet_v11_t *v11_ = nullptr;
    ncclNet_v12_t *v12_ = nullptr;
};

/// The logger handed to the plugin: NCCL-like lines on stderr, filtered by NCCL_DEBUG.
void bench_logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                  const char *fmt, ...);

} // namespace vigil::bench
