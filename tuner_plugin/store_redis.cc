// SPDX-License-Identifier: Apache-2.0
// Redis store through hiredis (opened at run time, redis_lib.h). Every step that must be atomic with the epoch check runs as
// one Lua script (EVAL), so a register is never written into a Redis that restarted empty
// unless the writer has seen the new epoch. Keys share the hash tag {<comm hex>} so a Redis
// Cluster keeps one communicator's keys in one slot.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <random>

#include "log.h"
#include "redis_lib.h"
#include "store.h"

namespace vigil::tuner {
namespace {

// Keys of one communicator (hash tag {<comm hex>}, one Redis Cluster slot): epoch (nonce),
// and per epoch E: m:E (hash member id -> record), p:E (sorted set member id -> progress),
// g:E (health generation), d:E (hash rules digest -> first member with it); r:B (register of
// block B; no epoch in the key, see Store::read).
//
// Redis counts every command a script runs, so each script does only what its step needs.

// KEYS: epoch. ARGV: new nonce, ttl. Returns the current nonce (creating it when absent).
constexpr const char *kEpochScript =
    "local e = redis.call('GET', KEYS[1]) "
    "if not e then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) return ARGV[1] end "
    "redis.call('EXPIRE', KEYS[1], ARGV[2]) return e";
// KEYS: epoch, m, p, g, d. ARGV: epoch, member id, record, ttl, progress, changed (0|1),
// digest, member name, need. Every publication refreshes the keys' expiry.
// Returns {-1} (stale) or {members, digests, min progress ("0" before `need` joined)}.
constexpr const char *kPublishScript =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end "
    "local new = redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) "
    "redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2]) "
    "if new == 1 or ARGV[6] == '1' then redis.call('INCR', KEYS[4]) end "
    "if new == 1 then redis.call('HSETNX', KEYS[5], ARGV[7], ARGV[8]) end "
    "for i = 1, 5 do redis.call('EXPIRE', KEYS[i], ARGV[4]) end "
    "local n = redis.call('HLEN', KEYS[2]) local low = '0' "
    "if n >= tonumber(ARGV[9]) then low = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')[2] end "
    "return {n, redis.call('HLEN', KEYS[5]), low}";
// KEYS: epoch, m, g. ARGV: epoch. Returns {-1} (stale) or {0, generation, record...}.
constexpr const char *kMembersScript =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end "
    "local v = redis.call('HVALS', KEYS[2]) table.insert(v, 1, redis.call('GET', KEYS[3]) or '0') "
    "table.insert(v, 1, 0) return v";
// KEYS: epoch, m, p, g, c:E:B, r:B, r:B+1, ... ARGV: epoch, need, value, ttl, generation
// ('': no check, '!': the checks only), max ahead (0: no check), B, proposer. Returns {-1}
// stale, {-2} too few members, {-5} another proposer holds the block's claim, {-4} the
// generation moved, {-3, slowest record, its progress} too far ahead, {1, held...} R[B]
// existed, {0, held...} written (held: what each register holds after, '' when absent).
// The claim (250 ms) makes one proposer per block read the member records; the others read
// the register again shortly.
constexpr const char *kProposeScript =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end "
    "local out = {1} local cur = redis.call('GET', KEYS[6]) "
    "if cur then out[2] = cur for i = 7, #KEYS do out[i - 4] = redis.call('GET', KEYS[i]) or '' end return out end "
    "local need = tonumber(ARGV[2]) "
    "if need > 0 and redis.call('HLEN', KEYS[2]) < need then return {-2} end "
    "if ARGV[8] ~= '' then local who = redis.call('GET', KEYS[5]) "
    "  if who and who ~= ARGV[8] then return {-5} end "
    "  if not who then redis.call('SET', KEYS[5], ARGV[8], 'PX', 250) end end "
    "if ARGV[5] ~= '' and (redis.call('GET', KEYS[4]) or '0') ~= ARGV[5] then return {-4} end "
    "local limit = nil local b = tonumber(ARGV[7]) "
    "if tonumber(ARGV[6]) > 0 then "
    "  local s = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES') "
    "  if s[2] then limit = tonumber(s[2]) + tonumber(ARGV[6]) "
    "    if b >= limit then return {-3, redis.call('HGET', KEYS[2], s[1]) or '', s[2]} end end "
    "end "
    "out[1] = 0 "
    "for i = 6, #KEYS do "
    "  if i > 6 and limit and b + i - 6 >= limit then out[i - 4] = '' "
    "  elseif redis.call('SET', KEYS[i], ARGV[3], 'NX', 'EX', ARGV[4]) then out[i - 4] = ARGV[3] "
    "  else out[i - 4] = redis.call('GET', KEYS[i]) or '' end "
    "end return out";
// KEYS: epoch, r:B1, r:B2, ... ARGV: epoch, ttl, value1, value2, ... Writes each register
// where absent. Returns {-1} (stale) or {0, held1, held2, ...} ('' where it wrote).
constexpr const char *kReassertScript =
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return {-1} end "
    "local out = {0} "
    "for i = 2, #KEYS do "
    "  if redis.call('SET', KEYS[i], ARGV[i + 1], 'NX', 'EX', ARGV[2]) then out[i] = '' "
    "  else out[i] = redis.call('GET', KEYS[i]) or '' end "
    "end return out";

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

    // 1: the host mirror already makes reads per host, not per rank; 2 would halve them
    // again, for one block more before a health change shows.
    uint32_t span() const override { return 1; }

    int publish(uint64_t comm, uint64_t epoch, const MemberRecord &m, bool health_changed, uint32_t need,
                PublishAck *ack) override
    {
        char id[24], digest[24];
        std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(m.id));
        std::snprintf(digest, sizeof(digest), "%016llx", static_cast<unsigned long long>(m.rules_digest));
        const std::string progress = m.progress == UINT64_MAX ? "+inf" : std::to_string(m.progress);
        const std::string e = std::to_string(epoch);
        Reply r = eval(kPublishScript,
                       {key(comm, "epoch"), epoch_key(comm, "m:", e), epoch_key(comm, "p:", e),
                        epoch_key(comm, "g:", e), epoch_key(comm, "d:", e)},
                       {e, id, encode_member(m), ttl_, progress, health_changed ? "1" : "0", digest, member_name(m),
                        std::to_string(need)});
        if (!r) return -EIO;
        if (r->type != RedisReply::kArray || r->elements.empty() || r->elements[0].type != RedisReply::kInteger)
            return bad_reply("publish");
        if (r->elements[0].integer < 0) return -ESTALE;
        if (r->elements.size() != 3 || r->elements[1].type != RedisReply::kInteger ||
            r->elements[2].type != RedisReply::kString)
            return bad_reply("publish");
        ack->members = static_cast<uint32_t>(std::clamp<long long>(r->elements[0].integer, 0, UINT32_MAX));
        ack->digests = static_cast<uint32_t>(std::clamp<long long>(r->elements[1].integer, 0, UINT32_MAX));
        ack->min_progress = parse_progress(r->elements[2].str);
        return 0;
    }

    int members(uint64_t comm, uint64_t epoch, std::vector<MemberRecord> *out, uint64_t *gen) override
    {
        out->clear();
        const std::string e = std::to_string(epoch);
        Reply r = eval(kMembersScript, {key(comm, "epoch"), epoch_key(comm, "m:", e), epoch_key(comm, "g:", e)}, {e});
        if (!r) return -EIO;
        if (r->type != RedisReply::kArray || r->elements.empty() || r->elements[0].type != RedisReply::kInteger)
            return bad_reply("members");
        if (r->elements[0].integer < 0) return -ESTALE;
        if (r->elements.size() < 2 || r->elements[1].type != RedisReply::kString ||
            !parse_u64(r->elements[1].str.data(), r->elements[1].str.size(), gen))
            return bad_reply("members");
        size_t bad = 0;
        for (size_t i = 2; i < r->elements.size() && i <= 65537; ++i) {
            const RedisReply &x = r->elements[i];
            MemberRecord m;
            if (x.type == RedisReply::kString && decode_member(x.str, &m)) out->push_back(m);
            else ++bad;
        }
        if (bad != 0 && !warned_bad_) {
            warned_bad_ = true;
            VLOG_WARN("store %s: %zu malformed member records ignored", describe().c_str(), bad);
        }
        return 0;
    }

    int digests(uint64_t comm, uint64_t epoch, std::vector<std::pair<uint64_t, std::string>> *out) override
    {
        out->clear();
        if (int rc = connect(); rc != 0) return rc;
        RedisReply r;
        const std::string k = epoch_key(comm, "d:", std::to_string(epoch));
        if (conn_.command({"HGETALL", k}, &r, &error_) != 0) return -EIO;
        if (r.type != RedisReply::kArray) return bad_reply("digests");
        for (size_t i = 0; i + 1 < r.elements.size() && i < 512; i += 2) {
            uint64_t d = 0;
            const std::string &h = r.elements[i].str;
            if (h.size() != 16 || std::from_chars(h.data(), h.data() + h.size(), d, 16).ec != std::errc()) continue;
            out->emplace_back(d, r.elements[i + 1].str.substr(0, 64));
        }
        return 0;
    }

    int propose(uint64_t comm, uint64_t epoch, uint64_t block, const View &proposal, uint32_t need_members,
                uint64_t max_ahead, const std::string &gen, View *held, bool *found, bool *existed,
                Slowest *slow) override
    {
        const std::string e = std::to_string(epoch);
        const std::string b = std::to_string(block);
        std::vector<std::string> keys = {key(comm, "epoch"), epoch_key(comm, "m:", e), epoch_key(comm, "p:", e),
                                         epoch_key(comm, "g:", e), epoch_key(comm, "c:", e + ":" + b)};
        for (uint32_t i = 0; i < span(); ++i) keys.push_back(register_key(comm, block + i));
        const std::string nkeys = std::to_string(keys.size()), value = encode_view(proposal);
        const std::string need = std::to_string(need_members), ahead = std::to_string(max_ahead);
        // The proposer, for the block's claim: its name (a re-assertion passes none).
        const std::string who(proposal.source, strnlen(proposal.source, sizeof(proposal.source)));
        std::vector<std::string_view> argv{"EVAL", kProposeScript, nkeys};
        for (const std::string &k : keys) argv.push_back(k);
        for (const std::string *a :
             std::initializer_list<const std::string *>{&e, &need, &value, &ttl_, &gen, &ahead, &b, &who})
            argv.push_back(*a);
        Reply r = command(argv);
        if (!r) return -EIO;
        if (r->type != RedisReply::kArray || r->elements.empty() || r->elements[0].type != RedisReply::kInteger)
            return bad_reply("propose");
        const long long code = r->elements[0].integer;
        if (code == -1) return -ESTALE;
        if (code == -2) return -EAGAIN;
        if (code == -4) return -ECANCELED;
        if (code == -5) {
            error_ = "another member is proposing block " + b;
            return -EALREADY;
        }
        if (code == -3) {
            if (r->elements.size() == 3 && r->elements[1].type == RedisReply::kString &&
                r->elements[2].type == RedisReply::kString) {
                slow->have = decode_member(r->elements[1].str, &slow->rec);
                slow->progress = parse_progress(r->elements[2].str);
            }
            return -EOVERFLOW;
        }
        if ((code != 0 && code != 1) || r->elements.size() != 1 + span()) return bad_reply("propose");
        *existed = code == 1;
        for (uint32_t i = 0; i < span(); ++i) {
            const RedisReply &x = r->elements[1 + i];
            found[i] = false;
            if (x.type != RedisReply::kString) return bad_reply("propose");
            if (x.str.empty()) continue;
            if (!decode_view(x.str, &held[i])) {
                error_ = "propose: malformed register value";
                return -EBADMSG;
            }
            found[i] = true;
        }
        if (!found[0]) return bad_reply("propose");
        return 0;
    }

    int read(uint64_t comm, uint64_t, uint64_t block, uint32_t count, View *out, uint32_t *found) override
    {
        *found = 0;
        count = std::clamp<uint32_t>(count, 1, kMaxSpan);
        std::vector<std::string> keys;
        for (uint32_t i = 0; i < count; ++i) keys.push_back(register_key(comm, block + i));
        std::vector<std::string_view> argv{"MGET"};
        for (const std::string &k : keys) argv.push_back(k);
        Reply r = command(argv);
        if (!r) return -EIO;
        if (r->type != RedisReply::kArray || r->elements.size() != count) return bad_reply("read");
        for (uint32_t i = 0; i < count; ++i) {
            const RedisReply &x = r->elements[i];
            if (x.type == RedisReply::kNil) break;
            if (x.type != RedisReply::kString || !decode_view(x.str, &out[i])) {
                error_ = "read: malformed register value";
                return -EBADMSG;
            }
            *found = i + 1;
        }
        return 0;
    }

    int reassert(uint64_t comm, uint64_t epoch, const std::vector<uint64_t> &blocks, const std::vector<View> &views,
                 uint32_t *conflicts) override
    {
        *conflicts = 0;
        if (int rc = connect(); rc != 0) return rc;
        const std::string ek = key(comm, "epoch"), e = std::to_string(epoch);
        // 256 registers a script call, pipelined: thousands of registers in a few round trips.
        constexpr size_t kBatch = 256;
        size_t batches = 0;
        for (size_t first = 0; first < blocks.size(); first += kBatch, ++batches) {
            const size_t n = std::min(kBatch, blocks.size() - first);
            std::vector<std::string> keys, values;
            for (size_t i = 0; i < n; ++i) {
                keys.push_back(register_key(comm, blocks[first + i]));
                values.push_back(encode_view(views[first + i]));
            }
            const std::string nkeys = std::to_string(n + 1);
            std::vector<std::string_view> argv{"EVAL", kReassertScript, nkeys, ek};
            for (const std::string &k : keys) argv.push_back(k);
            argv.push_back(e);
            argv.push_back(ttl_);
            for (const std::string &v : values) argv.push_back(v);
            if (conn_.append(argv, &error_) != 0) return -EIO;
        }
        int rc = 0;
        for (size_t k = 0, first = 0; k < batches; ++k, first += kBatch) {
            RedisReply r;
            if (conn_.get_reply(&r, &error_) != 0) return -EIO;
            if (r.type == RedisReply::kError) {
                error_ = "reassert: " + r.str;
                rc = rc != 0 ? rc : -EIO;
                continue;
            }
            if (r.type != RedisReply::kArray || r.elements.empty() || r.elements[0].type != RedisReply::kInteger) {
                rc = rc != 0 ? rc : bad_reply("reassert");
                continue;
            }
            if (r.elements[0].integer < 0) {
                rc = rc != 0 ? rc : -ESTALE;
                continue;
            }
            for (size_t i = 1; i < r.elements.size() && first + i - 1 < blocks.size(); ++i) {
                View held;
                const std::string &v = r.elements[i].str;
                if (!v.empty() && decode_view(v, &held) && !held.same(views[first + i - 1])) ++*conflicts;
            }
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
    std::string epoch_key(uint64_t comm, const char *what, const std::string &epoch) const
    {
        return key(comm, what) + epoch;
    }
    static std::string member_name(const MemberRecord &m)
    {
        char buf[96];
        if (m.env_rank >= 0) std::snprintf(buf, sizeof(buf), "%.63s/%d/r%d", m.host, m.pid, m.env_rank);
        else std::snprintf(buf, sizeof(buf), "%.63s/%d", m.host, m.pid);
        return buf;
    }
    // A sorted-set score as Redis prints it ("1234", "inf" for a member that left).
    static uint64_t parse_progress(const std::string &s)
    {
        if (s == "inf" || s == "+inf") return UINT64_MAX;
        uint64_t v = 0;
        return parse_u64(s.data(), s.size(), &v) ? v : 0;
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

    int connect()
    {
        if (conn_.ok()) return 0;
        return conn_.connect(host_, port_, timeout_ms_, &error_) == 0 ? 0 : -EIO;
    }

    Reply eval(const char *script, std::initializer_list<std::string> keys, std::initializer_list<std::string> args)
    {
        const std::string nkeys = std::to_string(keys.size());
        std::vector<std::string_view> argv{"EVAL", script, nkeys};
        for (const std::string &k : keys) argv.push_back(k);
        for (const std::string &a : args) argv.push_back(a);
        return command(argv);
    }

    Reply command(const std::vector<std::string_view> &argv)
    {
        if (connect() != 0) return nullptr;
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
