// SPDX-License-Identifier: Apache-2.0
// Fuzz target: `vigil report`'s inputs (tools/report*.cc): profiler summaries (JSONL),
// profiler traces (Chrome trace JSON, salvaged line by line when truncated) and the net
// plugin's telemetry files (JSONL), through the whole report: alignment of collectives
// across ranks, the verdicts, the printed tables, report.json and the merged trace.
//
// Input: up to five files separated by the byte 0x1e (ASCII record separator), in this order:
// rank A's summary, rank A's trace, rank A's telemetry, rank B's summary, rank B's rotated
// telemetry (.jsonl.1); so records of two ranks meet. Properties: the report never fails on
// what the files hold (no exception, exit code 0), and report.json and merged.trace.json are
// always valid JSON, whatever numbers and bytes the inputs carry.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "report.h"

namespace {

constexpr const char *kNames[] = {
    "vigil-prof-nodeA-100.jsonl", "vigil-prof-nodeA-100.trace.json", "vigil-nodeA-100.jsonl",
    "vigil-prof-nodeB-200.jsonl", "vigil-nodeB-200.jsonl.1",
};

} // namespace

extern "C" int LLVMFuzzerInitialize(int * /*argc*/, char *** /*argv*/)
{
    vigil::fuzz::init();
    // The report's tables go to stdout: formatted (that is fuzzed too), not shown.
    if (std::freopen("/dev/null", "w", stdout) == nullptr) std::abort();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const std::string text(reinterpret_cast<const char *>(data), size);
    std::vector<vigil::tool::ReportFile> files;
    size_t pos = 0;
    for (const char *name : kNames) {
        if (pos > text.size()) break;
        size_t end = text.find('\x1e', pos);
        if (end == std::string::npos) end = text.size();
        files.push_back({name, text.substr(pos, end - pos)});
        pos = end + 1;
    }
    std::string report, merged;
    const int rc = vigil::tool::report_from_memory(files, 10, &report, &merged);
    FUZZ_CHECK(rc == 0);
    // Validated without building them (a DOM of each costs more than the report itself).
    FUZZ_CHECK(nlohmann::json::accept(report) && report.front() == '{');
    FUZZ_CHECK(nlohmann::json::accept(merged) && merged.starts_with("{\"displayTimeUnit\""));
    return 0;
}
