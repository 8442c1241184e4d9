// SPDX-License-Identifier: Apache-2.0
// Rules files: NCCL's example-tuner format (every example line of its README), Vigil's
// trailing fields, hostile input, and the example's matching semantics.
#include <catch2/catch.hpp>
#include <cstdio>
#include <random>
#include <string>

#include "policy.h"
#include "rules.h"

using namespace vigil::tuner;

namespace {

// The "Example Configuration" block of NCCL's plugins/tuner/example/README.md.
const char *kReadmeExample = R"(# Single-node, small allreduce: use tree algorithm, registered buffers only
allreduce,0,65536,tree,simple,2,1,-1,-1,1

# 4-node, 32-rank setup: medium allreduce, single pipeline op, non-registered buffers
allreduce,65537,1048576,ring,simple,4,4,32,1,0

# Any topology: large allreduce with LL128, multiple pipeline ops, any buffer type
allreduce,1048577,4294967295,ring,ll128,-1,-1,-1,4,-1

# Single-node broadcast: prefer tree, any pipeOps, registered buffers (backward compatible)
broadcast,0,32768,tree,simple,-1,1,-1

# Multi-node broadcast: optimized for non-registered buffers, single pipeline op
broadcast,32769,4294967295,ring,simple,2,-1,-1,1,0
)";

Rules parse_ok(const std::string &text)
{
    Rules r;
    std::string err;
    INFO(err);
    REQUIRE(parse_rules(text, &r, &err));
    return r;
}

std::string parse_err(const std::string &text)
{
    Rules r;
    std::string err;
    REQUIRE_FALSE(parse_rules(text, &r, &err));
    CHECK(r.rules.empty());
    return err;
}

// What NCCL's example tuner does for one call (plugins/tuner/example/plugin.c
// pluginGetCollInfo, read 2026-11): the first matching config whose entry is in bounds and
// not IGNORE sets that entry to 0.0 and channels unless -1. Its default of one channel for
// unmatched calls is the documented difference and is left out here.
int example_decide(const Rules &rules, int coll, uint64_t bytes, int nodes, int ranks, int pipe, int reg, float *t,
                   int *channels)
{
    for (size_t i = 0; i < rules.rules.size(); ++i) {
        const Rule &c = rules.rules[i];
        if (c.coll == coll && bytes >= c.min_bytes && bytes <= c.max_bytes && (c.nodes == -1 || c.nodes == nodes) &&
            (c.ranks == -1 || c.ranks == ranks) && (c.pipe_ops == -1 || c.pipe_ops == pipe) &&
            (c.reg_buff == -1 || c.reg_buff == reg)) {
            if (c.algo < kNumAlgos && c.proto < kNumProtos && t[c.algo * 3 + c.proto] != -1.0f) {
                t[c.algo * 3 + c.proto] = 0.0f;
                if (c.channels != -1) *channels = c.channels;
                return static_cast<int>(i);
            }
        }
    }
    return -1;
}

} // namespace

TEST_CASE("every example line of NCCL's README parses with the example's meaning", "[rules]")
{
    const Rules r = parse_ok(kReadmeExample);
    REQUIRE(r.rules.size() == 5);
    const Rule &a = r.rules[0];
    CHECK(a.coll == 4);
    CHECK(a.min_bytes == 0);
    CHECK(a.max_bytes == 65536);
    CHECK(a.algo == 0);
    CHECK(a.proto == 2);
    CHECK(a.channels == 2);
    CHECK(a.nodes == 1);
    CHECK(a.ranks == -1);
    CHECK(a.pipe_ops == -1);
    CHECK(a.reg_buff == 1);
    CHECK(a.health == HealthMatch::kAny);
    CHECK(a.chunk == 0);
    CHECK(a.line == 2);
    CHECK(r.rules[2].max_bytes == 4294967295ull);
    CHECK(r.rules[2].proto == 1);
    CHECK(r.rules[2].pipe_ops == 4);
    CHECK(r.rules[3].coll == 0);
    CHECK(r.rules[3].pipe_ops == -1); // 8 fields: any numPipeOps and regBuff
    CHECK(r.rules[3].reg_buff == -1);
    CHECK(r.rules[4].line == 14);
    CHECK(r.digest != 0);
    CHECK(parse_ok(std::string(kReadmeExample) + "\n# trailing comment\n").digest == r.digest);
}

TEST_CASE("8, 9, 10, 11 and 12 fields; blanks, CRLF and comments", "[rules]")
{
    const Rules r = parse_ok("allgather,1,2,ring,ll,-1,-1,-1\r\n"
                             "  reducescatter , 3 , 4 , pat , simple , 8 , 2 , 16 , 2\n"
                             "\t# indented comment\n"
                             "\n   \n"
                             "reduce,5,6,collnet_chain,ll128,0,-1,-1,-1,0\n"
                             "allreduce,0,-1,nvls_tree,simple,-1,-1,-1,-1,-1,degraded\n"
                             "allreduce,0,100,collnet_direct,simple,-1,-1,-1,-1,-1,failover,65536\n");
    REQUIRE(r.rules.size() == 5);
    CHECK(r.rules[0].coll == 2);
    CHECK(r.rules[1].coll == 3);
    CHECK(r.rules[1].algo == 6);
    CHECK(r.rules[1].pipe_ops == 2);
    CHECK(r.rules[1].reg_buff == -1);
    CHECK(r.rules[2].algo == 3);
    CHECK(r.rules[2].channels == 0);
    CHECK(r.rules[2].reg_buff == 0);
    CHECK(r.rules[3].max_bytes == UINT64_MAX);
    CHECK(r.rules[3].health == HealthMatch::kDegraded);
    CHECK(r.rules[3].algo == 5);
    CHECK(r.rules[4].health == HealthMatch::kFailover);
    CHECK(r.rules[4].chunk == 65536);
    CHECK(r.rules[4].line == 8);
    for (const Rule &x : r.rules) { // the canonical form parses back to the same rule
        const Rules again = parse_ok(format_rule(x));
        REQUIRE(again.rules.size() == 1);
        CHECK(format_rule(again.rules[0]) == format_rule(x));
    }
    CHECK(parse_ok("").rules.empty());
    CHECK(parse_ok("# only comments\n\n").digest == 0);
}

TEST_CASE("hostile input is rejected whole with the line and the reason", "[rules]")
{
    const std::string good = "allreduce,0,65536,tree,simple,2,1,-1\n";
    CHECK(parse_err(good + "allreduce,0,99999999999999999999999,ring,simple,-1,-1,-1\n") ==
          "2: max_bytes '99999999999999999999999' is larger than 2^64-1");
    CHECK(parse_err(good + "allreduce,0,1,ring,simple,99999999999,-1,-1\n").rfind("2: channels", 0) == 0);
    CHECK(parse_err(good + "allreduce,0,1,ring,simple,65,-1,-1\n") == "2: channels '65' must be in [-1, 64]");
    CHECK(parse_err(good + std::string("allreduce,0,1,ring,simple,1,-1,-1\0\n", 35)) == "2: NUL byte in line");
    CHECK(parse_err(std::string(1 << 20, 'a') + "\n" + good) == "1: line is 1048576 bytes (limit 4096)");
    CHECK(parse_err(good + "allreduce,0,1,Ring,simple,1,-1,-1\n").find("unknown algorithm 'Ring'") != std::string::npos);
    CHECK(parse_err(good + "alltoall,0,1,ring,simple,1,-1,-1\n").find("unknown collective 'alltoall'") != std::string::npos);
    CHECK(parse_err(good + "allreduce,0,1,ring,ll64,1,-1,-1\n").find("unknown protocol 'll64'") != std::string::npos);
    CHECK(parse_err(good + "allreduce,0,1,ring,simple,1,-1,-1,-1,-1,sick\n").find("unknown health 'sick'") != std::string::npos);
    CHECK(parse_err(good + "allreduce,0,1,ring,simple,1,-1\n").rfind("2: 7 fields", 0) == 0);
    CHECK(parse_err(good + "allreduce,0,1,ring,simple,1,-1,-1,-1,-1,any,0,extra\n") == "2: more than 12 fields");
    CHECK(parse_err(good + "allreduce,,1,ring,simple,1,-1,-1\n") == "2: field 2 is empty");
    CHECK(parse_err(good + "allreduce,10,1,ring,simple,1,-1,-1\n") == "2: min_bytes is larger than max_bytes");
    CHECK(parse_err(good + "allreduce,0x10,100,ring,simple,1,-1,-1\n").find("not a byte count") != std::string::npos);
    CHECK(parse_err(good + "allreduce,-5,100,ring,simple,1,-1,-1\n").find("min_bytes") != std::string::npos);
    CHECK(parse_err(good + "allreduce,0,100,ring,simple,1,0,-1\n").find("nNodes 0") != std::string::npos);
    CHECK(parse_err(good + "allreduce,0,100,ring,simple,1,-1,-1,-1,2\n").find("regBuff '2'") != std::string::npos);
    CHECK(parse_err(good + "allreduce,0,100,ring,simple,1,-1,-1,-1,-1,any,2147483648\n").find("1 GiB") != std::string::npos);
    CHECK(parse_err(good + "allreduce,0,100,ring,simple,1,-1,-1 # note\n").find("nRanks") != std::string::npos);
    CHECK(parse_err(good + "allreduce,0,100,ring,simple,1,-1,\xff\xfe\n").find("\\xff\\xfe") != std::string::npos);
    // A file of more rules than the bound.
    std::string many;
    for (size_t i = 0; i <= kMaxRules; ++i) many += "allreduce,0,1,ring,simple,1,-1,-1\n";
    CHECK(parse_err(many) == std::to_string(kMaxRules + 1) + ": more than " + std::to_string(kMaxRules) + " rules");
}

TEST_CASE("load_rules: missing file, a file, a bad file names file:line", "[rules]")
{
    char path[] = "/tmp/vigil-rules-XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    const std::string text = std::string(kReadmeExample) + "broadcast,0,1,ring,simple,1,1,1,1,1,any,1,2\n";
    REQUIRE(write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    close(fd);
    Rules r;
    std::string err;
    CHECK(load_rules(path, &r, &err) == -EINVAL);
    CHECK(err == std::string(path) + ":15: more than 12 fields");
    CHECK(r.rules.empty());
    CHECK(load_rules("/nonexistent/nccl_tuner.conf", &r, &err) == -ENOENT);
    REQUIRE(truncate(path, static_cast<off_t>(std::string(kReadmeExample).size())) == 0);
    CHECK(load_rules(path, &r, &err) == 0);
    CHECK(r.rules.size() == 5);
    CHECK(r.file == path);
    unlink(path);
}

TEST_CASE("decisions equal the example tuner's on its README file over random calls", "[rules]")
{
    const Rules rules = parse_ok(kReadmeExample);
    std::mt19937_64 rng(7);
    const int shapes[][2] = {{1, 8}, {4, 32}, {2, 16}, {1, 1}, {8, 64}};
    for (int i = 0; i < 20000; ++i) {
        const auto &s = shapes[rng() % 5];
        const int coll = static_cast<int>(rng() % 5);
        const uint64_t bytes = rng() % 4 == 0 ? (rng() % 5000000000ull) : (1ull << (rng() % 33)) + rng() % 3 - 1;
        const int pipe = 1 + static_cast<int>(rng() % 5), reg = static_cast<int>(rng() % 2);
        float mine[21], theirs[21];
        for (int k = 0; k < 21; ++k) mine[k] = theirs[k] = rng() % 4 == 0 ? -1.0f : static_cast<float>(rng() % 1000) / 7;
        int ch_mine = 0, ch_theirs = 0;
        const CollQuery q{coll, bytes, s[0], s[1], pipe, reg, Health::kUnknown};
        const int a = apply_rules(rules, q, CostTable{mine, 7, 3}, &ch_mine);
        const int b = example_decide(rules, coll, bytes, s[0], s[1], pipe, reg, theirs, &ch_theirs);
        REQUIRE(a == b);
        REQUIRE(ch_mine == ch_theirs);
        for (int k = 0; k < 21; ++k) REQUIRE(mine[k] == theirs[k]);
    }
}

TEST_CASE("health field: any matches every state; others only theirs, never an unknown view", "[rules]")
{
    const Rules r = parse_ok("allreduce,0,-1,ring,simple,-1,-1,-1,-1,-1,degraded\n"
                             "allreduce,0,-1,ring,ll,-1,-1,-1,-1,-1,failover\n"
                             "allreduce,0,-1,tree,ll,-1,-1,-1,-1,-1,healthy\n"
                             "allreduce,0,-1,ring,ll128,-1,-1,-1\n");
    auto pick = [&](Health h) {
        float t[21];
        for (float &x : t) x = 5.0f;
        int ch = 0;
        return apply_rules(r, CollQuery{4, 1000, 2, 16, 1, 0, h}, CostTable{t, 7, 3}, &ch);
    };
    CHECK(pick(Health::kDegraded) == 0);
    CHECK(pick(Health::kFailover) == 1);
    CHECK(pick(Health::kHealthy) == 2);
    CHECK(pick(Health::kUnknown) == 3);
}
