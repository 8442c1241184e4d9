// SPDX-License-Identifier: Apache-2.0
// VIGIL_INJECT_FAIL: a deterministic, once-per-process fault for tests: break the active path
// on one device after a count of messages or bytes sent. Costs one relaxed atomic load per
// isend when off.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "fabric.h"

namespace vigil::net {

class SendComm;

/// Thread-safe; one per process (the plugin's global state).
class Injector
{
public:
    /// Parses "DEV:msgs=N" or "DEV:bytes=N" (N with K/M/G suffixes) against the device names.
    /// Empty: off. Returns false with *why on a bad value.
    bool arm(const std::string &spec, const std::vector<DeviceProps> &devs, std::string *why);
    /// After a send of `size` bytes was posted on `c`: counts it when `c` is active on the
    /// armed device and, at the limit, fails that path (both ends see it) once.
    void on_send(SendComm &c, size_t size) noexcept
    {
        if (armed_.load(std::memory_order_relaxed)) count(c, size);
    }

private:
    void count(SendComm &c, size_t size) noexcept;

    std::atomic<bool> armed_{false};
    int dev_ = -1;
    std::string dev_name_;
    bool by_bytes_ = false;
    uint64_t limit_ = 0;
    std::atomic<uint64_t> count_{0};
};

} // namespace vigil::net
