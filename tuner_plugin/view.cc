// SPDX-License-Identifier: Apache-2.0
// Health records and agreed views: encodings and aggregation.
#include "view.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

namespace vigil::tuner {
namespace {

// Splits on single spaces into at most `max` fields; false when there are more.
bool split(std::string_view s, std::vector<std::string_view> *out, size_t max)
{
    out->clear();
    size_t pos = 0;
    while (pos <= s.size()) {
        const size_t sp = s.find(' ', pos);
        const size_t end = sp == std::string_view::npos ? s.size() : sp;
        if (out->size() == max) return false;
        out->push_back(s.substr(pos, end - pos));
        if (sp == std::string_view::npos) break;
        pos = sp + 1;
    }
    return true;
}

template <class T> bool num(std::string_view s, T *out, int base = 10)
{
    if (s.empty()) return false;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, base);
    return ec == std::errc() && p == s.data() + s.size();
}

// A token safe in the space-separated encoding: printable, no space or ':' ; bounded.
bool copy_token(std::string_view s, char *dst, size_t cap)
{
    if (s.empty() || s.size() >= cap) return false;
    for (char c : s)
        if (c <= ' ' || c > '~' || c == ':') return false;
    std::memcpy(dst, s.data(), s.size());
    dst[s.size()] = '\0';
    return true;
}

std::string token(const char *s, size_t cap)
{
    std::string out;
    for (size_t i = 0; i < cap && s[i] != '\0'; ++i) {
        const char c = s[i];
        out += (c <= ' ' || c > '~' || c == ':') ? '_' : c;
    }
    return out.empty() ? std::string("-") : out;
}

} // namespace

std::string encode_view(const View &v)
{
    char buf[224];
    // v2: v1 and the generation the proposal was computed at.
    std::snprintf(buf, sizeof(buf), "v2 %u %u %u %u %u %016llx %s %llu %llu", v.state, v.permille, v.degraded_nics,
                  v.failed_nics, v.nodes, static_cast<unsigned long long>(v.digest),
                  token(v.source, sizeof(v.source)).c_str(), static_cast<unsigned long long>(v.gen_epoch),
                  static_cast<unsigned long long>(v.gen));
    return buf;
}

bool decode_view(std::string_view s, View *out)
{
    std::vector<std::string_view> f;
    // v1 (an older proposer: no generation) or v2.
    if (s.size() > 240 || !split(s, &f, 10) || !((f.size() == 8 && f[0] == "v1") || (f.size() == 10 && f[0] == "v2")))
        return false;
    View v;
    if (f.size() == 10 && (!num(f[8], &v.gen_epoch) || !num(f[9], &v.gen))) return false;
    unsigned state = 0, pm = 0, deg = 0, failed = 0, nodes = 0;
    if (!num(f[1], &state) || state > 2 || !num(f[2], &pm) || pm > 1000 || !num(f[3], &deg) || deg > 65535 ||
        !num(f[4], &failed) || failed > 65535 || !num(f[5], &nodes) || nodes > 65535 || !num(f[6], &v.digest, 16) ||
        !copy_token(f[7], v.source, sizeof(v.source)))
        return false;
    v.state = static_cast<uint8_t>(state);
    v.permille = static_cast<uint16_t>(pm);
    v.degraded_nics = static_cast<uint16_t>(deg);
    v.failed_nics = static_cast<uint16_t>(failed);
    v.nodes = static_cast<uint16_t>(nodes);
    *out = v;
    return true;
}

std::string encode_member(const MemberRecord &m)
{
    char buf[256];
    // m2: m1 and the multipath flag before the NICs.
    std::snprintf(buf, sizeof(buf), "m2 %016llx %s %d %d %llu %016llx %llu %u %u",
                  static_cast<unsigned long long>(m.id), token(m.host, sizeof(m.host)).c_str(), m.pid, m.env_rank,
                  static_cast<unsigned long long>(m.progress), static_cast<unsigned long long>(m.rules_digest),
                  static_cast<unsigned long long>(m.seq), std::min<uint32_t>(m.n_nics, kMaxNics),
                  m.multipath ? 1u : 0u);
    std::string out = buf;
    for (uint32_t i = 0; i < m.n_nics && i < kMaxNics; ++i) {
        const NicHealth &n = m.nics[i];
        std::snprintf(buf, sizeof(buf), " %s:%u:%u:%u:%llu:%llu", token(n.name, sizeof(n.name)).c_str(), n.state,
                      n.permille, n.failovers, static_cast<unsigned long long>(n.judged_bps),
                      static_cast<unsigned long long>(n.baseline_bps));
        out += buf;
    }
    return out;
}

bool decode_member(std::string_view s, MemberRecord *out)
{
    std::vector<std::string_view> f;
    // m1 (an older member: no multipath flag) or m2.
    if (s.size() > 4096 || !split(s, &f, 10 + kMaxNics) || f.size() < 9 || (f[0] != "m1" && f[0] != "m2"))
        return false;
    const size_t fixed = f[0] == "m2" ? 10 : 9;
    MemberRecord m;
    uint32_t n = 0, mp = 0;
    if (!num(f[1], &m.id, 16) || m.id == 0 || !copy_token(f[2], m.host, sizeof(m.host)) || !num(f[3], &m.pid) ||
        !num(f[4], &m.env_rank) || !num(f[5], &m.progress) || !num(f[6], &m.rules_digest, 16) || !num(f[7], &m.seq) ||
        !num(f[8], &n) || n > kMaxNics || f.size() != fixed + n || (fixed == 10 && (!num(f[9], &mp) || mp > 1)))
        return false;
    m.n_nics = n;
    m.multipath = mp == 1;
    std::vector<std::string_view> g;
    for (uint32_t i = 0; i < n; ++i) {
        std::string_view nic = f[fixed + i];
        g.clear();
        size_t pos = 0;
        while (g.size() < 7) {
            const size_t c = nic.find(':', pos);
            g.push_back(nic.substr(pos, c == std::string_view::npos ? std::string_view::npos : c - pos));
            if (c == std::string_view::npos) break;
            pos = c + 1;
        }
        NicHealth &h = m.nics[i];
        unsigned state = 0, pm = 0;
        if (g.size() != 6 || !copy_token(g[0], h.name, sizeof(h.name)) || !num(g[1], &state) || state > 2 ||
            !num(g[2], &pm) || pm > 1000 || !num(g[3], &h.failovers) || !num(g[4], &h.judged_bps) ||
            !num(g[5], &h.baseline_bps))
            return false;
        h.state = static_cast<uint8_t>(state);
        h.permille = static_cast<uint16_t>(pm);
    }
    *out = m;
    return true;
}

View aggregate(const std::vector<MemberRecord> &members, const View *previous, const std::string &source)
{
    struct Nic {
        uint8_t state = 0;
        uint16_t permille = 1000;
    };
    std::map<std::string, std::map<std::string, Nic>> hosts; // sorted: the digest is order-free
    std::set<std::string> striped;                            // hosts where a member stripes
    for (const MemberRecord &m : members) {
        const std::string host(m.host, strnlen(m.host, sizeof(m.host)));
        auto &nics = hosts[host];
        if (m.multipath) striped.insert(host);
        for (uint32_t i = 0; i < m.n_nics && i < kMaxNics; ++i) {
            const NicHealth &h = m.nics[i];
            Nic &n = nics[std::string(h.name, strnlen(h.name, sizeof(h.name)))];
            n.state = std::max(n.state, h.state);
            n.permille = std::min(n.permille, h.state == 2 ? uint16_t{0} : h.permille);
        }
    }
    View v;
    uint64_t digest = 0xcbf29ce484222325ull;
    auto mix = [&](std::string_view s) {
        for (char c : s) digest = (digest ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
    };
    uint32_t worst = 1000;
    for (const auto &[host, nics] : hosts) {
        uint32_t deg_min = 1000, failed = 0;
        for (const auto &[name, n] : nics) {
            if (n.state == 2) ++failed, ++v.failed_nics;
            else if (n.state == 1) ++v.degraded_nics, deg_min = std::min<uint32_t>(deg_min, n.permille);
            if (n.state != 0) {
                mix(host);
                mix("/");
                mix(name);
                mix(n.state == 2 ? "=f;" : "=d;");
            }
        }
        uint32_t node = deg_min;
        if (striped.count(host) != 0 && !nics.empty()) {
            // Multipath: every NIC carries what it can, so the node keeps the mean.
            uint32_t sum = 0;
            for (const auto &[name, n] : nics) sum += n.state == 2 ? 0u : n.state == 1 ? n.permille : 1000u;
            node = static_cast<uint32_t>(sum / nics.size());
        } else if (!nics.empty() && failed > 0) {
            node = std::min<uint32_t>(node, static_cast<uint32_t>(1000 * (nics.size() - failed) / nics.size()));
        }
        worst = std::min(worst, node);
    }
    v.nodes = static_cast<uint16_t>(std::min<size_t>(hosts.size(), 65535));
    v.state = v.failed_nics ? 2 : v.degraded_nics ? 1 : 0;
    // Steps of 50 permille (a bandwidth estimate is not finer than that), never 0.
    v.permille = static_cast<uint16_t>(v.state == 0 ? 1000 : std::max<uint32_t>(worst / 50 * 50, 50));
    v.digest = v.state == 0 ? 0 : digest;
    // One episode (the same NICs in the same state): its fraction only falls, and only by more
    // than one step. A degraded NIC's measured fraction swings while the episode lasts (its
    // paths carry less once striping moves off them, and a window without a judgement reads
    // as 1), and every swing was a view change on every rank; a NIC that recovers leaves the
    // episode (healthy) instead.
    if (previous != nullptr && previous->state == v.state && previous->digest == v.digest &&
        previous->degraded_nics == v.degraded_nics && previous->failed_nics == v.failed_nics &&
        v.permille + 50 >= previous->permille)
        v.permille = previous->permille;
    std::snprintf(v.source, sizeof(v.source), "%s", source.c_str());
    return v;
}

std::string describe_view(const View &v)
{
    char buf[128];
    switch (v.state) {
    case 0: return "healthy";
    case 1:
        std::snprintf(buf, sizeof(buf), "degraded %.3f (%u NIC%s degraded)", v.fraction(), v.degraded_nics,
                      v.degraded_nics == 1 ? "" : "s");
        return buf;
    default:
        std::snprintf(buf, sizeof(buf), "failover %.3f (%u NIC%s failed, %u degraded)", v.fraction(), v.failed_nics,
                      v.failed_nics == 1 ? "" : "s", v.degraded_nics);
        return buf;
    }
}

} // namespace vigil::tuner
