// SPDX-License-Identifier: Apache-2.0
// libibverbs.so.1 opened with dlopen, its entry points resolved with dlsym.
#include "lib.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>

namespace vigil::verbs {
namespace {

struct Loaded {
    Lib lib{};
    const Lib *table = nullptr; // &lib once every required symbol resolved
    std::string why;
};

// Resolves `name` into *slot. Symbols that libibverbs also exports in their pre-1.1 ABI are
// asked for at IBVERBS_1.1, the version this header's structures belong to (the default
// one, which NCCL asks for by name too); newer ones have a single version.
template <typename Fn>
bool resolve(void *handle, const char *name, const char *version, Fn *slot, std::string *why)
{
    void *sym = version != nullptr ? dlvsym(handle, name, version) : dlsym(handle, name);
    *slot = reinterpret_cast<Fn>(sym);
    if (sym != nullptr || why == nullptr) return sym != nullptr;
    *why = std::string("libibverbs.so.1 lacks ") + name;
    return false;
}

void load(Loaded *out)
{
    // RTLD_NODELETE: the verbs objects Vigil creates outlive any single user of this table.
    void *h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h == nullptr) {
        const char *e = dlerror();
        out->why = e != nullptr ? e : "libibverbs.so.1: cannot open";
        return;
    }
    Lib &l = out->lib;
    std::string *w = &out->why;
    const char *v11 = "IBVERBS_1.1";
    bool ok = resolve(h, "ibv_get_device_list", v11, &l.get_device_list, w) &&
              resolve(h, "ibv_free_device_list", v11, &l.free_device_list, w) &&
              resolve(h, "ibv_get_device_name", v11, &l.get_device_name, w) &&
              resolve(h, "ibv_open_device", v11, &l.open_device, w) &&
              resolve(h, "ibv_close_device", v11, &l.close_device, w) &&
              resolve(h, "ibv_query_device", v11, &l.query_device, w) &&
              resolve(h, "ibv_query_port", v11, &l.query_port_compat, w) &&
              resolve(h, "ibv_query_gid", v11, &l.query_gid, w) &&
              resolve(h, "ibv_alloc_pd", v11, &l.alloc_pd, w) &&
              resolve(h, "ibv_dealloc_pd", v11, &l.dealloc_pd, w) &&
              resolve(h, "ibv_reg_mr", v11, &l.reg_mr, w) &&
              resolve(h, "ibv_dereg_mr", v11, &l.dereg_mr, w) &&
              resolve(h, "ibv_create_comp_channel", nullptr, &l.create_comp_channel, w) &&
              resolve(h, "ibv_destroy_comp_channel", nullptr, &l.destroy_comp_channel, w) &&
              resolve(h, "ibv_create_cq", v11, &l.create_cq, w) &&
              resolve(h, "ibv_destroy_cq", v11, &l.destroy_cq, w) &&
              resolve(h, "ibv_get_cq_event", v11, &l.get_cq_event, w) &&
              resolve(h, "ibv_ack_cq_events", v11, &l.ack_cq_events, w) &&
              resolve(h, "ibv_create_qp", v11, &l.create_qp, w) &&
              resolve(h, "ibv_modify_qp", v11, &l.modify_qp, w) &&
              resolve(h, "ibv_query_qp", v11, &l.query_qp, w) &&
              resolve(h, "ibv_destroy_qp", v11, &l.destroy_qp, w) &&
              resolve(h, "ibv_get_async_event", v11, &l.get_async_event, w) &&
              resolve(h, "ibv_ack_async_event", v11, &l.ack_async_event, w);
    if (!ok) return; // the library stays open (NODELETE); nothing of it is used
    // Optional: older rdma-core lacks them, and the callers fall back.
    resolve(h, "_ibv_query_gid_table", nullptr, &l.query_gid_table, nullptr);
    resolve(h, "ibv_reg_dmabuf_mr", nullptr, &l.reg_dmabuf_mr, nullptr);
    out->table = &l;
}

Loaded &loaded()
{
    static Loaded state;
    static std::once_flag once;
    std::call_once(once, [] { load(&state); });
    return state;
}

} // namespace

const Lib *library(std::string *why) noexcept
{
    try {
        Loaded &s = loaded();
        if (s.table == nullptr && why != nullptr) *why = s.why;
        return s.table;
    } catch (...) { // std::system_error from call_once, std::bad_alloc from the strings
        if (why != nullptr) *why = "libibverbs.so.1: loading failed";
        return nullptr;
    }
}

const Lib &lib() noexcept
{
    return loaded().lib;
}

int query_port(ibv_context *context, uint8_t port, ibv_port_attr *attr) noexcept
{
    if (verbs_context *vctx = verbs_get_ctx_op(context, query_port)) {
        return vctx->query_port(context, port, attr, sizeof *attr);
    }
    std::memset(attr, 0, sizeof *attr);
    return lib().query_port_compat(context, port, attr);
}

} // namespace vigil::verbs
