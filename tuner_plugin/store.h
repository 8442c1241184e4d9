// SPDX-License-Identifier: Apache-2.0
// The store behind the agreed health view: per communicator, an epoch (a nonce that changes
// when the store lost its data: restarted, flushed, its segment removed), the epoch's
// members with their published health and progress, a health generation (bumped whenever a
// member's published health changes or a member joins), and write-once registers R[block]
// holding Views. Backends: the host's shared memory (store_shm.cc) and Redis through
// hiredis (store_redis.cc). The agreement protocol above (agreement.h) is
// backend-independent; what each call costs a Redis is stated at its declaration.
//
// Thread-safety: none; one thread (the tuner's background thread) uses a Store. Calls may
// block for the backend's I/O timeout; none throws except std::bad_alloc.
// Return codes: 0, -ESTALE (the epoch named is no longer the store's: nothing was written),
// -EAGAIN (a proposal needs more members: nothing was written), -EOVERFLOW (the block is
// kMaxAhead or more past the slowest member's published progress: nothing was written),
// -ECANCELED (the members' health changed since the generation the proposal was computed
// at: nothing was written, read the members again), -EALREADY (another member holds the
// block's proposal claim: read the register again shortly), -ERANGE (the register slot is held by
// a newer block: the caller is too far behind), or another -errno with a reason in
// last_error() (unreachable, malformed data).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "view.h"

namespace vigil::tuner {

/// What a publication reports back.
struct PublishAck {
    uint32_t members = 0;            ///< members of the epoch afterwards
    uint32_t digests = 0;            ///< distinct rules digests among them
    /// The smallest progress any member published, once `need` members have joined (else
    /// 0): no member can still need a register below it (agreement.h, store restarts).
    uint64_t min_progress = 0;
};

/// The member holding the others back (a proposal's -EOVERFLOW): its record when the store
/// could give it (have), and its published progress.
struct Slowest {
    bool have = false;
    MemberRecord rec;
    uint64_t progress = 0;
};

class Store
{
public:
    virtual ~Store() = default;
    /// "shm:/dev/shm/..." or "redis://host:port", for logs.
    virtual std::string describe() const = 0;
    /// Registers one proposal writes (R[block] and the next span() - 1, set-if-absent) and
    /// one read() fetches: 1 for shared memory (reads are free), 2 for Redis (half the reads,
    /// for at most one block more before a health change shows).
    virtual uint32_t span() const { return 1; }
    /// Its calls cost no store traffic (shared memory): the agreement then checks the epoch
    /// at every health read, not only on the heartbeat and when a register is absent.
    virtual bool local() const { return false; }
    /// The current epoch of `comm`'s data, creating it (random nonzero nonce) when absent.
    /// Redis: one script call, at join and on the heartbeat.
    virtual int epoch(uint64_t comm, uint64_t *out) = 0;
    /// Adds or refreshes `m` (its record, its progress) in `epoch`'s members. `health_changed`:
    /// its NICs differ from what it published last; a new member or a change bumps the
    /// health generation, so proposers read the members again. `need`: members the
    /// communicator has (for ack->min_progress). -ESTALE when `epoch` is not current.
    /// Redis: one script call (O(1) and O(log members)).
    virtual int publish(uint64_t comm, uint64_t epoch, const MemberRecord &m, bool health_changed, uint32_t need,
                        PublishAck *ack) = 0;
    /// Every member record of `epoch` and the health generation they are current at, read
    /// in one step (malformed records are skipped and counted in a WARN). Redis: one script
    /// call, O(members): proposers call it only when the generation moved.
    virtual int members(uint64_t comm, uint64_t epoch, std::vector<MemberRecord> *out, uint64_t *gen) = 0;
    /// Each distinct rules digest of `epoch` with the member that published it first
    /// ("host/pid[/rRANK]"). Redis: one command, O(digests).
    virtual int digests(uint64_t comm, uint64_t epoch, std::vector<std::pair<uint64_t, std::string>> *out) = 0;
    /// Atomically, when `epoch` is current: if R[block] holds a value, held[0] = it
    /// (*existed); else, when the epoch has at least `need_members` members (0: no check),
    /// the health generation is `gen` (empty: no check; "!": never, so nothing is written;
    /// else -ECANCELED) and `block` is below the slowest member's published progress +
    /// `max_ahead` (0: no check; else -EOVERFLOW with *slow), R[block] = `proposal`, and R[block + i] too where absent and within the
    /// head start, for i < span(). held[i] (span() entries): what R[block + i] holds after
    /// the step, found[i] whether it holds anything. The checks and the writes are one step,
    /// so a register is never written into a store that lost data the writer has not seen
    /// lost. Redis: one script call, O(log members); no member records are read. Once every
    /// member joined, the first proposer of a block (named by proposal.source) holds its
    /// claim for 250 ms; another gets -EALREADY and reads the register again, so one
    /// proposer a block reads the member records after a change.
    virtual int propose(uint64_t comm, uint64_t epoch, uint64_t block, const View &proposal, uint32_t need_members,
                        uint64_t max_ahead, const std::string &gen, View *held, bool *found, bool *existed,
                        Slowest *slow) = 0;
    /// Reads R[block .. block + count - 1] (count <= span()): *found is how many
    /// consecutive registers from `block` hold a value (out[0 .. *found - 1]). No epoch
    /// check (Redis: one MGET): a register of a newer epoch was re-asserted with the value
    /// the older one held, or proposed once every member, this one too, joined that epoch;
    /// an absent register leads to propose(), which checks the epoch. -EINPROGRESS: another
    /// rank of this host is reading it from the store (the host mirror): ask again shortly.
    virtual int read(uint64_t comm, uint64_t epoch, uint64_t block, uint32_t count, View *out, uint32_t *found) = 0;
    /// Re-asserts known registers after an epoch change (write where absent, no member
    /// check): blocks[i] -> views[i]. *conflicts: registers that held another value.
    /// Redis: one script call per 256 registers, pipelined.
    virtual int reassert(uint64_t comm, uint64_t epoch, const std::vector<uint64_t> &blocks,
                         const std::vector<View> &views, uint32_t *conflicts) = 0;
    /// The communicator is gone from this process (drop per-comm resources).
    virtual void forget(uint64_t comm) = 0;
    const std::string &last_error() const { return error_; }

protected:
    std::string error_;
};

/// Shared-memory store: one segment per communicator, /dev/shm/vigil-tstore-<uid>-<comm hex>,
/// mode 0600, holding the epoch, `max_members` member slots and a ring of `ring` registers
/// (a slot is reused for block + ring only when every member is past block).
std::unique_ptr<Store> make_shm_store(uint32_t max_members);
/// Redis store at host:port (keys vigil:{<comm hex>}:..., each with `ttl_s` expiry).
/// `timeout_ms` bounds every connect and command. nullptr, with *why, when hiredis cannot
/// be loaded on this host (redis_lib.h).
std::unique_ptr<Store> make_redis_store(const std::string &host, int port, int ttl_s, int timeout_ms,
                                        std::string *why);

/// `inner` (a store shared between hosts) behind the host's mirror of its registers
/// (store_mirror.cc): what one rank of the host read or wrote, the host's other ranks read
/// from /dev/shm. Everything else goes to `inner` unchanged.
std::unique_ptr<Store> make_host_mirror(std::unique_ptr<Store> inner);
/// Removes this user's /dev/shm files named `stem`* that no process holds (flock) and that
/// are older than 10 s (a younger one may be a creator between open and flock).
void reap_stale_segments(const std::string &stem);

/// Parses VIGIL_TUNER_STORE: "" or "auto", "shm", "none", "redis://HOST:PORT" (HOST may be
/// a name, an IPv4 address or [IPv6]). Returns "" and fills *kind ("auto"|"shm"|"none"|
/// "redis"), *host, *port; else the reason.
std::string parse_store_url(const std::string &url, std::string *kind, std::string *host, int *port);

/// Register ring length of the shm store, and how far (in blocks) the agreement lets the
/// fastest member run ahead of the slowest member's published progress (half the ring, so a
/// slot is never reused while a member can still need it).
inline constexpr uint32_t kShmRing = 4096;
inline constexpr uint64_t kMaxAhead = kShmRing / 2;
/// Most registers one propose() or read() covers (Store::span()).
inline constexpr uint32_t kMaxSpan = 4;

} // namespace vigil::tuner
