// SPDX-License-Identifier: Apache-2.0
// Names and classes of verbs enums.
#include "names.h"

#include <arpa/inet.h>

namespace vigil::verbs {

const char *wc_status_name(int status) noexcept
{
#define VIGIL_WC(x)                                                                                \
    case x: return #x
    switch (status) {
        VIGIL_WC(IBV_WC_SUCCESS);
        VIGIL_WC(IBV_WC_LOC_LEN_ERR);
        VIGIL_WC(IBV_WC_LOC_QP_OP_ERR);
        VIGIL_WC(IBV_WC_LOC_EEC_OP_ERR);
        VIGIL_WC(IBV_WC_LOC_PROT_ERR);
        VIGIL_WC(IBV_WC_WR_FLUSH_ERR);
        VIGIL_WC(IBV_WC_MW_BIND_ERR);
        VIGIL_WC(IBV_WC_BAD_RESP_ERR);
        VIGIL_WC(IBV_WC_LOC_ACCESS_ERR);
        VIGIL_WC(IBV_WC_REM_INV_REQ_ERR);
        VIGIL_WC(IBV_WC_REM_ACCESS_ERR);
        VIGIL_WC(IBV_WC_REM_OP_ERR);
        VIGIL_WC(IBV_WC_RETRY_EXC_ERR);
        VIGIL_WC(IBV_WC_RNR_RETRY_EXC_ERR);
        VIGIL_WC(IBV_WC_LOC_RDD_VIOL_ERR);
        VIGIL_WC(IBV_WC_REM_INV_RD_REQ_ERR);
        VIGIL_WC(IBV_WC_REM_ABORT_ERR);
        VIGIL_WC(IBV_WC_INV_EECN_ERR);
        VIGIL_WC(IBV_WC_INV_EEC_STATE_ERR);
        VIGIL_WC(IBV_WC_FATAL_ERR);
        VIGIL_WC(IBV_WC_RESP_TIMEOUT_ERR);
        VIGIL_WC(IBV_WC_GENERAL_ERR);
        VIGIL_WC(IBV_WC_TM_ERR);
        VIGIL_WC(IBV_WC_TM_RNDV_INCOMPLETE);
    default: return "IBV_WC_UNKNOWN";
    }
#undef VIGIL_WC
}

const char *event_type_name(int type) noexcept
{
#define VIGIL_EV(x)                                                                                \
    case x: return #x
    switch (type) {
        VIGIL_EV(IBV_EVENT_CQ_ERR);
        VIGIL_EV(IBV_EVENT_QP_FATAL);
        VIGIL_EV(IBV_EVENT_QP_REQ_ERR);
        VIGIL_EV(IBV_EVENT_QP_ACCESS_ERR);
        VIGIL_EV(IBV_EVENT_COMM_EST);
        VIGIL_EV(IBV_EVENT_SQ_DRAINED);
        VIGIL_EV(IBV_EVENT_PATH_MIG);
        VIGIL_EV(IBV_EVENT_PATH_MIG_ERR);
        VIGIL_EV(IBV_EVENT_DEVICE_FATAL);
        VIGIL_EV(IBV_EVENT_PORT_ACTIVE);
        VIGIL_EV(IBV_EVENT_PORT_ERR);
        VIGIL_EV(IBV_EVENT_LID_CHANGE);
        VIGIL_EV(IBV_EVENT_PKEY_CHANGE);
        VIGIL_EV(IBV_EVENT_SM_CHANGE);
        VIGIL_EV(IBV_EVENT_SRQ_ERR);
        VIGIL_EV(IBV_EVENT_SRQ_LIMIT_REACHED);
        VIGIL_EV(IBV_EVENT_QP_LAST_WQE_REACHED);
        VIGIL_EV(IBV_EVENT_CLIENT_REREGISTER);
        VIGIL_EV(IBV_EVENT_GID_CHANGE);
        VIGIL_EV(IBV_EVENT_WQ_FATAL);
    default: return "IBV_EVENT_UNKNOWN";
    }
#undef VIGIL_EV
}

const char *port_state_name(int state) noexcept
{
    switch (state) {
    case IBV_PORT_NOP: return "NOP";
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
    default: return "UNKNOWN";
    }
}

WcClass classify_wc_status(int status) noexcept
{
    switch (status) {
    case IBV_WC_SUCCESS: return WcClass::Success;
    // Transport gave up or the QP was torn down under the work: the data was never wrong,
    // only this path. (rxe reports a local link down as LOC_QP_OP_ERR at once.)
    case IBV_WC_RETRY_EXC_ERR:
    case IBV_WC_RNR_RETRY_EXC_ERR:
    case IBV_WC_WR_FLUSH_ERR:
    case IBV_WC_LOC_QP_OP_ERR:
    case IBV_WC_RESP_TIMEOUT_ERR:
    case IBV_WC_FATAL_ERR:
    case IBV_WC_GENERAL_ERR: return WcClass::Path;
    default: return WcClass::Protection;
    }
}

int mtu_bytes(int mtu) noexcept
{
    switch (mtu) {
    case IBV_MTU_256: return 256;
    case IBV_MTU_512: return 512;
    case IBV_MTU_1024: return 1024;
    case IBV_MTU_2048: return 2048;
    case IBV_MTU_4096: return 4096;
    default: return 0;
    }
}

int mtu_from_bytes(int bytes) noexcept
{
    switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
    default: return 0;
    }
}

std::string gid_to_string(const uint8_t raw[16])
{
    char text[INET6_ADDRSTRLEN] = {};
    if (inet_ntop(AF_INET6, raw, text, sizeof text) == nullptr) return "?";
    return text;
}

} // namespace vigil::verbs
