// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the telemetry registry's readers over a hostile or truncated /dev/shm segment
// (common/telemetry/registry.{h,cc}, health.cc): RegistryView's checks, its entries and ring
// reads, and read_health(), which the tuner and the `vigil` tool run on every segment of
// the user.
//
// Input: the segment's bytes, as long as the input (a segment with max_paths 1 or 2 fits in
// -max_len; the seeds are real segments cut to that). They are copied into an 8-byte aligned
// buffer of exactly that size, so ASan sees any read past the segment's end. Properties:
// nothing is read outside the segment; a view that opens holds only entries inside it; the
// walk `vigil dump` and `vigil top` make over every entry's ring reads only records it
// checked; read_health's fractions stay in [0, 1].
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "fuzz_util.h"
#include "telemetry/health.h"
#include "telemetry/registry.h"

namespace tel = vigil::telemetry;

extern "C" int LLVMFuzzerInitialize(int * /*argc*/, char *** /*argv*/)
{
    vigil::fuzz::init();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    // operator new aligns to 16; the size is exact (ASan redzones start right after it).
    std::unique_ptr<uint8_t[]> seg(new uint8_t[size == 0 ? 1 : size]);
    std::memcpy(seg.get(), data, size);
    tel::RegistryView v;
    std::string why;
    if (v.open_bytes(seg.get(), size, &why) != 0) {
        FUZZ_CHECK(!why.empty());
        return 0;
    }
    const tel::RegistryHeader &h = v.header();
    FUZZ_CHECK(v.entries() <= h.max_paths && h.max_paths <= tel::kMaxRegistryPaths);
    FUZZ_CHECK(tel::registry_bytes(v.entries()) <= size);
    (void)strnlen(h.host, sizeof(h.host));

    // What `vigil dump` and `vigil top` do with each entry: its names, then its newest windows.
    for (uint32_t i = 0; i < v.entries(); ++i) {
        const tel::PathEntry &e = v.entry(i);
        if (e.in_use.load() == 0) continue;
        (void)strnlen(e.dev_name, sizeof(e.dev_name));
        (void)strnlen(e.local, sizeof(e.local));
        (void)strnlen(e.peer, sizeof(e.peer));
        const uint64_t head = e.ring.head.load();
        const uint64_t from = head > tel::kRingCapacity ? head - tel::kRingCapacity : 0;
        for (uint64_t k = from; k < head; ++k) {
            tel::WindowRecord w;
            if (tel::RegistryView::read(e, k, &w)) FUZZ_CHECK(w.reserved[0] == k);
        }
    }

    const tel::ProcessHealth ph = tel::read_health(v);
    for (const tel::DeviceHealth &d : ph.devices) {
        const double f = d.fraction();
        FUZZ_CHECK(!std::isnan(f) && f >= 0.0 && f <= 1.0);
    }
    const double f = ph.effective_fraction();
    FUZZ_CHECK(!std::isnan(f) && f >= 0.0 && f <= 1.0);
    return 0;
}
