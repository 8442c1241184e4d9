// SPDX-License-Identifier: Apache-2.0
// Negative controls of the sanitizer runs (scripts/sanitize.sh): each mode commits one defect
// the build's sanitizer must report and stop the process on. Without the sanitizer every mode
// exits 0 (test/tools/sanitizer_control.sh then fails: reports would go unseen).
//   usage: vigil-sanitizer-control overflow|leak|ub|race
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace {

// Opaque to the optimizer, so that no defect below is folded away at -O2.
template <class T> T launder_value(T v)
{
    asm volatile("" : "+r"(v));
    return v;
}

int overflow()
{
    char *p = static_cast<char *>(std::malloc(16));
    std::memset(p, 1, 16);
    char out[32];
    // One byte past the block, read by memcpy (AddressSanitizer's interceptor; a plain load
    // would meet UBSan's object-size check first).
    std::memcpy(out, p, launder_value<size_t>(17));
    std::free(p);
    return out[0] == 2 ? 1 : 0;
}

void *volatile g_sink;

int leak()
{
    g_sink = std::malloc(64); // escapes, so the allocation stays; then nothing points to it
    g_sink = nullptr;        // at exit: never freed (LeakSanitizer)
    return 0;
}

int ub()
{
    const int big = launder_value(INT_MAX);
    const int sum = big + launder_value(1); // signed overflow (UndefinedBehaviorSanitizer)
    return sum == 0 ? 1 : 0;
}

int race()
{
    long shared = 0; // written by two threads without synchronization (ThreadSanitizer)
    std::atomic<bool> go{false};
    auto work = [&] {
        while (!go.load()) {
        }
        for (int i = 0; i < 100000; ++i) shared = shared + 1;
    };
    std::thread a(work), b(work);
    go.store(true);
    a.join();
    b.join();
    return shared < 0 ? 1 : 0;
}

} // namespace

int main(int argc, char **argv)
{
    const char *mode = argc == 2 ? argv[1] : "";
    if (std::strcmp(mode, "overflow") == 0) return overflow();
    if (std::strcmp(mode, "leak") == 0) return leak();
    if (std::strcmp(mode, "ub") == 0) return ub();
    if (std::strcmp(mode, "race") == 0) return race();
    std::fprintf(stderr, "usage: vigil-sanitizer-control overflow|leak|ub|race\n");
    return 2;
}
