// SPDX-License-Identifier: Apache-2.0
// The main of vigil-verbs-lab: runs only in the RDMA lab (scripts/rxe/run-suite.sh boots it)
// or on a host with the same four rxe ports; anywhere else it exits 77 (skipped), saying why.

#include <cstdio>
#include <cstdlib>
#include <unistd.h>

#include "catch_session.h"
#include "device.h"

int main(int argc, char **argv)
{
    auto skip = [](const char *why) {
        std::fprintf(stderr, "vigil-verbs-lab: skipped: %s\n", why);
        return 77;
    };
    if (geteuid() != 0) return skip("needs root (the tests take lab ports down and up)");
    const char *topo = std::getenv("VIGIL_RXE_TOPO");
    if (topo == nullptr || access(topo, X_OK) != 0)
        return skip("VIGIL_RXE_TOPO does not name the lab's topo.sh");
    vigil::verbs::DeviceList list;
    if (vigil::verbs::DeviceList::get(&list) != 0)
        return skip("no RDMA support in this kernel (run it with scripts/rxe/run-suite.sh)");
    for (const char *dev : {"rxe_a0", "rxe_a1", "rxe_b0", "rxe_b1"})
        if (list.find(dev) == nullptr)
            return skip(
                "the lab's rxe devices are not here (run it with scripts/rxe/run-suite.sh)");
    return vigil::test::run_catch(argc, argv);
}
