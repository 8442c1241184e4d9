// SPDX-License-Identifier: Apache-2.0
// A ring indexed by an ever-increasing 64-bit index, power of two in size, that doubles while
// more entries are live: the shape of the receiving comm's message ring, the sending comm's
// CTS group ring and a TCP path's piece FIFO.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace vigil::net {

/// Entry `i` lives in slot `i & (size() - 1)`. The owner keeps the live range [lo, hi) of
/// indexes, which must hold at most size() entries; grow() moves the live entries to their
/// slots in a ring twice the size, so the entries of [lo, hi) stay reachable by index across a
/// growth and the slots outside it are default-constructed.
///
/// T: default-constructible and move-assignable. Memory: size() × sizeof(T), in one vector.
/// Not thread-safe: used under its owner's lock. References into the ring are invalidated
/// by grow(), as by a vector's growth.
template <class T> class Pow2Ring
{
public:
    /// `slots`: a power of two, ≥ 1.
    explicit Pow2Ring(size_t slots) : slots_(slots) { assert(slots > 0 && (slots & (slots - 1)) == 0); }

    T &at(uint64_t i) noexcept { return slots_[i & (slots_.size() - 1)]; }
    const T &at(uint64_t i) const noexcept { return slots_[i & (slots_.size() - 1)]; }
    /// Slots now (a power of two).
    size_t size() const noexcept { return slots_.size(); }

    /// Doubles the ring, moving the entries of [lo, hi) (hi - lo ≤ size()) to their slots in
    /// it. False, the ring unchanged, when doubling would pass `max_slots` or the allocation
    /// fails. Never throws.
    [[nodiscard]] bool grow(uint64_t lo, uint64_t hi, size_t max_slots) noexcept
    {
        // Here, not at class scope: a nested T with default member initialisers is complete
        // only once its enclosing class is.
        static_assert(std::is_nothrow_default_constructible_v<T> &&
                          std::is_nothrow_move_assignable_v<T>,
                      "grow() moves the live entries into a fresh ring and must not fail half way");
        const size_t n = slots_.size();
        assert(hi - lo <= n);
        if (2 * n > max_slots) return false;
        try {
            std::vector<T> next(2 * n);
            // The live range holds at most n entries, so their indexes are distinct modulo 2n.
            for (uint64_t i = lo; i < hi; ++i) next[i & (2 * n - 1)] = std::move(at(i));
            slots_ = std::move(next);
            return true;
        } catch (...) {
            return false;
        }
    }

private:
    std::vector<T> slots_;
};

} // namespace vigil::net
