// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the tuner's rules file parser (tuner_plugin/rules.cc; the file is
// NCCL_TUNER_CONFIG_FILE, user input) and what the tuner does with the rules it accepts
// (tuner_plugin/policy.cc: apply_rules on NCCL's cost table, chunk_for).
//
// Input: the file's text. Properties: a rejected file leaves no rules and names its line; an
// accepted one holds only rules inside the documented bounds; each rule's canonical line
// (format_rule) parses back to the same rule, and the canonical text to the same digest;
// applying the rules to a 7 x 3 cost table with unusable entries picks a matching rule whose
// entry is usable and in the table, and sets a channel count only from 1..64; a chunk size
// from a rule is a whole number of protocol grains.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "policy.h"
#include "rules.h"

namespace vt = vigil::tuner;

namespace {

bool same_rule(const vt::Rule &a, const vt::Rule &b)
{
    return a.coll == b.coll && a.min_bytes == b.min_bytes && a.max_bytes == b.max_bytes &&
           a.algo == b.algo && a.proto == b.proto && a.channels == b.channels &&
           a.nodes == b.nodes && a.ranks == b.ranks && a.pipe_ops == b.pipe_ops &&
           a.reg_buff == b.reg_buff && a.health == b.health && a.chunk == b.chunk;
}

void check_bounds(const vt::Rule &r)
{
    FUZZ_CHECK(r.coll >= 0 && r.coll < 5 && r.algo >= 0 && r.algo < vt::kNumAlgos);
    FUZZ_CHECK(r.proto >= 0 && r.proto < vt::kNumProtos);
    FUZZ_CHECK(r.min_bytes <= r.max_bytes);
    FUZZ_CHECK(r.channels >= -1 && r.channels <= vt::kMaxRuleChannels);
    FUZZ_CHECK(r.nodes == -1 || r.nodes > 0);
    FUZZ_CHECK(r.ranks == -1 || r.ranks > 0);
    FUZZ_CHECK(r.pipe_ops >= -1 && r.reg_buff >= -1 && r.reg_buff <= 1);
    FUZZ_CHECK(r.chunk <= (1ull << 30) && r.line >= 1);
}

// The rules on a cost table where every third entry is unusable, for a query each rule
// matches (its own fields, at both ends of its byte range, under each health state).
void apply(const vt::Rules &rules, const vt::Rule &r)
{
    float table[vt::kNumAlgos * vt::kNumProtos];
    for (int i = 0; i < vt::kNumAlgos * vt::kNumProtos; ++i)
        table[i] = i % 3 == 2 ? -1.0f : 10.0f + i;
    const vt::CostTable t{table, vt::kNumAlgos, vt::kNumProtos};
    for (uint64_t bytes : {r.min_bytes, r.max_bytes}) {
        for (int h = 0; h < 4; ++h) {
            vt::CollQuery q{r.coll,
                            bytes,
                            r.nodes,
                            r.ranks,
                            r.pipe_ops,
                            r.reg_buff,
                            static_cast<vt::Health>(h)};
            int channels = -7;
            const int i = vt::apply_rules(rules, q, t, &channels);
            FUZZ_CHECK(i >= -1 && i < static_cast<int>(rules.rules.size()));
            if (i < 0) {
                FUZZ_CHECK(channels == -7);
                continue;
            }
            const vt::Rule &hit = rules.rules[static_cast<size_t>(i)];
            FUZZ_CHECK(vt::rule_matches(hit, q));
            FUZZ_CHECK(t.at(hit.algo, hit.proto) == 0.0f);
            FUZZ_CHECK(channels == -7 || (channels >= 1 && channels <= vt::kMaxRuleChannels));
            int used = -1;
            const uint64_t chunk = vt::chunk_for(rules, q, r.algo, r.proto, 12345, &used);
            if (used >= 0)
                FUZZ_CHECK(chunk >= vt::proto_grain(r.proto) &&
                           chunk % vt::proto_grain(r.proto) == 0);
            else
                FUZZ_CHECK(chunk == 12345);
        }
    }
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int * /*argc*/, char *** /*argv*/)
{
    vigil::fuzz::init();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const std::string_view text(reinterpret_cast<const char *>(data), size);
    vt::Rules rules;
    std::string error;
    if (!vt::parse_rules(text, &rules, &error)) {
        FUZZ_CHECK(rules.rules.empty() && rules.digest == 0 && !error.empty());
        FUZZ_CHECK(error[0] >= '1' && error[0] <= '9'); // "LINE: reason"
        return 0;
    }
    FUZZ_CHECK(rules.rules.size() <= vt::kMaxRules);
    FUZZ_CHECK(rules.rules.empty() == (rules.digest == 0));
    std::string canonical;
    for (const vt::Rule &r : rules.rules) {
        check_bounds(r);
        const std::string line = vt::format_rule(r);
        canonical += line + "\n";
        vt::Rules one;
        std::string why;
        FUZZ_CHECK(vt::parse_rules(line, &one, &why));
        FUZZ_CHECK(one.rules.size() == 1 && same_rule(one.rules[0], r));
    }
    vt::Rules again;
    FUZZ_CHECK(vt::parse_rules(canonical, &again, &error));
    FUZZ_CHECK(again.digest == rules.digest && again.rules.size() == rules.rules.size());
    // Applying every rule is quadratic; the first few show the policy's bounds.
    for (size_t i = 0; i < rules.rules.size() && i < 8; ++i) apply(rules, rules.rules[i]);
    return 0;
}
