// SPDX-License-Identifier: Apache-2.0
// Fabric selection.
#include "fabrics.h"

#include "tcp/tcp_fabric.h"

namespace vigil::net {

int make_fabric(const Params &params, std::unique_ptr<Fabric> *out, std::string *why)
{
    return tcp::make_fabric(params, out, why);
}

} // namespace vigil::net
