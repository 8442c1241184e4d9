// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the TCP fabric's wire headers (net_plugin/tcp/wire.h): the per-stream Hello,
// the FrameHeader before every chunk and control frame, and the back channel's BackHeader.
//
// Input: up to 304 bytes, zero-padded; bytes [0,40) are decoded as a Hello and as a
// FrameHeader, [0,24) as a BackHeader; bytes [40,48) give the FrameHeader's message size
// limit (0 there: the plugin's own, kMaxMessageBytes); bytes [48,304) are a kCts or kLanded
// header's payload (its own length of them). Properties: a header that decodes re-encodes to
// the same bytes, and what the receiver then trusts is inside its bounds (stream < nstreams
// <= kMaxStreams, path kind and count, a data chunk inside its message inside the limit, a
// CTS entry index < 8, a back-channel payload within kMaxBytes); a CTS group that decodes
// (decode_cts) encodes (encode_cts) to the same kind, count, index and payload, and a landed
// report's entries (decode_landed) encode (encode_landed) to the same payload.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "fabric.h"
#include "fuzz_util.h"
#include "tcp/wire.h"

namespace tcp = vigil::net::tcp;

namespace {

void hello(const uint8_t *p)
{
    tcp::Hello h;
    if (h.decode(p) != nullptr) return;
    FUZZ_CHECK(h.nstreams >= 1 && h.nstreams <= tcp::kMaxStreams && h.stream < h.nstreams);
    FUZZ_CHECK(tcp::hello_kind(h.path_kind) <= 1);
    FUZZ_CHECK(tcp::hello_npaths(h.path_kind) >= 1 && tcp::hello_npaths(h.path_kind) <= 2);
    FUZZ_CHECK(h.conn_id != 0 && h.path_id != 0);
    std::array<uint8_t, tcp::Hello::kSize> again{};
    h.encode(again.data());
    FUZZ_CHECK(std::memcmp(again.data(), p, again.size()) == 0);
}

void frame(const uint8_t *p, uint64_t max_message)
{
    tcp::FrameHeader h;
    if (h.decode(p, max_message) != nullptr) return;
    FUZZ_CHECK(h.kind <= tcp::FrameHeader::kGoodbye);
    if (h.kind == tcp::FrameHeader::kData) {
        FUZZ_CHECK(h.entry < tcp::FrameHeader::kMaxEntries);
        FUZZ_CHECK(h.size <= max_message && h.len <= tcp::kMaxFrameBytes);
        FUZZ_CHECK(static_cast<uint64_t>(h.offset) + h.len <= h.size);
    } else {
        FUZZ_CHECK(h.size == 0 && h.offset == 0 && h.len == 0);
        if (h.kind == tcp::FrameHeader::kGeneration)
            FUZZ_CHECK(h.entry == tcp::FrameHeader::kNoSlot ||
                       h.entry < tcp::FrameHeader::kMaxSlots);
    }
    std::array<uint8_t, tcp::FrameHeader::kSize> again{};
    h.encode(again.data());
    FUZZ_CHECK(std::memcmp(again.data(), p, again.size()) == 0);
}

void back(const uint8_t *p, const uint8_t *payload)
{
    tcp::BackHeader h;
    if (h.decode(p) != nullptr) return;
    FUZZ_CHECK(h.kind <= tcp::BackHeader::kLanded);
    FUZZ_CHECK(h.kSize + h.payload() <= tcp::BackHeader::kMaxBytes);
    if (h.kind == tcp::BackHeader::kCts)
        FUZZ_CHECK(h.count >= 1 && h.count <= tcp::BackHeader::kMaxEntries);
    if (h.kind == tcp::BackHeader::kLanded)
        FUZZ_CHECK(h.count >= 1 && h.count <= tcp::BackHeader::kMaxLanded);
    std::array<uint8_t, tcp::BackHeader::kSize> again{};
    h.encode(again.data());
    FUZZ_CHECK(std::memcmp(again.data(), p, again.size()) == 0);
    if (h.kind != tcp::BackHeader::kCts && h.kind != tcp::BackHeader::kLanded) return;
    // Exact-size copy of the payload the header announces: a read past it is a bug.
    auto *body = new uint8_t[h.payload()];
    std::memcpy(body, payload, h.payload());
    if (h.kind == tcp::BackHeader::kLanded) {
        std::array<tcp::Landed, tcp::BackHeader::kMaxLanded> e{};
        for (size_t k = 0; k < h.count; ++k) e[k] = tcp::decode_landed(body, k);
        std::array<uint8_t, tcp::BackHeader::kMaxBytes - tcp::BackHeader::kSize> out{};
        tcp::BackHeader eh;
        tcp::encode_landed(e.data(), h.count, h.value, &eh, out.data());
        FUZZ_CHECK(eh.kind == h.kind && eh.count == h.count && eh.value == h.value &&
                   eh.payload() == h.payload());
        FUZZ_CHECK(std::memcmp(out.data(), body, h.payload()) == 0);
        delete[] body;
        return;
    }
    vigil::net::CtsGroup g;
    if (tcp::decode_cts(h, body, &g) == nullptr) {
        FUZZ_CHECK(g.n == h.count && g.index == h.value);
        std::array<uint8_t, tcp::BackHeader::kMaxBytes - tcp::BackHeader::kSize> out{};
        tcp::BackHeader eh;
        tcp::encode_cts(g, &eh, out.data());
        // The fields a group travels in (a CTS header's arg is not part of it).
        FUZZ_CHECK(eh.kind == h.kind && eh.count == h.count && eh.value == h.value);
        FUZZ_CHECK(eh.payload() == h.payload());
        FUZZ_CHECK(std::memcmp(out.data(), body, h.payload()) == 0);
    }
    delete[] body;
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int * /*argc*/, char *** /*argv*/)
{
    vigil::fuzz::init();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    constexpr size_t kPayload = 48; // a CTS payload follows the size limit
    constexpr size_t kIn = kPayload + tcp::BackHeader::kMaxBytes - tcp::BackHeader::kSize;
    uint8_t buf[kIn] = {};
    std::memcpy(buf, data, std::min(size, kIn));
    // Exact-size heap copies: ASan sees a read past the end of each header.
    auto *h40 = new uint8_t[tcp::Hello::kSize];
    std::memcpy(h40, buf, tcp::Hello::kSize);
    auto *b24 = new uint8_t[tcp::BackHeader::kSize];
    std::memcpy(b24, buf, tcp::BackHeader::kSize);
    uint64_t max_message = tcp::get_le(buf + 40, 8);
    if (max_message == 0) max_message = vigil::net::kMaxMessageBytes;

    hello(h40);
    frame(h40, max_message);
    back(b24, buf + kPayload);
    delete[] h40;
    delete[] b24;
    return 0;
}
