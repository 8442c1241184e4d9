// SPDX-License-Identifier: Apache-2.0
// Fuzz target: ListenHandle::decode, the 128 bytes NCCL carries from another rank's listen()
// to this rank's connect().
//
// Input: the handle (shorter inputs are zero-padded, longer ones cut at 128 bytes). Each input
// is decoded twice: as it is, and with its checksum recomputed, so mutations get past the
// checksum to the fields behind it. Properties: decode never reads outside the 128 bytes; a
// handle it accepts holds 1..kMaxAddrs addresses with a known family and a non-zero port, and
// encodes back to the same bytes [0,108) (a handle has one canonical form).
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_util.h"
#include "handle.h"

using vigil::net::ListenHandle;

namespace {

constexpr size_t kSumOffset = 104; // handle.h: FNV-1a of [0,104) at [104,108)

void decode_one(const uint8_t *in)
{
    ListenHandle h;
    std::string why;
    const int rc = ListenHandle::decode(in, &h, &why);
    if (rc != 0) {
        FUZZ_CHECK(rc == -EBADMSG && !why.empty());
        return;
    }
    FUZZ_CHECK(!h.addrs.empty() && h.addrs.size() <= ListenHandle::kMaxAddrs);
    FUZZ_CHECK(h.addr_devs.size() == h.addrs.size());
    for (const vigil::net::Endpoint &e : h.addrs) {
        FUZZ_CHECK(e.family == AF_INET || e.family == AF_INET6);
        FUZZ_CHECK(e.port != 0);
        (void)e.to_string();
    }
    std::array<uint8_t, ListenHandle::kSize> again{};
    FUZZ_CHECK(h.encode(again.data()) == 0);
    FUZZ_CHECK(std::memcmp(again.data(), in, ListenHandle::kScratchOffset) == 0);
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int * /*argc*/, char *** /*argv*/)
{
    vigil::fuzz::init();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    // An exact-size heap copy: ASan sees any read past the 128 bytes.
    auto *in = new uint8_t[ListenHandle::kSize]();
    std::memcpy(in, data, std::min(size, ListenHandle::kSize));
    decode_one(in);
    const uint32_t sum = vigil::net::fnv1a32(in, kSumOffset);
    for (int i = 0; i < 4; ++i) in[kSumOffset + i] = static_cast<uint8_t>(sum >> (8 * i));
    decode_one(in);
    delete[] in;
    return 0;
}
