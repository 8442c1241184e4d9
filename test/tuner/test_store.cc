// SPDX-License-Identifier: Apache-2.0
// The stores' contract, call by call (store.h), on the shm segment and on a real
// redis-server: one publication per member bumps the health generation, a proposal computed
// at an older generation is refused, the head start names the slowest member, a restart
// shows as an absent register and a stale epoch; the host mirror serves a register one rank
// read to the host's others; and 16 ranks of one host cost the store about one round trip
// per block, not one per rank.
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdio>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <sys/random.h>
#include <thread>
#include <unistd.h>

#include "agree_lib.h"
#include "redis_lib.h"
#include "store.h"
#include "tuner.h"

using namespace vigil::tuner;
using namespace vigil::tuner::test;

namespace {

uint64_t random_comm()
{
    uint64_t v = 0;
    REQUIRE(getrandom(&v, sizeof(v), 0) == sizeof(v));
    return v | 1;
}

MemberRecord rec(uint64_t id, int pid, uint64_t progress, uint64_t digest)
{
    MemberRecord m;
    m.id = id;
    std::snprintf(m.host, sizeof(m.host), "h%d", pid);
    m.pid = pid;
    m.progress = progress;
    m.rules_digest = digest;
    m.n_nics = 1;
    m.nics[0] = nic("eth0", 0, 1000);
    return m;
}

View view(uint8_t state, const char *source)
{
    View v;
    v.state = state;
    v.permille = state == 0 ? 1000 : 500;
    std::snprintf(v.source, sizeof(v.source), "%s", source);
    return v;
}

/// What every store must do, call by call. `restart` makes the store lose comm's data.
void check_contract(Store &s, const std::function<void(uint64_t comm)> &restart)
{
    const uint64_t comm = random_comm();
    const uint32_t span = s.span();
    uint64_t e = 0;
    REQUIRE(s.epoch(comm, &e) == 0);
    REQUIRE(e != 0);
    PublishAck ack;
    REQUIRE(s.publish(comm, e, rec(1, 101, 10, 0xaa), false, 2, &ack) == 0);
    CHECK(ack.members == 1);
    CHECK(ack.min_progress == 0); // not everyone joined yet
    std::vector<MemberRecord> ms;
    uint64_t g1 = 0, g2 = 0;
    REQUIRE(s.members(comm, e, &ms, &g1) == 0);
    CHECK(ms.size() == 1);
    View held[kMaxSpan];
    bool found[kMaxSpan] = {}, existed = false;
    Slowest slow;
    // Too few members.
    CHECK(s.propose(comm, e, 0, view(0, "a"), 2, kMaxAhead, std::to_string(g1), held, found, &existed, &slow) ==
          -EAGAIN);
    // A second member joins: the generation moves, the proposal computed before is refused.
    REQUIRE(s.publish(comm, e, rec(2, 102, 5000, 0xbb), false, 2, &ack) == 0);
    CHECK(ack.members == 2);
    CHECK(ack.digests == 2);
    CHECK(ack.min_progress == 10);
    CHECK(s.propose(comm, e, 0, view(0, "a"), 2, kMaxAhead, std::to_string(g1), held, found, &existed, &slow) ==
          -ECANCELED);
    REQUIRE(s.members(comm, e, &ms, &g2) == 0);
    CHECK(g2 != g1);
    CHECK(ms.size() == 2);
    // "!" only asks: everyone joined, so it is told to read the members, and writes nothing.
    CHECK(s.propose(comm, e, 0, view(0, "a"), 2, kMaxAhead, "!", held, found, &existed, &slow) == -ECANCELED);
    uint32_t none = 9;
    REQUIRE(s.read(comm, e, 0, 1, held, &none) == 0);
    CHECK(none == 0);
    // A republication without a change does not move it; a change does.
    REQUIRE(s.publish(comm, e, rec(2, 102, 5000, 0xbb), false, 2, &ack) == 0);
    uint64_t g = 0;
    REQUIRE(s.members(comm, e, &ms, &g) == 0);
    CHECK(g == g2);
    // The head start: block 3000 is more than kMaxAhead past the slowest member (block 10),
    // who is named.
    CHECK(s.propose(comm, e, 3000, view(0, "a"), 2, kMaxAhead, std::to_string(g2), held, found, &existed, &slow) ==
          -EOVERFLOW);
    CHECK(slow.have);
    CHECK(slow.rec.pid == 101);
    CHECK(slow.progress == 10);
    // Written once: R[0] (and R[1] with a span of 2); the second proposal finds it.
    REQUIRE(s.propose(comm, e, 0, view(1, "a"), 2, kMaxAhead, std::to_string(g2), held, found, &existed, &slow) ==
          0);
    CHECK_FALSE(existed);
    for (uint32_t i = 0; i < span; ++i) {
        CHECK(found[i]);
        CHECK(held[i].state == 1);
    }
    REQUIRE(s.propose(comm, e, 0, view(2, "b"), 2, kMaxAhead, std::to_string(g2), held, found, &existed, &slow) ==
          0);
    CHECK(existed);
    CHECK(held[0].state == 1);
    uint32_t n = 0;
    REQUIRE(s.read(comm, e, 0, span, held, &n) == 0);
    CHECK(n == span);
    CHECK(held[0].state == 1);
    REQUIRE(s.read(comm, e, span, span, held, &n) == 0);
    CHECK(n == 0);
    std::vector<std::pair<uint64_t, std::string>> d;
    REQUIRE(s.digests(comm, e, &d) == 0);
    CHECK(d.size() == 2);
    // The store loses its data: the register is absent, a proposal in the old epoch is
    // stale, and the known registers go back into the new epoch before anyone proposes.
    // (A local store's members keep the segment they mapped until their epoch check, at
    // every health read, moves them: until then they agree on the old one.)
    restart(comm);
    if (!s.local()) {
        // The connection the restart cut costs one failed call; the next one reconnects.
        if (s.read(comm, e, 0, 1, held, &n) == -EIO) INFO(s.last_error());
        REQUIRE(s.read(comm, e, 0, 1, held, &n) == 0);
        CHECK(n == 0);
        CHECK(s.propose(comm, e, 0, view(2, "b"), 2, kMaxAhead, "", held, found, &existed, &slow) == -ESTALE);
    }
    uint64_t e2 = 0;
    REQUIRE(s.epoch(comm, &e2) == 0);
    CHECK(e2 != e);
    CHECK(s.propose(comm, e, 0, view(2, "b"), 2, kMaxAhead, "", held, found, &existed, &slow) == -ESTALE);
    uint32_t conflicts = 9;
    REQUIRE(s.reassert(comm, e2, {0}, {view(1, "a")}, &conflicts) == 0);
    CHECK(conflicts == 0);
    REQUIRE(s.read(comm, e2, 0, 1, held, &n) == 0);
    CHECK(n == 1);
    CHECK(held[0].state == 1);
    REQUIRE(s.reassert(comm, e2, {0}, {view(2, "b")}, &conflicts) == 0);
    CHECK(conflicts == 1);
    s.forget(comm);
}

std::string shm_path(uint64_t comm)
{
    char buf[96];
    std::snprintf(buf, sizeof(buf), "/dev/shm/vigil-tstore-%u-%016llx", static_cast<unsigned>(getuid()),
                  static_cast<unsigned long long>(comm));
    return buf;
}

/// Counts reads and proposals; registers in a map.
class CountingStore final : public Store
{
public:
    std::map<uint64_t, View> regs;
    int reads = 0;
    std::string describe() const override { return "counting"; }
    uint32_t span() const override { return 2; }
    int epoch(uint64_t, uint64_t *out) override { return *out = 7, 0; }
    int publish(uint64_t, uint64_t, const MemberRecord &, bool, uint32_t, PublishAck *) override { return 0; }
    int members(uint64_t, uint64_t, std::vector<MemberRecord> *, uint64_t *g) override { return *g = 1, 0; }
    int digests(uint64_t, uint64_t, std::vector<std::pair<uint64_t, std::string>> *) override { return 0; }
    int propose(uint64_t, uint64_t, uint64_t block, const View &p, uint32_t, uint64_t, const std::string &,
                View *held, bool *found, bool *existed, Slowest *) override
    {
        *existed = regs.count(block) != 0;
        for (uint64_t b = block; b < block + 2; ++b) regs.try_emplace(b, p);
        held[0] = regs[block];
        held[1] = regs[block + 1];
        found[0] = found[1] = true;
        return 0;
    }
    int read(uint64_t, uint64_t, uint64_t block, uint32_t count, View *out, uint32_t *found) override
    {
        ++reads;
        *found = 0;
        while (*found < count && regs.count(block + *found)) out[*found] = regs[block + *found], ++*found;
        return 0;
    }
    int reassert(uint64_t, uint64_t, const std::vector<uint64_t> &, const std::vector<View> &, uint32_t *) override
    {
        return 0;
    }
    void forget(uint64_t) override {}
};

uint64_t redis_calls(int port, const char *cmd)
{
    RedisConnection c;
    RedisReply r;
    std::string why;
    if (c.connect("127.0.0.1", port, 1000, &why) != 0 || c.command({"INFO", "commandstats"}, &r, &why) != 0)
        return 0;
    const std::string key = std::string("cmdstat_") + cmd + ":calls=";
    const size_t p = r.str.find(key);
    return p == std::string::npos ? 0 : std::strtoull(r.str.c_str() + p + key.size(), nullptr, 10);
}

} // namespace

TEST_CASE("store contract: shared memory", "[store][shm]")
{
    auto s = make_shm_store(64);
    uint64_t used = 0;
    check_contract(*s, [&](uint64_t comm) {
        used = comm;
        REQUIRE(unlink(shm_path(comm).c_str()) == 0);
    });
    unlink(shm_path(used).c_str());
}

TEST_CASE("store contract: redis-server", "[store][redis]")
{
    RedisServer redis;
    std::string why;
    INFO(why);
    REQUIRE(redis.start(&why));
    auto s = make_redis_store("127.0.0.1", redis.port(), 3600, 1000, &why);
    REQUIRE(s);
    check_contract(*s, [&](uint64_t) { REQUIRE(redis.restart(&why)); });
}

TEST_CASE("host mirror: a register one rank learned is served to the host's others", "[store][mirror][shm]")
{
    const uint64_t comm = random_comm();
    auto *a_inner = new CountingStore, *b_inner = new CountingStore;
    auto a = make_host_mirror(std::unique_ptr<Store>(a_inner));
    auto b = make_host_mirror(std::unique_ptr<Store>(b_inner));
    View held[kMaxSpan], out[kMaxSpan];
    bool found[kMaxSpan] = {}, existed = false;
    Slowest slow;
    // Rank A proposes blocks 10 and 11; rank B (whose own store has nothing) reads both
    // from the mirror, without a store call.
    REQUIRE(a->propose(comm, 7, 10, view(1, "a"), 1, 0, "", held, found, &existed, &slow) == 0);
    uint32_t n = 0;
    REQUIRE(b->read(comm, 7, 10, 2, out, &n) == 0);
    CHECK(n == 2);
    CHECK(out[0].state == 1);
    CHECK(std::string(out[1].source) == "a");
    CHECK(b_inner->reads == 0);
    // Another epoch, or a block nobody learned, is a miss: the store is asked.
    REQUIRE(b->read(comm, 8, 10, 2, out, &n) == 0);
    CHECK(n == 0);
    CHECK(b_inner->reads == 1);
    // What B reads from its store goes into the mirror for A.
    b_inner->regs[20] = view(2, "b");
    REQUIRE(b->read(comm, 7, 20, 2, out, &n) == 0);
    CHECK(n == 1);
    REQUIRE(a->read(comm, 7, 20, 2, out, &n) == 0);
    CHECK(n == 1);
    CHECK(out[0].state == 2);
    CHECK(a_inner->reads == 0);
    a->forget(comm);
    b->forget(comm);
    char path[128];
    std::snprintf(path, sizeof(path), "/dev/shm/vigil-tmirror1-%u-%016llx", static_cast<unsigned>(getuid()),
                  static_cast<unsigned long long>(comm));
    unlink(path);
}

TEST_CASE("16 ranks of one host: the store serves about one round trip a block, not one a rank", "[store][redis]")
{
    RedisServer redis;
    std::string why;
    INFO(why);
    REQUIRE(redis.start(&why));
    constexpr int kRanks = 16;
    constexpr uint64_t kBlock = 16, kBlocks = 300;
    Config cfg;
    cfg.block = kBlock;
    cfg.store = redis.url();
    const uint64_t comm = random_comm(), t0 = now_ns();
    std::vector<std::unique_ptr<Tuner>> tuners;
    std::vector<Context *> ctx(kRanks, nullptr);
    for (int r = 0; r < kRanks; ++r) {
        tuners.push_back(std::make_unique<Tuner>(cfg)); // its own thread and connection, as a process
        REQUIRE(tuners.back()->open(comm_info(comm, kRanks, 2), std::make_unique<ScriptedHealth>(t0, std::vector<ScriptedHealth::Step>{
                                                                                  {0, {nic("eth0", 0, 1000)}}}),
                                    &ctx[static_cast<size_t>(r)], &why) == 0);
    }
    std::vector<View> seen(kRanks * kBlocks);
    float first[kRanks][21];
    auto call = [&](int r, uint64_t i, float *table) {
        fill_table(4, 1 << 20, table);
        int channels = 0;
        ctx[static_cast<size_t>(r)]->get_coll_info(4, 1 << 20, 1, table, 7, 3, 0, &channels);
        if (i % kBlock == 0) seen[static_cast<size_t>(r) * kBlocks + i / kBlock] = ctx[static_cast<size_t>(r)]->current_view();
    };
    // The first call of every rank waits for the last one to join; what that costs depends on
    // how long the ranks take to start, so the count begins once all have their first view.
    {
        std::vector<std::thread> joins;
        for (int r = 0; r < kRanks; ++r) joins.emplace_back([&, r] { call(r, 0, first[r]); });
        for (std::thread &t : joins) t.join();
    }
    const uint64_t before = redis_calls(redis.port(), "mget") + redis_calls(redis.port(), "eval");
    std::vector<std::thread> ranks;
    for (int r = 0; r < kRanks; ++r)
        ranks.emplace_back([&, r] {
            float table[21];
            for (uint64_t i = 1; i < kBlock * kBlocks; ++i) {
                call(r, i, table);
                if (i % kBlock == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
            }
        });
    for (std::thread &t : ranks) t.join();
    const uint64_t mgets = redis_calls(redis.port(), "mget"), evals = redis_calls(redis.port(), "eval");
    const uint64_t trips = mgets + evals - before, member_reads = redis_calls(redis.port(), "hvals");
    for (int r = 0; r < kRanks; ++r) tuners[static_cast<size_t>(r)]->close(ctx[static_cast<size_t>(r)]);
    // Every rank used the same view for every block.
    for (int r = 1; r < kRanks; ++r)
        for (uint64_t b = 0; b < kBlocks; ++b)
            CHECK(seen[static_cast<size_t>(r) * kBlocks + b].same(seen[b]));
    // One round trip per rank per block would be 4800; the host's mirror leaves about one or
    // two a block for the host (a read, and the proposal when it is first), plus each rank's
    // progress publications (kProgressStep). Counted, not timed.
    INFO("store round trips " << trips << " (" << mgets << " MGET, " << evals << " EVAL, " << member_reads
                                << " member reads) for " << kBlocks << " blocks of " << kRanks << " ranks");
    CHECK(trips <= 3 * kBlocks + 20 * kRanks);
    char path[128];
    std::snprintf(path, sizeof(path), "/dev/shm/vigil-tmirror1-%u-%016llx", static_cast<unsigned>(getuid()),
                  static_cast<unsigned long long>(comm));
    unlink(path);
}
