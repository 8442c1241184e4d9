// SPDX-License-Identifier: Apache-2.0
// Redis store through hiredis. Every step that must be atomic with the epoch check runs as
// one Lua script (EVAL), so a register is never written into a Redis that restarted empty
// unless the writer has seen the new epoch. Keys share the hash tag {<comm hex>} so a Redis
// Cluster keeps one communicator's keys in one slot.
#include <cerrno>
#include <cstring>
#include <hiredis/hiredis.h>
#include <random>

#include "log.h"
#include "store.h"

namespace vigil::tuner {
namespace {

// KEYS: epoch. ARGV: new nonce, ttl. Returns the current nonce (creating it when absent).
constexpr const char *kEpochScript =
    "local e = redis.call('GET', KEYS[1]) "
    "if not e then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) return ARGV[1] end "
    "redis.call('EXPIRE', KEYS[1], ARGV[2]) return e";
// KEYS: epoch, members. ARGV: epoch, member id, record, ttl. Returns the member count or -1.
constexpr const char *kPublishScript =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end "
    "redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) redis.call('EXPIRE', KEYS[2], ARGV[4]) "
    "return redis.call('HLEN', KEYS[2])";
// KEYS: epoch, members. ARGV: epoch. Returns {-1} (stale) or {0, record...}.
constexpr const char *kMembersScript =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end "
    "local v = redis.call('HVALS', KEYS[2]) table.insert(v, 1, 0) return v";
// KEYS: epoch, members, register. ARGV: epoch, need, value, ttl.
// Returns {-1,''} stale, {-2,''} too few members, {1,held} existed, {0,value} written.
constexpr const char *kProposeScript =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1, ''} end "
    "local cur = redis.call('GET', KEYS[3]) if cur then return {1, cur} end "
    "local need = tonumber(ARGV[2]) "
    "if need > 0 and redis.call('HLEN', KEYS[2]) < need then return {-2, ''} end "
    "redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[4]) return {0, ARGV[3]}";
// KEYS: epoch, register. ARGV: epoch. Returns {-1,''} stale, {1,value} or {0,''}.
constexpr const char *kReadScript =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1, ''} end "
    "local cur = redis.call('GET', KEYS[2]) if cur then return {1, cur} end return {0, ''}";

struct ReplyDeleter {
    void operator()(redisReply *r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

class RedisStore final : public Store
{
public:
    RedisStore(std::string host, int port, int ttl_s, int timeout_ms)
        : host_(std::move(host)), port_(port), ttl_(std::to_string(ttl_s)), timeout_ms_(timeout_ms)
    {
    }
    ~RedisStore() override
    {
        if (ctx_ != nullptr) redisFree(ctx_);
    }

    std::string describe() const override
    {
        return "redis://" + (host_.find(':') != std::string::npos ? "[" + host_ + "]" : host_) + ":" +
               std::to_string(port_);
    }

    int epoch(uint64_t comm, uint64_t *out) override
    {
        std::random_device rd;
        uint64_t nonce = 0;
        while (nonce == 0) nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd();
        const std::string n = std::to_string(nonce), ek = key(comm, "epoch");
        Reply r = eval(kEpochScript, {ek}, {n, ttl_});
        if (!r) return -EIO;
        if (r->type != REDIS_REPLY_STRING || !parse_u64(r->str, r->len, out)) return bad_reply("epoch");
        return 0;
    }

    int publish(uint64_t comm, uint64_t epoch, const MemberRecord &m, uint32_t *count) override
    {
        char id[24];
        std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(m.id));
        Reply r = eval(kPublishScript, {key(comm, "epoch"), members_key(comm, epoch)},
                       {std::to_string(epoch), id, encode_member(m), ttl_});
        if (!r) return -EIO;
        if (r->type != REDIS_REPLY_INTEGER) return bad_reply("publish");
        if (r->integer < 0) return -ESTALE;
        *count = static_cast<uint32_t>(std::min<long long>(r->integer, UINT32_MAX));
        return 0;
    }

    int members(uint64_t comm, uint64_t epoch, std::vector<MemberRecord> *out) override
    {
        out->clear();
        Reply r = eval(kMembersScript, {key(comm, "epoch"), members_key(comm, epoch)}, {std::to_string(epoch)});
        if (!r) return -EIO;
        if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 || r->element[0]->type != REDIS_REPLY_INTEGER)
            return bad_reply("members");
        if (r->element[0]->integer < 0) return -ESTALE;
        size_t bad = 0;
        for (size_t i = 1; i < r->elements && i <= 65536; ++i) {
            const redisReply *e = r->element[i];
            MemberRecord m;
            if (e->type == REDIS_REPLY_STRING && decode_member(std::string_view(e->str, e->len), &m)) out->push_back(m);
            else ++bad;
        }
        if (bad != 0 && !warned_bad_) {
            warned_bad_ = true;
            VLOG_WARN("store %s: %zu malformed member records ignored", describe().c_str(), bad);
        }
        return 0;
    }

    int propose(uint64_t comm, uint64_t epoch, uint64_t block, const View &proposal, uint32_t need_members,
                View *held, bool *existed) override
    {
        Reply r = eval(kProposeScript, {key(comm, "epoch"), members_key(comm, epoch), register_key(comm, block)},
                       {std::to_string(epoch), std::to_string(need_members), encode_view(proposal), ttl_});
        if (!r) return -EIO;
        return view_reply(r.get(), held, existed, "propose");
    }

    int read(uint64_t comm, uint64_t epoch, uint64_t block, View *out, bool *found) override
    {
        Reply r = eval(kReadScript, {key(comm, "epoch"), register_key(comm, block)}, {std::to_string(epoch)});
        if (!r) return -EIO;
        return view_reply(r.get(), out, found, "read");
    }

    int reassert(uint64_t comm, uint64_t epoch, const std::vector<uint64_t> &blocks, const std::vector<View> &views,
                 uint32_t *conflicts) override
    {
        *conflicts = 0;
        if (int rc = connect(); rc != 0) return rc;
        const std::string ek = key(comm, "epoch"), mk = members_key(comm, epoch), e = std::to_string(epoch);
        // Pipelined: thousands of registers in one round trip's worth of waiting.
        for (size_t i = 0; i < blocks.size(); ++i) {
            const std::string rk = register_key(comm, blocks[i]), v = encode_view(views[i]);
            const char *argv[] = {"EVAL", kProposeScript, "3", ek.c_str(), mk.c_str(), rk.c_str(), e.c_str(), "0",
                                  v.c_str(), ttl_.c_str()};
            if (redisAppendCommandArgv(ctx_, 10, argv, nullptr) != REDIS_OK) return lost("pipeline");
        }
        int rc = 0;
        for (size_t i = 0; i < blocks.size(); ++i) {
            void *raw = nullptr;
            if (redisGetReply(ctx_, &raw) != REDIS_OK) return lost("pipeline");
            Reply r(static_cast<redisReply *>(raw));
            View held;
            bool existed = false;
            const int one = view_reply(r.get(), &held, &existed, "reassert");
            if (one != 0 && rc == 0) rc = one;
            if (one == 0 && existed && !held.same(views[i])) ++*conflicts;
        }
        return rc;
    }

    void forget(uint64_t) override {}

private:
    std::string key(uint64_t comm, const char *what) const
    {
        char buf[64];
        std::snprintf(buf, sizeof(buf), "vigil:{%016llx}:%s", static_cast<unsigned long long>(comm), what);
        return buf;
    }
    std::string members_key(uint64_t comm, uint64_t epoch) const
    {
        return key(comm, "m:") + std::to_string(epoch);
    }
    std::string register_key(uint64_t comm, uint64_t block) const
    {
        return key(comm, "r:") + std::to_string(block);
    }

    static bool parse_u64(const char *s, size_t n, uint64_t *out)
    {
        if (n == 0 || n > 20) return false;
        uint64_t v = 0;
        for (size_t i = 0; i < n; ++i) {
            if (s[i] < '0' || s[i] > '9') return false;
            const uint64_t d = static_cast<uint64_t>(s[i] - '0');
            if (v > (UINT64_MAX - d) / 10) return false;
            v = v * 10 + d;
        }
        *out = v;
        return true;
    }

    int bad_reply(const char *what)
    {
        error_ = std::string("unexpected reply to ") + what;
        return -EBADMSG;
    }

    int lost(const char *what)
    {
        error_ = std::string(what) + ": " + (ctx_ != nullptr ? ctx_->errstr : "no connection");
        if (ctx_ != nullptr) redisFree(ctx_);
        ctx_ = nullptr;
        return -EIO;
    }

    int view_reply(const redisReply *r, View *out, bool *found, const char *what)
    {
        if (r->type == REDIS_REPLY_ERROR) {
            error_ = std::string(what) + ": " + std::string(r->str, r->len);
            return -EIO;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[0]->type != REDIS_REPLY_INTEGER ||
            r->element[1]->type != REDIS_REPLY_STRING)
            return bad_reply(what);
        const long long code = r->element[0]->integer;
        if (code == -1) return -ESTALE;
        if (code == -2) return -EAGAIN;
        *found = code == 1;
        if (code == 1 || code == 0) {
            const redisReply *v = r->element[1];
            if ((code == 1 || v->len != 0) && !decode_view(std::string_view(v->str, v->len), out)) {
                error_ = std::string(what) + ": malformed register value";
                return -EBADMSG;
            }
            if (code == 0 && v->len != 0) *found = false; // written by us: *out is the proposal
            return 0;
        }
        return bad_reply(what);
    }

    int connect()
    {
        if (ctx_ != nullptr && ctx_->err == 0) return 0;
        if (ctx_ != nullptr) redisFree(ctx_);
        timeval tv{timeout_ms_ / 1000, (timeout_ms_ % 1000) * 1000};
        ctx_ = redisConnectWithTimeout(host_.c_str(), port_, tv);
        if (ctx_ == nullptr) {
            error_ = "connect: out of memory";
            return -ENOMEM;
        }
        if (ctx_->err != 0) return lost("connect");
        if (redisSetTimeout(ctx_, tv) != REDIS_OK) return lost("set timeout");
        return 0;
    }

    Reply eval(const char *script, std::initializer_list<std::string> keys, std::initializer_list<std::string> args)
    {
        if (connect() != 0) return nullptr;
        std::vector<const char *> argv;
        std::vector<size_t> lens;
        const std::string nkeys = std::to_string(keys.size());
        argv.push_back("EVAL");
        argv.push_back(script);
        argv.push_back(nkeys.c_str());
        for (const std::string &k : keys) argv.push_back(k.c_str());
        for (const std::string &a : args) argv.push_back(a.c_str());
        for (const char *a : argv) lens.push_back(std::strlen(a));
        auto *r = static_cast<redisReply *>(
            redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data()));
        if (r == nullptr) {
            lost("command");
            return nullptr;
        }
        if (r->type == REDIS_REPLY_ERROR) {
            error_ = std::string(r->str, r->len);
            freeReplyObject(r);
            return nullptr;
        }
        return Reply(r);
    }

    std::string host_;
    int port_;
    std::string ttl_;
    int timeout_ms_;
    redisContext *ctx_ = nullptr;
    bool warned_bad_ = false;
};

} // namespace

std::unique_ptr<Store> make_redis_store(const std::string &host, int port, int ttl_s, int timeout_ms)
{
    return std::make_unique<RedisStore>(host, port, ttl_s, timeout_ms);
}

} // namespace vigil::tuner
