// SPDX-License-Identifier: Apache-2.0
// Linked like vigil-netbench-portable (common/compat/exe_start.cc): prints how many of its
// constructors ran, which must be both of them, once, on a new glibc and under an old one's
// loader (test/tools/old_glibc.sh): an old glibc runs none of a new crt1.o's on its own.
#include <cstdio>

namespace {
int g_ran = 0;
[[gnu::constructor]] void by_attribute() { ++g_ran; }
struct ByObject {
    ByObject() { ++g_ran; }
} g_object;
} // namespace

int main()
{
    std::printf("constructors %d\n", g_ran);
    return g_ran == 2 ? 0 : 1;
}
