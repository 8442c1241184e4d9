// SPDX-License-Identifier: Apache-2.0
// JSON string escaping (see json_text.h).
#include "json_text.h"

#include <cstdio>

namespace vigil::telemetry {

std::string json_escape(std::string_view in)
{
    std::string o;
    o.reserve(in.size());
    const auto *p = reinterpret_cast<const unsigned char *>(in.data());
    const auto *end = p + in.size();
    while (p < end) {
        const unsigned char c = *p;
        if (c == '"' || c == '\\') {
            o += '\\';
            o += static_cast<char>(c);
            ++p;
        } else if (c < 0x20) {
            char b[8];
            std::snprintf(b, sizeof(b), "\\u%04x", c);
            o += b;
            ++p;
        } else if (c < 0x80) {
            o += static_cast<char>(c);
            ++p;
        } else {
            // Length from the lead byte (no overlongs, no surrogates, <= U+10FFFF).
            const long len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
            bool ok = len > 0 && end - p >= len;
            for (long k = 1; ok && k < len; ++k) ok = (p[k] & 0xc0) == 0x80;
            if (ok && len == 3) ok = !(c == 0xe0 && p[1] < 0xa0) && !(c == 0xed && p[1] >= 0xa0);
            if (ok && len == 4) ok = !(c == 0xf0 && p[1] < 0x90) && !(c == 0xf4 && p[1] >= 0x90);
            if (ok) {
                o.append(reinterpret_cast<const char *>(p), static_cast<size_t>(len));
                p += len;
            } else {
                o += "\\ufffd";
                ++p;
            }
        }
    }
    return o;
}

} // namespace vigil::telemetry
