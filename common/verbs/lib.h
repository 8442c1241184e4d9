// SPDX-License-Identifier: Apache-2.0
// libibverbs opened at run time: the plugins never link it, so they load on GPU nodes that
// have no RDMA stack (NCCL opens libibverbs the same way, src/misc/ibvwrap.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <infiniband/verbs.h>

namespace vigil::verbs {

/// The libibverbs entry points Vigil calls, resolved with dlsym from libibverbs.so.1. The
/// data-path verbs (post_send, post_recv, poll_cq, req_notify_cq) are not here: rdma-core
/// implements them inline through the context's provider ops, which need no symbol.
/// Members are plain function pointers with libibverbs' own signatures; `query_gid_table`
/// (rdma-core >= 33) and `reg_dmabuf_mr` (>= 34) are nullptr where the library lacks them.
/// Filled once by library(); immutable afterwards, so thread-safe to read.
struct Lib {
    ibv_device **(*get_device_list)(int *num_devices);
    void (*free_device_list)(ibv_device **list);
    const char *(*get_device_name)(ibv_device *device);
    ibv_context *(*open_device)(ibv_device *device);
    int (*close_device)(ibv_context *context);
    int (*query_device)(ibv_context *context, ibv_device_attr *device_attr);
    /// The exported ibv_query_port, which takes the compat (pre-extension) port attributes;
    /// use verbs::query_port below, which prefers the provider's extended query as
    /// rdma-core's inline ibv_query_port does.
    int (*query_port_compat)(ibv_context *context, uint8_t port_num, ibv_port_attr *port_attr);
    int (*query_gid)(ibv_context *context, uint8_t port_num, int index, ibv_gid *gid);
    ssize_t (*query_gid_table)(ibv_context *context, ibv_gid_entry *entries, size_t max_entries,
                               uint32_t flags, size_t entry_size);
    ibv_pd *(*alloc_pd)(ibv_context *context);
    int (*dealloc_pd)(ibv_pd *pd);
    ibv_mr *(*reg_mr)(ibv_pd *pd, void *addr, size_t length, int access);
    ibv_mr *(*reg_dmabuf_mr)(ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                             int access);
    int (*dereg_mr)(ibv_mr *mr);
    ibv_comp_channel *(*create_comp_channel)(ibv_context *context);
    int (*destroy_comp_channel)(ibv_comp_channel *channel);
    ibv_cq *(*create_cq)(ibv_context *context, int cqe, void *cq_context,
                         ibv_comp_channel *channel, int comp_vector);
    int (*destroy_cq)(ibv_cq *cq);
    int (*get_cq_event)(ibv_comp_channel *channel, ibv_cq **cq, void **cq_context);
    void (*ack_cq_events)(ibv_cq *cq, unsigned int nevents);
    ibv_qp *(*create_qp)(ibv_pd *pd, ibv_qp_init_attr *qp_init_attr);
    int (*modify_qp)(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask);
    int (*query_qp)(ibv_qp *qp, ibv_qp_attr *attr, int attr_mask, ibv_qp_init_attr *init_attr);
    int (*destroy_qp)(ibv_qp *qp);
    int (*get_async_event)(ibv_context *context, ibv_async_event *event);
    void (*ack_async_event)(ibv_async_event *event);
};

/// Opens libibverbs.so.1 and resolves Lib on the first call; later calls return the same
/// answer. Returns the table, or nullptr with *why (when given) saying what failed: the
/// dlopen error, or the first required symbol that is missing. Thread-safe.
const Lib *library(std::string *why = nullptr) noexcept;

/// The table; only after library() returned non-null (every verbs object comes from a
/// device list, which needs it). Thread-safe.
const Lib &lib() noexcept;

/// ibv_query_port as rdma-core's inline wrapper does it: the provider's extended query when
/// the context has one (it fills every field of this rdma-core's ibv_port_attr), else the
/// exported compat call on a zeroed struct. Returns the verb's raw result (0 or an errno
/// value; see errno_rc()).
int query_port(ibv_context *context, uint8_t port, ibv_port_attr *attr) noexcept;

} // namespace vigil::verbs
