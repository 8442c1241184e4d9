// SPDX-License-Identifier: Apache-2.0
// Where a connection's paths go (VIGIL_BACKUP), and the VIGIL_* failover and telemetry values
// as the core's plain configuration structs. Fabric-neutral: works on the devices any fabric
// reports.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "comm.h"
#include "fabric.h"
#include "handle.h"
#include "params.h"

namespace vigil::net {

/// VIGIL_BACKUP: for each local device, the devices its connections' backup paths may leave
/// from. `spread` deals them round-robin over every other device, nearest first (same NUMA
/// node, then the longest shared PCI path), so that a failed port's load lands on all
/// surviving ports; `off` gives no backup; `eth0:eth1,eth1:eth0` fixes pairs.
/// Thread-safe (connects from several proxy threads share the round-robin cursors).
class BackupPlan
{
public:
    BackupPlan() = default;
    BackupPlan(const BackupPlan &o) : candidates_(o.candidates_), next_(o.next_) {}
    BackupPlan &operator=(const BackupPlan &o)
    {
        candidates_ = o.candidates_;
        next_ = o.next_;
        return *this;
    }

    /// Parses `spec` over `devs`. Returns false with *why on a bad value.
    static bool parse(const std::string &spec, const std::vector<DeviceProps> &devs, BackupPlan *out,
                      std::string *why);
    /// The paths of a new connection from local device `dev` to the listener of `handle`: the
    /// primary to the listener's own address; the backup from the next candidate device in
    /// turn, to the listener's address on that same device index when it has one (rail
    /// aligned), else on any of its other devices; none when either side has no other device.
    ConnectPlan plan(int dev, const ListenHandle &handle, int traffic_class);
    /// Backup candidates of `dev`, nearest first (for tests and the banner).
    std::vector<int> candidates(int dev) const;

private:
    mutable std::mutex mu_;
    std::vector<std::vector<int>> candidates_;
    std::vector<size_t> next_;
};

/// The VIGIL_* failover timings.
FailoverConfig failover_config(const Params &params);
/// The VIGIL_* telemetry values; `devs` gives each device's link speed (the detector's
/// baseline cap).
TelemetryConfig telemetry_config(const Params &params, const std::vector<DeviceProps> &devs);

} // namespace vigil::net
