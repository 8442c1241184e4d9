// SPDX-License-Identifier: Apache-2.0
// The exception firewall at every extern "C" entry point and the one errno -> ncclResult_t
// table (house style: aws-ofi-nccl nccl_ofi_api.h).
#pragma once

#include <cerrno>
#include <exception>
#include <new>

#include "log.h"
#include "nccl_abi/nccl_common.h"

namespace vigil {

/// Maps a core return code (0 or -errno) to NCCL's result. ncclRemoteError is reserved for
/// "the peer or every path to it is gone"; misuse is ncclInternalError, a message larger than
/// the posted buffer ncclInvalidUsage. Pure function, thread-safe.
constexpr ncclResult_t to_nccl_result(int rc) noexcept
{
    switch (rc) {
    case 0: return ncclSuccess;
    case -EINVAL: return ncclInternalError;
    case -EMSGSIZE: return ncclInvalidUsage;
    case -ENOMEM: return ncclSystemError;
    case -ECONNRESET:
    case -ECONNREFUSED:
    case -ECONNABORTED:
    case -EHOSTUNREACH:
    case -ENETUNREACH:
    case -ENETDOWN:
    case -EPIPE:
    case -ETIMEDOUT:
    case -EPROTO:
    case -EBADMSG:
    case -EACCES: return ncclRemoteError;
    default: return ncclSystemError;
    }
}

/// Runs `body` (returning ncclResult_t) and converts any escaping exception into an NCCL
/// result with one WARN naming the entry point `fn`. Nothing ever propagates into NCCL.
template <class Body> ncclResult_t abi_guard(const char *fn, Body &&body) noexcept
{
    try {
        return body();
    } catch (const std::bad_alloc &) {
        VLOG_WARN("%s: out of memory", fn);
        return ncclSystemError;
    } catch (const std::exception &e) {
        VLOG_WARN("%s: internal error: %s", fn, e.what());
        return ncclInternalError;
    } catch (...) {
        VLOG_WARN("%s: internal error: unknown exception", fn);
        return ncclInternalError;
    }
}

} // namespace vigil
