// SPDX-License-Identifier: Apache-2.0
// What the profiler's core (profiler.cc) and its writer (writer.cc) share, below both: the
// table of communicator contexts, the event selection (VIGIL_PROFILE_EVENTS as NCCL mask
// bits) and the monotonic-to-realtime clock offset. Neither of them includes the other.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "event.h"

namespace vigil::prof {

inline constexpr uint16_t kMaxContexts = 1024;

/// One communicator, as its init described it. Lives in a static table for the life of the
/// process (never freed, so a late event naming a finalized context is harmless).
/// Thread-safe: written once in init before `live` is set, read-only afterwards.
struct Context {
    uint32_t magic = 0; ///< kContextMagic once initialised
    uint16_t index = 0;
    uint64_t comm_hash = 0;
    char name[64] = {};
    int rank = -1;
    int nranks = 0;
    int nnodes = 0;
    int abi = 0; ///< profiler ABI version the communicator came through (4 to 7)
    uint64_t init_ns = 0;
    std::atomic<bool> live{false};
};
inline constexpr uint32_t kContextMagic = 0x56474c43; // "VGLC"

/// The context `p` (a value NCCL passes back) if it is one of ours, else nullptr.
Context *context_of(void *p) noexcept;
/// Context number `i` (0 = unknown), or nullptr.
const Context *context_at(uint16_t i) noexcept;
/// A free context slot (never used, or finalized: NCCL sends nothing for a finalized
/// communicator, and its records were drained at finalize), or nullptr when all
/// kMaxContexts - 1 are live. The caller fills it, sets `magic` and then `live`; calls are
/// serialised by the caller (init's lock).
Context *free_context() noexcept;

/// What VIGIL_PROFILE_EVENTS selects, as NCCL mask bits. `recorded` adds the kinds the
/// selected ones need (parents that carry the collective, proxy steps that parent net
/// events); `traced` is what the trace shows. Returns false with *why on a bad list.
struct Selection {
    uint32_t traced = 0;
    uint32_t recorded = 0;
};
bool parse_events(const std::string &text, Selection *out, std::string *why);
/// The list form of a mask ("coll,p2p,..."), for logs and the summary.
std::string events_text(uint32_t mask);

/// Offset to add to a CLOCK_MONOTONIC time to get CLOCK_REALTIME (ns), measured at the
/// first init as the midpoint of the tightest of several bracketed reads.
int64_t mono_to_realtime_ns() noexcept;
/// Measures the offset mono_to_realtime_ns() returns, once (later calls keep it). Serialised
/// by the caller (init's lock).
void calibrate_clock() noexcept;

} // namespace vigil::prof
