// SPDX-License-Identifier: Apache-2.0
// For executables linked like the plugins (glibc_compat.cc): the C runtime's startup object
// calls __libc_start_main, at GLIBC_2.34 on a new glibc; -Wl,--wrap=__libc_start_main sends
// it to the original version. Only the test programs that run on an old glibc need this.
//
// A new crt1.o passes no `init` function: glibc >= 2.34 then runs the program's constructors
// itself, an older one runs none. So the wrapper passes one that runs them (preinit_array,
// _init, init_array), as the old crt's __libc_csu_init did; glibc of every version calls a
// given `init` instead of its own, so they run exactly once. Destructors need nothing: the
// dynamic loader's _dl_fini runs the program's fini_array on every version.
#if !defined(__x86_64__)
#error "exe_start.cc binds x86_64 symbol versions"
#endif

extern "C" {

using InitFn = void (*)(int, char **, char **);
extern InitFn __preinit_array_start[] __attribute__((visibility("hidden")));
extern InitFn __preinit_array_end[] __attribute__((visibility("hidden")));
extern InitFn __init_array_start[] __attribute__((visibility("hidden")));
extern InitFn __init_array_end[] __attribute__((visibility("hidden")));
void _init();

using MainFn = int (*)(int, char **, char **);
int vigil_old_libc_start_main(MainFn main, int argc, char **argv, InitFn init, void (*fini)(),
                              void (*rtld_fini)(), void *stack_end);
__asm__(".symver vigil_old_libc_start_main, __libc_start_main@GLIBC_2.2.5");

static void vigil_run_constructors(int argc, char **argv, char **envp)
{
    for (InitFn *f = __preinit_array_start; f < __preinit_array_end; ++f) (*f)(argc, argv, envp);
    _init();
    for (InitFn *f = __init_array_start; f < __init_array_end; ++f) (*f)(argc, argv, envp);
}

[[gnu::visibility("hidden")]] int __wrap___libc_start_main(MainFn main, int argc, char **argv, InitFn init,
                                                           void (*fini)(), void (*rtld_fini)(), void *stack_end)
{
    return vigil_old_libc_start_main(main, argc, argv, init != nullptr ? init : vigil_run_constructors, fini,
                                     rtld_fini, stack_end);
}

} // extern "C"
