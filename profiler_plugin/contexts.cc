// SPDX-License-Identifier: Apache-2.0
// The profiler's shared tables: communicator contexts, the event selection, the clock offset.
#include "contexts.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string_view>

namespace vigil::prof {

namespace {

Context g_contexts[kMaxContexts];
int64_t g_mono_to_real = 0;

struct Name {
    std::string_view word;
    uint32_t bits;
};
constexpr Name kNames[] = {
    {"group", bit(Kind::kGroup)},
    {"coll", bit(Kind::kColl)},
    {"p2p", bit(Kind::kP2p)},
    {"proxy-op", bit(Kind::kProxyOp)},
    {"proxy-step", bit(Kind::kProxyStep)},
    {"proxy-ctrl", bit(Kind::kProxyCtrl)},
    {"kernel-ch", bit(Kind::kKernelCh)},
    {"kernel-phase", bit(Kind::kKernelPhase)},
    {"net", bit(Kind::kNet)},
    {"api", bit(Kind::kGroupApi) | bit(Kind::kCollApi) | bit(Kind::kP2pApi) | bit(Kind::kKernelLaunch)},
};
constexpr uint32_t kAll = ((1u << static_cast<unsigned>(Kind::kLegacyCount)) - 1) | bit(Kind::kKernelPhase);

int64_t calibrate()
{
    // The tightest of several realtime reads bracketed by monotonic ones.
    int64_t best_span = INT64_MAX, offset = 0;
    for (int i = 0; i < 16; ++i) {
        timespec a, r, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        clock_gettime(CLOCK_REALTIME, &r);
        clock_gettime(CLOCK_MONOTONIC, &b);
        const int64_t ma = a.tv_sec * 1'000'000'000ll + a.tv_nsec, mb = b.tv_sec * 1'000'000'000ll + b.tv_nsec;
        const int64_t rr = r.tv_sec * 1'000'000'000ll + r.tv_nsec;
        if (mb - ma < best_span) {
            best_span = mb - ma;
            offset = rr - (ma + (mb - ma) / 2);
        }
    }
    return offset;
}

} // namespace

bool parse_events(const std::string &text, Selection *out, std::string *why)
{
    uint32_t mask = 0;
    std::string_view s = text;
    if (!s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos) {
        char *end = nullptr;
        const unsigned long v = std::strtoul(text.c_str(), &end, 10);
        if (v > 0xffff) {
            *why = "mask " + text + " has bits beyond NCCL's event types (0-15)";
            return false;
        }
        mask = static_cast<uint32_t>(v) & kAll; // CE bits (12-14): never recorded
    } else {
        while (!s.empty()) {
            const size_t comma = s.find(',');
            std::string_view w = s.substr(0, comma);
            s = comma == std::string_view::npos ? std::string_view{} : s.substr(comma + 1);
            while (!w.empty() && std::isspace(static_cast<unsigned char>(w.front()))) w.remove_prefix(1);
            while (!w.empty() && std::isspace(static_cast<unsigned char>(w.back()))) w.remove_suffix(1);
            if (w.empty()) continue;
            if (w == "all") {
                mask = kAll;
                continue;
            }
            bool found = false;
            for (const Name &n : kNames)
                if (n.word == w) {
                    mask |= n.bits;
                    found = true;
                }
            if (!found) {
                *why = "unknown event type '" + std::string(w) +
                       "' (known: group, coll, p2p, proxy-op, proxy-step, proxy-ctrl, kernel-ch, kernel-phase, "
                       "net, api, all)";
                return false;
            }
        }
    }
    uint32_t rec = mask;
    // Every event below a collective is tied back to it, and the summary needs the
    // collective, so Coll/P2p are always recorded. Net events are children of proxy steps
    // (the net plugin never starts one without its parent), steps of proxy ops.
    if (rec & bit(Kind::kNet)) rec |= bit(Kind::kProxyStep);
    // A phase is tied to its collective through its kernel channel (NCCL >= 2.31 forces
    // kernel-channel events on with phases, too).
    if (rec & bit(Kind::kKernelPhase)) rec |= bit(Kind::kKernelCh);
    if (rec & bit(Kind::kProxyStep)) rec |= bit(Kind::kProxyOp);
    rec |= bit(Kind::kColl) | bit(Kind::kP2p);
    // The user's call (CollApi/P2pApi start, v5+) is a collective's enqueue time, the start
    // of its queueing (docs/profiler.md, "Timing"): one more event per collective.
    rec |= bit(Kind::kCollApi) | bit(Kind::kP2pApi);
    // NCCL 2.27 (v4 native) starts no Coll/P2p when the Group handle is NULL
    // (docs/nccl-abi.md, "Profiler calls and handles"), so groups get real handles too.
    rec |= bit(Kind::kGroup);
    out->traced = mask;
    out->recorded = rec;
    return true;
}

std::string events_text(uint32_t mask)
{
    std::string s;
    uint32_t named = 0;
    for (const Name &n : kNames)
        if ((mask & n.bits) == n.bits) {
            // Appends, not `"," + std::string`: a bogus GCC 12 -Wrestrict at -O3 (bug 105329).
            if (!s.empty()) s += ',';
            s += n.word;
            named |= n.bits;
        }
    if (const uint32_t rest = mask & ~named) { // e.g. one API bit of a numeric mask
        char b[16];
        std::snprintf(b, sizeof(b), "0x%x", rest);
        if (!s.empty()) s += ',';
        s += b;
    }
    return s.empty() ? "none" : s;
}

Context *context_of(void *p) noexcept
{
    const auto a = reinterpret_cast<uintptr_t>(p);
    const auto lo = reinterpret_cast<uintptr_t>(&g_contexts[0]);
    const auto hi = reinterpret_cast<uintptr_t>(&g_contexts[kMaxContexts]);
    if (a < lo || a >= hi || (a - lo) % sizeof(Context) != 0) return nullptr;
    Context *c = static_cast<Context *>(p);
    return c->magic == kContextMagic && c->live.load(std::memory_order_acquire) ? c : nullptr;
}

const Context *context_at(uint16_t i) noexcept
{
    return i > 0 && i < kMaxContexts && g_contexts[i].magic == kContextMagic ? &g_contexts[i] : nullptr;
}

Context *free_context() noexcept
{
    for (uint16_t i = 1; i < kMaxContexts; ++i)
        if (g_contexts[i].magic == 0 || !g_contexts[i].live.load(std::memory_order_relaxed)) {
            g_contexts[i].index = i;
            return &g_contexts[i];
        }
    return nullptr;
}

int64_t mono_to_realtime_ns() noexcept { return g_mono_to_real; }

void calibrate_clock() noexcept
{
    if (g_mono_to_real == 0) g_mono_to_real = calibrate();
}

} // namespace vigil::prof
