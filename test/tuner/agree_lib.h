// SPDX-License-Identifier: Apache-2.0
// Shared pieces of the agreement tests and the tuner benchmark: a scripted health source,
// a deterministic NCCL-like cost table, a redis-server started on a free loopback port.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <sys/types.h>
#include <vector>

#include "tuner.h"

namespace vigil::tuner::test {

/// Health that follows a script of (seconds since `t0`, NICs) steps. Thread-safe.
class ScriptedHealth final : public HealthSource
{
public:
    struct Step {
        double at_s;
        std::vector<NicHealth> nics;
    };
    ScriptedHealth(uint64_t t0_ns, std::vector<Step> steps) : t0_(t0_ns), steps_(std::move(steps)) {}
    void read(MemberRecord *rec) override;

private:
    uint64_t t0_;
    std::vector<Step> steps_;
};

NicHealth nic(const char *name, uint8_t state, uint16_t permille);

/// NCCL's cost table for (coll, bytes) on a made-up 2-node machine: ring and tree with
/// latency + bytes / bandwidth per protocol, tree for all-reduce only, the rest -1.
void fill_table(int coll, uint64_t bytes, float *table);
/// A latency model with the order of NCCL's default constants.
LatencyModel default_model();
/// What NCCL's init tells the tuner about communicator `comm` (tuner `abi`, with
/// default_model()'s constants).
CommInfo comm_info(uint64_t comm, size_t nranks, size_t nnodes, int abi = 6);

/// One call's outcome, packed: algo, proto, channels, chunk / 16.
uint64_t pack(const Choice &c, int channels, uint64_t chunk);

/// A redis-server of ours on 127.0.0.1:`port` (no persistence: a restart loses its data).
class RedisServer
{
public:
    /// Finds a free port and starts the server (with `extra` arguments, kept for restarts);
    /// false (with *why) when it cannot.
    bool start(std::string *why, std::vector<std::string> extra = {});
    /// Starts it again on the same port (after stop()).
    bool restart(std::string *why);
    /// SIGKILL by PID and reap it.
    void stop();
    ~RedisServer() { stop(); }
    int port() const { return port_; }
    pid_t pid() const { return pid_; }
    std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
    static bool available();

private:
    bool spawn(std::string *why);
    pid_t pid_ = -1;
    int port_ = 0;
    std::string dir_;
    std::vector<std::string> extra_;
};

/// Writes `text` to a temporary rules file and points NCCL_TUNER_CONFIG_FILE at it.
std::string install_rules(const std::string &text);

} // namespace vigil::tuner::test
