// SPDX-License-Identifier: Apache-2.0
// VIGIL_INJECT_FAIL parsing and firing.
#include "injector.h"

#include <cstdint>

#include "log.h"
#include "params.h"
#include "send_comm.h"

namespace vigil::net {

bool Injector::arm(const std::string &spec, const std::vector<DeviceProps> &devs, std::string *why)
{
    if (spec.empty()) return true;
    const size_t colon = spec.find(':'), eq = spec.find('=');
    int dev = -1;
    for (size_t i = 0; i < devs.size(); ++i)
        if (colon != std::string::npos && devs[i].name == spec.substr(0, colon)) dev = static_cast<int>(i);
    const std::string what = colon == std::string::npos || eq == std::string::npos || eq < colon
                                 ? "" : spec.substr(colon + 1, eq - colon - 1);
    const ParamSpec count{"VIGIL_INJECT_FAIL", ParamType::Bytes, "", 1, INT64_MAX, "", ParamClass::Data};
    int64_t limit = 0;
    if (dev < 0 || (what != "msgs" && what != "bytes") ||
        !parse_number(count, std::string_view(spec).substr(eq + 1), &limit).empty()) {
        *why = "bad VIGIL_INJECT_FAIL \"" + spec +
               "\": expected DEV:msgs=N or DEV:bytes=N with DEV one of the selected devices";
        return false;
    }
    dev_ = dev;
    dev_name_ = devs[static_cast<size_t>(dev)].name;
    by_bytes_ = what == "bytes";
    limit_ = static_cast<uint64_t>(limit);
    armed_.store(true);
    VLOG_INFO(NCCL_INIT | NCCL_NET, "fault injection armed: dev %s fails after %llu %s",
              dev_name_.c_str(), static_cast<unsigned long long>(limit), what.c_str());
    return true;
}

void Injector::count(SendComm &c, size_t size) noexcept
{
    if (c.active_dev() != dev_) return;
    const uint64_t step = by_bytes_ ? size : 1;
    const uint64_t n = count_.fetch_add(step) + step;
    if (n < limit_ || !armed_.exchange(false)) return;
    VLOG_WARN("fault injection: failing dev %s now (after %llu %s)", dev_name_.c_str(),
              static_cast<unsigned long long>(n), by_bytes_ ? "bytes" : "messages");
    c.fail_active("injected failure (VIGIL_INJECT_FAIL)", true);
}

} // namespace vigil::net
