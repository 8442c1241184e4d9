// SPDX-License-Identifier: Apache-2.0
// vigil-netbench's command line: the usage text and the parsing of options (see options.h).
#include "options.h"

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli.h"

namespace vigil::bench {

namespace {

[[noreturn]] void usage(int rc)
{
    std::fprintf(rc ? stderr : stdout, R"(usage: vigil-netbench --rank R --nranks N --rendezvous ADDR [options]

Loads an ncclNet plugin the way NCCL does and runs a validated workload between N processes.

  --plugin NAME|PATH   plugin to load (NCCL_NET_PLUGIN rules: NAME tries NAME, then
                       libnccl-net-NAME.so); default vigil
  --api-version N      use ncclNetPlugin_vN (8..12) instead of the newest exported
  --rendezvous ADDR    unix:/path (works across network namespaces) or HOST:PORT; rank 0 listens
  --workload W         latency | bandwidth | allreduce | multirecv | fanout (default allreduce)
  --bytes SIZE         message size (latency: 8, bandwidth: sweep) or per-rank buffer
                       (allreduce: 64M); K/M/G suffixes
  --min-bytes SIZE --max-bytes SIZE --factor F   bandwidth sweep (default 8 .. 256M, x2)
  --iters N --warmup N iterations (defaults depend on the workload)
  --window N           requests in flight per direction (default 8, max 64; above 32
                       the plugin must answer some irecv calls with a NULL request)
  --recv-ahead 0|1     latency: keep a receive posted ahead of the message awaited, as
                       NCCL does with its next steps (default 1); 0: post each receive
                       after the previous message (the plain ping-pong)
  --slice SIZE         all-reduce slice per request (default 1M)
  --check              validate every received byte (always on for allreduce and multirecv)
  --dev D              NCCL device index to use (default 0)
  --channels C         all-reduce and bandwidth: C connections per ring neighbour, channel c
                       on device (dev + c) mod ndevices, slices (all-reduce) or messages
                       (bandwidth) dealt round-robin (like NCCL channels); 1..32.
                       fanout: C connections from rank 0 to rank 1 (1..16384), as an
                       all-to-all at scale opens one per remote peer and channel: the set-up
                       time, --iters rounds of one --bytes message (default 64K) on every
                       connection at once (time per round and connection), then --idle
                       seconds with all open and nothing posted; each rank's idle CPU, memory
                       (RSS) and fds per connection
  --idle S             fanout: seconds every connection stays open with nothing posted,
                       the CPU each rank's process spends meanwhile measured (default 10)
  --duration S         fanout: rounds for S seconds instead of --iters (a port cut meanwhile
                       shows in the worst round: each connection's completion time in it)
  --timeout S          abort with ok:false after S seconds (default 600; 0: never)
  --profile net|PATH   all-reduce: drive an NCCL profiler plugin like NCCL's proxy does (a Coll
                       per iteration, ProxyOps per channel and direction, a ProxyStep per
                       request, the net plugin's events through the profiler callback);
                       "net" takes ncclProfiler_v6/_v5 from the net plugin's own library
  --delay-rank R --delay-us U   all-reduce: rank R arrives U us late at every iteration (a
                       straggler, e.g. for `vigil report`)
  --tuner net|PATH     all-reduce: load an NCCL tuner plugin (ncclTunerPlugin_v7..v3; "net" takes
                       it from the net plugin's own library, as NCCL falls back to), init it per
                       run like NCCL's comm init, and per iteration build NCCL's cost table, call
                       getCollInfo and getChunkSize like NCCL's enqueue; every rank prints its
                       decisions ("# tuner ...") and the ranks' decisions must agree
  --tuner-nodes N      nNodes given to the tuner (default: one rank per node)
  --loop               all-reduce: iterate until the ranks agree to stop (or --iters): SIGUSR1
                       to any rank casts its stop vote, which rides in the last element of
                       the next iteration's all-reduce, so every rank stops after that same
                       iteration and then closes cleanly. No rendezvous barrier between
                       iterations: the ring alone paces the ranks, as under NCCL, so a dead
                       peer surfaces through the plugin, never through the rendezvous
  --yield              yield the CPU after a polling pass in which no request was posted
                       or completed (latency: after each test() of a pending request), as
                       NCCL's proxy progress thread does (proxy.cc, ncclProxyProgress), so
                       ranks sharing few cores leave the plugin's threads (and a software
                       RDMA device's kernel work) room to run
  --progress           all-reduce: every rank prints, after each validated iteration, one
                       line {"type":"progress","rank","iter","mono_s" (CLOCK_MONOTONIC, the
                       plugin log's clock),"msgs" (completed requests),"bytes_verified",
                       "wrong" (elements),"stall_s","stall_from_s" (this iteration),
                       "stall_max_s","stall_max_from_s" (the run so far),"null_retries"}.
                       A stall is the longest time the rank waited on the network with no
                       request completing (from a ring step's start or the previous
                       completion); *_from_s is when that wait began

Prints a table on rank 0 and, last, a one-line JSON summary:
  {"ok":..,"workload":..,"ranks":..,"bytes":..,"seconds":..,"gbps":..,"errors":..,...}
(with --progress also "iters","msgs","bytes_verified","stall_max_s", summed or maxed over
ranks). A rank whose plugin call fails prints
  {"ok":false,"rank":..,"error":..,"call":..,"peer":..,"channel":..,"mono_s":..,...}
(peer and channel of the failing comm, -1 when not tied to one; with --progress also its
counters and "stall_s", how long it had waited without progress) and exits with status 1.
Exit status 0 only when every rank saw no error.
)");
    std::exit(rc);
}

constexpr const char *kProg = "vigil-netbench";

// A usage error: one line on stderr naming what was wrong, exit status 2.
[[noreturn]] void bad_usage(const std::string &what)
{
    std::exit(vigil::cli::usage_error(stderr, kProg, what));
}

// SIZE with an optional K/M/G suffix (binary units), for option `opt`.
int64_t parse_size(const std::string &opt, const char *s)
{
    char *end = nullptr;
    errno = 0;
    long long v = std::strtoll(s, &end, 10);
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; ++end; break;
    case 'm': case 'M': shift = 20; ++end; break;
    case 'g': case 'G': shift = 30; ++end; break;
    default: break;
    }
    if (errno != 0 || end == s || v < 0 || *end != '\0' || v > (INT64_MAX >> shift))
        bad_usage(opt + " wants a size (bytes, K/M/G suffixes), not '" + s + "'");
    return v << shift;
}

int parse_count(const std::string &opt, const char *s)
{
    int v = 0;
    if (!vigil::cli::parse_int(std::string(s), INT32_MIN, INT32_MAX, &v))
        bad_usage(opt + " wants an integer, not '" + s + "'");
    return v;
}

} // namespace

Options parse(int argc, char **argv)
{
    Options o;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> const char * {
            if (i + 1 >= argc) bad_usage(a + " wants a value");
            return argv[++i];
        };
        auto count = [&]() { return parse_count(a, next()); };
        auto size = [&]() { return parse_size(a, next()); };
        if (vigil::cli::is_help(a)) usage(0);
        else if (a == "--plugin") o.plugin = next();
        else if (a == "--api-version") o.api_version = count();
        else if (a == "--rank") o.rank = count();
        else if (a == "--nranks") o.nranks = count();
        else if (a == "--rendezvous") o.rendezvous = next();
        else if (a == "--workload") o.workload = next();
        else if (a == "--bytes") o.bytes = size();
        else if (a == "--min-bytes") o.min_bytes = size();
        else if (a == "--max-bytes") o.max_bytes = size();
        else if (a == "--factor") o.factor = count();
        else if (a == "--iters") o.iters = count();
        else if (a == "--warmup") o.warmup = count();
        else if (a == "--window") o.window = count();
        else if (a == "--recv-ahead") {
            const int v = count();
            if (v > 1) bad_usage("--recv-ahead wants 0 or 1, not " + std::to_string(v));
            o.recv_ahead = v == 1;
        }
        else if (a == "--slice") o.slice = size();
        else if (a == "--check") o.check = true;
        else if (a == "--dev") o.dev = count();
        else if (a == "--channels") o.channels = count();
        else if (a == "--timeout") {
            const std::string v = next();
            if (!vigil::cli::parse_double(v, 0, 1e9, &o.timeout_s))
                bad_usage("--timeout wants seconds, not '" + v + "'");
        } else if (a == "--profile") o.profile = next();
        else if (a == "--delay-rank") o.delay_rank = count();
        else if (a == "--delay-us") o.delay_us = count();
        else if (a == "--tuner") o.tuner = next();
        else if (a == "--tuner-nodes") o.tuner_nodes = count();
        else if (a == "--loop") o.loop = true;
        else if (a == "--progress") o.progress = true;
        else if (a == "--yield") o.yield = true;
        else if (a == "--duration") {
            const std::string v = next();
            if (!vigil::cli::parse_double(v, 0, 3600, &o.duration_s))
                bad_usage("--duration wants seconds (0..3600), not '" + v + "'");
        } else if (a == "--idle") {
            const std::string v = next();
            if (!vigil::cli::parse_double(v, 0, 3600, &o.idle_s))
                bad_usage("--idle wants seconds (0..3600), not '" + v + "'");
        }
        else if (a.starts_with("-")) std::exit(vigil::cli::unknown_option(stderr, kProg, a));
        else bad_usage("unexpected argument '" + a + "'");
    }
    if (o.rank < 0 || o.rendezvous.empty()) bad_usage("--rank R and --rendezvous ADDR are needed");
    if (o.nranks < 2 || o.rank >= o.nranks) bad_usage("--nranks wants 2 or more, --rank below it");
    if (o.window < 1 || o.window > 64) bad_usage("--window wants 1..64");
    if (o.factor < 2) bad_usage("--factor wants 2 or more");
    if (o.slice < 1) bad_usage("--slice wants 1 byte or more");
    if (o.workload == "fanout") {
        if (o.channels < 1 || o.channels > 16384) bad_usage("--channels wants 1..16384 for fanout");
        if (o.nranks != 2) bad_usage("fanout wants --nranks 2");
    } else if (o.channels < 1 || o.channels > 32) {
        bad_usage("--channels wants 1..32");
    }
    if (o.loop && o.workload != "allreduce") bad_usage("--loop wants --workload allreduce");
    if (o.api_version != 0 && (o.api_version < 8 || o.api_version > 12))
        bad_usage("--api-version wants 8..12");
    return o;
}

} // namespace vigil::bench
