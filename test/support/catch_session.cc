// SPDX-License-Identifier: Apache-2.0
// Catch2's implementation, compiled once per build into vigil-catch2-session (test/meson.build).
// Catch2 2.x is a single header: the translation unit that defines CATCH_CONFIG_RUNNER (or
// CATCH_CONFIG_MAIN) compiles all of it, about 30 s at -O2 and several times that under
// ASan + UBSan, so no test program defines either; each links this library instead.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.h"

int vigil::test::run_catch(int argc, char **argv)
{
    return Catch::Session().run(argc, argv);
}
