// SPDX-License-Identifier: Apache-2.0
// What the ranks of a communicator exchange through the store: each member's published
// health (MemberRecord), and the agreed view of one block (View, the value of a write-once
// register), with their text encodings and the aggregation a proposer runs.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "rules.h"

namespace vigil::tuner {

/// One local NIC as a member publishes it. state: 0 ok, 1 degraded, 2 failed (a path on it
/// died and its traffic failed over). fraction: busy-time bandwidth over baseline while
/// degraded (1 otherwise, 0 failed), in permille.
struct NicHealth {
    char name[16] = {};
    uint8_t state = 0;
    uint16_t permille = 1000;
    uint32_t failovers = 0;
    uint64_t judged_bps = 0;
    uint64_t baseline_bps = 0;
};

inline constexpr int kMaxNics = 16;

/// One member (a tuner context, i.e. one rank) of a communicator as it publishes itself.
/// Plain data, fixed size (the shm store keeps it as is).
struct MemberRecord {
    uint64_t id = 0;           ///< random, nonzero, per context
    char host[64] = {};
    int32_t pid = 0;
    int32_t env_rank = -1;     ///< RANK / OMPI_COMM_WORLD_RANK / SLURM_PROCID / PMI_RANK, else -1
    uint64_t progress = 0;     ///< the block its getCollInfo calls are in
    uint64_t rules_digest = 0; ///< of its rules file (0: none)
    uint64_t seq = 0;          ///< publication counter
    uint32_t n_nics = 0;
    NicHealth nics[kMaxNics];
    /// Its net plugin stripes connections over two NICs (telemetry::ProcessHealth::multipath):
    /// a degraded NIC then costs its own share, not the pace.
    bool multipath = false;
};

/// The agreed health view of one block: what register R[comm][block] holds. Fixed size.
struct View {
    uint8_t state = 0;          ///< Health: 0 healthy, 1 degraded, 2 failover
    uint16_t permille = 1000;   ///< worst node's effective network bandwidth fraction
    uint16_t degraded_nics = 0; ///< distinct (host, NIC) degraded
    uint16_t failed_nics = 0;   ///< distinct (host, NIC) failed over
    uint16_t nodes = 0;         ///< hosts that had published
    uint64_t digest = 0;        ///< FNV-1a over the sorted (host, NIC, state) list
    char source[48] = {};       ///< proposer: "host:pid" (and "/rRANK" when known)
    /// The store's epoch and health generation the proposal was computed at (0: unknown).
    /// Not content: a member whose last view carries the current generation proposes that
    /// view again without reading the members (aggregate() of the same records with that
    /// view as the previous one gives it back).
    uint64_t gen_epoch = 0;
    uint64_t gen = 0;

    Health health() const { return state <= 2 ? static_cast<Health>(state) : Health::kUnknown; }
    double fraction() const { return permille / 1000.0; }
    /// Same content (what a view change is judged on; the source is not content).
    bool same(const View &o) const
    {
        return state == o.state && permille == o.permille && degraded_nics == o.degraded_nics &&
               failed_nics == o.failed_nics && digest == o.digest;
    }
};

/// Text forms used in the Redis store and in logs. Decoders bound every field and return
/// false on anything malformed (the store is input like the wire).
std::string encode_view(const View &v);
bool decode_view(std::string_view s, View *out);
std::string encode_member(const MemberRecord &m);
bool decode_member(std::string_view s, MemberRecord *out);

/// The view a proposer puts forward from the members' records: per host, a NIC's state is
/// the worst any member reports and its fraction the smallest; a node's effective fraction
/// is min(smallest degraded fraction, (NICs - failed NICs) / NICs) (traffic is split evenly
/// over channels, so the slowest NIC paces a ring; a failed NIC's share moves to the others),
/// or, where a member of the host stripes (MemberRecord::multipath), the mean of its NICs'
/// fractions (a failed NIC: 0): the fraction actually achievable after the redistribution;
/// the view takes the worst node. state: failover if any NIC failed, else degraded if any is
/// degraded, else healthy. The fraction is rounded down to steps of 50 permille (at least
/// 50); with `previous` in the same state with the same NICs (one episode), the fraction
/// only falls, and only by more than one step: otherwise the previous one is kept (no churn
/// from measurement noise, nor from a degraded NIC's paths carrying less once striping moves
/// off them).
View aggregate(const std::vector<MemberRecord> &members, const View *previous, const std::string &source);

/// "healthy", "degraded 0.25 (1 NIC)", "failover 0.75 (1 NIC failed)".
std::string describe_view(const View &v);

} // namespace vigil::tuner
