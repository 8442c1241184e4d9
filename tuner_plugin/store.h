// SPDX-License-Identifier: Apache-2.0
// The store behind the agreed health view: per communicator, an epoch (a nonce that changes
// when the store lost its data: restarted, flushed, its segment removed), the epoch's
// members with their published health, and write-once registers R[block] holding Views.
// Backends: the host's shared memory (store_shm.cc) and Redis through hiredis
// (store_redis.cc). The agreement protocol above (agreement.h) is backend-independent.
//
// Thread-safety: none; one thread (the tuner's background thread) uses a Store. Calls may
// block for the backend's I/O timeout; none throws except std::bad_alloc.
// Return codes: 0, -ESTALE (the epoch named is no longer the store's: nothing was written),
// -EAGAIN (a proposal needs more members: nothing was written), -ERANGE (the register slot
// is held by a newer block: the caller is too far behind), or another -errno with a reason
// in last_error() (unreachable, malformed data).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "view.h"

namespace vigil::tuner {

class Store
{
public:
    virtual ~Store() = default;
    /// "shm:/dev/shm/..." or "redis://host:port", for logs.
    virtual std::string describe() const = 0;
    /// The current epoch of `comm`'s data, creating it (random nonzero nonce) when absent.
    virtual int epoch(uint64_t comm, uint64_t *out) = 0;
    /// Adds or refreshes `m` in `epoch`'s members; *count: members of the epoch afterwards.
    /// -ESTALE when `epoch` is not current.
    virtual int publish(uint64_t comm, uint64_t epoch, const MemberRecord &m, uint32_t *count) = 0;
    /// Every member record of `epoch` (malformed ones are skipped and counted in a WARN).
    virtual int members(uint64_t comm, uint64_t epoch, std::vector<MemberRecord> *out) = 0;
    /// Atomically: if `epoch` is current and R[block] holds a value, *held = it (existed);
    /// else if the epoch has at least `need_members` members (0: no check), R[block] =
    /// `proposal` and *held = proposal. The epoch check and the write are one step, so a
    /// register is never written into a store that lost data the writer has not seen lost.
    virtual int propose(uint64_t comm, uint64_t epoch, uint64_t block, const View &proposal,
                        uint32_t need_members, View *held, bool *existed) = 0;
    /// Reads R[block]: 0 and *found; -ESTALE when `epoch` is not current.
    virtual int read(uint64_t comm, uint64_t epoch, uint64_t block, View *out, bool *found) = 0;
    /// Re-asserts known registers after an epoch change (write where absent, no member
    /// check): blocks[i] -> views[i]. *conflicts: registers that held another value.
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

/// Parses VIGIL_TUNER_STORE: "" or "auto", "shm", "none", "redis://HOST:PORT" (HOST may be
/// a name, an IPv4 address or [IPv6]). Returns "" and fills *kind ("auto"|"shm"|"none"|
/// "redis"), *host, *port; else the reason.
std::string parse_store_url(const std::string &url, std::string *kind, std::string *host, int *port);

/// Register ring length of the shm store, and how far (in blocks) the agreement lets the
/// fastest member run ahead of the slowest (half the ring, so a slot is never reused while
/// a member can still need it).
inline constexpr uint32_t kShmRing = 4096;
inline constexpr uint64_t kMaxAhead = kShmRing / 2;

} // namespace vigil::tuner
