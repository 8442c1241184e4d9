// SPDX-License-Identifier: Apache-2.0
// Cost-table handling: -1 entries stay -1, NCCL's tie order, NCCL_ALGO/NCCL_PROTO
// exclusions, 1-rank tables, the model re-estimation against hand-computed cases, chunks.
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "agree_lib.h"
#include "policy.h"

using namespace vigil::tuner;

namespace {

constexpr int RING = 1, TREE = 0, LL = 0, LL128 = 1, SIMPLE = 2;

LatencyModel model() { return vigil::tuner::test::default_model(); }

Rules rules_of(const char *text)
{
    Rules r;
    std::string err;
    REQUIRE(parse_rules(text, &r, &err));
    return r;
}

} // namespace

TEST_CASE("select_like_nccl: strictly smallest, ties to the lowest algorithm then protocol", "[policy]")
{
    float t[21];
    for (float &x : t) x = -1.0f;
    CHECK(select_like_nccl(CostTable{t, 7, 3}) == Choice{-1, -1});
    t[RING * 3 + SIMPLE] = 5.0f;
    t[TREE * 3 + SIMPLE] = 5.0f;
    t[RING * 3 + LL] = 5.0f;
    CHECK(select_like_nccl(CostTable{t, 7, 3}) == Choice{TREE, SIMPLE});
    t[TREE * 3 + LL128] = 5.0f;
    CHECK(select_like_nccl(CostTable{t, 7, 3}) == Choice{TREE, LL128});
    t[6 * 3 + LL] = 4.999f;
    CHECK(select_like_nccl(CostTable{t, 7, 3}) == Choice{6, LL});
    t[5 * 3 + SIMPLE] = -0.5f; // any negative is unusable
    CHECK(select_like_nccl(CostTable{t, 7, 3}) == Choice{6, LL});
}

TEST_CASE("rules never make a -1 entry usable; NCCL_ALGO/NCCL_PROTO exclusions fall through", "[policy]")
{
    // NCCL_PROTO=^LL128 and NCCL_ALGO=ring show up as -1 entries everywhere but ring/{ll,simple}.
    float t[21];
    for (float &x : t) x = -1.0f;
    t[RING * 3 + LL] = 30.0f;
    t[RING * 3 + SIMPLE] = 40.0f;
    const Rules r = rules_of("allreduce,0,-1,ring,ll128,8,-1,-1\n"
                             "allreduce,0,-1,tree,simple,4,-1,-1\n"
                             "allreduce,0,-1,ring,simple,2,-1,-1\n");
    int ch = 0;
    const int used = apply_rules(r, CollQuery{4, 1 << 20, 2, 16, 1, 0, Health::kUnknown}, CostTable{t, 7, 3}, &ch);
    CHECK(used == 2);
    CHECK(ch == 2);
    CHECK(t[RING * 3 + SIMPLE] == 0.0f);
    CHECK(t[RING * 3 + LL] == 30.0f);
    for (int k = 0; k < 21; ++k)
        if (k != RING * 3 + SIMPLE && k != RING * 3 + LL) CHECK(t[k] == -1.0f);
    // No rule matches: nothing changes, channels stay NCCL's (0), unlike the example's 1.
    float u[21];
    std::memcpy(u, t, sizeof(u));
    ch = 0;
    CHECK(apply_rules(r, CollQuery{2, 1 << 20, 2, 16, 1, 0, Health::kUnknown}, CostTable{u, 7, 3}, &ch) == -1);
    CHECK(ch == 0);
    CHECK(std::memcmp(t, u, sizeof(t)) == 0);
}

TEST_CASE("a 1-rank table keeps ring/simple as its only entry", "[policy]")
{
    float t[21];
    for (float &x : t) x = -1.0f;
    t[RING * 3 + SIMPLE] = 0.0f;
    const Rules r = rules_of("allreduce,0,-1,tree,ll,-1,-1,-1\nallreduce,0,-1,ring,ll,-1,-1,-1\n");
    int ch = 0;
    CHECK(apply_rules(r, CollQuery{4, 64, 1, 1, 1, 0, Health::kUnknown}, CostTable{t, 7, 3}, &ch) == -1);
    CHECK(reestimate(CostTable{t, 7, 3}, model(), 4, 64, 1, 1, 1, 0.25) == 0);
    CHECK(select_like_nccl(CostTable{t, 7, 3}) == Choice{RING, SIMPLE});
    CHECK(t[RING * 3 + SIMPLE] == 0.0f);
}

TEST_CASE("model latency: hand-computed ring and tree cases", "[policy]")
{
    const LatencyModel m = model();
    // Ring all-reduce, 16 ranks on 2 nodes: 30 steps, 2 inter-node ones.
    // 8.4 + 28 x 3.4 + 2 x 14.0 = 131.6 us.
    CHECK(model_latency_us(m, 4, RING, SIMPLE, 16, 2, 1) == Approx(131.6));
    // Two pipelined ops double a ring's latency.
    CHECK(model_latency_us(m, 4, RING, SIMPLE, 16, 2, 2) == Approx(263.2));
    // Tree all-reduce, 8 ranks per node, 2 nodes: 6.8 + 2 x (7 x 0.6 + 1 x 5.0) = 25.2 us.
    CHECK(model_latency_us(m, 4, TREE, LL, 16, 2, 1) == Approx(25.2));
    // Ring all-gather, 4 ranks on 4 nodes: 3 steps, all inter-node: 6.6 + 3 x 2.7 = 14.7.
    CHECK(model_latency_us(m, 2, RING, LL, 4, 4, 1) == Approx(14.7));
    CHECK(model_latency_us(LatencyModel{}, 4, RING, SIMPLE, 16, 2, 1) == 0);
}

TEST_CASE("re-estimation: cost' = L + (cost - L) / fraction, crossovers move, -1 untouched", "[policy]")
{
    const LatencyModel m = model();
    float t[21];
    for (float &x : t) x = -1.0f;
    t[RING * 3 + LL] = 40.0f;       // L = 6.6 + 28 x 0.6 + 2 x 2.7 = 28.8: bandwidth part 11.2
    t[RING * 3 + SIMPLE] = 1000.0f; // L = 131.6: bandwidth part 868.4
    t[TREE * 3 + LL] = 20.0f;       // below its modelled latency 25.2: all latency
    float h[21];
    std::memcpy(h, t, sizeof(h));
    CHECK(reestimate(CostTable{h, 7, 3}, m, 4, 1 << 20, 16, 2, 1, 1.0) == 0); // healthy: bit-identical
    CHECK(std::memcmp(h, t, sizeof(h)) == 0);
    CHECK(reestimate(CostTable{t, 7, 3}, m, 4, 1 << 20, 16, 2, 1, 0.5) == 2);
    CHECK(t[RING * 3 + LL] == Approx(28.8 + 11.2 / 0.5));
    CHECK(t[RING * 3 + SIMPLE] == Approx(131.6 + 868.4 / 0.5));
    CHECK(t[TREE * 3 + LL] == 20.0f);
    for (int k = 0; k < 21; ++k)
        if (k != RING * 3 + LL && k != RING * 3 + SIMPLE && k != TREE * 3 + LL) CHECK(t[k] == -1.0f);

    // The LL/SIMPLE crossover moves to smaller messages at a quarter of the bandwidth:
    // ring/LL 40 (28.8 + 11.2) beats ring/SIMPLE 45 (all latency) when healthy, and loses
    // at 0.25 (28.8 + 44.8 = 73.6 > 45).
    float c[21];
    for (float &x : c) x = -1.0f;
    c[RING * 3 + LL] = 40.0f;
    c[RING * 3 + SIMPLE] = 45.0f;
    CHECK(select_like_nccl(CostTable{c, 7, 3}) == Choice{RING, LL});
    reestimate(CostTable{c, 7, 3}, m, 4, 65536, 16, 2, 1, 0.25);
    CHECK(c[RING * 3 + LL] == Approx(73.6));
    CHECK(c[RING * 3 + SIMPLE] == 45.0f);
    CHECK(select_like_nccl(CostTable{c, 7, 3}) == Choice{RING, SIMPLE});

    // Single node, invalid model, fraction out of (0, 1): nothing changes.
    float s[21];
    std::memcpy(s, c, sizeof(s));
    CHECK(reestimate(CostTable{s, 7, 3}, m, 4, 65536, 8, 1, 1, 0.25) == 0);
    CHECK(reestimate(CostTable{s, 7, 3}, LatencyModel{}, 4, 65536, 16, 2, 1, 0.25) == 0);
    CHECK(reestimate(CostTable{s, 7, 3}, m, 4, 65536, 16, 2, 1, 0.0) == 0);
    CHECK(std::memcmp(s, c, sizeof(s)) == 0);
}

TEST_CASE("re-estimation never turns -1 usable and is a pure function (random tables)", "[policy]")
{
    std::mt19937 rng(3);
    const LatencyModel m = model();
    for (int i = 0; i < 5000; ++i) {
        float t[21], u[21];
        for (float &x : t) x = rng() % 3 == 0 ? -1.0f : static_cast<float>(rng() % 100000) / 10.0f;
        std::memcpy(u, t, sizeof(u));
        const double f = (1 + rng() % 999) / 1000.0;
        const int nodes = 2 + static_cast<int>(rng() % 8), coll = static_cast<int>(rng() % 5);
        reestimate(CostTable{t, 7, 3}, m, coll, 0, nodes * 8, nodes, 1, f);
        float v[21]; // same inputs, same outputs, bit for bit (what every rank relies on)
        std::memcpy(v, u, sizeof(v));
        reestimate(CostTable{v, 7, 3}, m, coll, 0, nodes * 8, nodes, 1, f);
        REQUIRE(std::memcmp(t, v, sizeof(t)) == 0);
        for (int k = 0; k < 21; ++k) {
            if (u[k] < 0) REQUIRE(t[k] == u[k]);
            else REQUIRE(t[k] >= u[k]);
        }
    }
}

TEST_CASE("chunk_for: rule chunk on its own algorithm/protocol, grain-aligned, never below one grain", "[policy]")
{
    CHECK(proto_grain(LL) == 16);
    CHECK(proto_grain(LL128) == 1920);
    CHECK(proto_grain(SIMPLE) == 512);
    const Rules r = rules_of("allreduce,0,1048576,ring,simple,-1,-1,-1,-1,-1,any,131000\n"
                             "allreduce,0,-1,ring,ll128,-1,-1,-1,4,-1,degraded,100\n"
                             "allgather,0,-1,ring,simple,-1,-1,-1\n");
    int rule = -1;
    const CollQuery q{4, 65536, 2, 16, 0, 0, Health::kHealthy};
    CHECK(chunk_for(r, q, RING, SIMPLE, 524288, &rule) == 130560); // 131000 rounded down to 512
    CHECK(rule == 0);
    CHECK(chunk_for(r, q, RING, LL, 4096, &rule) == 4096); // another protocol: NCCL's value
    CHECK(rule == -1);
    CHECK(chunk_for(r, CollQuery{4, 2 << 20, 2, 16, 0, 0, Health::kHealthy}, RING, SIMPLE, 524288, &rule) == 524288);
    CHECK(chunk_for(r, q, RING, LL128, 7680, &rule) == 7680); // health must match
    CHECK(chunk_for(r, CollQuery{4, 65536, 2, 16, 0, 0, Health::kDegraded}, RING, LL128, 7680, &rule) == 1920);
    CHECK(rule == 1); // numPipeOps (not passed to getChunkSize) ignored; 100 B -> one grain
    CHECK(chunk_for(r, CollQuery{2, 65536, 2, 16, 0, 0, Health::kHealthy}, RING, SIMPLE, 999, &rule) == 999);
    CHECK(chunk_for(r, q, RING, 7, 4096, &rule) == 4096);
}
