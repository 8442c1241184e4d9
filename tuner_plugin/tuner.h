// SPDX-License-Identifier: Apache-2.0
// The tuner's core: process-wide state (configuration, rules, store, background thread,
// status segment) and one Context per communicator, whose get_coll_info/get_chunk_size are
// the hot path behind every ABI version (abi_tuner.cc only translates).
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agreement.h"
#include "policy.h"
#include "rules.h"
#include "store.h"
#include "view.h"

namespace vigil::tuner {

/// The tuner's settings (VIGIL_TUNER_* in common/params.def). Plain data.
struct Config {
    uint64_t block = 128;        ///< getCollInfo calls per block
    std::string store = "auto";  ///< VIGIL_TUNER_STORE as given
    bool strict = false;         ///< a bad rules file or store fails init
    bool steer = true;           ///< health steering (re-estimation) on
    int publish_ms = 100;        ///< how often local health is read (published when it changed)
    int heartbeat_s = 60;        ///< republication period without a change (capped at ttl_s / 4)
    int ttl_s = 86400;           ///< Redis key expiry
    int store_timeout_ms = 1000; ///< Redis connect/command bound
    uint32_t lookahead = 2;      ///< blocks resolved ahead of use
    uint32_t max_members = 4096; ///< shm store member slots
};

/// Where a context's local NIC health comes from. Called from the background thread only.
class HealthSource
{
public:
    virtual ~HealthSource() = default;
    /// Fills rec->n_nics and rec->nics with this member's NICs now.
    virtual void read(MemberRecord *rec) = 0;
};

/// The net plugin's registry of this process (common/telemetry/health.h).
std::unique_ptr<HealthSource> registry_health_source();

/// What init tells the tuner about a communicator.
struct CommInfo {
    uint64_t comm = 0;
    bool has_comm = false;  ///< v5..v7 pass a commId; v3/v4 do not
    size_t nranks = 1;
    size_t nnodes = 1;
    int abi = 0;            ///< 3..7
    LatencyModel model;     ///< from the v5..v7 constants; invalid under v3/v4
};

class Tuner;

/// One communicator's tuner context. get_coll_info/get_chunk_size run on the thread NCCL
/// calls from, one call at a time per communicator (NCCL serialises a communicator's group
/// launch); they never block except to wait for an unresolved register (asleep on a
/// condition variable the background thread notifies), never allocate, never make a system
/// call on their common path, and never fail.
class Context
{
public:
    /// NCCL's getCollInfo on its cost table (flat [n_algo][n_proto]); *n_channels as NCCL
    /// passed it (0). See policy.h for what is changed and why.
    void get_coll_info(int coll, uint64_t bytes, int pipe_ops, float *table, int n_algo, int n_proto, int reg_buff,
                       int *n_channels) noexcept;
    /// NCCL's getChunkSize (v6/v7): *chunk is NCCL's value on entry.
    void get_chunk_size(int coll, uint64_t bytes, int algo, int proto, int n_channels, uint64_t *chunk) noexcept;

    uint64_t comm() const { return info_.comm; }
    uint64_t calls() const { return calls_.load(std::memory_order_relaxed); }
    /// The agreed view the hot path uses now (state 3 before the first block or with
    /// steering off). Hot-path thread only.
    const View &current_view() const { return cur_view_; }
    /// Times, and nanoseconds, the hot path waited for an unresolved register.
    uint64_t waits() const { return waits_.load(std::memory_order_relaxed); }
    uint64_t wait_ns() const { return wait_ns_.load(std::memory_order_relaxed); }
    /// Health steering is on (an agreement runs for this communicator).
    bool agreeing() const { return agr_ != nullptr; }
    /// Blocks whose view is resolved (0 without an agreement). Any thread.
    uint64_t resolved_blocks() const { return agr_ ? agr_->resolved() : 0; }
    /// The agreement (null with steering off), for its counters. Background-thread data:
    /// read it after close() or from the tuner's own thread.
    const Agreement *agreement() const { return agr_.get(); }

    /// The tuner this context belongs to (finalize closes the context there).
    Tuner &tuner() const { return tuner_; }

    ~Context();

private:
    friend class Tuner;
    Context(Tuner &t, const CommInfo &info, std::shared_ptr<const Rules> rules, std::unique_ptr<HealthSource> health);

    void enter_block(uint64_t b) noexcept;
    void wait_for(uint64_t b) noexcept;
    void note(int coll, uint64_t bytes, const Choice &before, const Choice &after, int channels, int rule,
              bool reestimated, uint64_t chunk = 0) noexcept;

    /// A decision to log (pushed by the hot path, logged by the background thread).
    struct Note {
        int coll;
        uint64_t bytes;
        Choice before, after;
        int channels;
        int rule;
        bool reestimated;
        uint64_t chunk; ///< getChunkSize decision (0: a getCollInfo decision)
        uint64_t block;
        View view;
    };
    static constexpr uint32_t kNotes = 256;
    static constexpr uint32_t kSeen = 4096;

    Tuner &tuner_;
    const CommInfo info_;
    const std::shared_ptr<const Rules> rules_;
    std::unique_ptr<HealthSource> health_;
    std::unique_ptr<Agreement> agr_; // null: health steering off
    bool steer_ = false;
    bool reestimate_ok_ = true;      // table shape is NCCL's 7x3
    std::string off_reason_;
    int status_slot_ = -1;

    // hot path state
    std::atomic<uint64_t> calls_{0};
    uint64_t cur_block_ = UINT64_MAX;
    View cur_view_;
    Health health_now_ = Health::kUnknown;
    std::atomic<uint64_t> steered_{0};
    std::atomic<uint64_t> waits_{0};
    std::atomic<uint64_t> wait_ns_{0};
    std::atomic<uint64_t> view_block_{0};
    std::atomic<uint64_t> waiting_since_{0}; ///< 0, or when the hot path began to wait
    std::mutex wait_mu_;                     ///< a waiting hot path sleeps on wait_cv_ under it
    std::condition_variable wait_cv_;        ///< notified when the awaited block resolves
    std::array<uint64_t, kSeen> seen_{};
    uint32_t seen_count_ = 0;
    std::array<Note, kNotes> notes_{};
    std::atomic<uint64_t> note_head_{0}, note_tail_{0};
    std::atomic<uint64_t> notes_dropped_{0};
    bool warned_shape_ = false;

    // background thread state
    Store *store_ = nullptr;
    View last_view_;
    bool have_last_view_ = false;
    uint64_t next_status_ns_ = 0;
    uint64_t notes_dropped_logged_ = 0;
    uint64_t next_publish_ns_ = 0; // next local health read
    uint64_t retry_ns_ = 0;        // blocked on the store or on members: next try
    uint64_t backoff_ns_ = 0;
    uint64_t seen_progress_ = 0, seen_progress_ns_ = 0;
    uint64_t block_ns_ = 0;        // estimated time the hot path spends in one block (0: unknown)
    uint64_t view_changes_ = 0;
    uint64_t last_wait_warn_ns_ = 0;
    bool rules_mismatch_warned_ = false;
};

/// Process-wide tuner state. One per process for NCCL (acquire()/release()); tests make their
/// own. Thread-safe: open/close may run concurrently with each other and with any context's
/// hot path.
class Tuner
{
public:
    explicit Tuner(Config cfg);
    ~Tuner();
    /// The process's tuner for one more context: the existing one, else a new one configured
    /// from the VIGIL_* environment (a bad VIGIL_TUNER_* value gets one WARN and its default:
    /// observability settings never fail init). Never null; each return is ended by one
    /// release(). May throw std::bad_alloc.
    static Tuner *acquire();
    /// Ends one acquire(). The last one destroys the tuner, whose thread ended with its last
    /// close(): NCCL unloads the library after the last finalize (2.28.9 does), and nothing of
    /// ours may outlive it, neither a thread nor memory only the library's globals reached.
    /// The next acquire() builds a new tuner.
    static void release(Tuner *t);

    /// Creates the context of a communicator. `health`: null for the net plugin's registry.
    /// Returns 0, or -EINVAL with *why when init must fail (strict mode: bad rules file,
    /// unusable store).
    int open(const CommInfo &info, std::unique_ptr<HealthSource> health, Context **out, std::string *why);
    /// Ends a context (its member leaves the store; status entry finalized). Safe on nullptr.
    void close(Context *ctx);

    const Config &config() const { return cfg_; }
    /// Rules from NCCL_TUNER_CONFIG_FILE / ./nccl_tuner.conf, loaded once per file version.
    /// A bad file gives no rules (one WARN) or, strict, *why and nullptr.
    std::shared_ptr<const Rules> rules(std::string *why);

private:
    friend class Context;
    void run(std::shared_ptr<std::atomic<bool>> stop);
    /// One context's background work at `now`; returns when it next needs the thread.
    uint64_t serve(Context &c, uint64_t now);
    void warn_rules_mismatch(Context &c);
    void drain_notes(Context &c);
    void write_status(Context &c);
    void wake()
    {
        kick_.store(true, std::memory_order_release);
        cv_.notify_one();
    }
    Store *store_for(const CommInfo &info, std::string *why_off);

    Config cfg_;
    std::mutex mu_;      // contexts_, thread_, stop_, rules, stores' creation
    std::mutex work_mu_; // held by the thread while it serves contexts (stores are its own)
    std::condition_variable cv_;
    std::atomic<bool> kick_{false}; // wake() since the thread last looked
    std::vector<Context *> contexts_;
    std::thread thread_;
    std::shared_ptr<std::atomic<bool>> stop_flag_; // the running thread's
    std::unique_ptr<Store> shm_store_, redis_store_;
    bool redis_unavailable_ = false; // hiredis could not be loaded: said once, rules only
    std::string store_kind_, store_host_;
    int store_port_ = 0;
    std::shared_ptr<const Rules> rules_;
    std::string rules_key_;
    bool said_no_comm_ = false, said_no_store_ = false;
    void *status_base_ = nullptr;
    int status_fd_ = -1;
    size_t status_size_ = 0;
    std::vector<Context *> leaving_;
};

/// Monotonic nanoseconds (vDSO clock_gettime: no system call).
uint64_t now_ns() noexcept;

} // namespace vigil::tuner
