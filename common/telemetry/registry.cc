// SPDX-License-Identifier: Apache-2.0
// Telemetry registry: shared-memory segment, per-path rings, readers, stale reaping.
#include "registry.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string_view>
#include <dirent.h>
#include <fcntl.h>
#include <mutex>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "writer.h"

namespace vigil::telemetry {
namespace {

std::mutex g_mu;

// Seconds after its last change before a segment is judged: one younger may be one whose
// owner has created it and not yet locked it or written its header.
constexpr time_t kSettleS = 2;

std::string prefix(const char *stem)
{
    return std::string("/dev/shm/") + stem + "-" + std::to_string(getuid()) + "-";
}

void copy_str(char *dst, size_t n, const std::string &s)
{
    std::memset(dst, 0, n);
    std::memcpy(dst, s.data(), std::min(n - 1, s.size()));
}

} // namespace

bool pid_alive(int pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

namespace {

bool digits(std::string_view s)
{
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "<digits>-<16 hex>" after the prefix: only names open() creates. With `uid`, the prefix
// stopped before the uid: "<digits>-" comes first.
bool segment_name(std::string_view rest, bool uid)
{
    if (uid) {
        const size_t dash = rest.find('-');
        if (dash == std::string_view::npos || !digits(rest.substr(0, dash))) return false;
        rest.remove_prefix(dash + 1);
    }
    const size_t dash = rest.find('-');
    if (dash == std::string_view::npos || !digits(rest.substr(0, dash)) ||
        rest.size() - dash - 1 != 16)
        return false;
    return std::all_of(rest.begin() + static_cast<std::ptrdiff_t>(dash) + 1, rest.end(),
                       [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
}

} // namespace

std::vector<std::string> list_segments(const char *stem, bool all_users)
{
    std::vector<std::string> out;
    const std::string base = all_users ? std::string(stem) + "-"
                                       : prefix(stem).substr(std::string("/dev/shm/").size());
    DIR *d = opendir("/dev/shm");
    if (d == nullptr) return out;
    while (dirent *e = readdir(d)) {
        const std::string name = e->d_name;
        if (name.rfind(base, 0) == 0 &&
            segment_name(std::string_view(name).substr(base.size()), all_users))
            out.push_back("/dev/shm/" + name);
    }
    closedir(d);
    return out;
}

std::vector<std::string> list_registries(bool all_users)
{
    return list_segments(kRegistryStem, all_users);
}

int reap_stale(bool all_users) { return reap_stale_segments(kRegistryStem, all_users); }

bool segment_settled(const std::string &file)
{
    struct stat st;
    return stat(file.c_str(), &st) == 0 && time(nullptr) - st.st_mtime >= kSettleS;
}

int reap_stale_segments(const char *stem, bool all_users)
{
    int n = 0;
    for (const std::string &f : list_segments(stem, all_users)) {
        int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) continue;
        // The owner holds LOCK_SH for its lifetime: an exclusive lock means nobody does. A
        // segment modified less than 2 s ago may be one whose owner has created it and not
        // locked it yet (create_segment: open, then flock), so it is left for a later pass.
        struct stat st;
        const bool young = fstat(fd, &st) != 0 || time(nullptr) - st.st_mtime < kSettleS;
        if (!young && flock(fd, LOCK_EX | LOCK_NB) == 0 && unlink(f.c_str()) == 0) ++n;
        ::close(fd);
    }
    return n;
}

Registry &Registry::instance()
{
    static Registry *r = new Registry; // never destroyed: windows may be pushed at exit
    return *r;
}

int create_segment(const char *stem, size_t size, Segment *out)
{
    reap_stale_segments(stem);
    uint64_t token = 0;
    getrandom(&token, sizeof(token), 0);
    char suffix[32];
    std::snprintf(suffix, sizeof(suffix), "%d-%016llx", static_cast<int>(getpid()),
                  static_cast<unsigned long long>(token));
    const std::string path = prefix(stem) + suffix;
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return -errno;
    fchmod(fd, 0600); // owner-only whatever the umask
    flock(fd, LOCK_SH);
    // Reserve the memory now: a tmpfs that runs out later would SIGBUS the data path.
    if (int rc = posix_fallocate(fd, 0, static_cast<off_t>(size)); rc != 0) {
        ::close(fd);
        unlink(path.c_str());
        return -rc;
    }
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int rc = -errno;
        ::close(fd);
        unlink(path.c_str());
        return rc;
    }
    out->path = path;
    out->base = p;
    out->size = size;
    out->fd = fd;
    return 0;
}

int Registry::open(uint64_t window_ns, int rank)
{
    std::lock_guard<std::mutex> g(g_mu);
    if (base_.load() != nullptr) return 0;
    Segment seg;
    if (int rc = create_segment(kRegistryStem, registry_bytes(kMaxRegistryPaths), &seg); rc != 0) return rc;
    path_ = seg.path;
    size_ = seg.size;
    fd_ = seg.fd;
    void *p = seg.base;
    auto *h = static_cast<RegistryHeader *>(p);
    std::memcpy(h->magic, kRegistryMagic, sizeof(h->magic));
    h->version = kRegistryVersion;
    h->header_size = sizeof(RegistryHeader);
    h->entry_size = sizeof(PathEntry);
    h->max_paths = kMaxRegistryPaths;
    h->ring_capacity = kRingCapacity;
    h->record_size = sizeof(WindowRecord);
    h->pid = getpid();
    h->rank = rank >= 0 ? rank : launcher_rank();
    h->start_ns = now_ns();
    h->window_ns = window_ns;
    char host[64] = {};
    gethostname(host, sizeof(host) - 1);
    copy_str(h->host, sizeof(h->host), host);
    window_ns_ = window_ns;
    base_.store(p, std::memory_order_release);
    return 0;
}

PathEntry *Registry::acquire(int kind, int slot, int dev, const std::string &dev_name,
                             const std::string &local, const std::string &peer, uint64_t conn_id)
{
    void *base = base_.load(std::memory_order_acquire);
    if (base == nullptr) return nullptr;
    std::lock_guard<std::mutex> g(g_mu);
    auto *h = static_cast<RegistryHeader *>(base);
    auto *entries = reinterpret_cast<PathEntry *>(static_cast<char *>(base) + sizeof(RegistryHeader));
    for (uint32_t i = 0; i < kMaxRegistryPaths; ++i) {
        PathEntry &e = entries[i];
        if (e.in_use.load(std::memory_order_acquire) != 0) continue;
        e.kind = static_cast<uint8_t>(kind);
        e.slot = static_cast<uint8_t>(slot);
        e.state.store(kActive);
        e.degraded.store(0);
        e.generation.store(1);
        e.dev = static_cast<uint32_t>(dev);
        e.conn_id = conn_id;
        copy_str(e.dev_name, sizeof(e.dev_name), dev_name);
        copy_str(e.local, sizeof(e.local), local);
        copy_str(e.peer, sizeof(e.peer), peer);
        e.total_bytes.store(0);
        e.total_ops.store(0);
        e.failovers.store(0);
        e.failbacks.store(0);
        e.degraded_verdicts.store(0);
        e.verdict_judged_bps.store(0);
        e.verdict_baseline_bps.store(0);
        e.ring.head.store(0);
        e.ring.tail.store(0);
        e.ring.dropped.store(0);
        e.ring.consumer_pid.store(0);
        e.ring.capacity = kRingCapacity;
        // The device's totals, named before the first window can reach them (its name is
        // the one of the first path on it: a device index never changes its name).
        if (dev >= 0 && static_cast<uint32_t>(dev) < kMaxRegistryDevices) {
            DeviceTotals &t = h->devices[dev];
            if (t.name[0] == '\0') copy_str(t.name, sizeof(t.name), dev_name);
            if (static_cast<uint32_t>(dev) + 1 > h->devices_used.load())
                h->devices_used.store(static_cast<uint32_t>(dev) + 1, std::memory_order_release);
        }
        e.in_use.store(1, std::memory_order_release);
        if (i + 1 > h->paths_used.load()) h->paths_used.store(i + 1, std::memory_order_release);
        return &e;
    }
    return nullptr;
}

uint32_t Registry::entries_used() const
{
    void *base = base_.load(std::memory_order_acquire);
    if (base == nullptr) return 0;
    return std::min(static_cast<RegistryHeader *>(base)->paths_used.load(std::memory_order_acquire), kMaxRegistryPaths);
}

PathEntry *Registry::entry_at(uint32_t i) const
{
    void *base = base_.load(std::memory_order_acquire);
    if (base == nullptr || i >= kMaxRegistryPaths) return nullptr;
    return reinterpret_cast<PathEntry *>(static_cast<char *>(base) + sizeof(RegistryHeader)) + i;
}

void Registry::release(PathEntry *e, bool retire)
{
    if (e == nullptr) return;
    e->state.store(retire ? kDead : kUnused); // retired: dead until the writer frees it
    e->in_use.store(retire ? 2 : 0, std::memory_order_release);
}

PortCounterEntry *Registry::port(const std::string &name)
{
    std::lock_guard<std::mutex> g(g_mu);
    auto *h = static_cast<RegistryHeader *>(base_.load());
    if (h == nullptr || name.empty()) return nullptr;
    const uint32_t used = h->ports_used.load(std::memory_order_relaxed);
    for (uint32_t i = 0; i < used; ++i)
        if (name.compare(0, sizeof(h->ports[i].name) - 1, h->ports[i].name) == 0) return &h->ports[i];
    if (used == kMaxRegistryPorts) return nullptr;
    PortCounterEntry &e = h->ports[used];
    copy_str(e.name, sizeof(e.name), name);
    write_port(e, PortCounters{});
    h->ports_used.store(used + 1, std::memory_order_release); // named and consistent first
    return &e;
}

namespace {

// The counter fields of an entry and of a value, in one order (the seqlock copies them as
// relaxed atomics: a reader may race with the writer and retry, never read a torn value).
template <class Entry, class Values, class F> void each_counter(Entry &e, Values &v, F f)
{
    f(e.sampled_ns, v.sampled_ns);
    f(e.retransmits, v.retransmits);
    f(e.seq_errors, v.seq_errors);
    f(e.out_of_sequence, v.out_of_sequence);
    f(e.duplicate_requests, v.duplicate_requests);
    f(e.rnr_naks, v.rnr_naks);
    f(e.retry_exceeded, v.retry_exceeded);
    f(e.link_downed, v.link_downed);
    f(e.tx_packets, v.tx_packets);
    f(e.rx_packets, v.rx_packets);
}

} // namespace

void write_port(PortCounterEntry &e, const PortCounters &c) noexcept
{
    const uint64_t s = e.seq.load(std::memory_order_relaxed);
    e.seq.store(s + 1, std::memory_order_relaxed); // odd: changing
    std::atomic_thread_fence(std::memory_order_release);
    each_counter(e, c, [](auto &field, const auto &value) {
        std::atomic_ref(field).store(value, std::memory_order_relaxed);
    });
    e.seq.store(s + 2, std::memory_order_release);
}

bool read_port(const PortCounterEntry &e, PortCounters *out) noexcept
{
    if (e.name[0] == '\0') return false;
    for (int tries = 0; tries < 100; ++tries) {
        const uint64_t s0 = e.seq.load(std::memory_order_acquire);
        if (s0 & 1) continue;
        PortCounters c;
        // The entry may live in read-only memory (a reader's mapping): atomic_ref needs a
        // non-const object, and a relaxed load writes nothing.
        each_counter(const_cast<PortCounterEntry &>(e), c, [](auto &field, auto &value) {
            value = std::atomic_ref(field).load(std::memory_order_relaxed);
        });
        std::atomic_thread_fence(std::memory_order_acquire);
        if (e.seq.load(std::memory_order_relaxed) == s0) {
            *out = c;
            return true;
        }
    }
    return false;
}

namespace {

// The device totals of `e`'s device, when `e` is an entry of this process's own segment (a
// unit test's stand-alone entry is not) and the device is counted.
DeviceTotals *totals_of(const PathEntry &e) noexcept
{
    const Registry &reg = Registry::instance();
    const PathEntry *first = reg.entry_at(0);
    if (first == nullptr || &e < first || &e >= first + kMaxRegistryPaths ||
        e.dev >= kMaxRegistryDevices)
        return nullptr;
    char *base = reinterpret_cast<char *>(const_cast<PathEntry *>(first)) - sizeof(RegistryHeader);
    auto *h = reinterpret_cast<RegistryHeader *>(base);
    DeviceTotals &t = h->devices[e.dev];
    return t.name[0] != '\0' ? &t : nullptr;
}

} // namespace

void count_failover(PathEntry &e) noexcept
{
    e.failovers.fetch_add(1, std::memory_order_relaxed);
    if (DeviceTotals *t = totals_of(e)) t->failovers.fetch_add(1, std::memory_order_relaxed);
}

void count_failback(PathEntry &e) noexcept
{
    e.failbacks.fetch_add(1, std::memory_order_relaxed);
    if (DeviceTotals *t = totals_of(e)) t->failbacks.fetch_add(1, std::memory_order_relaxed);
}

int launcher_rank() noexcept
{
    // The tuner's proposer names use the same variables in the same order (tuner_plugin/
    // tuner.cc), so a rank reads alike in its log lines and its metrics.
    for (const char *name : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"}) {
        const char *s = std::getenv(name);
        if (s == nullptr || *s == '\0') continue;
        char *end = nullptr;
        errno = 0;
        const long v = std::strtol(s, &end, 10);
        if (*end == '\0' && errno == 0 && v >= 0 && v < INT32_MAX) return static_cast<int>(v);
    }
    return -1;
}

void ring_push(PathEntry &e, const WindowRecord &w) noexcept
{
    // The device's totals count every window, also one the ring drops below: its bytes moved.
    DeviceTotals *t = totals_of(e);
    if (t != nullptr) {
        t->bytes[e.kind & 1].fetch_add(w.bytes, std::memory_order_relaxed);
        t->ops[e.kind & 1].fetch_add(w.ops, std::memory_order_relaxed);
    }
    RingHeader &r = e.ring;
    const uint64_t head = r.head.load(std::memory_order_relaxed);
    const uint32_t consumer = r.consumer_pid.load(std::memory_order_acquire);
    if (consumer != 0 && head - r.tail.load(std::memory_order_acquire) >= r.capacity) {
        if (pid_alive(static_cast<int>(consumer))) { // rare: only when full
            r.dropped.fetch_add(1, std::memory_order_relaxed);
            if (t != nullptr) t->windows_dropped.fetch_add(1, std::memory_order_relaxed);
            return;
        }
        r.consumer_pid.store(0, std::memory_order_release); // consumer died: overwrite again
    }
    // Seqlock writer order: the stores below must not become visible before the previous
    // head store (matters on weakly ordered CPUs; readers re-check head after copying).
    std::atomic_thread_fence(std::memory_order_release);
    WindowRecord &slot = e.records[head % r.capacity];
    slot = w;
    slot.reserved[0] = head; // the ring index, so readers can tell an overwritten slot
    r.head.store(head + 1, std::memory_order_release);
    e.total_bytes.fetch_add(w.bytes, std::memory_order_relaxed);
    e.total_ops.fetch_add(w.ops, std::memory_order_relaxed);
    e.degraded.store(w.degraded, std::memory_order_relaxed);
    e.generation.store(w.generation, std::memory_order_relaxed);
}

void RegistrySink::state(PathState s, uint32_t generation) noexcept
{
    if (e_ == nullptr) return;
    e_->state.store(s, std::memory_order_relaxed);
    e_->generation.store(generation, std::memory_order_relaxed);
}

void RegistrySink::push(const WindowRecord &w) noexcept
{
    if (e_ != nullptr) ring_push(*e_, w);
}

void RegistrySink::verdict(bool degraded, const WindowRecord &w) noexcept
{
    if (degraded && e_ != nullptr) {
        // Before the degraded flag the window carries (ring_push stores it after this call):
        // a reader that sees the flag sees the episode's evidence.
        e_->verdict_judged_bps.store(w.judged_bps, std::memory_order_relaxed);
        e_->verdict_baseline_bps.store(w.baseline_bps, std::memory_order_release);
        e_->degraded_verdicts.fetch_add(1, std::memory_order_relaxed);
        if (DeviceTotals *t = totals_of(*e_))
            t->degraded[e_->kind & 1].fetch_add(1, std::memory_order_relaxed);
    }
    record_event(degraded ? EventType::kDegraded : EventType::kHealthy,
                 what_ + ": " + std::to_string(w.judged_bps / 1000000) + " MB/s, baseline " +
                     std::to_string(w.baseline_bps / 1000000) + " MB/s");
    if (degraded)
        VLOG_WARN("path degraded: %s: %.1f MB/s over busy time in its last windows, baseline %.1f MB/s",
                  what_.c_str(), static_cast<double>(w.judged_bps) / 1e6,
                  static_cast<double>(w.baseline_bps) / 1e6);
    else
        VLOG_INFO(NCCL_NET, "path healthy again: %s: %.1f MB/s over busy time, baseline %.1f MB/s",
                  what_.c_str(), static_cast<double>(w.judged_bps) / 1e6,
                  static_cast<double>(w.baseline_bps) / 1e6);
}

RegistryView::~RegistryView()
{
    if (map_ != nullptr) munmap(map_, size_);
}

int map_segment_readonly(const std::string &file, size_t min_size, void **base, size_t *size, std::string *why)
{
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return *why = strerror(errno), -errno;
    struct stat st;
    if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < min_size) {
        ::close(fd);
        return *why = "too small for its header", -EBADMSG;
    }
    void *p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    ::close(fd);
    if (p == MAP_FAILED) return *why = strerror(e), -e;
    *base = p;
    *size = static_cast<size_t>(st.st_size);
    return 0;
}

int RegistryView::open(const std::string &file, std::string *why)
{
    if (int rc = map_segment_readonly(file, sizeof(RegistryHeader), &map_, &size_, why); rc != 0)
        return rc;
    base_ = map_;
    return check(why);
}

int RegistryView::open_bytes(const void *base, size_t size, std::string *why)
{
    if (size < sizeof(RegistryHeader)) return *why = "too small for its header", -EBADMSG;
    base_ = base;
    size_ = size;
    return check(why);
}

int RegistryView::check(std::string *why)
{
    hdr_ = static_cast<const RegistryHeader *>(base_);
    auto fail = [&](const char *what) {
        *why = what;
        return -EBADMSG;
    };
    if (std::memcmp(hdr_->magic, kRegistryMagic, sizeof(kRegistryMagic)) != 0) return fail("bad magic");
    if (hdr_->version != kRegistryVersion) return fail("unsupported registry version");
    if (hdr_->header_size != sizeof(RegistryHeader) || hdr_->entry_size != sizeof(PathEntry) ||
        hdr_->record_size != sizeof(WindowRecord) || hdr_->ring_capacity != kRingCapacity ||
        hdr_->max_paths == 0 || hdr_->max_paths > kMaxRegistryPaths)
        return fail("layout differs from this build");
    if (size_ < registry_bytes(hdr_->max_paths)) return fail("segment shorter than its header says");
    return 0;
}

uint32_t RegistryView::entries() const
{
    return std::min(hdr_->paths_used.load(std::memory_order_acquire), hdr_->max_paths);
}

uint32_t RegistryView::ports() const
{
    return std::min(hdr_->ports_used.load(std::memory_order_acquire), kMaxRegistryPorts);
}

uint32_t RegistryView::devices() const
{
    return std::min(hdr_->devices_used.load(std::memory_order_acquire), kMaxRegistryDevices);
}

const PathEntry &RegistryView::entry(uint32_t i) const
{
    return reinterpret_cast<const PathEntry *>(static_cast<const char *>(base_) + sizeof(RegistryHeader))[i];
}

bool RegistryView::read(const PathEntry &e, uint64_t index, WindowRecord *out)
{
    const uint64_t cap = kRingCapacity;
    const uint64_t head = e.ring.head.load(std::memory_order_acquire);
    if (index >= head || head - index > cap) return false;
    std::memcpy(out, &e.records[index % cap], sizeof(*out));
    std::atomic_thread_fence(std::memory_order_acquire);
    // The producer rewrites this slot only when publishing index + cap, i.e. once head has
    // reached index + cap; before that the copy is intact.
    const uint64_t after = e.ring.head.load(std::memory_order_acquire);
    // With a live consumer that has not taken `index` yet, the producer drops instead of
    // overwriting, so the oldest slot is intact too.
    const bool held = e.ring.consumer_pid.load(std::memory_order_acquire) != 0 &&
                      e.ring.tail.load(std::memory_order_acquire) <= index;
    return (after < index + cap || held) && out->reserved[0] == index;
}

} // namespace vigil::telemetry
