// SPDX-License-Identifier: Apache-2.0
// Tuning rules in the CSV format of NCCL's example tuner (plugins/tuner/example, read
// 2026-11: `collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks
// [,numPipeOps[,regBuff]]`, `#` comments), with the same first-match semantics, plus two
// optional trailing fields of Vigil's own: `health` (11th) and `chunk` (12th).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vigil::tuner {

/// The agreed health state a rule may require (docs/tuner.md "Agreed health view").
/// kUnknown: no agreed view (steering off); only `any` rules match then.
enum class Health : uint8_t { kHealthy = 0, kDegraded = 1, kFailover = 2, kUnknown = 3 };
/// What a rule's `health` field asks for. kAny matches every state, kUnknown included.
enum class HealthMatch : uint8_t { kHealthy = 0, kDegraded = 1, kFailover = 2, kAny = 3 };

const char *health_name(Health h);
const char *health_match_name(HealthMatch h);

/// One line of a rules file. Field semantics are the example tuner's: -1 in channels keeps
/// NCCL's channel count (so does 0); -1 in nNodes, nRanks, numPipeOps, regBuff matches
/// anything. chunk 0: NCCL's chunk size.
struct Rule {
    int coll = 0;            ///< ncclFunc_t: 0 broadcast .. 4 allreduce
    uint64_t min_bytes = 0;  ///< inclusive
    uint64_t max_bytes = 0;  ///< inclusive
    int algo = 0;            ///< NCCL_ALGO_* (0..6)
    int proto = 0;           ///< NCCL_PROTO_* (0..2)
    int channels = -1;       ///< 1..64, or -1/0: NCCL's choice
    int nodes = -1;
    int ranks = -1;
    int pipe_ops = -1;
    int reg_buff = -1;       ///< -1, 0, 1 (rank-local in NCCL: see docs/tuner.md)
    HealthMatch health = HealthMatch::kAny;
    uint64_t chunk = 0;      ///< bytes; 0: NCCL's value (v6/v7 getChunkSize only)
    int line = 0;            ///< 1-based line in its file
};

/// A parsed rules file. Immutable after load; safe to share between threads.
struct Rules {
    std::string file;        ///< where they came from ("" when none)
    std::vector<Rule> rules; ///< in file order: the first match wins
    uint64_t digest = 0;     ///< FNV-1a of the rules' canonical form (0 when empty)
};

/// Limits on what a file may hold; beyond them the file is rejected whole.
inline constexpr size_t kMaxRulesFileBytes = 16u << 20;
inline constexpr size_t kMaxRuleLineBytes = 4096;
inline constexpr size_t kMaxRules = 100000;
inline constexpr int kMaxRuleChannels = 64; // NCCL's MAXCHANNELS

/// Parses rules text. On the first bad line returns false with *error set to
/// "LINE: reason" (1-based line) and leaves *out empty: a file with any bad line is rejected
/// whole. Accepts 8 to 12 comma-separated fields per line, blanks around fields, CRLF line
/// ends, `#` comment lines (after optional blanks) and blank lines. Names are lower case as
/// in the example tuner (`allreduce`, `ring`, `ll128`, ...); numbers are decimal (max_bytes
/// may be -1: no upper bound). Rejects NUL bytes, lines over kMaxRuleLineBytes, more than
/// kMaxRules rules, unknown names, empty fields, out-of-range numbers and min > max.
/// Never throws except std::bad_alloc.
bool parse_rules(std::string_view text, Rules *out, std::string *error);

/// Where the rules come from, as NCCL's example tuner looks: NCCL_TUNER_CONFIG_FILE, else
/// `nccl_tuner.conf` in the working directory. *explicit_path: the variable was set.
std::string rules_path(bool *explicit_path);

/// Reads and parses `path`. Returns 0 (rules loaded, possibly none), -ENOENT (no such
/// file), or another -errno / -EINVAL with *error "FILE:LINE: reason" or "FILE: reason".
int load_rules(const std::string &path, Rules *out, std::string *error);

/// Inputs every rank of a communicator shares for one getCollInfo call.
struct CollQuery {
    int coll = 0;
    uint64_t bytes = 0;
    int nodes = 0;
    int ranks = 0;
    int pipe_ops = 0;
    int reg_buff = 0;
    Health health = Health::kUnknown;
};

/// True when rule `r` matches `q` (the example tuner's test, plus the health field).
bool rule_matches(const Rule &r, const CollQuery &q) noexcept;

/// Canonical one-line text of a rule (the CSV line it round-trips to, with the health and
/// chunk fields only when set).
std::string format_rule(const Rule &r);

const char *coll_name(int coll);   ///< "allreduce", ... or "unknown"
const char *algo_name(int algo);   ///< "ring", ... or "unknown"
const char *proto_name(int proto); ///< "simple", ... or "unknown"
/// Parses the example tuner's names; -1 when unknown.
int parse_coll(std::string_view s);
int parse_algo(std::string_view s);
int parse_proto(std::string_view s);

} // namespace vigil::tuner
