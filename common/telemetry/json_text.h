// SPDX-License-Identifier: Apache-2.0
// Text for the JSON lines Vigil writes (telemetry files, profiler trace and summary).
#pragma once

#include <string>
#include <string_view>

namespace vigil::telemetry {

/// The body of a JSON string holding `in`: quotes, backslashes and control characters
/// escaped, valid UTF-8 kept as is, and any other byte (an invalid sequence, or one cut by a
/// bounded copy such as a 64-byte name) replaced by U+FFFD, so the output is valid UTF-8
/// JSON whatever the input. Thread-safe; allocates.
std::string json_escape(std::string_view in);

} // namespace vigil::telemetry
