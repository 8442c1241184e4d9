// SPDX-License-Identifier: Apache-2.0
// Shared-memory store for communicators whose ranks all run on this host. One segment per
// communicator, /dev/shm/vigil-tstore-<uid>-<comm hex>, mode 0600, layout below; every
// attached process holds a shared flock on it, so a segment nobody holds is stale and is
// removed by the next process that creates one. A segment that disappears (removed by hand,
// by systemd-logind's RemoveIPC, ...) is a store restart: the next epoch() call notices the
// path no longer names the mapped file and attaches to (or creates) the new one, whose
// epoch differs.
//
//   ShmHeader                          (256 bytes; `ready` is stored last by the creator;
//                                       `gen`: the health generation, bumped by publish)
//   ShmMember[max_members]             (id 0 free; record under a seqlock)
//   ShmRegister[kShmRing]              (tag = (block + 1) << 2 | 1 writing, | 2 written)
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <map>
#include <random>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "log.h"
#include "store.h"

namespace vigil::tuner {
namespace {

constexpr char kMagic[8] = {'V', 'G', 'L', 'T', 'S', 'T', '0', '1'};
constexpr uint32_t kVersion = 3; // 2: the health generation; 3: views carry it

struct ShmHeader {
    char magic[8];
    uint32_t version;
    uint32_t header_size;
    uint32_t member_size;
    uint32_t max_members;
    uint32_t ring;
    uint32_t register_size;
    uint64_t comm;
    uint64_t epoch;
    std::atomic<uint32_t> ready;
    std::atomic<uint32_t> members_used; ///< high-water mark of claimed slots
    std::atomic<uint64_t> gen;          ///< health generation (Store::publish)
    uint8_t pad[256 - 8 - 6 * 4 - 2 * 8 - 2 * 4 - 8];
};
static_assert(sizeof(ShmHeader) == 256);

struct ShmMember {
    std::atomic<uint64_t> id;
    std::atomic<uint64_t> seq; ///< odd while the record is being written
    MemberRecord rec;
};

struct ShmRegister {
    std::atomic<uint64_t> tag;
    View value;
};

constexpr uint64_t kWriting = 1, kWritten = 2;
constexpr uint64_t tag_of(uint64_t block, uint64_t st) { return ((block + 1) << 2) | st; }

size_t segment_bytes(uint32_t max_members)
{
    return sizeof(ShmHeader) + static_cast<size_t>(max_members) * sizeof(ShmMember) +
           static_cast<size_t>(kShmRing) * sizeof(ShmRegister);
}

struct Segment {
    std::string path;
    int fd = -1;
    ino_t ino = 0;
    void *base = nullptr;
    size_t size = 0;
    ShmHeader *hdr() const { return static_cast<ShmHeader *>(base); }
    ShmMember *member(uint32_t i) const
    {
        return reinterpret_cast<ShmMember *>(static_cast<char *>(base) + sizeof(ShmHeader)) + i;
    }
    ShmRegister *reg(uint64_t block) const
    {
        auto *first = reinterpret_cast<ShmRegister *>(static_cast<char *>(base) + sizeof(ShmHeader) +
                                                      static_cast<size_t>(hdr()->max_members) * sizeof(ShmMember));
        return first + block % kShmRing;
    }
    void close()
    {
        if (base != nullptr) munmap(base, size);
        if (fd >= 0) ::close(fd);
        base = nullptr;
        fd = -1;
    }
};

class ShmStore final : public Store
{
public:
    explicit ShmStore(uint32_t max_members) : max_members_(max_members) {}
    ~ShmStore() override
    {
        for (auto &[c, s] : segs_) s.close();
    }

    std::string describe() const override { return "shm:/dev/shm/vigil-tstore-" + std::to_string(getuid()) + "-*"; }
    bool local() const override { return true; }

    int epoch(uint64_t comm, uint64_t *out) override
    {
        Segment *s = nullptr;
        if (int rc = attach(comm, &s); rc != 0) return rc;
        // The path must still name the file we map; if not, the store was restarted.
        struct stat st{};
        if (::stat(s->path.c_str(), &st) != 0 || st.st_ino != s->ino) {
            s->close();
            segs_.erase(comm);
            if (int rc = attach(comm, &s); rc != 0) return rc;
        }
        *out = s->hdr()->epoch;
        return 0;
    }

    int publish(uint64_t comm, uint64_t epoch, const MemberRecord &m, bool health_changed, uint32_t need,
                PublishAck *ack) override
    {
        Segment *s = nullptr;
        if (int rc = current(comm, epoch, &s); rc != 0) return rc;
        ShmHeader *h = s->hdr();
        ShmMember *slot = nullptr;
        const uint32_t used = std::min(h->members_used.load(std::memory_order_acquire), h->max_members);
        for (uint32_t i = 0; i < used && slot == nullptr; ++i)
            if (s->member(i)->id.load(std::memory_order_acquire) == m.id) slot = s->member(i);
        for (uint32_t i = 0; i < h->max_members && slot == nullptr; ++i) {
            uint64_t expect = 0;
            if (s->member(i)->id.compare_exchange_strong(expect, m.id, std::memory_order_acq_rel)) {
                slot = s->member(i);
                uint32_t hw = h->members_used.load(std::memory_order_acquire);
                while (hw < i + 1 && !h->members_used.compare_exchange_weak(hw, i + 1, std::memory_order_acq_rel)) {
                }
            }
        }
        if (slot == nullptr) {
            error_ = "all " + std::to_string(h->max_members) + " member slots are taken";
            return -ENOSPC;
        }
        const uint64_t seq = slot->seq.load(std::memory_order_relaxed);
        slot->seq.store(seq | 1, std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_release);
        std::memcpy(&slot->rec, &m, sizeof(m));
        slot->seq.store((seq | 1) + 1, std::memory_order_release);
        // After the record: a proposer that reads the new generation reads this record too.
        if (health_changed || seq == 0) h->gen.fetch_add(1, std::memory_order_acq_rel);
        std::vector<MemberRecord> all;
        read_members(*s, &all);
        ack->members = static_cast<uint32_t>(all.size());
        std::vector<uint64_t> d;
        uint64_t low = UINT64_MAX;
        for (const MemberRecord &x : all) {
            d.push_back(x.rules_digest);
            low = std::min(low, x.progress);
        }
        std::sort(d.begin(), d.end());
        ack->digests = static_cast<uint32_t>(std::unique(d.begin(), d.end()) - d.begin());
        ack->min_progress = all.size() >= need && !all.empty() ? low : 0;
        return 0;
    }

    int members(uint64_t comm, uint64_t epoch, std::vector<MemberRecord> *out, uint64_t *gen) override
    {
        out->clear();
        Segment *s = nullptr;
        if (int rc = current(comm, epoch, &s); rc != 0) return rc;
        // The generation first: a record published after it bumps it again, and the proposal
        // computed from this read is refused (-ECANCELED).
        *gen = s->hdr()->gen.load(std::memory_order_acquire);
        read_members(*s, out);
        return 0;
    }

    int digests(uint64_t comm, uint64_t epoch, std::vector<std::pair<uint64_t, std::string>> *out) override
    {
        out->clear();
        Segment *s = nullptr;
        if (int rc = current(comm, epoch, &s); rc != 0) return rc;
        std::vector<MemberRecord> all;
        read_members(*s, &all);
        for (const MemberRecord &m : all) {
            bool seen = false;
            for (const auto &d : *out) seen |= d.first == m.rules_digest;
            if (seen) continue;
            char name[96];
            if (m.env_rank >= 0) std::snprintf(name, sizeof(name), "%.63s/%d/r%d", m.host, m.pid, m.env_rank);
            else std::snprintf(name, sizeof(name), "%.63s/%d", m.host, m.pid);
            out->emplace_back(m.rules_digest, name);
        }
        return 0;
    }

    int propose(uint64_t comm, uint64_t epoch, uint64_t block, const View &proposal, uint32_t need_members,
                uint64_t max_ahead, const std::string &gen, View *held, bool *found, bool *existed,
                Slowest *slow) override
    {
        Segment *s = nullptr;
        if (int rc = current(comm, epoch, &s); rc != 0) return rc;
        found[0] = false;
        // Checks of the whole proposal (the register slot's own come in propose_one).
        if (int rc = propose_one(*s, block, nullptr, held, existed); rc != -ENOENT) {
            found[0] = rc == 0;
            return rc;
        }
        if (need_members != 0 && count_members(*s) < need_members) return -EAGAIN;
        if (!gen.empty() && gen != std::to_string(s->hdr()->gen.load(std::memory_order_acquire))) return -ECANCELED;
        if (max_ahead != 0) {
            std::vector<MemberRecord> all;
            read_members(*s, &all);
            const MemberRecord *low = nullptr;
            for (const MemberRecord &m : all)
                if (low == nullptr || m.progress < low->progress) low = &m;
            if (low != nullptr && low->progress != UINT64_MAX && block >= low->progress + max_ahead) {
                slow->have = true;
                slow->rec = *low;
                slow->progress = low->progress;
                return -EOVERFLOW;
            }
        }
        const int rc = propose_one(*s, block, &proposal, held, existed);
        found[0] = rc == 0;
        return rc;
    }

    int read(uint64_t comm, uint64_t epoch, uint64_t block, uint32_t count, View *out, uint32_t *found) override
    {
        *found = 0;
        Segment *s = nullptr;
        if (int rc = current(comm, epoch, &s); rc != 0) return rc;
        for (uint32_t i = 0; i < std::min(count, kMaxSpan); ++i) {
            ShmRegister *r = s->reg(block + i);
            if (r->tag.load(std::memory_order_acquire) != tag_of(block + i, kWritten)) return 0;
            View v;
            std::memcpy(&v, &r->value, sizeof(View));
            std::atomic_thread_fence(std::memory_order_acquire);
            if (r->tag.load(std::memory_order_relaxed) != tag_of(block + i, kWritten)) return 0; // reused meanwhile
            v.source[sizeof(v.source) - 1] = '\0';
            out[i] = v;
            *found = i + 1;
        }
        return 0;
    }

    int reassert(uint64_t comm, uint64_t epoch, const std::vector<uint64_t> &blocks, const std::vector<View> &views,
                 uint32_t *conflicts) override
    {
        *conflicts = 0;
        for (size_t i = 0; i < blocks.size(); ++i) {
            View held;
            bool existed = false;
            Segment *s = nullptr;
            if (int rc = current(comm, epoch, &s); rc != 0) return rc;
            const int rc = propose_one(*s, blocks[i], &views[i], &held, &existed);
            if (rc == -ERANGE || rc == -EAGAIN) continue; // a newer block owns the slot: no one needs ours
            if (rc != 0) return rc;
            if (existed && !held.same(views[i])) ++*conflicts;
        }
        return 0;
    }

    void forget(uint64_t comm) override
    {
        auto it = segs_.find(comm);
        if (it == segs_.end()) return;
        it->second.close();
        segs_.erase(it);
    }

private:
    // One register: R[block] into *held (*existed) when written; else, with a `proposal`,
    // writes it (set-if-absent on the slot, when no member can still need the slot's older
    // block); without one, -ENOENT.
    int propose_one(Segment &s, uint64_t block, const View *proposal, View *held, bool *existed)
    {
        ShmRegister *r = s.reg(block);
        for (int spins = 0;; ++spins) {
            uint64_t tag = r->tag.load(std::memory_order_acquire);
            if (tag == tag_of(block, kWritten)) {
                std::memcpy(held, &r->value, sizeof(View));
                held->source[sizeof(held->source) - 1] = '\0';
                *existed = true;
                return 0;
            }
            if (tag == tag_of(block, kWriting)) { // a writer is between its claim and publish
                if (spins > 1000000) {
                    error_ = "register writer never finished";
                    return -EIO;
                }
                std::this_thread::yield();
                continue;
            }
            if (tag != 0 && (tag >> 2) - 1 > block) return -ERANGE;
            if (proposal == nullptr) return -ENOENT;
            if (tag != 0 && !all_past(s, (tag >> 2) - 1)) return -EAGAIN; // slot still needed
            if (!r->tag.compare_exchange_strong(tag, tag_of(block, kWriting), std::memory_order_acq_rel)) continue;
            std::memcpy(&r->value, proposal, sizeof(View));
            r->tag.store(tag_of(block, kWritten), std::memory_order_release);
            *held = *proposal;
            *existed = false;
            return 0;
        }
    }

    // The published records (seqlock reads; a claimed slot with nothing published yet is
    // skipped).
    void read_members(const Segment &s, std::vector<MemberRecord> *out) const
    {
        const uint32_t used = std::min(s.hdr()->members_used.load(std::memory_order_acquire), s.hdr()->max_members);
        for (uint32_t i = 0; i < used; ++i) {
            ShmMember *slot = s.member(i);
            if (slot->id.load(std::memory_order_acquire) == 0) continue;
            for (int tries = 0; tries < 1000; ++tries) {
                const uint64_t a = slot->seq.load(std::memory_order_acquire);
                if (a & 1) {
                    std::this_thread::yield();
                    continue;
                }
                MemberRecord m;
                std::memcpy(&m, &slot->rec, sizeof(m));
                std::atomic_thread_fence(std::memory_order_acquire);
                if (slot->seq.load(std::memory_order_relaxed) != a) continue;
                if (a == 0) break; // claimed, nothing published yet
                m.host[sizeof(m.host) - 1] = '\0';
                m.n_nics = std::min<uint32_t>(m.n_nics, kMaxNics);
                out->push_back(m);
                break;
            }
        }
    }

    uint32_t count_members(const Segment &s) const
    {
        uint32_t n = 0;
        const uint32_t used = std::min(s.hdr()->members_used.load(std::memory_order_acquire), s.hdr()->max_members);
        for (uint32_t i = 0; i < used; ++i) n += s.member(i)->id.load(std::memory_order_acquire) != 0;
        return n;
    }

    // Every member that published is past `block` (its slot may be reused).
    bool all_past(const Segment &s, uint64_t block) const
    {
        const uint32_t used = std::min(s.hdr()->members_used.load(std::memory_order_acquire), s.hdr()->max_members);
        for (uint32_t i = 0; i < used; ++i) {
            const ShmMember *m = s.member(i);
            if (m->id.load(std::memory_order_acquire) == 0) continue;
            if (m->seq.load(std::memory_order_acquire) == 0) return false;
            if (m->rec.progress <= block) return false;
        }
        return true;
    }

    int current(uint64_t comm, uint64_t epoch, Segment **out)
    {
        if (int rc = attach(comm, out); rc != 0) return rc;
        return (*out)->hdr()->epoch == epoch ? 0 : -ESTALE;
    }

    std::string path_of(uint64_t comm) const
    {
        char buf[96];
        std::snprintf(buf, sizeof(buf), "/dev/shm/vigil-tstore-%u-%016llx", static_cast<unsigned>(getuid()),
                      static_cast<unsigned long long>(comm));
        return buf;
    }

    int fail(const std::string &what, int e)
    {
        error_ = what + ": " + std::strerror(e);
        return -e;
    }

    int attach(uint64_t comm, Segment **out)
    {
        auto it = segs_.find(comm);
        if (it != segs_.end()) {
            *out = &it->second;
            return 0;
        }
        Segment s;
        s.path = path_of(comm);
        const size_t want = segment_bytes(max_members_);
        bool created = false;
        s.fd = ::open(s.path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (s.fd < 0 && errno == ENOENT) {
            reap_stale_segments("vigil-tstore-" + std::to_string(getuid()) + "-");
            s.fd = ::open(s.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
            created = s.fd >= 0;
            if (s.fd < 0 && errno == EEXIST) s.fd = ::open(s.path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        }
        if (s.fd < 0) return fail("open " + s.path, errno);
        if (flock(s.fd, LOCK_SH) != 0) {
            const int e = errno;
            s.close();
            return fail("flock " + s.path, e);
        }
        struct stat st{};
        if (fstat(s.fd, &st) != 0) {
            const int e = errno;
            s.close();
            return fail("fstat " + s.path, e);
        }
        if (st.st_uid != getuid() || (st.st_mode & 077) != 0) {
            s.close();
            error_ = s.path + " is not owned by this user with mode 0600";
            return -EACCES;
        }
        s.ino = st.st_ino;
        if (created && ftruncate(s.fd, static_cast<off_t>(want)) != 0) {
            const int e = errno;
            ::unlink(s.path.c_str());
            s.close();
            return fail("ftruncate " + s.path, e);
        }
        // An attacher may see the file before the creator sized and initialised it.
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (!created) {
            if (fstat(s.fd, &st) != 0) {
                const int e = errno;
                s.close();
                return fail("fstat " + s.path, e);
            }
            if (static_cast<size_t>(st.st_size) >= sizeof(ShmHeader)) break;
            if (std::chrono::steady_clock::now() > deadline) {
                s.close();
                error_ = s.path + " was never initialised by its creator";
                return -EIO;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        s.size = created ? want : static_cast<size_t>(st.st_size);
        s.base = mmap(nullptr, s.size, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0);
        if (s.base == MAP_FAILED) {
            const int e = errno;
            s.base = nullptr;
            s.close();
            return fail("mmap " + s.path, e);
        }
        ShmHeader *h = s.hdr();
        if (created) {
            std::random_device rd;
            uint64_t nonce = 0;
            while (nonce == 0) nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
            std::memcpy(h->magic, kMagic, sizeof(kMagic));
            h->version = kVersion;
            h->header_size = sizeof(ShmHeader);
            h->member_size = sizeof(ShmMember);
            h->max_members = max_members_;
            h->ring = kShmRing;
            h->register_size = sizeof(ShmRegister);
            h->comm = comm;
            h->epoch = nonce;
            h->ready.store(1, std::memory_order_release);
        } else {
            while (h->ready.load(std::memory_order_acquire) != 1) {
                if (std::chrono::steady_clock::now() > deadline) {
                    s.close();
                    error_ = s.path + " was never initialised by its creator";
                    return -EIO;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
            }
            if (std::memcmp(h->magic, kMagic, sizeof(kMagic)) != 0 || h->version != kVersion ||
                h->header_size != sizeof(ShmHeader) || h->member_size != sizeof(ShmMember) || h->ring != kShmRing ||
                h->register_size != sizeof(ShmRegister) || h->comm != comm || h->max_members == 0 ||
                h->max_members > 65536 || s.size < segment_bytes(h->max_members)) {
                s.close();
                error_ = s.path + ": layout differs from this build";
                return -EBADMSG;
            }
        }
        auto [pos, ok] = segs_.emplace(comm, s);
        *out = &pos->second;
        return 0;
    }

    uint32_t max_members_;
    std::map<uint64_t, Segment> segs_;
};

} // namespace

void reap_stale_segments(const std::string &stem)
{
    DIR *d = opendir("/dev/shm");
    if (d == nullptr) return;
    while (dirent *e = readdir(d)) {
        if (std::strncmp(e->d_name, stem.c_str(), stem.size()) != 0) continue;
        const std::string p = std::string("/dev/shm/") + e->d_name;
        const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) continue;
        struct stat st{};
        if (fstat(fd, &st) == 0 && st.st_uid == getuid() && time(nullptr) - st.st_mtime > 10 &&
            flock(fd, LOCK_EX | LOCK_NB) == 0)
            ::unlink(p.c_str());
        ::close(fd);
    }
    closedir(d);
}

std::unique_ptr<Store> make_shm_store(uint32_t max_members)
{
    return std::make_unique<ShmStore>(max_members);
}

std::string parse_store_url(const std::string &url, std::string *kind, std::string *host, int *port)
{
    *host = "";
    *port = 0;
    if (url.empty() || url == "auto") return *kind = "auto", "";
    if (url == "shm" || url == "none") return *kind = url, "";
    const std::string scheme = "redis://";
    if (url.rfind(scheme, 0) != 0) return "expected auto, shm, none or redis://HOST:PORT";
    std::string rest = url.substr(scheme.size());
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    std::string h, p;
    if (!rest.empty() && rest.front() == '[') {
        const size_t close = rest.find(']');
        if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
            return "expected redis://[IPV6]:PORT";
        h = rest.substr(1, close - 1);
        p = rest.substr(close + 2);
    } else {
        const size_t colon = rest.rfind(':');
        if (colon == std::string::npos) return "expected redis://HOST:PORT";
        h = rest.substr(0, colon);
        p = rest.substr(colon + 1);
    }
    if (h.empty() || h.size() > 255) return "empty or overlong host";
    int v = 0;
    for (char c : p) {
        if (c < '0' || c > '9' || v > 65535) return "bad port";
        v = v * 10 + (c - '0');
    }
    if (p.empty() || v < 1 || v > 65535) return "port must be in [1, 65535]";
    *kind = "redis";
    *host = h;
    *port = v;
    return "";
}

} // namespace vigil::tuner
