// SPDX-License-Identifier: Apache-2.0
// The tuner core: contexts, the background thread, configuration, rules loading, status.
#include "tuner.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <ctime>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "params.h"
#include "telemetry/health.h"

namespace vigil::tuner {
namespace {

uint64_t random_id()
{
    uint64_t v = 0;
    while (v == 0)
        if (getrandom(&v, sizeof(v), 0) != static_cast<ssize_t>(sizeof(v))) v = static_cast<uint64_t>(now_ns()) * 0x9E3779B97F4A7C15ull;
    return v;
}

int env_rank()
{
    for (const char *name : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"}) {
        const char *s = std::getenv(name);
        if (s == nullptr || *s == '\0') continue;
        char *end = nullptr;
        const long v = std::strtol(s, &end, 10);
        if (*end == '\0' && v >= 0 && v < INT32_MAX) return static_cast<int>(v);
    }
    return -1;
}

std::string choice_text(const Choice &c)
{
    if (c.algo < 0) return "none";
    return std::string(algo_name(c.algo)) + "/" + proto_name(c.proto);
}

uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    return h;
}

class RegistryHealth final : public HealthSource
{
public:
    void read(MemberRecord *rec) override
    {
        telemetry::ProcessHealth ph;
        std::string why;
        rec->n_nics = 0;
        rec->multipath = false;
        if (telemetry::read_process_health(static_cast<int>(getpid()), &ph, &why) != 0) return;
        rec->multipath = ph.multipath;
        for (const telemetry::DeviceHealth &d : ph.devices) {
            if (rec->n_nics == kMaxNics) break;
            NicHealth &n = rec->nics[rec->n_nics++];
            std::snprintf(n.name, sizeof(n.name), "%s", d.name.empty() ? "dev" : d.name.c_str());
            n.state = d.failed ? 2 : d.degraded ? 1 : 0;
            n.permille = static_cast<uint16_t>(std::lround(d.fraction() * 1000));
            n.failovers = static_cast<uint32_t>(std::min<uint64_t>(d.failovers, UINT32_MAX));
            n.judged_bps = static_cast<uint64_t>(d.judged_bps);
            n.baseline_bps = static_cast<uint64_t>(d.baseline_bps);
        }
    }
};

/// Logs what the agreement resolves for one context (background thread).
class Sink final : public ResolveSink
{
public:
    Sink(uint64_t comm, uint64_t block_len, View *last, bool *have_last, uint64_t *changes)
        : comm_(comm), block_len_(block_len), last_(last), have_last_(have_last), changes_(changes)
    {
    }
    void resolved(uint64_t block, const View &v, bool changed, bool proposed) override
    {
        if (changed) {
            ++*changes_;
            VLOG_INFO(NCCL_TUNING, "comm %016llx view change at block %llu (collective %llu): %s -> %s, proposed by %s",
                      static_cast<unsigned long long>(comm_), static_cast<unsigned long long>(block),
                      static_cast<unsigned long long>(block * block_len_),
                      *have_last_ ? describe_view(*last_).c_str() : "none", describe_view(v).c_str(), v.source);
        }
        if (proposed)
            VLOG_TRACE(NCCL_TUNING, "comm %016llx proposed the view of block %llu: %s",
                       static_cast<unsigned long long>(comm_), static_cast<unsigned long long>(block),
                       describe_view(v).c_str());
        *last_ = v;
        *have_last_ = true;
    }
    void store_event(const std::string &what, bool warn) override
    {
        if (warn) VLOG_WARN("comm %016llx: %s", static_cast<unsigned long long>(comm_), what.c_str());
        else VLOG_INFO(NCCL_TUNING, "comm %016llx: %s", static_cast<unsigned long long>(comm_), what.c_str());
    }

private:
    uint64_t comm_, block_len_;
    View *last_;
    bool *have_last_;
    uint64_t *changes_;
};

} // namespace

uint64_t now_ns() noexcept
{
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

std::unique_ptr<HealthSource> registry_health_source()
{
    return std::make_unique<RegistryHealth>();
}

// ---- Context: the hot path ---------------------------------------------------------------

Context::Context(Tuner &t, const CommInfo &info, std::shared_ptr<const Rules> rules,
                 std::unique_ptr<HealthSource> health)
    : tuner_(t), info_(info), rules_(std::move(rules)), health_(std::move(health))
{
    cur_view_.state = 3; // none until the first block resolves
}

Context::~Context() = default;

void Context::get_coll_info(int coll, uint64_t bytes, int pipe_ops, float *table, int n_algo, int n_proto,
                            int reg_buff, int *n_channels) noexcept
{
    const uint64_t idx = calls_.load(std::memory_order_relaxed);
    calls_.store(idx + 1, std::memory_order_relaxed);
    if (agr_) {
        const uint64_t b = idx / tuner_.cfg_.block;
        if (b != cur_block_) enter_block(b);
    }
    if (table == nullptr || n_channels == nullptr || n_algo <= 0 || n_proto <= 0 || n_algo > 64 || n_proto > 64) {
        if (!warned_shape_) note(coll, bytes, {}, {}, -1, -2, false); // logged once: bad table
        warned_shape_ = true;
        return;
    }
    const CostTable t{table, n_algo, n_proto};
    const CollQuery q{coll, bytes, static_cast<int>(info_.nnodes), static_cast<int>(info_.nranks), pipe_ops, reg_buff,
                      health_now_};
    const bool may_reestimate = steer_ && reestimate_ok_ && health_now_ != Health::kHealthy &&
                                health_now_ != Health::kUnknown && info_.nnodes > 1;
    if (rules_->rules.empty() && !may_reestimate) return; // NCCL's choice, untouched
    const Choice before = select_like_nccl(t);
    const int rule = apply_rules(*rules_, q, t, n_channels);
    bool re = false;
    if (rule < 0 && may_reestimate) {
        if (n_algo == kNumAlgos && n_proto == kNumProtos)
            re = reestimate(t, info_.model, coll, bytes, static_cast<int>(info_.nranks), static_cast<int>(info_.nnodes),
                            pipe_ops, cur_view_.fraction()) > 0;
    }
    if (rule < 0 && !re) return;
    const Choice after = select_like_nccl(t);
    steered_.store(steered_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    note(coll, bytes, before, after, *n_channels, rule, re);
}

void Context::get_chunk_size(int coll, uint64_t bytes, int algo, int proto, int /*n_channels*/,
                             uint64_t *chunk) noexcept
{
    if (chunk == nullptr || rules_->rules.empty()) return;
    const CollQuery q{coll, bytes, static_cast<int>(info_.nnodes), static_cast<int>(info_.nranks), 0, 0, health_now_};
    int rule = -1;
    const uint64_t v = chunk_for(*rules_, q, algo, proto, *chunk, &rule);
    if (rule < 0) return;
    if (v != *chunk) note(coll, bytes, {algo, proto}, {algo, proto}, 0, rule, false, v);
    *chunk = v;
}

void Context::enter_block(uint64_t b) noexcept
{
    agr_->set_progress(b);
    const View prev = cur_view_;
    if (const View *v = agr_->view_at(b)) cur_view_ = *v;
    else wait_for(b);
    if (cur_block_ == UINT64_MAX || !prev.same(cur_view_) || prev.state != cur_view_.state)
        view_block_.store(b, std::memory_order_relaxed);
    cur_block_ = b;
    health_now_ = cur_view_.health();
}

void Context::wait_for(uint64_t b) noexcept
{
    const uint64_t t0 = now_ns();
    waits_.store(waits_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    waiting_since_.store(t0, std::memory_order_release);
    tuner_.wake();
    {
        // Asleep until the background thread resolves the block: it notifies under the
        // mutex, so no wake-up is lost, and retries on its own schedule (the 1 s bound is a
        // safety net only). Thousands of ranks waiting for their last member cost no CPU.
        std::unique_lock lk(wait_mu_);
        const View *v = nullptr;
        while ((v = agr_->view_at(b)) == nullptr) wait_cv_.wait_for(lk, std::chrono::seconds(1));
        cur_view_ = *v;
    }
    waiting_since_.store(0, std::memory_order_release);
    wait_ns_.store(wait_ns_.load(std::memory_order_relaxed) + (now_ns() - t0), std::memory_order_relaxed);
}

void Context::note(int coll, uint64_t bytes, const Choice &before, const Choice &after, int channels, int rule,
                   bool reestimated, uint64_t chunk) noexcept
{
    const int bucket = bytes == 0 ? 0 : 64 - __builtin_clzll(bytes);
    uint64_t key = mix(mix(mix(static_cast<uint64_t>(coll), static_cast<uint64_t>(bucket)),
                           static_cast<uint64_t>(before.algo * 8 + before.proto + 64 * (after.algo * 8 + after.proto))),
                       static_cast<uint64_t>(channels) ^ (static_cast<uint64_t>(rule + 2) << 32) ^
                           (static_cast<uint64_t>(reestimated) << 63));
    key = mix(key, chunk);
    key = mix(mix(key, cur_view_.digest), static_cast<uint64_t>(cur_view_.permille) | (uint64_t{cur_view_.state} << 16));
    if (key == 0) key = 1;
    for (uint32_t p = 0; p < 8; ++p) {
        uint64_t &slot = seen_[(key + p) % kSeen];
        if (slot == key) return; // logged already
        if (slot == 0) {
            if (seen_count_ >= kSeen * 3 / 4) return; // table full: stop logging new decisions
            slot = key;
            ++seen_count_;
            const uint64_t head = note_head_.load(std::memory_order_relaxed);
            if (head - note_tail_.load(std::memory_order_acquire) >= kNotes) {
                notes_dropped_.store(notes_dropped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
                return;
            }
            notes_[head % kNotes] = Note{coll, bytes, before, after, channels, rule, reestimated, chunk,
                                         cur_block_ == UINT64_MAX ? 0 : cur_block_, cur_view_};
            note_head_.store(head + 1, std::memory_order_release);
            return;
        }
    }
}

// ---- Tuner: process-wide state and the background thread ---------------------------------

Tuner::Tuner(Config cfg) : cfg_(std::move(cfg))
{
    cfg_.block = std::max<uint64_t>(cfg_.block, 1);
    if (std::string why = parse_store_url(cfg_.store, &store_kind_, &store_host_, &store_port_); !why.empty())
        store_kind_ = "none"; // instance() rejects a bad value before it gets here
}

Tuner::~Tuner()
{
    std::thread t;
    {
        std::lock_guard lk(mu_);
        if (stop_flag_) stop_flag_->store(true);
        t = std::move(thread_);
    }
    cv_.notify_all();
    if (t.joinable()) t.join();
    if (status_base_ != nullptr) munmap(status_base_, status_size_);
    if (status_fd_ >= 0) ::close(status_fd_);
}

namespace {
// The process's tuner and its users (open contexts plus inits under way). Counted, not
// immortal: a tuner only its library's globals reach would leak at every unload; and, as
// the last finalize (also one NCCL runs from an exit handler) releases the last user, a
// finalize always finds the tuner its init acquired.
std::mutex g_tuner_mu;
Tuner *g_tuner = nullptr;
uint64_t g_tuner_users = 0;
} // namespace

Tuner *Tuner::acquire()
{
    std::lock_guard lk(g_tuner_mu);
    Tuner *&t = g_tuner;
    if (t == nullptr) {
        // Every VIGIL_TUNER_* value is an Observe one: a bad value costs a WARN and its
        // default, never the tuner.
        const ParamLoad load = load_params(environment_source());
        (void)report_params(load, ParamScope::Tuner);
        Config c;
        c.block = static_cast<uint64_t>(load.values.tuner_block);
        c.store = load.values.tuner_store;
        c.strict = load.values.tuner_strict;
        c.steer = load.values.tuner_steer;
        c.publish_ms = static_cast<int>(load.values.tuner_publish_ms);
        c.heartbeat_s = static_cast<int>(load.values.tuner_heartbeat_s);
        c.ttl_s = static_cast<int>(load.values.tuner_store_ttl_s);
        c.store_timeout_ms = static_cast<int>(load.values.tuner_store_timeout_ms);
        std::string kind, host;
        int port = 0;
        if (std::string why = parse_store_url(c.store, &kind, &host, &port); !why.empty()) {
            VLOG_WARN("bad value VIGIL_TUNER_STORE=\"%s\": %s; using the default auto", c.store.c_str(),
                      why.c_str());
            c.store = "auto";
        }
        t = new Tuner(c);
    }
    ++g_tuner_users;
    return t;
}

void Tuner::release(Tuner *t)
{
    std::unique_lock lk(g_tuner_mu);
    if (t == nullptr || t != g_tuner || g_tuner_users == 0 || --g_tuner_users != 0) return;
    g_tuner = nullptr;
    lk.unlock();
    delete t;
}

std::shared_ptr<const Rules> Tuner::rules(std::string *why)
{
    bool explicit_path = false;
    const std::string path = rules_path(&explicit_path);
    struct stat st{};
    const bool exists = ::stat(path.c_str(), &st) == 0;
    const std::string key = path + "|" + (exists ? std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" +
                                                       std::to_string(st.st_mtim.tv_sec) + "." +
                                                       std::to_string(st.st_mtim.tv_nsec)
                                                 : std::string("-"));
    std::lock_guard lk(mu_);
    if (rules_ && key == rules_key_) return rules_;
    auto r = std::make_shared<Rules>();
    std::string error;
    const int rc = exists ? load_rules(path, r.get(), &error) : -ENOENT;
    if (rc == -ENOENT) {
        if (explicit_path)
            VLOG_WARN("NCCL_TUNER_CONFIG_FILE=%s: no such file; no rules, NCCL's choices stand", path.c_str());
        else
            VLOG_INFO(NCCL_TUNING | NCCL_INIT, "no rules file (%s not found; NCCL_TUNER_CONFIG_FILE unset)",
                      path.c_str());
        r->file = path;
    } else if (rc != 0) {
        if (cfg_.strict) {
            *why = error + " (VIGIL_TUNER_STRICT=1: init fails)";
            VLOG_WARN("rules rejected: %s", why->c_str());
            return nullptr;
        }
        VLOG_WARN("rules file rejected whole: %s; no rules apply, NCCL's choices stand (VIGIL_TUNER_STRICT=1 makes "
                  "this fail init)",
                  error.c_str());
        r->rules.clear();
    } else {
        VLOG_INFO(NCCL_TUNING | NCCL_INIT, "%zu rules from %s (digest %016llx)", r->rules.size(), path.c_str(),
                  static_cast<unsigned long long>(r->digest));
        for (const Rule &x : r->rules)
            if (x.reg_buff != -1) {
                VLOG_INFO(NCCL_TUNING, "rule %s:%d matches on regBuff, which NCCL sets per rank: ranks may decide "
                                       "differently (docs/tuner.md)",
                          path.c_str(), x.line);
                break;
            }
    }
    rules_ = std::move(r);
    rules_key_ = key;
    return rules_;
}

Store *Tuner::store_for(const CommInfo &info, std::string *why_off)
{
    if (!info.has_comm) {
        *why_off = "tuner v" + std::to_string(info.abi) + " passes no communicator id";
        if (!said_no_comm_) {
            said_no_comm_ = true;
            VLOG_INFO(NCCL_TUNING | NCCL_INIT, "NCCL uses tuner v%d, which passes no communicator id: rules apply, "
                                               "health steering is off",
                      info.abi);
        }
        return nullptr;
    }
    std::string kind = store_kind_;
    if (kind == "auto") kind = info.nnodes <= 1 ? "shm" : "none-multihost";
    if (kind == "none" || kind == "none-multihost") {
        *why_off = kind == "none" ? "VIGIL_TUNER_STORE=none" : "no store for a multi-host communicator";
        if (!said_no_store_) {
            said_no_store_ = true;
            if (kind == "none")
                VLOG_INFO(NCCL_TUNING | NCCL_INIT, "VIGIL_TUNER_STORE=none: rules without a health field apply, "
                                                   "health steering is off");
            else
                VLOG_INFO(NCCL_TUNING | NCCL_INIT, "no store for a %zu-node communicator (set VIGIL_TUNER_STORE="
                                                   "redis://HOST:PORT): rules without a health field apply, health "
                                                   "steering is off",
                          info.nnodes);
        }
        return nullptr;
    }
    if (kind == "shm") {
        if (!shm_store_) shm_store_ = make_shm_store(cfg_.max_members);
        return shm_store_.get();
    }
    if (!redis_store_ && !redis_unavailable_) {
        std::string lib_why;
        redis_store_ = make_redis_store(store_host_, store_port_, cfg_.ttl_s, cfg_.store_timeout_ms, &lib_why);
        // The host's ranks share what one of them read: the store's load grows with the hosts.
        if (redis_store_) redis_store_ = make_host_mirror(std::move(redis_store_));
        if (!redis_store_) {
            redis_unavailable_ = true;
            VLOG_WARN("VIGIL_TUNER_STORE=%s needs hiredis: %s; rules without a health field apply, health "
                      "steering is off",
                      cfg_.store.c_str(), lib_why.c_str());
        }
    }
    if (!redis_store_) *why_off = "hiredis not available";
    return redis_store_.get();
}

int Tuner::open(const CommInfo &info, std::unique_ptr<HealthSource> health, Context **out, std::string *why)
{
    *out = nullptr;
    std::shared_ptr<const Rules> rules = this->rules(why);
    if (!rules) return -EINVAL;
    if (!health) health = registry_health_source();
    std::unique_ptr<Context> c(new Context(*this, info, std::move(rules), std::move(health)));
    std::unique_lock lk(mu_);
    std::string off;
    Store *store = store_for(info, &off);
    if (store != nullptr) {
        MemberRecord self;
        self.id = random_id();
        gethostname(self.host, sizeof(self.host) - 1);
        self.pid = static_cast<int32_t>(getpid());
        self.env_rank = env_rank();
        self.rules_digest = c->rules_->digest;
        Pacing pacing;
        pacing.lookahead = cfg_.lookahead;
        pacing.heartbeat_ns = static_cast<uint64_t>(std::clamp(cfg_.heartbeat_s, 1, std::max(cfg_.ttl_s / 4, 1))) *
                              1'000'000'000ull;
        c->agr_ = std::make_unique<Agreement>(info.comm, static_cast<uint32_t>(std::min<size_t>(info.nranks, UINT32_MAX)),
                                              self, pacing);
        c->store_ = store;
        c->steer_ = cfg_.steer && info.model.valid;
        if (cfg_.steer && !info.model.valid) off = "no tuning constants (tuner v" + std::to_string(info.abi) + ")";
    }
    c->off_reason_ = store != nullptr ? (c->steer_ ? store->describe() : "rules only: " + off) : off;
    VLOG_INFO(NCCL_TUNING | NCCL_INIT, "comm %016llx: tuner v%d, %zu ranks on %zu nodes, %zu rules, block %llu, %s",
              static_cast<unsigned long long>(info.comm), info.abi, info.nranks, info.nnodes, c->rules_->rules.size(),
              static_cast<unsigned long long>(cfg_.block),
              c->agr_ ? ("agreed health view through " + store->describe() + (c->steer_ ? "" : " (no steering: " + off + ")")).c_str()
                      : ("health steering off: " + off).c_str());
    // Status segment (for vigil top/export), created with the first context.
    if (status_base_ == nullptr) {
        telemetry::Segment seg;
        if (telemetry::create_segment(telemetry::kTunerStatusStem, telemetry::tuner_status_bytes(), &seg) == 0) {
            status_base_ = seg.base;
            status_size_ = seg.size;
            status_fd_ = seg.fd;
            auto *h = static_cast<telemetry::TunerStatusHeader *>(status_base_);
            h->version = telemetry::kTunerStatusVersion;
            h->header_size = sizeof(*h);
            h->entry_size = sizeof(telemetry::TunerCommStatus);
            h->max_comms = telemetry::kMaxTunerComms;
            h->pid = static_cast<int32_t>(getpid());
            gethostname(h->host, sizeof(h->host) - 1);
            std::memcpy(h->magic, telemetry::kTunerStatusMagic, sizeof(h->magic));
        }
    }
    if (status_base_ != nullptr) {
        auto *h = static_cast<telemetry::TunerStatusHeader *>(status_base_);
        auto *e = reinterpret_cast<telemetry::TunerCommStatus *>(static_cast<char *>(status_base_) + sizeof(*h));
        for (uint32_t i = 0; i < telemetry::kMaxTunerComms; ++i) {
            if (e[i].in_use.load(std::memory_order_acquire) == 1) continue;
            c->status_slot_ = static_cast<int>(i);
            e[i].seq.store(e[i].seq.load() | 1, std::memory_order_relaxed);
            e[i].comm = info.comm;
            e[i].nranks = static_cast<uint32_t>(info.nranks);
            e[i].nnodes = static_cast<uint32_t>(info.nnodes);
            e[i].abi = static_cast<uint32_t>(info.abi);
            e[i].steering = c->steer_ ? 1 : 0;
            e[i].state = 3;
            e[i].permille = 1000;
            std::snprintf(e[i].store, sizeof(e[i].store), "%s", c->off_reason_.c_str());
            e[i].in_use.store(1, std::memory_order_release);
            e[i].seq.store((e[i].seq.load() | 1) + 1, std::memory_order_release);
            if (i + 1 > h->comms_used.load()) h->comms_used.store(i + 1, std::memory_order_release);
            break;
        }
    }
    contexts_.push_back(c.get());
    if (!thread_.joinable()) {
        stop_flag_ = std::make_shared<std::atomic<bool>>(false);
        thread_ = std::thread([this, stop = stop_flag_] { run(stop); });
    }
    lk.unlock();
    cv_.notify_one();
    *out = c.release();
    return 0;
}

void Tuner::close(Context *ctx)
{
    if (ctx == nullptr) return;
    {
        std::lock_guard lk(mu_);
        contexts_.erase(std::remove(contexts_.begin(), contexts_.end(), ctx), contexts_.end());
    }
    {
        // The thread serves contexts under work_mu_, taking its list under mu_ once it holds
        // work_mu_: past this point it holds no pointer to ctx.
        std::lock_guard work(work_mu_);
        if (ctx->agr_) ctx->agr_->leave(*ctx->store_);
        drain_notes(*ctx);
        write_status(*ctx);
        if (status_base_ != nullptr && ctx->status_slot_ >= 0) {
            auto *e = reinterpret_cast<telemetry::TunerCommStatus *>(static_cast<char *>(status_base_) +
                                                                     sizeof(telemetry::TunerStatusHeader));
            e[ctx->status_slot_].in_use.store(2, std::memory_order_release);
        }
    }
    std::thread done;
    {
        std::lock_guard lk(mu_);
        if (contexts_.empty() && thread_.joinable()) {
            // NCCL may unload the library after the last finalize: no thread of ours may
            // outlive it. A later open starts a new thread with its own stop flag.
            stop_flag_->store(true);
            done = std::move(thread_);
        }
    }
    cv_.notify_all();
    if (done.joinable()) done.join();
    delete ctx;
}

void Tuner::run(std::shared_ptr<std::atomic<bool>> stop)
{
    // hiredis writes with write(2): a store that drops the connection must cost an EPIPE,
    // not the job. SIGPIPE from a write is delivered to the writing thread, so blocking it
    // here leaves the application's own disposition alone.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    while (!stop->load()) {
        uint64_t due = UINT64_MAX;
        kick_.store(false, std::memory_order_release);
        {
            std::lock_guard work(work_mu_);
            std::vector<Context *> snapshot;
            {
                std::lock_guard lk(mu_);
                snapshot = contexts_;
            }
            const uint64_t now = now_ns();
            for (Context *c : snapshot) due = std::min(due, serve(*c, now));
        }
        // Asleep until a context is due (its next health read, a retry, or the time its
        // calls may reach the lookahead), a context opens or closes, or a call waits.
        std::unique_lock lk(mu_);
        const uint64_t now = now_ns();
        if (due > now)
            cv_.wait_for(lk, std::chrono::nanoseconds(std::min<uint64_t>(due - now, 1'000'000'000ull)),
                         [&] { return stop->load() || kick_.load(std::memory_order_acquire); });
    }
}

uint64_t Tuner::serve(Context &c, uint64_t now)
{
    const uint64_t publish_ns = static_cast<uint64_t>(cfg_.publish_ms) * 1'000'000ull;
    uint64_t due = now + publish_ns;
    if (c.agr_) {
        const bool fresh = now >= c.next_publish_ns_;
        MemberRecord health;
        if (fresh) {
            c.health_->read(&health);
            c.next_publish_ns_ = now + publish_ns;
        }
        // How long the calls stay in one block, so that the thread looks again well before
        // they reach the lookahead: the only clock the hot path gives it is its progress.
        const uint64_t progress = c.agr_->progress();
        if (progress != c.seen_progress_) {
            if (c.seen_progress_ns_ != 0 && progress > c.seen_progress_) {
                const uint64_t sample = (now - c.seen_progress_ns_) / (progress - c.seen_progress_);
                c.block_ns_ = c.block_ns_ == 0 ? sample : (3 * c.block_ns_ + sample) / 4;
            }
            c.seen_progress_ = progress;
            c.seen_progress_ns_ = now;
        }
        const bool waiting = c.waiting_since_.load(std::memory_order_acquire) != 0;
        if (now >= c.retry_ns_ || fresh) {
            Sink sink(c.info_.comm, cfg_.block, &c.last_view_, &c.have_last_view_, &c.view_changes_);
            switch (c.agr_->step(*c.store_, health, fresh, now, sink)) {
            case Agreement::Step::kMore:
                c.backoff_ns_ = 0;
                c.retry_ns_ = 0;
                due = now;
                break;
            case Agreement::Step::kBlocked:
                // Back off (1 ms doubling to 100 ms): thousands of ranks waiting for their
                // last member or a store must not become a storm of retries.
                c.backoff_ns_ = std::clamp<uint64_t>(c.backoff_ns_ * 2, 1'000'000ull, 100'000'000ull);
                c.retry_ns_ = now + c.backoff_ns_;
                break;
            case Agreement::Step::kIdle:
                c.backoff_ns_ = 0;
                c.retry_ns_ = 0;
                break;
            }
        }
        if (waiting && c.agr_->view_at(progress) != nullptr) {
            std::lock_guard lk(c.wait_mu_);
            c.wait_cv_.notify_all();
        }
        if (c.retry_ns_ != 0) due = std::min(due, c.retry_ns_);
        else if (due > now) due = std::min(due, now + std::clamp<uint64_t>(c.block_ns_ / 2, 1'000'000ull, publish_ns));
        due = std::min(due, c.next_publish_ns_);
        const uint64_t since = c.waiting_since_.load(std::memory_order_acquire);
        if (waiting && since != 0 && now > since && now - since >= 10'000'000'000ull &&
            now - c.last_wait_warn_ns_ >= 10'000'000'000ull) {
            c.last_wait_warn_ns_ = now;
            const uint64_t b = c.agr_->progress();
            VLOG_WARN("comm %016llx: waiting %.0f s for the agreed view of block %llu (collective %llu): %s",
                      static_cast<unsigned long long>(c.info_.comm), static_cast<double>(now - since) / 1e9,
                      static_cast<unsigned long long>(b), static_cast<unsigned long long>(b * cfg_.block),
                      c.agr_->last_error().empty() ? ("store " + c.store_->describe() + ": no answer yet").c_str()
                                                   : c.agr_->last_error().c_str());
        }
        if (waiting) due = std::min<uint64_t>(due, now + 10'000'000'000ull);
        if (!c.rules_mismatch_warned_ && c.agr_->digests_seen() > 1) warn_rules_mismatch(c);
    }
    drain_notes(c);
    if (now >= c.next_status_ns_) {
        write_status(c);
        c.next_status_ns_ = now + 50'000'000ull;
    }
    return due;
}

void Tuner::warn_rules_mismatch(Context &c)
{
    std::vector<std::pair<uint64_t, std::string>> d;
    if (c.store_->digests(c.info_.comm, c.agr_->epoch(), &d) != 0) return; // the next publication tries again
    c.rules_mismatch_warned_ = true;
    std::string list;
    for (const auto &[digest, who] : d) {
        char buf[128];
        std::snprintf(buf, sizeof(buf), "%s%016llx (first %s)", list.empty() ? "" : ", ",
                      static_cast<unsigned long long>(digest), who.c_str());
        list += buf;
    }
    VLOG_WARN("comm %016llx: ranks use %zu different rules digests: %s; this rank %016llx: ranks with different "
              "rules files may choose differently and hang NCCL",
              static_cast<unsigned long long>(c.info_.comm), d.size(), list.c_str(),
              static_cast<unsigned long long>(c.rules_->digest));
}

void Tuner::drain_notes(Context &c)
{
    const uint64_t head = c.note_head_.load(std::memory_order_acquire);
    for (uint64_t i = c.note_tail_.load(std::memory_order_relaxed); i < head; ++i) {
        const Context::Note n = c.notes_[i % Context::kNotes];
        c.note_tail_.store(i + 1, std::memory_order_release);
        const auto comm = static_cast<unsigned long long>(c.info_.comm);
        std::string why;
        if (n.rule == -2) {
            VLOG_WARN("comm %016llx: getCollInfo got no usable cost table; NCCL's choice stands", comm);
            continue;
        }
        if (n.rule >= 0) {
            const Rule &r = c.rules_->rules[static_cast<size_t>(n.rule)];
            why = "rule " + c.rules_->file + ":" + std::to_string(r.line);
        } else if (n.reestimated) {
            why = "agreed view " + describe_view(n.view) + ": cost model re-estimate";
        }
        if (n.chunk != 0) {
            VLOG_INFO(NCCL_TUNING, "comm %016llx %s %llu B %s: chunk %llu B (%s)", comm, coll_name(n.coll),
                      static_cast<unsigned long long>(n.bytes), choice_text(n.after).c_str(),
                      static_cast<unsigned long long>(n.chunk), why.c_str());
            continue;
        }
        std::string ch = n.channels > 0 ? ", " + std::to_string(n.channels) + " channels" : "";
        VLOG_INFO(NCCL_TUNING, "comm %016llx %s %llu B (block %llu): %s -> %s%s (%s)", comm, coll_name(n.coll),
                  static_cast<unsigned long long>(n.bytes), static_cast<unsigned long long>(n.block),
                  choice_text(n.before).c_str(), choice_text(n.after).c_str(), ch.c_str(), why.c_str());
    }
    const uint64_t dropped = c.notes_dropped_.load(std::memory_order_relaxed);
    if (dropped != c.notes_dropped_logged_) {
        VLOG_INFO(NCCL_TUNING, "comm %016llx: %llu steering decisions not logged (log ring full)",
                  static_cast<unsigned long long>(c.info_.comm),
                  static_cast<unsigned long long>(dropped - c.notes_dropped_logged_));
        c.notes_dropped_logged_ = dropped;
    }
}

void Tuner::write_status(Context &c)
{
    if (status_base_ == nullptr || c.status_slot_ < 0) return;
    auto *e = reinterpret_cast<telemetry::TunerCommStatus *>(static_cast<char *>(status_base_) +
                                                             sizeof(telemetry::TunerStatusHeader)) +
              c.status_slot_;
    const uint32_t seq = e->seq.load(std::memory_order_relaxed);
    e->seq.store(seq | 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    if (c.agr_ && c.have_last_view_) {
        // What this rank uses now: the view of the block its calls are in.
        const uint64_t b = c.agr_->progress();
        const View *v = c.agr_->view_at(b);
        const View &shown = v != nullptr ? *v : c.last_view_;
        e->state = shown.state;
        e->permille = shown.permille;
        e->degraded_nics = shown.degraded_nics;
        e->failed_nics = shown.failed_nics;
        std::snprintf(e->source, sizeof(e->source), "%s", shown.source);
        e->block = b;
    }
    e->calls = c.calls_.load(std::memory_order_relaxed);
    e->view_block = c.view_block_.load(std::memory_order_relaxed);
    e->view_changes = c.view_changes_;
    e->waits = c.waits_.load(std::memory_order_relaxed);
    e->wait_ns = c.wait_ns_.load(std::memory_order_relaxed);
    e->steered = c.steered_.load(std::memory_order_relaxed);
    e->seq.store((seq | 1) + 1, std::memory_order_release);
}

} // namespace vigil::tuner
