// SPDX-License-Identifier: Apache-2.0
// The plain Catch2 main of the test programs that need nothing before their tests run
// (vigil-catch2-main, test/meson.build): what CATCH_CONFIG_MAIN would generate, without
// compiling Catch2's implementation again (test/support/catch_session.cc holds it).
#include "catch_session.h"

int main(int argc, char **argv)
{
    return vigil::test::run_catch(argc, argv);
}
