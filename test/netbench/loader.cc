// SPDX-License-Identifier: Apache-2.0
// NCCL-style plugin loading and per-version dispatch for vigil-netbench.
#include "loader.h"

#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

namespace vigil::bench {

void bench_logger(ncclDebugLogLevel level, unsigned long /*flags*/, const char * /*file*/,
                  int /*line*/, const char *fmt, ...)
{
    static const int want = [] {
        const char *s = std::getenv("NCCL_DEBUG");
        if (s == nullptr) return static_cast<int>(NCCL_LOG_WARN);
        if (strcasecmp(s, "INFO") == 0) return static_cast<int>(NCCL_LOG_INFO);
        if (strcasecmp(s, "TRACE") == 0) return static_cast<int>(NCCL_LOG_TRACE);
        if (strcasecmp(s, "VERSION") == 0) return static_cast<int>(NCCL_LOG_VERSION);
        return static_cast<int>(NCCL_LOG_WARN);
    }();
    if (static_cast<int>(level) > want) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    char host[64] = "?";
    gethostname(host, sizeof(host) - 1);
    std::fprintf(stderr, "%s:%d NCCL %s %s\n", host, static_cast<int>(getpid()),
                 level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_INFO ? "INFO" : "TRACE", buf);
}

std::string NetPlugin::load(const std::string &spec, int force_version)
{
    lib_ = dlopen(spec.c_str(), RTLD_NOW | RTLD_LOCAL);
    path_ = spec;
    const bool has_slash = spec.find('/') != std::string::npos;
    const bool lib_so = spec.rfind("lib", 0) == 0 && spec.size() > 3 &&
                        spec.compare(spec.size() - 3, 3, ".so") == 0;
    if (lib_ == nullptr && !has_slash && !lib_so) {
        path_ = "libnccl-net-" + spec + ".so";
        lib_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    }
    if (lib_ == nullptr) return std::string("cannot load plugin: ") + dlerror();
    for (int v = 12; v >= 8; --v) {
        if (force_version > 0 && v != force_version) continue;
        void *sym = dlsym(lib_, ("ncclNetPlugin_v" + std::to_string(v)).c_str());
        if (sym == nullptr) continue;
        version_ = v;
        switch (v) {
        case 12: v12_ = static_cast<ncclNet_v12_t *>(sym); break;
        case 11: v11_ = static_cast<ncclNet_v11_t *>(sym); break;
        case 10: v10_ = static_cast<ncclNet_v10_t *>(sym); break;
        case 9: v9_ = static_cast<ncclNet_v9_t *>(sym); break;
        default: v8_ = static_cast<ncclNet_v8_t *>(sym); break;
        }
        return "";
    }
    return force_version > 0 ? "plugin has no ncclNetPlugin_v" + std::to_string(force_version)
                             : "plugin exports no ncclNetPlugin_v8..v12";
}

// Calls the member `fn` of whichever version is loaded, with the given arguments.
#define DISPATCH(fn, ...)                                                                      \
    (v12_ ? v12_->fn(__VA_ARGS__)                                                              \
     : v11_ ? v11_->fn(__VA_ARGS__)                                                            \
     : v10_ ? v10_->fn(__VA_ARGS__)                                                            \
     : v9_  ? v9_->fn(__VA_ARGS__)                                                             \
            : v8_->fn(__VA_ARGS__))

const char *NetPlugin::name() const
{
    return v12_ ? v12_->name : v11_ ? v11_->name : v10_ ? v10_->name : v9_ ? v9_->name : v8_->name;
}

ncclResult_t NetPlugin::init(uint64_t comm_id)
{
    ncclNetCommConfig_v11_t cfg{NCCL_NET_TRAFFIC_CLASS_UNDEF};
    if (v12_) return v12_->init(&ctx_, comm_id, &cfg, bench_logger, prof_cb_);
    if (v11_) return v11_->init(&ctx_, comm_id, &cfg, bench_logger, prof_cb_);
    if (v10_) return v10_->init(bench_logger, prof_cb_);
    if (v9_) return v9_->init(bench_logger);
    return v8_->init(bench_logger);
}

ncclResult_t NetPlugin::finalize()
{
    if (v12_) return v12_->finalize(ctx_);
    if (v11_) return v11_->finalize(ctx_);
    return ncclSuccess; // v8..v10 have no finalize
}

void NetPlugin::unload()
{
    if (lib_ != nullptr) dlclose(lib_);
    *this = NetPlugin();
}

ncclResult_t NetPlugin::devices(int *n) { return DISPATCH(devices, n); }

ncclResult_t NetPlugin::properties(int dev, DevProps *out)
{
    ncclResult_t r;
    auto copy = [&](const auto &p) {
        out->name = p.name ? p.name : "";
        out->pci_path = p.pciPath ? p.pciPath : "";
        out->speed_mbps = p.speed;
        out->max_recvs = p.maxRecvs;
        out->ptr_support = p.ptrSupport;
    };
    if (v12_) {
        ncclNetProperties_v12_t p{};
        if ((r = v12_->getProperties(dev, &p)) == ncclSuccess) copy(p);
    } else if (v11_) {
        ncclNetProperties_v11_t p{};
        if ((r = v11_->getProperties(dev, &p)) == ncclSuccess) copy(p);
    } else if (v10_) {
        ncclNetProperties_v10_t p{};
        if ((r = v10_->getProperties(dev, &p)) == ncclSuccess) copy(p);
    } else if (v9_) {
        ncclNetProperties_v9_t p{};
        if ((r = v9_->getProperties(dev, &p)) == ncclSuccess) copy(p);
    } else {
        ncclNetProperties_v8_t p{};
        if ((r = v8_->getProperties(dev, &p)) == ncclSuccess) copy(p);
    }
    return r;
}

ncclResult_t NetPlugin::listen(int dev, void *handle, void **lc)
{
    if (v12_) return v12_->listen(ctx_, dev, handle, lc);
    if (v11_) return v11_->listen(ctx_, dev, handle, lc);
    if (v10_) return v10_->listen(dev, handle, lc);
    if (v9_) return v9_->listen(dev, handle, lc);
    return v8_->listen(dev, handle, lc);
}

ncclResult_t NetPlugin::connect(int dev, void *handle, void **sc)
{
    // NCCL passes a pointer to a NULL device handle for host plugins (transport/net.cc:817).
    ncclNetDeviceHandle_t *dev_handle = nullptr;
    if (v12_) return v12_->connect(ctx_, dev, handle, sc, &dev_handle);
    if (v11_) return v11_->connect(ctx_, dev, handle, sc, &dev_handle);
    if (v10_) {
        ncclNetCommConfig_v10_t cfg{NCCL_NET_TRAFFIC_CLASS_UNDEF};
        return v10_->connect(dev, &cfg, handle, sc, &dev_handle);
    }
    if (v9_) return v9_->connect(dev, handle, sc, &dev_handle);
    return v8_->connect(dev, handle, sc, &dev_handle);
}

ncclResult_t NetPlugin::accept(void *lc, void **rc)
{
    ncclNetDeviceHandle_t *dev_handle = nullptr;
    return DISPATCH(accept, lc, rc, &dev_handle);
}

ncclResult_t NetPlugin::reg_mr(void *comm, void *data, size_t size, void **mh)
{
    return DISPATCH(regMr, comm, data, size, NCCL_PTR_HOST, mh);
}

ncclResult_t NetPlugin::dereg_mr(void *comm, void *mh) { return DISPATCH(deregMr, comm, mh); }

ncclResult_t NetPlugin::isend(void *sc, void *data, size_t size, int tag, void *mh, void **req, void *phandle)
{
    if (v12_) return v12_->isend(sc, data, size, tag, mh, phandle, req);
    if (v11_) return v11_->isend(sc, data, size, tag, mh, phandle, req);
    if (v10_) return v10_->isend(sc, data, size, tag, mh, phandle, req);
    if (v9_) return v9_->isend(sc, data, size, tag, mh, req);
    if (size > INT_MAX) return ncclInvalidArgument; // what NCCL's v8 shim does (net_v8.cc:58)
    return v8_->isend(sc, data, static_cast<int>(size), tag, mh, req);
}

ncclResult_t NetPlugin::irecv(void *rc, int n, void **data, size_t *sizes, int *tags, void **mhs,
                              void **req, void **phandles)
{
    // NCCL pre-loads (void*)0x1 for LL/LL128 receives; the plugin must overwrite it.
    *req = reinterpret_cast<void *>(0x1);
    if (v12_) return v12_->irecv(rc, n, data, sizes, tags, mhs, phandles, req);
    if (v11_) return v11_->irecv(rc, n, data, sizes, tags, mhs, phandles, req);
    if (v10_) return v10_->irecv(rc, n, data, sizes, tags, mhs, phandles, req);
    if (v9_) return v9_->irecv(rc, n, data, sizes, tags, mhs, req);
    int narrow[64];
    for (int i = 0; i < n && i < 64; ++i) {
        if (sizes[i] > INT_MAX) return ncclInvalidArgument;
        narrow[i] = static_cast<int>(sizes[i]);
    }
    return v8_->irecv(rc, n, data, narrow, tags, mhs, req);
}

ncclResult_t NetPlugin::test(void *req, int *done, int *sizes) { return DISPATCH(test, req, done, sizes); }
ncclResult_t NetPlugin::close_send(void *sc) { return DISPATCH(closeSend, sc); }
ncclResult_t NetPlugin::close_recv(void *rc) { return DISPATCH(closeRecv, rc); }
ncclResult_t NetPlugin::close_listen(void *lc) { return DISPATCH(closeListen, lc); }

} // namespace vigil::bench
