// SPDX-License-Identifier: Apache-2.0
// Catch2 main of vigil-tuner-agree: exits 77 (skipped) when the tests asked for need a
// redis-server and none is installed.
#include <cstdio>
#include <cstring>

#include "agree_lib.h"
#include "catch_session.h"

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; ++i)
        if (std::strstr(argv[i], "redis") != nullptr && !vigil::tuner::test::RedisServer::available()) {
            std::fprintf(stderr, "redis-server is not installed (scripts/setup.sh installs it): skipped\n");
            return 77;
        }
    return vigil::test::run_catch(argc, argv);
}
