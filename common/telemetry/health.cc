// SPDX-License-Identifier: Apache-2.0
// Per-device health from the telemetry registry; the tuner status segment's reader.
#include "health.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>
#include <vector>
#include <sys/mman.h>

namespace vigil::telemetry {

double DeviceHealth::fraction() const
{
    if (failed) return 0.0;
    if (!degraded) return 1.0;
    if (baseline_bps <= 0) return 1.0;
    return std::clamp(judged_bps / baseline_bps, 0.0, 1.0);
}

double ProcessHealth::effective_fraction() const
{
    if (devices.empty()) return 1.0;
    if (multipath) {
        double sum = 0;
        for (const DeviceHealth &d : devices) sum += d.fraction();
        return sum / static_cast<double>(devices.size());
    }
    double f = 1.0;
    size_t failed = 0;
    for (const DeviceHealth &d : devices) {
        if (d.failed) ++failed;
        else if (d.degraded) f = std::min(f, d.fraction());
    }
    return std::min(f, static_cast<double>(devices.size() - failed) / static_cast<double>(devices.size()));
}

ProcessHealth read_health(const RegistryView &view)
{
    const RegistryHeader &h = view.header();
    ProcessHealth out;
    out.host.assign(h.host, strnlen(h.host, sizeof(h.host)));
    out.pid = h.pid;
    std::map<uint32_t, DeviceHealth> devs;
    std::map<uint64_t, int> carrying; // connection -> its send paths that are active
    for (uint32_t i = 0; i < view.entries(); ++i) {
        const PathEntry &e = view.entry(i);
        if (e.in_use.load(std::memory_order_acquire) != 1) continue;
        DeviceHealth &d = devs[e.dev];
        d.dev = e.dev;
        if (d.name.empty()) d.name.assign(e.dev_name, strnlen(e.dev_name, sizeof(e.dev_name)));
        ++d.paths;
        d.failovers += e.failovers.load(std::memory_order_relaxed);
        const uint8_t state = e.state.load(std::memory_order_acquire);
        if (state == kActive && e.kind == 0 && ++carrying[e.conn_id] > 1) out.multipath = true;
        if (state == kDead) {
            d.failed = true;
            continue;
        }
        if (e.degraded.load(std::memory_order_acquire) == 0) continue;
        d.degraded = true;
        // The episode's evidence: the judged value and baseline of the window that flagged
        // the path. What the path measures afterwards is not its port's rate: under multipath
        // a degraded path carries only what the striper leaves it, now and then a few pieces
        // at its burst rate, and its newest windows swung from a tenth of the baseline to
        // above it while the port stayed cut; each swing was another fraction in the tuner's
        // view.
        double judged = static_cast<double>(e.verdict_judged_bps.load(std::memory_order_relaxed));
        double base = static_cast<double>(e.verdict_baseline_bps.load(std::memory_order_acquire));
        if (judged == 0 || base == 0) {
            // A writer without those fields: the median of the judged values over the ring's
            // windows of the episode (flagged, with a judged value and a baseline).
            const uint64_t head = e.ring.head.load(std::memory_order_acquire);
            std::vector<std::pair<double, WindowRecord>> flagged; // judged / baseline, window
            WindowRecord w{};
            for (uint64_t k = head; k-- > 0 && head - k <= kRingCapacity;)
                if (RegistryView::read(e, k, &w) && w.degraded != 0 && w.baseline_bps != 0 && w.judged_bps != 0)
                    flagged.emplace_back(static_cast<double>(w.judged_bps) / static_cast<double>(w.baseline_bps), w);
            if (flagged.empty()) continue;
            auto mid = flagged.begin() + static_cast<std::ptrdiff_t>(flagged.size() / 2);
            std::nth_element(flagged.begin(), mid, flagged.end(),
                             [](const auto &a, const auto &b) { return a.first < b.first; });
            judged = static_cast<double>(mid->second.judged_bps);
            base = static_cast<double>(mid->second.baseline_bps);
        }
        if (d.baseline_bps == 0 || judged / base < d.judged_bps / d.baseline_bps) {
            d.judged_bps = judged;
            d.baseline_bps = base;
        }
    }
    for (auto &[dev, d] : devs) out.devices.push_back(d);
    return out;
}

int read_process_health(int pid, ProcessHealth *out, std::string *why)
{
    int rc = -ENOENT;
    *why = "no telemetry registry for this process";
    for (const std::string &file : list_registries()) {
        // Cheap filter on the name ("vigil-<uid>-<pid>-<hex>"); the header decides.
        char tag[24];
        std::snprintf(tag, sizeof(tag), "-%d-", pid);
        if (file.find(tag) == std::string::npos) continue;
        RegistryView v;
        std::string w;
        if (int r = v.open(file, &w); r != 0) {
            rc = r;
            why->assign(file).append(": ").append(w);
            continue;
        }
        if (v.header().pid != pid) continue;
        *out = read_health(v);
        return 0;
    }
    return rc;
}

std::vector<ProcessHealth> read_all_health()
{
    std::vector<ProcessHealth> out;
    for (const std::string &file : list_registries()) {
        RegistryView v;
        std::string why;
        if (v.open(file, &why) != 0) continue;
        out.push_back(read_health(v));
    }
    return out;
}

std::vector<TunerProcessStatus> read_tuner_status(bool all_users, int *refused)
{
    std::vector<TunerProcessStatus> out;
    reap_stale_segments(kTunerStatusStem, all_users);
    for (const std::string &file : list_segments(kTunerStatusStem, all_users)) {
        void *base = nullptr;
        size_t size = 0;
        std::string why;
        if (map_segment_readonly(file, sizeof(TunerStatusHeader), &base, &size, &why) != 0) {
            if (refused != nullptr && segment_settled(file)) ++*refused;
            continue;
        }
        const auto *h = static_cast<const TunerStatusHeader *>(base);
        if (std::memcmp(h->magic, kTunerStatusMagic, sizeof(kTunerStatusMagic)) != 0 ||
            h->version != kTunerStatusVersion || h->header_size != sizeof(TunerStatusHeader) ||
            h->entry_size != sizeof(TunerCommStatus) || h->max_comms != kMaxTunerComms || size < tuner_status_bytes()) {
            munmap(base, size);
            if (refused != nullptr && segment_settled(file)) ++*refused;
            continue;
        }
        TunerProcessStatus p;
        p.host.assign(h->host, strnlen(h->host, sizeof(h->host)));
        p.pid = h->pid;
        const auto *entries = reinterpret_cast<const TunerCommStatus *>(static_cast<const char *>(base) + sizeof(*h));
        const uint32_t used = std::min(h->comms_used.load(std::memory_order_acquire), kMaxTunerComms);
        for (uint32_t i = 0; i < used; ++i) {
            const TunerCommStatus &e = entries[i];
            if (e.in_use.load(std::memory_order_acquire) == 0) continue;
            for (int tries = 0; tries < 100; ++tries) {
                const uint32_t a = e.seq.load(std::memory_order_acquire);
                if (a & 1) continue;
                alignas(TunerCommStatus) unsigned char raw[sizeof(TunerCommStatus)];
                std::memcpy(raw, static_cast<const void *>(&e), sizeof(raw));
                std::atomic_thread_fence(std::memory_order_acquire);
                if (e.seq.load(std::memory_order_relaxed) != a) continue;
                const auto *c = reinterpret_cast<const TunerCommStatus *>(raw);
                TunerCommSnapshot s;
                s.finalized = e.in_use.load(std::memory_order_relaxed) == 2;
                s.comm = c->comm;
                s.nranks = c->nranks;
                s.nnodes = c->nnodes;
                s.abi = c->abi;
                s.steering = c->steering != 0;
                s.state = c->state;
                s.permille = c->permille;
                s.degraded_nics = c->degraded_nics;
                s.failed_nics = c->failed_nics;
                s.block = c->block;
                s.calls = c->calls;
                s.view_block = c->view_block;
                s.view_changes = c->view_changes;
                s.waits = c->waits;
                s.wait_ns = c->wait_ns;
                s.steered = c->steered;
                s.source.assign(c->source, strnlen(c->source, sizeof(c->source)));
                s.store.assign(c->store, strnlen(c->store, sizeof(c->store)));
                p.comms.push_back(std::move(s));
                break;
            }
        }
        munmap(base, size);
        out.push_back(std::move(p));
    }
    return out;
}

} // namespace vigil::telemetry
