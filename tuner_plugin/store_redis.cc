// SPDX-License-Identifier: Apache-2.0
// Redis store through hiredis (opened at run time, redis_lib.h). Every step that must be atomic with the epoch check runs as
// one Lua script (EVAL), so a register is never written into a Redis that restarted empty
// unless the writer has seen the new epoch. Keys share the hash tag {<comm hex>} so a Redis
// Cluster keeps one communicator's keys in one slot.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "log.h"
#include "redis_lib.h"
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

using Reply = std::unique_ptr<RedisReply>;

class RedisStore final : public Store
{
public:
    RedisStore(std::string host, int port, int ttl_s, int timeout_ms)
        : host_(std::move(host)), port_(port), ttl_(std::to_string(ttl_s)), timeout_ms_(timeout_ms)
    {
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
        if (r->type != RedisReply::kString || !parse_u64(r->str.data(), r->str.size(), out)) return bad_reply("epoch");
        return 0;
    }

    int publish(uint64_t comm, uint64_t epoch, const MemberRecord &m, uint32_t *count) override
    {
        char id[24];
        std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(m.id));
        Reply r = eval(kPublishScript, {key(comm, "epoch"), members_key(comm, epoch)},
                       {std::to_string(epoch), id, encode_member(m), ttl_});
        if (!r) return -EIO;
        if (r->type != RedisReply::kInteger) return bad_reply("publish");
        if (r->integer < 0) return -ESTALE;
        *count = static_cast<uint32_t>(std::min<long long>(r->integer, UINT32_MAX));
        return 0;
    }

    int members(uint64_t comm, uint64_t epoch, std::vector<MemberRecord> *out) override
    {
        out->clear();
        Reply r = eval(kMembersScript, {key(comm, "epoch"), members_key(comm, epoch)}, {std::to_string(epoch)});
        if (!r) return -EIO;
        if (r->type != RedisReply::kArray || r->elements.empty() ||
            r->elements[0].type != RedisReply::kInteger)
            return bad_reply("members");
        if (r->elements[0].integer < 0) return -ESTALE;
        size_t bad = 0;
        for (size_t i = 1; i < r->elements.size() && i <= 65536; ++i) {
            const RedisReply &e = r->elements[i];
            MemberRecord m;
            if (e.type == RedisReply::kString && decode_member(e.str, &m)) out->push_back(m);
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
            if (conn_.append({"EVAL", kProposeScript, "3", ek, mk, rk, e, "0", v, ttl_}, &error_) != 0)
                return -EIO;
        }
        int rc = 0;
        for (size_t i = 0; i < blocks.size(); ++i) {
            RedisReply r;
            if (conn_.get_reply(&r, &error_) != 0) return -EIO;
            View held;
            bool existed = false;
            const int one = view_reply(&r, &held, &existed, "reassert");
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

    int view_reply(const RedisReply *r, View *out, bool *found, const char *what)
    {
        if (r->type == RedisReply::kError) {
            error_ = std::string(what) + ": " + r->str;
            return -EIO;
        }
        if (r->type != RedisReply::kArray || r->elements.size() != 2 ||
            r->elements[0].type != RedisReply::kInteger || r->elements[1].type != RedisReply::kString)
            return bad_reply(what);
        const long long code = r->elements[0].integer;
        if (code == -1) return -ESTALE;
        if (code == -2) return -EAGAIN;
        *found = code == 1;
        if (code == 1 || code == 0) {
            const std::string &v = r->elements[1].str;
            if ((code == 1 || !v.empty()) && !decode_view(v, out)) {
                error_ = std::string(what) + ": malformed register value";
                return -EBADMSG;
            }
            if (code == 0 && !v.empty()) *found = false; // written by us: *out is the proposal
            return 0;
        }
        return bad_reply(what);
    }

    int connect()
    {
        if (conn_.ok()) return 0;
        return conn_.connect(host_, port_, timeout_ms_, &error_) == 0 ? 0 : -EIO;
    }

    Reply eval(const char *script, std::initializer_list<std::string> keys, std::initializer_list<std::string> args)
    {
        if (connect() != 0) return nullptr;
        const std::string nkeys = std::to_string(keys.size());
        std::vector<std::string_view> argv{"EVAL", script, nkeys};
        for (const std::string &k : keys) argv.push_back(k);
        for (const std::string &a : args) argv.push_back(a);
        auto r = std::make_unique<RedisReply>();
        if (conn_.command(argv, r.get(), &error_) != 0) return nullptr;
        if (r->type == RedisReply::kError) {
            error_ = r->str;
            return nullptr;
        }
        return r;
    }

    std::string host_;
    int port_;
    std::string ttl_;
    int timeout_ms_;
    RedisConnection conn_;
    bool warned_bad_ = false;
};

} // namespace

std::unique_ptr<Store> make_redis_store(const std::string &host, int port, int ttl_s, int timeout_ms,
                                        std::string *why)
{
    if (!redis_library(why)) return nullptr;
    return std::make_unique<RedisStore>(host, port, ttl_s, timeout_ms);
}

} // namespace vigil::tuner
