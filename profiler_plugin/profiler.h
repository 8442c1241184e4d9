// SPDX-License-Identifier: Apache-2.0
// The profiler core behind the ABI shims: init and finalize of communicator contexts
// (contexts.h) and the hot-path entry points (open, record state, close) on top of the Recorder.
//
// NCCL calls init once per communicator, from whatever thread creates it; the first init
// reads the VIGIL_PROFILE_* parameters, configures the recorder and starts the writer; the
// last finalize drains and stops it (NCCL 2.30.7 dlcloses the library after that, so no
// thread may outlive it). Event calls for one context arrive concurrently from the user
// thread, NCCL's launch thread and the proxy progress thread
// (docs/nccl-abi.md, "Profiler calls and handles"); every entry point here is safe for that.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "contexts.h"
#include "event.h"
#include "nccl_abi/nccl_common.h"

namespace vigil::prof {

/// init for every ABI version. Never fails: on a bad parameter it WARNs once and returns
/// success with a NULL context (whose events are ignored). Writes the process-wide mask.
ncclResult_t init(void **context, uint64_t comm_hash, int *mask, const char *name, int nnodes, int nranks,
                  int rank, ncclDebugLogger_t logfn, int abi);
/// finalize: flushes the context's collectives; the last one stops the writer.
ncclResult_t finalize(void *context);

/// Opens an event of `kind` for `context` with NCCL's `parent` handle, writes the handle to
/// *eHandle (NULL when the event is not recorded or dropped) and returns the record for the
/// shim to fill, or nullptr. `op_pid`: ProxyOp's pid (another process's op under PXN: its
/// context and parent pointers are not ours and are not touched). Hot path.
Record *open_event(void *context, Kind kind, void *parent, void **eHandle, int op_pid = 0) noexcept;

/// Whether a collective starting now will get KernelCh events: this profiler records them and
/// NCCL's activation mask (read live: RAS may change it after init, NCCL >= 2.31) has them on.
/// Hot path.
bool kernel_channels_due() noexcept;

/// recordEventState for every ABI version; `arg` is the state-args union's 8 bytes (0 when
/// NCCL passed NULL). Tolerates NULL and foreign handles. Hot path.
void record_state(void *eHandle, int state, uint64_t arg, bool has_arg) noexcept;
/// stopEvent for every ABI version. Tolerates NULL and foreign handles. Hot path.
void stop_event(void *eHandle) noexcept;

/// Drains and writes everything now (tests and fatal paths). Thread-safe.
void flush() noexcept;

} // namespace vigil::prof
