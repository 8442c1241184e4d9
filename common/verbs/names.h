// SPDX-License-Identifier: Apache-2.0
// Names and classes of verbs enums for logs and policy: completion statuses, async events,
// port states, MTUs and GIDs. Pure functions, thread-safe, no allocation unless stated.
#pragma once

#include <cstdint>
#include <string>

#include <infiniband/verbs.h>

namespace vigil::verbs {

/// The enum's own name ("IBV_WC_RETRY_EXC_ERR"), unlike ibv_wc_status_str()'s prose.
/// "IBV_WC_UNKNOWN" for a value this build does not know.
const char *wc_status_name(int status) noexcept;

/// "IBV_EVENT_PORT_ERR", ...; "IBV_EVENT_UNKNOWN" for an unknown value.
const char *event_type_name(int type) noexcept;

/// "ACTIVE", "DOWN", "INIT", "ARMED", "ACTIVE_DEFER", "NOP"; "UNKNOWN" otherwise.
const char *port_state_name(int state) noexcept;

/// What a failed completion means for a connection that has another path.
enum class WcClass {
    Success,   ///< IBV_WC_SUCCESS
    Path,      ///< the path failed (RETRY_EXC_ERR, WR_FLUSH_ERR, LOC_QP_OP_ERR,
               ///< RNR_RETRY_EXC_ERR, RESP_TIMEOUT_ERR, FATAL_ERR, GENERAL_ERR): another
               ///< path can carry the same work, so fail over
    Protection ///< the work itself is wrong (REM_ACCESS_ERR, LOC_PROT_ERR, REM_INV_REQ_ERR,
               ///< MW_BIND_ERR, LOC_LEN_ERR, LOC_ACCESS_ERR, REM_OP_ERR, BAD_RESP_ERR, ...):
               ///< replaying it elsewhere fails the same way, so fail the connection at once
};

/// Classifies a completion status into the classes above: a Path error fails over to the
/// backup, a Protection error fails the connection (README.md, "The verbs (RDMA) fabric").
/// Unknown statuses are Protection: an error nobody understands is not retried on another
/// path blindly.
WcClass classify_wc_status(int status) noexcept;

/// Bytes of an enum ibv_mtu (IBV_MTU_1024 -> 1024); 0 for an invalid value.
int mtu_bytes(int mtu) noexcept;

/// The enum ibv_mtu for a byte count that is exactly 256, 512, 1024, 2048 or 4096; 0 else.
int mtu_from_bytes(int bytes) noexcept;

/// A GID as text: "::ffff:10.10.0.1" for IPv4-mapped GIDs, else the IPv6 form
/// ("fe80::e4ab:69ff:fee1:32b1"). Allocates the string.
std::string gid_to_string(const uint8_t raw[16]);

} // namespace vigil::verbs
