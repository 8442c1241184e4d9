// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the telemetry unit tests (test_telemetry_*.cc): the window length they use
// and this test process's real registry segment (/dev/shm/vigil-<uid>-<pid>).
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>

#include "telemetry/registry.h"
#include "telemetry/window.h"

namespace vt = vigil::telemetry;

/// The window length used throughout the telemetry tests: 1 ms, in ns.
inline constexpr uint64_t kW = 1'000'000;

/// This process's registry, opened on first use (kW windows, rank 3) and kept open for the
/// rest of the test process; every test that uses the registry shares it. Fails the calling
/// test if the segment cannot be created. Not thread-safe: call from the test thread.
inline vt::Registry &registry()
{
    static const int rc = vt::Registry::instance().open(kW, 3);
    REQUIRE(rc == 0);
    REQUIRE(vt::Registry::instance().is_open());
    return vt::Registry::instance();
}

/// The read-only view of the in-use entry of `v` with `conn_id`, or nullptr. The entry lives
/// as long as the view's mapping.
inline const vt::PathEntry *find_entry(const vt::RegistryView &v, uint64_t conn_id)
{
    for (uint32_t i = 0; i < v.entries(); ++i) {
        const vt::PathEntry &e = v.entry(i);
        if (e.in_use.load() != 0 && e.conn_id == conn_id) return &e;
    }
    return nullptr;
}
