// SPDX-License-Identifier: Apache-2.0
// The Prometheus text exposition's escaping, shared by the exporter's writers (export.cc and
// the tuner's families in tuner_cmd.cc).
#pragma once

#include <string>
#include <string_view>

namespace vigil::tool {

/// `s` as a label value of the text exposition (format 0.0.4): backslash, double quote and
/// newline escaped. Pure; thread-safe.
inline std::string prom_label_value(std::string_view s)
{
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        if (c == '\\' || c == '"') out += '\\';
        out += c;
    }
    return out;
}

} // namespace vigil::tool
