// SPDX-License-Identifier: Apache-2.0
// For executables linked like the plugins (glibc_compat.cc): the C runtime's startup object
// calls __libc_start_main, at GLIBC_2.34 on a new glibc; -Wl,--wrap=__libc_start_main sends
// it to the original version. Only the test programs that run on an old glibc need this.
#if !defined(__x86_64__)
#error "exe_start.cc binds x86_64 symbol versions"
#endif

__asm__(".globl __wrap___libc_start_main\n"
        ".hidden __wrap___libc_start_main\n"
        ".type __wrap___libc_start_main, @function\n"
        "__wrap___libc_start_main:\n"
        "\tjmp vigil_old___libc_start_main@PLT\n"
        ".size __wrap___libc_start_main, . - __wrap___libc_start_main\n"
        ".symver vigil_old___libc_start_main, __libc_start_main@GLIBC_2.2.5\n");
