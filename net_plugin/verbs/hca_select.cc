// SPDX-License-Identifier: Apache-2.0
// NCCL_IB_HCA syntax.
#include "hca_select.h"

namespace vigil::net::ib {
namespace {
constexpr size_t kMaxEntries = 32;
constexpr size_t kMaxName = 63;

bool name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

bool fail(std::string *why, std::string text)
{
    if (why != nullptr) *why = std::move(text);
    return false;
}
} // namespace

bool HcaSelector::parse(std::string_view spec, HcaSelector *out, std::string *why)
{
    HcaSelector sel;
    if (!spec.empty() && spec.front() == '^') {
        sel.exclude = true;
        spec.remove_prefix(1);
    }
    if (!spec.empty() && spec.front() == '=') {
        sel.exact = true;
        spec.remove_prefix(1);
    }
    if (!spec.empty() && spec.front() == '^')
        return fail(why, "`^` must come before `=` (NCCL reads `=^x` as the name `^x`)");
    while (!spec.empty()) {
        const size_t comma = spec.find(',');
        std::string_view item = spec.substr(0, comma);
        spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
        if (item.empty()) continue; // "a,,b" and a trailing comma are harmless
        Entry e;
        const size_t colon = item.find(':');
        std::string_view name = item.substr(0, colon);
        if (colon != std::string_view::npos) {
            std::string_view port = item.substr(colon + 1);
            int value = 0;
            bool ok = !port.empty() && port.size() <= 3;
            for (char c : port) {
                ok = ok && c >= '0' && c <= '9';
                if (!ok) break; // a long non-number would overflow `value`
                value = value * 10 + (c - '0');
            }
            if (!ok || value < 1 || value > 255)
                return fail(why,
                            "bad port in `" + std::string(item) + "` (a number from 1 to 255)");
            e.port = value;
        }
        if (name.empty()) return fail(why, "empty device name in `" + std::string(item) + "`");
        if (name.size() > kMaxName)
            return fail(why, "device name longer than 63 characters: " + std::string(name));
        for (char c : name)
            if (!name_char(c))
                return fail(why, "bad character in device name `" + std::string(name) + "`");
        if (sel.entries.size() == kMaxEntries) return fail(why, "more than 32 entries");
        e.name = std::string(name);
        sel.entries.push_back(std::move(e));
    }
    if (sel.entries.empty() && (sel.exclude || sel.exact))
        return fail(why, "`^` or `=` without device names");
    *out = std::move(sel);
    return true;
}

bool HcaSelector::matches(std::string_view device, int port) const noexcept
{
    if (entries.empty()) return true; // no list: everything
    bool hit = false;
    for (const Entry &e : entries) {
        const bool name_ok = exact ? device == e.name : device.substr(0, e.name.size()) == e.name;
        if (name_ok && (e.port == -1 || e.port == port)) {
            hit = true;
            break;
        }
    }
    return exclude ? !hit : hit;
}

} // namespace vigil::net::ib
