// SPDX-License-Identifier: Apache-2.0
// Profiler counters segment (see prof_metrics.h).
#include "prof_metrics.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "registry.h"

namespace vigil::telemetry {

namespace {
constexpr size_t segment_bytes() { return sizeof(ProfHeader) + kMaxComms * sizeof(CommEntry); }

struct TypeName {
    const char *func;
    const char *label;
};
constexpr TypeName kTypes[] = {
    {"AllReduce", "allreduce"}, {"AllGather", "allgather"}, {"ReduceScatter", "reducescatter"},
    {"Broadcast", "broadcast"}, {"Reduce", "reduce"},       {"Send", "send"},
    {"Recv", "recv"},           {"", "other"},
};
static_assert(sizeof(kTypes) / sizeof(kTypes[0]) == static_cast<size_t>(CollType::kCount));
} // namespace

CollType coll_type(const char *func) noexcept
{
    if (func != nullptr)
        for (size_t i = 0; i + 1 < sizeof(kTypes) / sizeof(kTypes[0]); ++i)
            if (std::strcmp(func, kTypes[i].func) == 0) return static_cast<CollType>(i);
    return CollType::kOther;
}

const char *coll_type_name(CollType t) noexcept
{
    const auto i = static_cast<size_t>(t);
    return i < sizeof(kTypes) / sizeof(kTypes[0]) ? kTypes[i].label : "other";
}

int ProfMetrics::open()
{
    if (hdr_ != nullptr) return 0;
    Segment seg;
    if (int rc = create_segment(kProfStem, segment_bytes(), &seg); rc != 0) return rc;
    auto *h = static_cast<ProfHeader *>(seg.base);
    std::memcpy(h->magic, kProfMagic, sizeof(h->magic));
    h->version = kProfVersion;
    h->header_size = sizeof(ProfHeader);
    h->entry_size = sizeof(CommEntry);
    h->max_comms = kMaxComms;
    h->pid = getpid();
    gethostname(h->host, sizeof(h->host) - 1);
    entries_ = reinterpret_cast<CommEntry *>(static_cast<char *>(seg.base) + sizeof(ProfHeader));
    seg_ = seg;
    hdr_ = h; // the fd stays open until close(): its flock marks the segment live
    return 0;
}

void ProfMetrics::close()
{
    if (hdr_ == nullptr) return;
    unlink(seg_.path.c_str());
    forget();
}

void ProfMetrics::forget()
{
    if (hdr_ == nullptr) return;
    munmap(seg_.base, seg_.size);
    ::close(seg_.fd);
    hdr_ = nullptr;
    entries_ = nullptr;
    seg_ = Segment{};
}

CommEntry *ProfMetrics::add_comm(uint64_t comm_hash, const char *name, int rank, int nranks)
{
    if (hdr_ == nullptr) return nullptr;
    const uint32_t i = hdr_->comms_used.load(std::memory_order_relaxed);
    if (i >= kMaxComms) return nullptr;
    CommEntry &e = entries_[i];
    e.rank = rank;
    e.nranks = nranks;
    e.comm_hash = comm_hash;
    std::memset(e.name, 0, sizeof(e.name));
    std::strncpy(e.name, name ? name : "", sizeof(e.name) - 1);
    e.in_use.store(1, std::memory_order_release);
    hdr_->comms_used.store(i + 1, std::memory_order_release);
    return &e;
}

void ProfMetrics::finalize_comm(CommEntry *e)
{
    if (e != nullptr) e->in_use.store(2, std::memory_order_release);
}

void ProfMetrics::count(CommEntry *e, const char *func, uint64_t bytes, uint64_t duration_ns, double busbw_Bps)
{
    if (e == nullptr) return;
    CollCounters &c = e->types[static_cast<int>(coll_type(func))];
    // Single producer: load + store is enough, and readers never see a torn value.
    c.count.store(c.count.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    c.bytes.store(c.bytes.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
    c.time_ns.store(c.time_ns.load(std::memory_order_relaxed) + duration_ns, std::memory_order_relaxed);
    if (duration_ns) c.busbw_Bps.store(static_cast<uint64_t>(busbw_Bps), std::memory_order_relaxed);
}

void ProfMetrics::set_totals(uint64_t events, uint64_t dropped)
{
    if (hdr_ == nullptr) return;
    hdr_->events.store(events, std::memory_order_relaxed);
    hdr_->dropped.store(dropped, std::memory_order_relaxed);
}

ProfView::~ProfView()
{
    if (base_ != nullptr) munmap(base_, size_);
}

int ProfView::open(const std::string &file, std::string *why)
{
    if (int rc = map_segment_readonly(file, sizeof(ProfHeader), &base_, &size_, why); rc != 0) return rc;
    hdr_ = static_cast<const ProfHeader *>(base_);
    if (std::memcmp(hdr_->magic, kProfMagic, sizeof(kProfMagic)) != 0) return *why = "bad magic", -EBADMSG;
    if (hdr_->version != kProfVersion) return *why = "unsupported version", -EBADMSG;
    if (hdr_->header_size != sizeof(ProfHeader) || hdr_->entry_size != sizeof(CommEntry) || hdr_->max_comms == 0 ||
        hdr_->max_comms > kMaxComms || size_ < sizeof(ProfHeader) + hdr_->max_comms * sizeof(CommEntry))
        return *why = "layout differs from this build", -EBADMSG;
    return 0;
}

uint32_t ProfView::entries() const
{
    return std::min(hdr_->comms_used.load(std::memory_order_acquire), hdr_->max_comms);
}

const CommEntry &ProfView::entry(uint32_t i) const
{
    return reinterpret_cast<const CommEntry *>(static_cast<const char *>(base_) + sizeof(ProfHeader))[i];
}

} // namespace vigil::telemetry
