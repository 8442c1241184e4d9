// SPDX-License-Identifier: Apache-2.0
// Fabric selection: VIGIL_FABRIC=verbs, tcp, or auto (verbs when an active RDMA port is
// selected, else tcp).
#include "fabrics.h"

#include <cerrno>

#include "log.h"
#include "tcp/tcp_fabric.h"
#if VIGIL_HAVE_VERBS
#include "verbs/verbs_fabric.h"
#endif

namespace vigil::net {

int make_fabric(const Params &params, std::unique_ptr<Fabric> *out, std::string *why)
{
    const std::string &want = params.fabric;
    if (want != "auto" && want != "verbs" && want != "tcp") {
        *why = "bad VIGIL_FABRIC \"" + want + "\": expected auto, verbs or tcp";
        return -EINVAL;
    }
    if (want != "tcp") {
#if VIGIL_HAVE_VERBS
        std::string vwhy;
        const int rc = verbs_fabric::make_fabric(params, out, &vwhy);
        if (rc == 0) return 0;
        // auto takes TCP when there is no RDMA port; a bad VIGIL_IB_* value is an error either way.
        if (want == "verbs" || rc == -EINVAL) {
            *why = "verbs fabric: " + vwhy;
            return rc;
        }
        VLOG_INFO(NCCL_INIT | NCCL_NET, "no verbs fabric (%s); using tcp", vwhy.c_str());
#else
        if (want == "verbs") {
            *why = "VIGIL_FABRIC=verbs, but this build has no verbs fabric (libibverbs was not found)";
            return -EINVAL;
        }
#endif
    }
    return tcp::make_fabric(params, out, why);
}

} // namespace vigil::net
