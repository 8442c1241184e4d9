// SPDX-License-Identifier: Apache-2.0
// The Catch2 main of vigil-tuner-unit.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
