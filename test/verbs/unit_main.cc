// SPDX-License-Identifier: Apache-2.0
// The Catch2 main of vigil-verbs-unit: host-side tests of the verbs fabric's pure parts.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
