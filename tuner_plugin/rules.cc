// SPDX-License-Identifier: Apache-2.0
// Rules file parser and matcher (NCCL example tuner's CSV format plus health and chunk).
#include "rules.h"

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace vigil::tuner {
namespace {

constexpr const char *kColls[] = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
constexpr const char *kAlgos[] = {"tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat"};
constexpr const char *kProtos[] = {"ll", "ll128", "simple"};
constexpr const char *kHealth[] = {"healthy", "degraded", "failover", "any"};

template <size_t N> int index_of(const char *const (&names)[N], std::string_view s)
{
    for (size_t i = 0; i < N; ++i)
        if (s == names[i]) return static_cast<int>(i);
    return -1;
}

template <size_t N> std::string list_of(const char *const (&names)[N])
{
    std::string out;
    for (size_t i = 0; i < N; ++i) out += (i ? ", " : "") + std::string(names[i]);
    return out;
}

std::string_view trim(std::string_view s)
{
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
    return s;
}

// Shows a field in an error message: bounded, control bytes escaped.
std::string shown(std::string_view s)
{
    std::string out = "'";
    for (size_t i = 0; i < s.size() && i < 40; ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if (c < 0x20 || c >= 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\x%02x", c);
            out += buf;
        } else {
            out += static_cast<char>(c);
        }
    }
    if (s.size() > 40) out += "...";
    return out + "'";
}

// Decimal integer in [lo, hi]; "" on success, else the reason.
std::string parse_int(std::string_view s, const char *what, int64_t lo, int64_t hi, int64_t *out)
{
    int64_t v = 0;
    const char *b = s.data(), *e = s.data() + s.size();
    if (!s.empty() && s.front() == '+') ++b;
    auto [p, ec] = std::from_chars(b, e, v);
    if (ec == std::errc::result_out_of_range) return std::string(what) + " " + shown(s) + " is out of range";
    if (ec != std::errc() || p != e || b == e) return std::string(what) + " " + shown(s) + " is not an integer";
    if (v < lo || v > hi)
        return std::string(what) + " " + shown(s) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    *out = v;
    return "";
}

// Unsigned byte count (up to 2^64-1); "" on success.
std::string parse_bytes(std::string_view s, const char *what, bool allow_minus_one, uint64_t *out)
{
    if (allow_minus_one && s == "-1") return *out = UINT64_MAX, "";
    uint64_t v = 0;
    const char *b = s.data(), *e = s.data() + s.size();
    auto [p, ec] = std::from_chars(b, e, v);
    if (ec == std::errc::result_out_of_range) return std::string(what) + " " + shown(s) + " is larger than 2^64-1";
    if (ec != std::errc() || p != e || b == e)
        return std::string(what) + " " + shown(s) + " is not a byte count (decimal" +
               (allow_minus_one ? ", or -1 for no limit)" : ")");
    *out = v;
    return "";
}

// One data line (already trimmed, not a comment) into *r; "" on success.
std::string parse_line(std::string_view line, Rule *r)
{
    std::string_view f[13];
    size_t n = 0;
    for (size_t start = 0;;) {
        const size_t comma = line.find(',', start);
        if (n == 12) return "more than 12 fields";
        f[n++] = trim(line.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
        if (comma == std::string_view::npos) break;
        start = comma + 1;
    }
    if (n < 8)
        return std::to_string(n) + " fields; expected collective_type,min_bytes,max_bytes,algorithm,protocol,"
                                   "channels,nNodes,nRanks[,numPipeOps[,regBuff[,health[,chunk]]]]";
    for (size_t i = 0; i < n; ++i)
        if (f[i].empty()) return "field " + std::to_string(i + 1) + " is empty";
    if ((r->coll = parse_coll(f[0])) < 0) return "unknown collective " + shown(f[0]) + " (expected " + list_of(kColls) + ")";
    std::string why;
    if (!(why = parse_bytes(f[1], "min_bytes", false, &r->min_bytes)).empty()) return why;
    if (!(why = parse_bytes(f[2], "max_bytes", true, &r->max_bytes)).empty()) return why;
    if (r->min_bytes > r->max_bytes) return "min_bytes is larger than max_bytes";
    if ((r->algo = parse_algo(f[3])) < 0) return "unknown algorithm " + shown(f[3]) + " (expected " + list_of(kAlgos) + ")";
    if ((r->proto = parse_proto(f[4])) < 0) return "unknown protocol " + shown(f[4]) + " (expected " + list_of(kProtos) + ")";
    int64_t v = 0;
    if (!(why = parse_int(f[5], "channels", -1, kMaxRuleChannels, &v)).empty()) return why;
    r->channels = static_cast<int>(v);
    if (!(why = parse_int(f[6], "nNodes", -1, INT32_MAX, &v)).empty()) return why;
    if (v == 0) return "nNodes 0 matches no communicator (use -1 for any)";
    r->nodes = static_cast<int>(v);
    if (!(why = parse_int(f[7], "nRanks", -1, INT32_MAX, &v)).empty()) return why;
    if (v == 0) return "nRanks 0 matches no communicator (use -1 for any)";
    r->ranks = static_cast<int>(v);
    r->pipe_ops = -1;
    if (n >= 9) {
        if (!(why = parse_int(f[8], "numPipeOps", -1, INT32_MAX, &v)).empty()) return why;
        r->pipe_ops = static_cast<int>(v);
    }
    r->reg_buff = -1;
    if (n >= 10) {
        if (!(why = parse_int(f[9], "regBuff", -1, 1, &v)).empty()) return why;
        r->reg_buff = static_cast<int>(v);
    }
    r->health = HealthMatch::kAny;
    if (n >= 11) {
        const int h = index_of(kHealth, f[10]);
        if (h < 0) return "unknown health " + shown(f[10]) + " (expected " + list_of(kHealth) + ")";
        r->health = static_cast<HealthMatch>(h);
    }
    r->chunk = 0;
    if (n >= 12) {
        if (!(why = parse_bytes(f[11], "chunk", false, &r->chunk)).empty()) return why;
        if (r->chunk > (1ull << 30)) return "chunk " + shown(f[11]) + " is larger than 1 GiB";
    }
    return "";
}

uint64_t fnv1a(uint64_t h, std::string_view s)
{
    for (char c : s) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    return h;
}

} // namespace

const char *health_name(Health h)
{
    switch (h) {
    case Health::kHealthy: return "healthy";
    case Health::kDegraded: return "degraded";
    case Health::kFailover: return "failover";
    default: return "unknown";
    }
}

const char *health_match_name(HealthMatch h)
{
    return kHealth[static_cast<int>(h) & 3];
}

const char *coll_name(int c) { return c >= 0 && c < 5 ? kColls[c] : "unknown"; }
const char *algo_name(int a) { return a >= 0 && a < 7 ? kAlgos[a] : "unknown"; }
const char *proto_name(int p) { return p >= 0 && p < 3 ? kProtos[p] : "unknown"; }
int parse_coll(std::string_view s) { return index_of(kColls, s); }
int parse_algo(std::string_view s) { return index_of(kAlgos, s); }
int parse_proto(std::string_view s) { return index_of(kProtos, s); }

bool parse_rules(std::string_view text, Rules *out, std::string *error)
{
    out->rules.clear();
    out->digest = 0;
    if (text.size() > kMaxRulesFileBytes) {
        *error = "file is larger than " + std::to_string(kMaxRulesFileBytes >> 20) + " MiB";
        return false;
    }
    std::vector<Rule> rules;
    int line_no = 0;
    for (size_t pos = 0; pos < text.size();) {
        size_t nl = text.find('\n', pos);
        if (nl == std::string_view::npos) nl = text.size();
        std::string_view raw = text.substr(pos, nl - pos);
        pos = nl + 1;
        ++line_no;
        auto fail = [&](const std::string &why) {
            *error = std::to_string(line_no) + ": " + why;
            return false;
        };
        if (raw.size() > kMaxRuleLineBytes)
            return fail("line is " + std::to_string(raw.size()) + " bytes (limit " + std::to_string(kMaxRuleLineBytes) + ")");
        if (raw.find('\0') != std::string_view::npos) return fail("NUL byte in line");
        std::string_view line = trim(raw);
        if (line.empty() || line.front() == '#') continue;
        if (rules.size() == kMaxRules) return fail("more than " + std::to_string(kMaxRules) + " rules");
        Rule r;
        if (std::string why = parse_line(line, &r); !why.empty()) return fail(why);
        r.line = line_no;
        rules.push_back(r);
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (const Rule &r : rules) h = fnv1a(h, format_rule(r) + "\n");
    out->rules = std::move(rules);
    out->digest = out->rules.empty() ? 0 : h;
    return true;
}

std::string rules_path(bool *explicit_path)
{
    const char *env = std::getenv("NCCL_TUNER_CONFIG_FILE");
    *explicit_path = env != nullptr && env[0] != '\0';
    return *explicit_path ? std::string(env) : std::string("nccl_tuner.conf");
}

int load_rules(const std::string &path, Rules *out, std::string *error)
{
    out->file = path;
    out->rules.clear();
    out->digest = 0;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        const int e = errno;
        *error = path + ": " + std::strerror(e);
        return -e;
    }
    struct stat st{};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        *error = path + ": not a regular file";
        return -EINVAL;
    }
    std::string text;
    char buf[65536];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            const int e = errno;
            ::close(fd);
            *error = path + ": " + std::strerror(e);
            return -e;
        }
        if (n == 0) break;
        if (text.size() + static_cast<size_t>(n) > kMaxRulesFileBytes) {
            ::close(fd);
            *error = path + ": file is larger than " + std::to_string(kMaxRulesFileBytes >> 20) + " MiB";
            return -EINVAL;
        }
        text.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    std::string why;
    if (!parse_rules(text, out, &why)) {
        *error = path + ":" + why;
        return -EINVAL;
    }
    out->file = path;
    return 0;
}

bool rule_matches(const Rule &r, const CollQuery &q) noexcept
{
    if (r.coll != q.coll || q.bytes < r.min_bytes || q.bytes > r.max_bytes) return false;
    if (r.nodes != -1 && r.nodes != q.nodes) return false;
    if (r.ranks != -1 && r.ranks != q.ranks) return false;
    if (r.pipe_ops != -1 && r.pipe_ops != q.pipe_ops) return false;
    if (r.reg_buff != -1 && r.reg_buff != q.reg_buff) return false;
    if (r.health != HealthMatch::kAny && static_cast<int>(r.health) != static_cast<int>(q.health)) return false;
    return true;
}

std::string format_rule(const Rule &r)
{
    // snprintf, not operator+: GCC 12 at -O3 flags long string concatenations (-Wrestrict,
    // a known false positive) and release builds keep warnings as errors.
    char max[24] = "-1", buf[256];
    if (r.max_bytes != UINT64_MAX) std::snprintf(max, sizeof(max), "%llu", static_cast<unsigned long long>(r.max_bytes));
    int n = std::snprintf(buf, sizeof(buf), "%s,%llu,%s,%s,%s,%d,%d,%d,%d,%d", coll_name(r.coll),
                          static_cast<unsigned long long>(r.min_bytes), max, algo_name(r.algo), proto_name(r.proto),
                          r.channels, r.nodes, r.ranks, r.pipe_ops, r.reg_buff);
    if (r.health != HealthMatch::kAny || r.chunk != 0)
        n += std::snprintf(buf + n, sizeof(buf) - static_cast<size_t>(n), ",%s", health_match_name(r.health));
    if (r.chunk != 0)
        std::snprintf(buf + n, sizeof(buf) - static_cast<size_t>(n), ",%llu", static_cast<unsigned long long>(r.chunk));
    return buf;
}

} // namespace vigil::tuner
