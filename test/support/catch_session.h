// SPDX-License-Identifier: Apache-2.0
// The entry point of Catch2's runner for the test programs that have a main of their own.
// Catch2 2.x declares Catch::Session only in the translation unit that compiles its whole
// implementation (CATCH_CONFIG_RUNNER); that unit is test/support/catch_session.cc, compiled
// once per build (vigil-catch2-session, test/meson.build), and this is its interface.
#pragma once

namespace vigil::test {

/// Runs the Catch2 session on the command line (argc, argv as main received them): parses it,
/// runs the tests it selects, reports. Returns the exit status Catch2 chooses (0: every test
/// passed; otherwise the number of failed tests, at most 255). Call once, from main.
int run_catch(int argc, char **argv);

} // namespace vigil::test
