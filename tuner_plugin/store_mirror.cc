// SPDX-License-Identifier: Apache-2.0
// The host's mirror of a shared store's registers: the first rank of a host to learn R[b]
// from the store (Redis) copies it into /dev/shm/vigil-tmirror1-<uid>-<comm hex>, and the
// host's other ranks read it there. The store then serves each block's register about once
// per host, not once per rank: its load grows with the hosts.
//
// Why this is safe: a register is write-once, so its value is the same wherever it is read;
// a slot carries the block and the epoch it was read in, and a rank takes it only for its own
// epoch and block (Store::read explains why a value read in any epoch is safe to use). The
// mirror is a cache: a torn, missing or overwritten slot is a miss, and a miss goes to the
// store. It holds no state of its own: removing the file loses nothing.
//
// One voice: a rank that misses the mirror claims the block; the host's other ranks that
// miss it while that rank reads the register (and, if absent, proposes it) are told to ask
// again shortly (-EINPROGRESS), not to ask the store.
//
// Layout (the 1 in the name is the layout's version): kSlots slots of MirrorSlot, indexed by
// block % kSlots, each under a seqlock whose writer claims it with a compare-and-swap (a
// writer that finds it claimed skips: the other writes the same value; a writer killed
// mid-write leaves its slot a miss until the file is made anew). Every attached process
// holds a shared flock; a file nobody holds is stale and removed by the next attach.
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <map>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ctime>
#include <unistd.h>

#include "log.h"
#include "store.h"

namespace vigil::tuner {
namespace {

constexpr uint32_t kSlots = 64; // > lookahead + span: the blocks the host's ranks resolve at once

constexpr size_t kViewWords = sizeof(View) / 8;
static_assert(sizeof(View) % 8 == 0, "a View is copied as words");

// Every field an atomic: another process may write the slot while this one reads it (the
// sequence check then discards the copy).
struct MirrorSlot {
    std::atomic<uint64_t> seq;       ///< odd while written
    std::atomic<uint64_t> block_tag; ///< block + 1 (0: empty)
    std::atomic<uint64_t> epoch;
    std::atomic<uint64_t> view[kViewWords];
    /// The rank of this host that asks the store for the slot's block now: (block + 1) mod
    /// 2^32 in the high half, when it claimed (CLOCK_MONOTONIC ms mod 2^32) in the low half;
    /// 0 once its read returned.
    std::atomic<uint64_t> fetch;
};
/// The longest a claim to read a block keeps the host's other ranks from asking the store
/// too (they ask the mirror again meanwhile): a claimer that dies or hangs costs this much.
constexpr uint32_t kClaimMs = 50;
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the mirror is shared between processes");

constexpr size_t kBytes = sizeof(MirrorSlot) * kSlots;

class MirrorStore final : public Store
{
public:
    explicit MirrorStore(std::unique_ptr<Store> inner) : inner_(std::move(inner)) {}
    ~MirrorStore() override
    {
        for (auto &[comm, m] : maps_) unmap(m);
    }

    std::string describe() const override { return inner_->describe(); }
    uint32_t span() const override { return inner_->span(); }
    bool local() const override { return inner_->local(); }
    int epoch(uint64_t comm, uint64_t *out) override { return pass(inner_->epoch(comm, out)); }
    int publish(uint64_t comm, uint64_t epoch, const MemberRecord &m, bool health_changed, uint32_t need,
                PublishAck *ack) override
    {
        return pass(inner_->publish(comm, epoch, m, health_changed, need, ack));
    }
    int members(uint64_t comm, uint64_t epoch, std::vector<MemberRecord> *out, uint64_t *gen) override
    {
        return pass(inner_->members(comm, epoch, out, gen));
    }
    int digests(uint64_t comm, uint64_t epoch, std::vector<std::pair<uint64_t, std::string>> *out) override
    {
        return pass(inner_->digests(comm, epoch, out));
    }

    int propose(uint64_t comm, uint64_t epoch, uint64_t block, const View &proposal, uint32_t need_members,
                uint64_t max_ahead, const std::string &gen, View *held, bool *found, bool *existed,
                Slowest *slow) override
    {
        const int rc = pass(inner_->propose(comm, epoch, block, proposal, need_members, max_ahead, gen, held, found,
                                            existed, slow));
        if (rc == 0)
            for (uint32_t i = 0; i < span() && found[i]; ++i) put(comm, epoch, block + i, held[i]);
        // The read that found the register absent kept this host's claim for this proposal.
        if (auto it = pending_.find(comm); it != pending_.end() && it->second.first == block) {
            release(comm, block, it->second.second);
            pending_.erase(it);
        }
        return rc;
    }

    int read(uint64_t comm, uint64_t epoch, uint64_t block, uint32_t count, View *out, uint32_t *found) override
    {
        *found = 0;
        count = std::min(count, kMaxSpan);
        while (*found < count && get(comm, epoch, block + *found, &out[*found])) ++*found;
        if (*found > 0) return 0;
        uint64_t claimed = 0;
        if (!claim(comm, block, &claimed)) {
            error_ = "another rank of this host is reading block " + std::to_string(block) + " from " +
                     inner_->describe();
            return -EINPROGRESS;
        }
        const int rc = pass(inner_->read(comm, epoch, block, count, out, found));
        if (rc == 0)
            for (uint32_t i = 0; i < *found; ++i) put(comm, epoch, block + i, out[i]);
        // Absent: the claim stays for the proposal this rank makes next (propose() releases
        // it, or it lapses), so the host's other ranks neither read nor propose meanwhile.
        if (rc == 0 && *found == 0 && claimed != 0) pending_[comm] = {block, claimed};
        else release(comm, block, claimed);
        return rc;
    }

    int reassert(uint64_t comm, uint64_t epoch, const std::vector<uint64_t> &blocks, const std::vector<View> &views,
                 uint32_t *conflicts) override
    {
        return pass(inner_->reassert(comm, epoch, blocks, views, conflicts));
    }

    void forget(uint64_t comm) override
    {
        pending_.erase(comm);
        if (auto it = maps_.find(comm); it != maps_.end()) {
            unmap(it->second);
            maps_.erase(it);
        }
        inner_->forget(comm);
    }

private:
    struct Map {
        MirrorSlot *slots = nullptr; // null: no mirror for this comm (said once)
        int fd = -1;
    };

    int pass(int rc)
    {
        if (rc != 0) error_ = inner_->last_error();
        return rc;
    }

    static void unmap(Map &m)
    {
        if (m.slots != nullptr) munmap(m.slots, kBytes);
        if (m.fd >= 0) ::close(m.fd);
        m = Map{};
    }

    MirrorSlot *slots(uint64_t comm)
    {
        auto [it, fresh] = maps_.try_emplace(comm);
        if (!fresh) return it->second.slots;
        std::string why;
        if (attach(comm, &it->second, &why) != 0) {
            unmap(it->second);
            VLOG_INFO(NCCL_TUNING, "comm %016llx: no host mirror of the store's registers (%s): every rank of this "
                                   "host reads them from %s",
                      static_cast<unsigned long long>(comm), why.c_str(), inner_->describe().c_str());
        }
        return it->second.slots;
    }

    int attach(uint64_t comm, Map *m, std::string *why)
    {
        const std::string stem = "vigil-tmirror1-" + std::to_string(getuid()) + "-";
        char path[128];
        std::snprintf(path, sizeof(path), "/dev/shm/%s%016llx", stem.c_str(), static_cast<unsigned long long>(comm));
        m->fd = ::open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (m->fd < 0 && errno == ENOENT) {
            reap_stale_segments(stem);
            m->fd = ::open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        }
        struct stat st{};
        if (m->fd < 0 || flock(m->fd, LOCK_SH) != 0 || fstat(m->fd, &st) != 0) {
            *why = std::string(path) + ": " + std::strerror(errno);
            return -1;
        }
        if (st.st_uid != getuid() || (st.st_mode & 077) != 0) {
            *why = std::string(path) + " is not owned by this user with mode 0600";
            return -1;
        }
        // Zero-filled by the kernel: an empty mirror. Any size but ours is another layout.
        if (st.st_size == 0 && ftruncate(m->fd, static_cast<off_t>(kBytes)) != 0) {
            *why = std::string("ftruncate ") + path + ": " + std::strerror(errno);
            return -1;
        }
        if (fstat(m->fd, &st) != 0 || static_cast<size_t>(st.st_size) != kBytes) {
            *why = std::string(path) + " has another size than this build's mirror";
            return -1;
        }
        void *p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
        if (p == MAP_FAILED) {
            *why = std::string("mmap ") + path + ": " + std::strerror(errno);
            return -1;
        }
        m->slots = static_cast<MirrorSlot *>(p);
        return 0;
    }

    bool get(uint64_t comm, uint64_t epoch, uint64_t block, View *out)
    {
        MirrorSlot *all = slots(comm);
        if (all == nullptr) return false;
        MirrorSlot &s = all[block % kSlots];
        const uint64_t a = s.seq.load(std::memory_order_acquire);
        if (a & 1) return false;
        const uint64_t tag = s.block_tag.load(std::memory_order_relaxed);
        const uint64_t e = s.epoch.load(std::memory_order_relaxed);
        uint64_t words[kViewWords];
        for (size_t i = 0; i < kViewWords; ++i) words[i] = s.view[i].load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (s.seq.load(std::memory_order_relaxed) != a || tag != block + 1 || e != epoch) return false;
        View v;
        std::memcpy(&v, words, sizeof(View));
        if (v.state > 2 || v.permille > 1000) return false; // not a value any rank wrote
        v.source[sizeof(v.source) - 1] = '\0';
        *out = v;
        return true;
    }

    // True when this rank is to ask the store for `block`: nobody of this host claimed it
    // within kClaimMs (or the host has no mirror). *claimed: the claim, for release().
    bool claim(uint64_t comm, uint64_t block, uint64_t *claimed)
    {
        MirrorSlot *all = slots(comm);
        if (all == nullptr) return true;
        std::atomic<uint64_t> &f = all[block % kSlots].fetch;
        timespec ts{};
        clock_gettime(CLOCK_MONOTONIC, &ts);
        const auto now_ms = static_cast<uint32_t>(static_cast<uint64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000);
        const uint64_t tag = (block + 1) & 0xffffffffull;
        uint64_t cur = f.load(std::memory_order_acquire);
        if ((cur >> 32) == tag && static_cast<uint32_t>(now_ms - static_cast<uint32_t>(cur)) < kClaimMs) return false;
        *claimed = tag << 32 | now_ms;
        return f.compare_exchange_strong(cur, *claimed, std::memory_order_acq_rel);
    }

    void release(uint64_t comm, uint64_t block, uint64_t claimed)
    {
        MirrorSlot *all = slots(comm);
        if (all == nullptr || claimed == 0) return;
        (void)all[block % kSlots].fetch.compare_exchange_strong(claimed, 0, std::memory_order_acq_rel);
    }

    void put(uint64_t comm, uint64_t epoch, uint64_t block, const View &v)
    {
        MirrorSlot *all = slots(comm);
        if (all == nullptr) return;
        MirrorSlot &s = all[block % kSlots];
        uint64_t a = s.seq.load(std::memory_order_acquire);
        if ((a & 1) || !s.seq.compare_exchange_strong(a, a + 1, std::memory_order_acq_rel)) return;
        s.block_tag.store(block + 1, std::memory_order_relaxed);
        s.epoch.store(epoch, std::memory_order_relaxed);
        uint64_t words[kViewWords];
        std::memcpy(words, &v, sizeof(View));
        for (size_t i = 0; i < kViewWords; ++i) s.view[i].store(words[i], std::memory_order_relaxed);
        s.seq.store(a + 2, std::memory_order_release);
    }

    std::unique_ptr<Store> inner_;
    std::map<uint64_t, Map> maps_;
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> pending_; // comm -> (block, claim) kept for propose()
};

} // namespace

std::unique_ptr<Store> make_host_mirror(std::unique_ptr<Store> inner)
{
    return std::make_unique<MirrorStore>(std::move(inner));
}

} // namespace vigil::tuner
