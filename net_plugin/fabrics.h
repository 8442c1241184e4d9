// SPDX-License-Identifier: Apache-2.0
// The fabrics this build has, and the choice between them (VIGIL_FABRIC).
#pragma once

#include <memory>
#include <string>

#include "fabric.h"
#include "params.h"

namespace vigil::net {

/// Opens the fabric the parameters select and discovers its devices. Returns 0, or -errno
/// with *why (no device, bad selection) when none can be opened.
int make_fabric(const Params &params, std::unique_ptr<Fabric> *out, std::string *why);

} // namespace vigil::net
