// SPDX-License-Identifier: Apache-2.0
// `vigil tuner explain|fit` and the tuner's rows of `vigil top` / `vigil export`.
#include "tuner_cmd.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string_view>
#include <vector>

#include "cli.h"
#include "prom_text.h"
#include "policy.h"
#include "rules.h"
#include "telemetry/health.h"

namespace vigil::tool {
namespace {

using namespace vigil::tuner;

bool parse_size(const std::string &s, uint64_t *out)
{
    char *end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    if (end == s.c_str() || errno != 0 || s[0] == '-') return false;
    uint64_t mul = 1;
    const std::string suffix(end);
    if (suffix == "K" || suffix == "k" || suffix == "KiB") mul = 1ull << 10;
    else if (suffix == "M" || suffix == "m" || suffix == "MiB") mul = 1ull << 20;
    else if (suffix == "G" || suffix == "g" || suffix == "GiB") mul = 1ull << 30;
    else if (!suffix.empty()) return false;
    if (v > UINT64_MAX / mul) return false;
    *out = v * mul;
    return true;
}

// "ring/ll128" -> (1, 1)
bool parse_pair(const std::string &s, int *algo, int *proto)
{
    const size_t slash = s.find('/');
    if (slash == std::string::npos) return false;
    *algo = parse_algo(s.substr(0, slash));
    *proto = parse_proto(s.substr(slash + 1));
    return *algo >= 0 && *proto >= 0;
}

constexpr const char *kExplainUsage =
    "usage: vigil tuner explain --rules FILE --coll allreduce --bytes 1M --nodes 4 --ranks 32\n"
    "       [--health any|healthy|degraded|failover] [--pipe-ops N] [--reg-buff 0|1]\n"
    "       [--unusable ALGO/PROTO,...]   (entries NCCL marks -1: NCCL_ALGO/NCCL_PROTO, hardware)\n"
    "Prints the algorithm, protocol and channels the rules file picks for one collective, and\n"
    "the rule that picked them.\n";

constexpr const char *kFitUsage =
    "usage: vigil tuner fit [--coll allreduce] [--nodes N] [--ranks N] [--margin PCT]\n"
    "       [ALGO/PROTO=]RESULTS...   (nccl-tests output, one algorithm/protocol per file: named\n"
    "       here, by NCCL_ALGO/NCCL_PROTO lines in the file, or by the file name, e.g.\n"
    "       ar_ring_ll128.txt)\n"
    "Prints a rules file that picks the fastest measured algorithm/protocol per size range.\n";

int explain(int argc, char **argv, FILE *out, FILE *err)
{
    constexpr const char *prog = "vigil tuner explain";
    std::string rules_file;
    CollQuery q;
    q.coll = -1;
    q.pipe_ops = 1;
    q.reg_buff = 0;
    q.nodes = 0;
    q.ranks = 0;
    bool have_bytes = false;
    std::string health = "any";
    std::vector<std::pair<int, int>> unusable;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (cli::is_help(a)) {
            std::fputs(kExplainUsage, out);
            return 0;
        }
        static constexpr std::string_view kOptions[] = {"--rules",    "--coll",     "--bytes",
                                                        "--nodes",    "--ranks",    "--pipe-ops",
                                                        "--reg-buff", "--health",   "--unusable"};
        if (std::find(std::begin(kOptions), std::end(kOptions), a) == std::end(kOptions)) {
            if (a.starts_with("-")) return cli::unknown_option(err, prog, a);
            return cli::usage_error(err, prog, "unexpected argument '" + a + "'");
        }
        if (i + 1 >= argc) return cli::usage_error(err, prog, a + " wants a value");
        const std::string v = argv[++i];
        bool ok = true;
        if (a == "--rules") rules_file = v;
        else if (a == "--coll") ok = (q.coll = parse_coll(v)) >= 0;
        else if (a == "--bytes") ok = have_bytes = parse_size(v, &q.bytes);
        else if (a == "--nodes") ok = cli::parse_int(v, 1, INT32_MAX, &q.nodes);
        else if (a == "--ranks") ok = cli::parse_int(v, 1, INT32_MAX, &q.ranks);
        else if (a == "--pipe-ops") ok = cli::parse_int(v, 1, INT32_MAX, &q.pipe_ops);
        else if (a == "--reg-buff") ok = cli::parse_int(v, 0, 1, &q.reg_buff);
        else if (a == "--health") health = v;
        else if (a == "--unusable") {
            std::stringstream ss(v);
            for (std::string item; ok && std::getline(ss, item, ',');) {
                int al = 0, pr = 0;
                ok = parse_pair(item, &al, &pr);
                unusable.emplace_back(al, pr);
            }
        }
        if (!ok) return cli::usage_error(err, prog, "bad value '" + v + "' for " + a);
    }
    if (rules_file.empty() || q.coll < 0 || !have_bytes || q.nodes == 0 || q.ranks == 0)
        return cli::usage_error(err, prog, "--rules, --coll, --bytes, --nodes and --ranks are needed");
    if (health == "any") q.health = Health::kUnknown;
    else if (health == "healthy") q.health = Health::kHealthy;
    else if (health == "degraded") q.health = Health::kDegraded;
    else if (health == "failover") q.health = Health::kFailover;
    else {
        std::fprintf(err, "vigil tuner explain: --health must be any, healthy, degraded or failover\n");
        return 2;
    }
    Rules rules;
    std::string why;
    if (load_rules(rules_file, &rules, &why) != 0) {
        std::fprintf(err, "vigil tuner explain: %s\n(the tuner would reject this file whole and keep NCCL's choices)\n",
                     why.c_str());
        return 1;
    }
    // Every entry usable unless told otherwise; costs equal so a rule's 0.0 decides.
    float table[kNumAlgos * kNumProtos];
    for (float &x : table) x = 1.0f;
    for (auto [al, pr] : unusable) table[al * kNumProtos + pr] = -1.0f;
    int channels = 0;
    const CostTable t{table, kNumAlgos, kNumProtos};
    std::fprintf(out, "%s %llu B, %d nodes, %d ranks, numPipeOps %d, regBuff %d, agreed view %s: %zu rules in %s\n",
                 coll_name(q.coll), static_cast<unsigned long long>(q.bytes), q.nodes, q.ranks, q.pipe_ops, q.reg_buff,
                 health == "any" ? "none (steering off)" : health.c_str(), rules.rules.size(), rules_file.c_str());
    for (const Rule &r : rules.rules)
        if (rule_matches(r, q) && !t.usable(r.algo, r.proto))
            std::fprintf(out, "  skipped %s:%d (%s): %s/%s is unusable in NCCL's table\n", rules_file.c_str(), r.line,
                         format_rule(r).c_str(), algo_name(r.algo), proto_name(r.proto));
    const int idx = apply_rules(rules, q, t, &channels);
    if (idx < 0) {
        std::fprintf(out, "decision: NCCL's own choice (no rule matches; channels: NCCL's)\n");
        if (q.health == Health::kDegraded || q.health == Health::kFailover)
            std::fprintf(out, "  under this view the tuner re-estimates NCCL's cost table with the agreed bandwidth "
                              "fraction (docs/tuner.md); the outcome depends on NCCL's table at run time\n");
        return 0;
    }
    const Rule &r = rules.rules[static_cast<size_t>(idx)];
    std::fprintf(out, "decision: %s/%s, channels %s\n", algo_name(r.algo), proto_name(r.proto),
                 channels > 0 ? std::to_string(channels).c_str() : "NCCL's");
    std::fprintf(out, "  by %s:%d: %s\n", rules_file.c_str(), r.line, format_rule(r).c_str());
    int chunk_rule = -1;
    const uint64_t chunk = chunk_for(rules, q, r.algo, r.proto, 0, &chunk_rule);
    if (chunk_rule >= 0)
        std::fprintf(out, "  chunk %llu B (NCCL 2.30+, getChunkSize, for pieces of this size) by %s:%d\n",
                     static_cast<unsigned long long>(chunk), rules_file.c_str(),
                     rules.rules[static_cast<size_t>(chunk_rule)].line);
    if (r.reg_buff != -1)
        std::fprintf(out, "  note: this rule matches on regBuff, which NCCL sets per rank; ranks may differ\n");
    return 0;
}

/// One measured point: time in us for (size, algo/proto).
struct Point {
    uint64_t bytes;
    double us;
};

// Parses an nccl-tests output table. Rows: size count type redop [root] time algbw busbw
// #wrong time algbw busbw #wrong; the out-of-place and in-place times, the better one kept.
// Rows with wrong values are refused. Returns the points and the algo/proto named by
// "NCCL_ALGO/NCCL_PROTO set by environment" lines when present.
bool parse_results(const std::string &file, std::vector<Point> *pts, std::string *algo_env, std::string *proto_env,
                   std::string *why)
{
    std::ifstream in(file);
    if (!in) return *why = file + ": cannot open", false;
    std::string line;
    int n = 0;
    while (std::getline(in, line) && ++n < 1000000) {
        if (line.size() > 4096) continue;
        for (auto [key, dst] : {std::pair<const char *, std::string *>{"NCCL_ALGO set by environment to ", algo_env},
                                {"NCCL_PROTO set by environment to ", proto_env}}) {
            const size_t at = line.find(key);
            if (at != std::string::npos) {
                *dst = line.substr(at + std::strlen(key));
                while (!dst->empty() && std::isspace(static_cast<unsigned char>(dst->back()))) dst->pop_back();
            }
        }
        std::stringstream ss(line);
        std::vector<std::string> tok;
        for (std::string t; ss >> t;) tok.push_back(t);
        if (tok.size() != 12 && tok.size() != 13) continue;
        if (tok[0].find_first_not_of("0123456789") != std::string::npos) continue;
        const size_t base = tok.size() == 13 ? 5 : 4; // with or without the root column
        uint64_t bytes = 0;
        if (!parse_size(tok[0], &bytes)) continue;
        double best = -1;
        for (size_t off : {base, base + 4}) {
            char *end = nullptr;
            const double t = std::strtod(tok[off].c_str(), &end);
            const bool num = end != tok[off].c_str() && *end == '\0' && std::isfinite(t) && t > 0;
            const std::string &wrong = tok[off + 3];
            if (!num || (wrong != "0" && wrong != "N/A")) {
                if (num && wrong != "0") return *why = file + ": size " + tok[0] + " has wrong values", false;
                continue;
            }
            best = best < 0 ? t : std::min(best, t);
        }
        if (best > 0) pts->push_back({bytes, best});
    }
    if (pts->empty()) return *why = file + ": no nccl-tests result rows", false;
    return true;
}

int fit(int argc, char **argv, FILE *out, FILE *err)
{
    constexpr const char *prog = "vigil tuner fit";
    int coll = 4, nodes = -1, ranks = -1;
    double margin = 0;
    std::vector<std::string> inputs;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (cli::is_help(a)) {
            std::fputs(kFitUsage, out);
            return 0;
        }
        const bool option = a == "--coll" || a == "--nodes" || a == "--ranks" || a == "--margin";
        if (!option && a.starts_with("-")) return cli::unknown_option(err, prog, a);
        if (option && i + 1 >= argc) return cli::usage_error(err, prog, a + " wants a value");
        auto next = [&]() -> std::string { return argv[++i]; };
        bool ok = true;
        if (a == "--coll") ok = (coll = parse_coll(next())) >= 0;
        else if (a == "--nodes") ok = cli::parse_int(next(), -1, INT32_MAX, &nodes) && nodes != 0;
        else if (a == "--ranks") ok = cli::parse_int(next(), -1, INT32_MAX, &ranks) && ranks != 0;
        else if (a == "--margin") {
            const std::string v = next();
            char *end = nullptr;
            margin = std::strtod(v.c_str(), &end);
            ok = end != v.c_str() && *end == '\0' && margin >= 0 && margin < 100;
        } else inputs.push_back(a);
        if (!ok) return cli::usage_error(err, prog, "bad value for " + a + ": '" + argv[i] + "'");
    }
    if (inputs.empty()) return cli::usage_error(err, prog, "no nccl-tests result file given");
    std::map<uint64_t, std::map<std::pair<int, int>, double>> by_size;
    std::vector<std::string> sources;
    for (const std::string &arg : inputs) {
        std::string file = arg;
        int algo = -1, proto = -1;
        const size_t eq = arg.find('=');
        if (eq != std::string::npos && parse_pair(arg.substr(0, eq), &algo, &proto)) file = arg.substr(eq + 1);
        std::vector<Point> pts;
        std::string a_env, p_env, why;
        if (!parse_results(file, &pts, &a_env, &p_env, &why)) {
            std::fprintf(err, "vigil tuner fit: %s\n", why.c_str());
            return 1;
        }
        auto lower = [](std::string s) {
            for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
            return s;
        };
        if (algo < 0 && !a_env.empty() && !p_env.empty()) {
            algo = parse_algo(lower(a_env));
            proto = parse_proto(lower(p_env));
        }
        if (algo < 0) { // from the file name: the longest names first (ll128 before ll)
            const std::string base = lower(file.substr(file.rfind('/') + 1));
            std::vector<std::string> toks;
            std::string cur;
            for (char c : base) {
                if (std::isalnum(static_cast<unsigned char>(c))) cur += c;
                else if (!cur.empty()) toks.push_back(cur), cur.clear();
            }
            if (!cur.empty()) toks.push_back(cur);
            for (size_t k = 0; k < toks.size(); ++k) {
                if (algo < 0 && (algo = parse_algo(toks[k])) < 0 && k + 1 < toks.size())
                    algo = parse_algo(toks[k] + "_" + toks[k + 1]);
                if (proto < 0) proto = parse_proto(toks[k]);
            }
        }
        if (algo < 0 || proto < 0) {
            std::fprintf(err, "vigil tuner fit: %s: cannot tell its algorithm/protocol; name it as ALGO/PROTO=%s\n",
                         file.c_str(), file.c_str());
            return 1;
        }
        for (const Point &p : pts) {
            double &slot = by_size[p.bytes][{algo, proto}];
            slot = slot == 0 ? p.us : std::min(slot, p.us);
        }
        sources.push_back(std::string(algo_name(algo)) + "/" + proto_name(proto) + " " + file + " (" +
                          std::to_string(pts.size()) + " sizes)");
    }
    // The fastest per size, then runs of equal winners become size ranges. With a margin,
    // a size keeps the previous winner while that one is within margin % of the fastest.
    std::vector<std::pair<uint64_t, std::pair<int, int>>> winners;
    for (const auto &[bytes, times] : by_size) {
        auto best = std::min_element(times.begin(), times.end(),
                                     [](const auto &x, const auto &y) { return x.second < y.second; });
        std::pair<int, int> w = best->first;
        if (!winners.empty()) {
            auto prev = times.find(winners.back().second);
            if (prev != times.end() && prev->second <= best->second * (1 + margin / 100)) w = prev->first;
        }
        winners.emplace_back(bytes, w);
    }
    std::fprintf(out, "# Generated by vigil tuner fit from nccl-tests results:\n");
    for (const std::string &s : sources) std::fprintf(out, "#   %s\n", s.c_str());
    std::fprintf(out, "# The fastest measured algorithm/protocol per size; a range runs up to the next measured\n"
                      "# size where another one wins. Format: NCCL's example tuner (NCCL_TUNER_CONFIG_FILE).\n");
    size_t i = 0;
    while (i < winners.size()) {
        size_t j = i;
        while (j + 1 < winners.size() && winners[j + 1].second == winners[i].second) ++j;
        const uint64_t lo = i == 0 ? 0 : winners[i].first;
        const std::string hi = j + 1 == winners.size() ? "-1" : std::to_string(winners[j + 1].first - 1);
        std::fprintf(out, "%s,%llu,%s,%s,%s,-1,%d,%d\n", coll_name(coll), static_cast<unsigned long long>(lo),
                     hi.c_str(), algo_name(winners[i].second.first), proto_name(winners[i].second.second), nodes, ranks);
        i = j + 1;
    }
    return 0;
}

const char *state_text(uint8_t s)
{
    switch (s) {
    case 0: return "healthy";
    case 1: return "degraded";
    case 2: return "failover";
    default: return "none";
    }
}

} // namespace

int tuner_command_to(int argc, char **argv, FILE *out, FILE *err)
{
    const std::string sub = argc >= 2 ? argv[1] : "";
    if (sub == "explain") return explain(argc - 1, argv + 1, out, err);
    if (sub == "fit") return fit(argc - 1, argv + 1, out, err);
    if (cli::is_help(sub)) {
        std::fputs("usage: vigil tuner explain --rules FILE --coll C --bytes SIZE --nodes N --ranks N ...\n"
                   "       vigil tuner fit [--coll C] [--nodes N] [--ranks N] [--margin PCT] RESULTS...\n"
                   "(vigil tuner explain --help, vigil tuner fit --help: the details)\n",
                   out);
        return 0;
    }
    if (sub.empty()) return cli::usage_error(err, "vigil tuner", "explain or fit?");
    if (sub.starts_with("-")) return cli::unknown_option(err, "vigil tuner", sub);
    return cli::usage_error(err, "vigil tuner", "unknown subcommand '" + sub + "'");
}

int tuner_command(int argc, char **argv)
{
    return tuner_command_to(argc, argv, stdout, stderr);
}

std::string tuner_top_text()
{
    std::string out;
    char buf[512];
    for (const telemetry::TunerProcessStatus &p : telemetry::read_tuner_status()) {
        for (const telemetry::TunerCommSnapshot &c : p.comms) {
            if (out.empty()) {
                std::snprintf(buf, sizeof(buf), "%-7s %-16s %5s %10s %-8s %5s %4s %4s %-22s %10s %9s %6s %s\n", "pid",
                              "comm", "ranks", "block", "view", "frac", "degr", "fail", "source", "calls", "steered",
                              "waits", "store");
                out += buf;
            }
            std::snprintf(buf, sizeof(buf), "%-7d %016llx %5u %10llu %-8s %5.2f %4u %4u %-22.22s %10llu %9llu %6llu %s%s\n",
                          p.pid, static_cast<unsigned long long>(c.comm), c.nranks,
                          static_cast<unsigned long long>(c.block), c.steering || c.state != 3 ? state_text(c.state) : "off",
                          c.permille / 1000.0, c.degraded_nics, c.failed_nics, c.source.empty() ? "-" : c.source.c_str(),
                          static_cast<unsigned long long>(c.calls), static_cast<unsigned long long>(c.steered),
                          static_cast<unsigned long long>(c.waits), c.store.c_str(), c.finalized ? " (finalized)" : "");
            out += buf;
        }
    }
    return out;
}

std::string tuner_metrics_text(bool all_users, const RankOf &rank_of, TunerScrape *stats)
{
    struct Family {
        const char *name, *type, *help;
        std::string body;
    };
    std::vector<Family> fams = {
        {"vigil_tuner_view_state", "gauge", "Agreed health view in use: 0 healthy, 1 degraded, 2 failover, 3 none yet.", ""},
        {"vigil_tuner_view_fraction", "gauge", "Agreed effective network bandwidth fraction of the worst node.", ""},
        {"vigil_tuner_view_block", "gauge", "Block the rank's getCollInfo calls are in.", ""},
        {"vigil_tuner_view_changes_total", "counter", "Agreed view changes seen.", ""},
        {"vigil_tuner_calls_total", "counter", "getCollInfo calls.", ""},
        {"vigil_tuner_steered_total", "counter", "Calls whose choice a rule or the view changed.", ""},
        {"vigil_tuner_waits_total", "counter", "Calls that waited for an unresolved view.", ""},
        {"vigil_tuner_wait_seconds_total", "counter", "Time calls spent waiting for an unresolved view.", ""},
    };
    int refused = 0;
    const std::vector<telemetry::TunerProcessStatus> procs =
        telemetry::read_tuner_status(all_users, &refused);
    if (stats != nullptr) {
        stats->segments += static_cast<int>(procs.size());
        stats->refused += refused;
    }
    for (const telemetry::TunerProcessStatus &p : procs) {
        const std::string rank = rank_of ? rank_of(p.pid, p.host) : "";
        for (const telemetry::TunerCommSnapshot &c : p.comms) {
            if (c.finalized) continue;
            char comm[24];
            std::snprintf(comm, sizeof(comm), "%016llx", static_cast<unsigned long long>(c.comm));
            const std::string l = "pid=\"" + std::to_string(p.pid) + "\"" +
                                  (rank.empty() ? "" : ",rank=\"" + prom_label_value(rank) + "\"") +
                                  ",comm=\"" + comm + "\"";
            auto put = [&](size_t f, const std::string &labels, double v) {
                char num[64];
                std::snprintf(num, sizeof(num), "%.17g", v);
                fams[f].body += std::string(fams[f].name) + "{" + labels + "} " + num + "\n";
            };
            const std::string source =
                c.source.empty() ? "" : ",source=\"" + prom_label_value(c.source) + "\"";
            put(0, l + source, c.state);
            put(1, l, c.permille / 1000.0);
            put(2, l, static_cast<double>(c.block));
            put(3, l, static_cast<double>(c.view_changes));
            put(4, l, static_cast<double>(c.calls));
            put(5, l, static_cast<double>(c.steered));
            put(6, l, static_cast<double>(c.waits));
            put(7, l, static_cast<double>(c.wait_ns) / 1e9);
        }
    }
    std::string out;
    for (const Family &f : fams)
        out += std::string("# HELP ") + f.name + " " + f.help + "\n# TYPE " + f.name + " " + f.type + "\n" + f.body;
    return out;
}

} // namespace vigil::tool
