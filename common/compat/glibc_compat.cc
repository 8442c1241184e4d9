// SPDX-License-Identifier: Apache-2.0
// Binds the plugins' glibc references to versions every glibc since 2.28 has, so a library
// built on a new distribution loads on an old GPU node (RHEL 8, Ubuntu 20.04).
//
// The plugins link the C++ runtime statically (-static-libstdc++ -static-libgcc), so their
// only dependency is glibc. Compiled against a new glibc, their code and that runtime refer
// to the newest version of some symbols: pthread_* and dl* moved into libc in 2.34 under a
// new version, stat64/fstat64 became real symbols in 2.33, and libstdc++/libgcc use
// functions that did not exist before 2.30-2.36. The build passes `-Wl,--wrap=NAME` for each
// NAME below (common/compat/meson.build keeps the list), which sends every reference to
// `__wrap_NAME` here; each wrapper forwards to the oldest version of NAME, or reimplements
// what an old glibc lacks on top of what it has. Nothing else in the tree knows about this.
//
// x86_64 only: the base version (GLIBC_2.2.5) and the stat ABI (_STAT_VER 1) are that
// architecture's. On glibc < 2.34 the old versions of pthread_* live in libpthread.so.0,
// dl* in libdl.so.2 and shm_* in librt.so.1; the libraries name all three as NEEDED
// (they exist, as empty stubs, on newer glibc too), so the references resolve on either.
// test/tools/portable.sh checks the result: no NEEDED entry beyond glibc's, no version
// newer than GLIBC_2.28.
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fcntl.h>

#if !defined(__x86_64__)
#error "glibc_compat.cc binds x86_64 symbol versions; build with -Dportable=false elsewhere"
#endif

// Forwarders: `__wrap_NAME` jumps to NAME@VERSION, whatever NAME's signature (a tail jump
// leaves the arguments and the return value untouched). `.symver` on the undefined local
// name makes the assembler bind that reference to the old version.
#define VIGIL_FORWARD(name, version)                                                         \
    __asm__(".globl __wrap_" #name "\n"                                                       \
            ".hidden __wrap_" #name "\n"                                                      \
            ".type __wrap_" #name ", @function\n"                                             \
            "__wrap_" #name ":\n"                                                             \
            "\tjmp vigil_old_" #name "@PLT\n"                                                 \
            ".size __wrap_" #name ", . - __wrap_" #name "\n"                                  \
            ".symver vigil_old_" #name ", " #name "@" version "\n")

// pthread_* and dl* moved from libpthread/libdl into libc in 2.34 under GLIBC_2.34; their
// original versions are still exported (and are what an old libpthread/libdl defines).
VIGIL_FORWARD(pthread_create, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_detach, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_join, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_once, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_key_create, "GLIBC_2.2.5");
VIGIL_FORWARD(__pthread_key_create, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_key_delete, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_getspecific, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_setspecific, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_mutex_trylock, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_sigmask, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_setname_np, "GLIBC_2.12");
VIGIL_FORWARD(pthread_getname_np, "GLIBC_2.12");
VIGIL_FORWARD(pthread_setaffinity_np, "GLIBC_2.3.4");
VIGIL_FORWARD(pthread_kill, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_getattr_np, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_attr_setstacksize, "GLIBC_2.2.5");
VIGIL_FORWARD(pthread_atfork, "GLIBC_2.2.5");
VIGIL_FORWARD(dlopen, "GLIBC_2.2.5");
VIGIL_FORWARD(dlclose, "GLIBC_2.2.5");
VIGIL_FORWARD(dlsym, "GLIBC_2.2.5");
VIGIL_FORWARD(dlvsym, "GLIBC_2.2.5");
VIGIL_FORWARD(dlerror, "GLIBC_2.2.5");
VIGIL_FORWARD(dladdr, "GLIBC_2.2.5");
VIGIL_FORWARD(shm_open, "GLIBC_2.2.5");
VIGIL_FORWARD(shm_unlink, "GLIBC_2.2.5");

extern "C" {

// The old stat entry points, which take the struct layout's version (x86_64: 1).
int __xstat64(int ver, const char *path, struct stat64 *buf);
int __fxstat64(int ver, int fd, struct stat64 *buf);
int __lxstat64(int ver, const char *path, struct stat64 *buf);
int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *buf, int flags);
__asm__(".symver __xstat64, __xstat64@GLIBC_2.2.5");
__asm__(".symver __fxstat64, __fxstat64@GLIBC_2.2.5");
__asm__(".symver __lxstat64, __lxstat64@GLIBC_2.2.5");
__asm__(".symver __fxstatat64, __fxstatat64@GLIBC_2.4");
constexpr int kStatVer = 1; // _STAT_VER_LINUX on x86_64

[[gnu::visibility("hidden")]] int __wrap_stat64(const char *path, struct stat64 *buf)
{
    return __xstat64(kStatVer, path, buf);
}
[[gnu::visibility("hidden")]] int __wrap_stat(const char *path, struct stat64 *buf)
{
    return __xstat64(kStatVer, path, buf);
}
[[gnu::visibility("hidden")]] int __wrap_fstat64(int fd, struct stat64 *buf)
{
    return __fxstat64(kStatVer, fd, buf);
}
[[gnu::visibility("hidden")]] int __wrap_fstat(int fd, struct stat64 *buf)
{
    return __fxstat64(kStatVer, fd, buf);
}
[[gnu::visibility("hidden")]] int __wrap_lstat64(const char *path, struct stat64 *buf)
{
    return __lxstat64(kStatVer, path, buf);
}
[[gnu::visibility("hidden")]] int __wrap_lstat(const char *path, struct stat64 *buf)
{
    return __lxstat64(kStatVer, path, buf);
}
[[gnu::visibility("hidden")]] int __wrap_fstatat64(int dirfd, const char *path,
                                                   struct stat64 *buf, int flags)
{
    return __fxstatat64(kStatVer, dirfd, path, buf, flags);
}
[[gnu::visibility("hidden")]] int __wrap_fstatat(int dirfd, const char *path, struct stat64 *buf,
                                                 int flags)
{
    return __fxstatat64(kStatVer, dirfd, path, buf, flags);
}

// libstdc++ (GCC >= 11) skips atomic reference counting while this is nonzero. glibc
// < 2.32 has no such variable; saying "never single-threaded" is always correct, and the
// plugins run inside NCCL's threads anyway.
[[gnu::visibility("hidden")]] char __wrap___libc_single_threaded = 0;

} // extern "C"

namespace {

// dlvsym of a glibc function newer than the baseline, resolved once: the real one where
// this glibc has it, nullptr where it does not. Racing first calls resolve the same value.
template <typename Fn>
Fn resolve_new(const char *name, const char *version) noexcept
{
    return reinterpret_cast<Fn>(dlvsym(RTLD_DEFAULT, name, version));
}

using ClockwaitFn = int (*)(pthread_cond_t *, pthread_mutex_t *, clockid_t, const timespec *);
using FindObjectFn = int (*)(void *, dl_find_object *);
using Arc4randomFn = uint32_t (*)();

std::atomic<ClockwaitFn> g_clockwait{nullptr};
std::atomic<FindObjectFn> g_find_object{nullptr};
std::atomic<bool> g_clockwait_resolved{false};
std::atomic<bool> g_find_object_resolved{false};

// At load, so the first exception's unwind does not call into the dynamic loader (which
// takes its lock and, where the symbol is missing, leaves a dlerror() behind).
[[gnu::constructor]] void resolve_at_load()
{
    g_find_object.store(resolve_new<FindObjectFn>("_dl_find_object", "GLIBC_2.35"), std::memory_order_relaxed);
    g_find_object_resolved.store(true, std::memory_order_release);
    g_clockwait.store(resolve_new<ClockwaitFn>("pthread_cond_clockwait", "GLIBC_2.30"),
                      std::memory_order_relaxed);
    g_clockwait_resolved.store(true, std::memory_order_release);
    (void)dlerror();
}

int64_t ns_of(const timespec &t) noexcept
{
    return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// What libgcc's unwinder asks of _dl_find_object (the object holding `pc`, its mapping and
// its PT_GNU_EH_FRAME), answered from dl_iterate_phdr, which every glibc has.
struct FindCtx {
    uintptr_t pc;
    dl_find_object *out;
    bool found;
};

int find_object_cb(dl_phdr_info *info, size_t, void *arg) noexcept
{
    auto *ctx = static_cast<FindCtx *>(arg);
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    bool holds = false;
    const void *eh = nullptr;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr) &ph = info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph.p_vaddr;
        if (ph.p_type == PT_LOAD) {
            lo = start < lo ? start : lo;
            hi = start + ph.p_memsz > hi ? start + ph.p_memsz : hi;
            holds = holds || (ctx->pc >= start && ctx->pc < start + ph.p_memsz);
        } else if (ph.p_type == PT_GNU_EH_FRAME) {
            eh = reinterpret_cast<const void *>(start);
        }
    }
    if (!holds) return 0;
    std::memset(ctx->out, 0, sizeof *ctx->out);
    ctx->out->dlfo_map_start = reinterpret_cast<void *>(lo);
    ctx->out->dlfo_map_end = reinterpret_cast<void *>(hi);
    ctx->out->dlfo_eh_frame = const_cast<void *>(eh);
    ctx->found = true;
    return 1;
}

} // namespace

extern "C" {

/// dl_iterate_phdr-based _dl_find_object: fills map start/end and eh_frame (dlfo_link_map
/// stays NULL; libgcc does not read it). 0 when `pc` lies in a loaded object, else -1.
/// Exposed for the unit test that compares it with glibc's own.
[[gnu::visibility("hidden")]] int vigil_find_object_fallback(void *pc, dl_find_object *out)
{
    FindCtx ctx{reinterpret_cast<uintptr_t>(pc), out, false};
    dl_iterate_phdr(find_object_cb, &ctx);
    return ctx.found ? 0 : -1;
}

// libgcc's unwinder (GCC >= 12 on glibc >= 2.35) finds a frame's unwind tables with
// _dl_find_object and has no other way once built that way, so an old glibc needs a real
// implementation, not a failure.
[[gnu::visibility("hidden")]] int __wrap__dl_find_object(void *pc, dl_find_object *out)
{
    if (!g_find_object_resolved.load(std::memory_order_acquire)) {
        g_find_object.store(resolve_new<FindObjectFn>("_dl_find_object", "GLIBC_2.35"),
                            std::memory_order_relaxed);
        g_find_object_resolved.store(true, std::memory_order_release);
    }
    FindObjectFn real = g_find_object.load(std::memory_order_relaxed);
    return real != nullptr ? real(pc, out) : vigil_find_object_fallback(pc, out);
}

// std::condition_variable waits on steady_clock through this (glibc >= 2.30). Before that,
// the deadline on `clock` becomes a realtime one and pthread_cond_timedwait waits on it, for
// at most kClockwaitSliceNs at a time: a wait cut short returns 0, a spurious wake-up its
// caller already handles (it re-checks its predicate and its own clock), so neither a wall
// clock stepped back nor a far deadline (time_point::max) costs more than one slice.
int vigil_old_cond_timedwait(pthread_cond_t *, pthread_mutex_t *, const timespec *);
__asm__(".symver vigil_old_cond_timedwait, pthread_cond_timedwait@GLIBC_2.3.2");
constexpr int64_t kClockwaitSliceNs = 100'000'000;

/// pthread_cond_clockwait for a glibc without it (exposed for the unit test).
[[gnu::visibility("hidden")]] int vigil_clockwait_fallback(pthread_cond_t *cond,
                                                           pthread_mutex_t *mutex, clockid_t clock,
                                                           const timespec *abstime)
{
    if (abstime->tv_nsec < 0 || abstime->tv_nsec >= 1'000'000'000) return EINVAL;
    timespec now_clock{}, now_real{};
    if (clock_gettime(clock, &now_clock) != 0) return EINVAL;
    clock_gettime(CLOCK_REALTIME, &now_real);
    // Seconds first, so no product overflows whatever the deadline.
    const int64_t left_s = int64_t(abstime->tv_sec) - int64_t(now_clock.tv_sec);
    int64_t left = left_s > kClockwaitSliceNs / 1'000'000'000 + 1
                       ? INT64_MAX
                       : left_s * 1'000'000'000 + (abstime->tv_nsec - now_clock.tv_nsec);
    if (left <= 0) return ETIMEDOUT;
    const bool sliced = left > kClockwaitSliceNs;
    if (sliced) left = kClockwaitSliceNs;
    const int64_t when = ns_of(now_real) + left;
    const timespec real_deadline{time_t(when / 1'000'000'000), long(when % 1'000'000'000)};
    const int rc = vigil_old_cond_timedwait(cond, mutex, &real_deadline);
    return rc == ETIMEDOUT && sliced ? 0 : rc;
}

[[gnu::visibility("hidden")]] int __wrap_pthread_cond_clockwait(pthread_cond_t *cond,
                                                                pthread_mutex_t *mutex,
                                                                clockid_t clock,
                                                                const timespec *abstime)
{
    if (!g_clockwait_resolved.load(std::memory_order_acquire)) {
        g_clockwait.store(resolve_new<ClockwaitFn>("pthread_cond_clockwait", "GLIBC_2.30"),
                          std::memory_order_relaxed);
        g_clockwait_resolved.store(true, std::memory_order_release);
    }
    if (ClockwaitFn real = g_clockwait.load(std::memory_order_relaxed)) {
        return real(cond, mutex, clock, abstime);
    }
    return vigil_clockwait_fallback(cond, mutex, clock, abstime);
}

// libstdc++'s random_device ("default" token) on glibc >= 2.36. getrandom (2.25) gives the
// same kernel entropy; /dev/urandom is the last resort of a kernel without getrandom. Always
// this one, old glibc or new: the unit test calls it as vigil_arc4random.
[[gnu::visibility("hidden")]] uint32_t __wrap_arc4random()
{
    uint32_t v = 0;
    auto *p = reinterpret_cast<unsigned char *>(&v);
    size_t got = 0;
    while (got < sizeof v) {
        ssize_t n = getrandom(p + got, sizeof v - got, 0);
        if (n > 0) {
            got += size_t(n);
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            break;
        }
    }
    if (got == sizeof v) return v;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        while (got < sizeof v) {
            ssize_t n = read(fd, p + got, sizeof v - got);
            if (n <= 0 && !(n < 0 && errno == EINTR)) break;
            if (n > 0) got += size_t(n);
        }
        close(fd);
    }
    return v;
}

} // extern "C"
