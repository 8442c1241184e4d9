// SPDX-License-Identifier: Apache-2.0
// vigil-netbench: nccl-tests for the network layer, no GPU needed. Loads any ncclNet plugin
// the way NCCL does, makes NCCL's call sequences (non-blocking connect/accept loops,
// NULL-request retries, test polling, multi-recv) across processes that meet at a rendezvous
// address, and runs validated workloads: latency ping-pong, bandwidth sweep, ring all-reduce
// of float32 on host memory, multi-recv tag matching.
#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "loader.h"
#include "cli.h"
#include "prof_driver.h"
#include "rendezvous.h"
#include "tuner_driver.h"

namespace {

volatile sig_atomic_t g_stop_requested = 0; // --loop: SIGUSR1 seen, vote to stop

using vigil::bench::NetPlugin;
using vigil::bench::ProfDriver;
using vigil::bench::Rendezvous;
using vigil::bench::TunerDriver;

struct Options {
    std::string plugin = "vigil";
    int api_version = 0;
    int rank = -1;
    int nranks = 2;
    std::string rendezvous;
    std::string workload = "allreduce";
    int64_t bytes = -1; // single size; -1 = workload default / sweep
    int64_t min_bytes = 8;
    int64_t max_bytes = 256ll << 20;
    int factor = 2;
    int iters = -1;
    int warmup = -1;
    int window = 8;
    bool recv_ahead = true; // latency: a receive posted ahead of the message awaited
    int64_t slice = 1 << 20;
    bool check = false;
    int dev = 0;
    int channels = 1;
    double timeout_s = 600;
    std::string profile; // "": off; "net": the plugin library's ncclProfiler; else a path
    int delay_rank = -1;  // all-reduce: this rank arrives late at every collective
    int delay_us = 0;
    std::string tuner;    // "": off; "net": the plugin library's ncclTunerPlugin; else a name/path
    int tuner_nodes = 0;  // nNodes told to the tuner (0: one rank per node)
    bool loop = false;    // all-reduce until the ranks agree to stop (SIGUSR1)
    bool progress = false; // every rank prints a JSON progress line per iteration
    bool yield = false;   // yield the CPU after a polling pass that moved nothing
};

[[noreturn]] void usage(int rc)
{
    std::fprintf(rc ? stderr : stdout, R"(usage: vigil-netbench --rank R --nranks N --rendezvous ADDR [options]

Loads an ncclNet plugin the way NCCL does and runs a validated workload between N processes.

  --plugin NAME|PATH   plugin to load (NCCL_NET_PLUGIN rules: NAME tries NAME, then
                       libnccl-net-NAME.so); default vigil
  --api-version N      use ncclNetPlugin_vN (8..12) instead of the newest exported
  --rendezvous ADDR    unix:/path (works across network namespaces) or HOST:PORT; rank 0 listens
  --workload W         latency | bandwidth | allreduce | multirecv   (default allreduce)
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
  --channels C         all-reduce: C connections per ring neighbour, channel c on device
                       (dev + c) mod ndevices, slices dealt round-robin (like NCCL channels)
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
        else if (a.starts_with("-")) std::exit(vigil::cli::unknown_option(stderr, kProg, a));
        else bad_usage("unexpected argument '" + a + "'");
    }
    if (o.rank < 0 || o.rendezvous.empty()) bad_usage("--rank R and --rendezvous ADDR are needed");
    if (o.nranks < 2 || o.rank >= o.nranks) bad_usage("--nranks wants 2 or more, --rank below it");
    if (o.window < 1 || o.window > 64) bad_usage("--window wants 1..64");
    if (o.factor < 2) bad_usage("--factor wants 2 or more");
    if (o.slice < 1) bad_usage("--slice wants 1 byte or more");
    if (o.channels < 1 || o.channels > 32) bad_usage("--channels wants 1..32");
    if (o.loop && o.workload != "allreduce") bad_usage("--loop wants --workload allreduce");
    if (o.api_version != 0 && (o.api_version < 8 || o.api_version > 12))
        bad_usage("--api-version wants 8..12");
    return o;
}

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Fills/validates message `k` of `n` bytes with a position- and message-dependent pattern,
// so lost, duplicated, misplaced or stale bytes all show.
uint64_t pattern_word(uint64_t k, uint64_t j)
{
    return (k << 40) ^ (j * 0x9E3779B97F4A7C15ull) ^ 0x5A5A5A5A5A5A5A5Aull;
}
void fill(uint8_t *p, size_t n, uint64_t k)
{
    size_t words = n / 8;
    for (size_t j = 0; j < words; ++j) {
        uint64_t w = pattern_word(k, j);
        std::memcpy(p + 8 * j, &w, 8);
    }
    uint64_t w = pattern_word(k, words);
    std::memcpy(p + 8 * words, &w, n % 8);
}
size_t count_bad(const uint8_t *p, size_t n, uint64_t k)
{
    size_t bad = 0, words = n / 8;
    for (size_t j = 0; j < words; ++j) {
        uint64_t w = pattern_word(k, j), got;
        std::memcpy(&got, p + 8 * j, 8);
        bad += got != w;
    }
    uint64_t w = pattern_word(k, words);
    bad += std::memcmp(p + 8 * words, &w, n % 8) != 0;
    return bad;
}

/// Host buffer with its registration on every channel's send and receive comm.
struct Buffer {
    std::vector<uint8_t> mem;
    std::vector<void *> mh_send, mh_recv; // per channel
};

class Bench
{
public:
    explicit Bench(Options o) : o_(std::move(o)) {}
    int run();

private:
    // die: prints the failure JSON (with the failing call and the comm's peer rank and
    // channel when known, -1 otherwise) and exits 1. check_nccl dies unless r succeeded.
    [[noreturn]] void die(const std::string &what, const char *call = "", int peer = -1,
                          int ch = -1);
    void check_nccl(ncclResult_t r, const char *call, int peer = -1, int ch = -1);
    // try_*: one call; nullptr when the plugin answered with a NULL request (NCCL then goes on
    // testing other requests and calls again later). post_*: retry until posted, only safe
    // while fewer than NCCL_NET_MAX_REQUESTS requests are outstanding.
    void *try_send(void *data, size_t size, void *mh, int ch = 0, void *phandle = nullptr);
    void *try_recv(int n, void **data, size_t *sizes, int *tags, void **mhs, int ch = 0, void **phandles = nullptr);
    void *post_send(void *data, size_t size, void *mh);
    void *post_recv(int n, void **data, size_t *sizes, int *tags, void **mhs);
    bool poll(void *req, int *sizes, int peer = -1, int ch = -1);
    void wait(void *req, int *sizes);
    void reg(Buffer &b, size_t n);
    void dereg(Buffer &b);

    void latency();
    void bandwidth();
    void allreduce();
    void multirecv();

    Options o_;
    NetPlugin net_;
    ProfDriver prof_;
    bool profiling_ = false;
    TunerDriver tuner_;
    bool tuning_ = false;
    uint64_t tuner_digest_ = 0xcbf29ce484222325ull; // FNV-1a over every decision
    Rendezvous rdv_;
    std::vector<void *> send_comms_, recv_comms_; // per channel
    int max_recvs_ = 1;
    // results
    uint64_t bytes_sent_ = 0;
    uint64_t errors_ = 0;
    uint64_t null_retries_ = 0;
    double seconds_ = 0;
    double gbps_ = 0;
    double busbw_ = 0;
    double lat_p50_us_ = 0, lat_p99_us_ = 0;
    // all-reduce progress (--progress): completed requests, validated bytes, iterations, and
    // the longest wait on the network without a completion (waiting_since_ is 0 outside
    // ring steps, else the start of the current wait; CLOCK_MONOTONIC seconds)
    uint64_t msgs_ = 0;
    uint64_t bytes_verified_ = 0;
    int iters_done_ = 0;
    double waiting_since_ = 0;
    double stall_max_s_ = 0, stall_from_s_ = 0;   // the run so far
    double stall_iter_s_ = 0, stall_iter_from_s_ = 0; // the current iteration
    void progressed(double now);
};

void Bench::die(const std::string &what, const char *call, int peer, int ch)
{
    const double now = now_s();
    std::fprintf(stderr, "vigil-netbench rank %d: %s\n", o_.rank, what.c_str());
    std::string counters;
    if (o_.progress) {
        char buf[256];
        std::snprintf(buf, sizeof(buf),
                      ",\"iter\":%d,\"msgs\":%" PRIu64 ",\"bytes_verified\":%" PRIu64
                      ",\"wrong\":%" PRIu64 ",\"stall_s\":%.6f",
                      iters_done_, msgs_, bytes_verified_, errors_,
                      waiting_since_ > 0 ? now - waiting_since_ : 0.0);
        counters = buf;
    }
    std::printf("{\"ok\":false,\"rank\":%d,\"workload\":\"%s\",\"error\":\"%s\",\"call\":\"%s\","
                "\"peer\":%d,\"channel\":%d,\"mono_s\":%.6f%s}\n",
                o_.rank, o_.workload.c_str(), what.c_str(), call, peer, ch, now, counters.c_str());
    std::fflush(stdout);
    std::_Exit(1);
}

void Bench::check_nccl(ncclResult_t r, const char *call, int peer, int ch)
{
    if (r != ncclSuccess)
        die(std::string(call) + " returned ncclResult " + std::to_string(r), call, peer, ch);
}

void Bench::progressed(double now)
{
    ++msgs_;
    if (waiting_since_ > 0 && now - waiting_since_ > stall_iter_s_) {
        stall_iter_s_ = now - waiting_since_;
        stall_iter_from_s_ = waiting_since_;
    }
    if (stall_iter_s_ > stall_max_s_) {
        stall_max_s_ = stall_iter_s_;
        stall_from_s_ = stall_iter_from_s_;
    }
    waiting_since_ = now;
}

void *Bench::try_send(void *data, size_t size, void *mh, int ch, void *phandle)
{
    void *req = reinterpret_cast<void *>(0x2); // must be overwritten, like NCCL expects
    check_nccl(net_.isend(send_comms_[static_cast<size_t>(ch)], data, size, o_.rank, mh, &req,
                          phandle),
               "isend", (o_.rank + 1) % o_.nranks, ch);
    if (req == reinterpret_cast<void *>(0x2)) die("isend left *request unwritten");
    if (req == nullptr) ++null_retries_;
    return req;
}

void *Bench::try_recv(int n, void **data, size_t *sizes, int *tags, void **mhs, int ch, void **phandles)
{
    void *req = nullptr;
    check_nccl(net_.irecv(recv_comms_[static_cast<size_t>(ch)], n, data, sizes, tags, mhs, &req,
                          phandles),
               "irecv", (o_.rank + o_.nranks - 1) % o_.nranks, ch);
    if (req == reinterpret_cast<void *>(0x1)) die("irecv left the 0x1 pre-load in *request");
    if (req == nullptr) ++null_retries_;
    return req;
}

void *Bench::post_send(void *data, size_t size, void *mh)
{
    for (;;)
        if (void *req = try_send(data, size, mh)) return req;
}

void *Bench::post_recv(int n, void **data, size_t *sizes, int *tags, void **mhs)
{
    for (;;)
        if (void *req = try_recv(n, data, sizes, tags, mhs)) return req;
}

bool Bench::poll(void *req, int *sizes, int peer, int ch)
{
    int done = 0;
    check_nccl(net_.test(req, &done, sizes), "test", peer, ch);
    return done != 0;
}

void Bench::wait(void *req, int *sizes)
{
    while (!poll(req, sizes))
        if (o_.yield) std::this_thread::yield();
}

void Bench::reg(Buffer &b, size_t n)
{
    b.mem.assign(std::max<size_t>(n, 1), 0);
    b.mh_send.assign(send_comms_.size(), nullptr);
    b.mh_recv.assign(recv_comms_.size(), nullptr);
    for (size_t c = 0; c < send_comms_.size(); ++c) {
        check_nccl(net_.reg_mr(send_comms_[c], b.mem.data(), b.mem.size(), &b.mh_send[c]), "regMr");
        check_nccl(net_.reg_mr(recv_comms_[c], b.mem.data(), b.mem.size(), &b.mh_recv[c]), "regMr");
    }
}

void Bench::dereg(Buffer &b)
{
    for (size_t c = 0; c < send_comms_.size(); ++c) {
        check_nccl(net_.dereg_mr(send_comms_[c], b.mh_send[c]), "deregMr");
        check_nccl(net_.dereg_mr(recv_comms_[c], b.mh_recv[c]), "deregMr");
    }
}

int Bench::run()
{
    if (std::string e = net_.load(o_.plugin, o_.api_version); !e.empty()) die(e);
    if (!o_.profile.empty()) {
        if (std::string e = prof_.load(o_.profile == "net" ? net_.handle() : nullptr, o_.profile); !e.empty()) die(e);
        net_.set_profiler_callback(ProfDriver::net_callback);
    }
    if (std::string e = rdv_.open(o_.rendezvous, o_.rank, o_.nranks, 60); !e.empty()) die(e);
    uint64_t comm_id = 0x76696769ull; // same on every rank, like NCCL's commHash
    if (!o_.profile.empty()) {
        uint64_t hash = 0xcbf29ce484222325ull; // FNV-1a of the rendezvous: one "communicator" per job
        for (char ch : o_.rendezvous) hash = (hash ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
        if (std::string e = prof_.init(hash, o_.nranks, o_.rank); !e.empty()) die(e);
        profiling_ = true;
    }
    check_nccl(net_.init(comm_id), "init");
    if (!o_.tuner.empty()) { // NCCL initialises the tuner after the net plugin (init.cc:1352)
        if (std::string e = tuner_.load(o_.tuner, net_.handle()); !e.empty()) die(e);
        const int nodes = o_.tuner_nodes > 0 ? o_.tuner_nodes : o_.nranks;
        uint64_t tuner_comm = 0xcbf29ce484222325ull; // per job, like NCCL's commHash: FNV-1a of the rendezvous
        for (char ch : o_.rendezvous) tuner_comm = (tuner_comm ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
        if (std::string e = tuner_.init(tuner_comm, o_.nranks, nodes); !e.empty()) die(e);
        tuning_ = true;
        if (o_.rank == 0)
            std::printf("# tuner %s ncclTunerPlugin_v%d, %d ranks on %d nodes\n", tuner_.name(), tuner_.version(),
                        o_.nranks, nodes);
    }
    int ndev = 0;
    check_nccl(net_.devices(&ndev), "devices");
    if (o_.dev >= ndev) die("--dev " + std::to_string(o_.dev) + " but the plugin has " + std::to_string(ndev) + " devices");
    vigil::bench::DevProps props;
    check_nccl(net_.properties(o_.dev, &props), "getProperties");
    max_recvs_ = props.max_recvs;
    if (o_.rank == 0)
        std::printf("# plugin %s (%s) ncclNet v%d, %d devices, using dev %d %s %d Mb/s maxRecvs %d\n",
                    net_.name(), net_.path().c_str(), net_.version(), ndev, o_.dev,
                    props.name.c_str(), props.speed_mbps, props.max_recvs);

    // listen (one listenComm per channel), exchange handles, then NCCL's proxy pattern:
    // connect and accept both polled until each returns a comm (neither may block).
    const int nch = o_.workload == "allreduce" ? o_.channels : 1;
    std::vector<uint8_t> my_handles(static_cast<size_t>(nch) * NCCL_NET_HANDLE_MAXSIZE, 0);
    std::vector<void *> listen_comms(static_cast<size_t>(nch), nullptr);
    std::vector<int> ch_dev(static_cast<size_t>(nch));
    for (int c = 0; c < nch; ++c) {
        ch_dev[static_cast<size_t>(c)] = (o_.dev + c) % ndev;
        check_nccl(net_.listen(ch_dev[static_cast<size_t>(c)], my_handles.data() + static_cast<size_t>(c) * NCCL_NET_HANDLE_MAXSIZE,
                               &listen_comms[static_cast<size_t>(c)]), "listen");
        if (listen_comms[static_cast<size_t>(c)] == nullptr) die("listen returned a NULL listenComm");
    }
    std::vector<uint8_t> handles;
    if (std::string e = rdv_.allgather(my_handles.data(), my_handles.size(), &handles); !e.empty()) die(e);
    const int next = (o_.rank + 1) % o_.nranks;
    send_comms_.assign(static_cast<size_t>(nch), nullptr);
    recv_comms_.assign(static_cast<size_t>(nch), nullptr);
    const double t_connect = now_s();
    uint64_t polls = 0;
    for (int c = 0; c < nch; ++c) {
        uint8_t peer_handle[NCCL_NET_HANDLE_MAXSIZE];
        std::memcpy(peer_handle, handles.data() + (static_cast<size_t>(next) * nch + c) * NCCL_NET_HANDLE_MAXSIZE,
                    sizeof(peer_handle));
        void *&sc = send_comms_[static_cast<size_t>(c)];
        void *&rc = recv_comms_[static_cast<size_t>(c)];
        while (sc == nullptr || rc == nullptr) {
            if (sc == nullptr) check_nccl(net_.connect(ch_dev[static_cast<size_t>(c)], peer_handle, &sc), "connect");
            if (rc == nullptr) check_nccl(net_.accept(listen_comms[static_cast<size_t>(c)], &rc), "accept");
            ++polls;
            if (now_s() - t_connect > 60) die("connect/accept did not complete within 60 s");
        }
        check_nccl(net_.close_listen(listen_comms[static_cast<size_t>(c)]), "closeListen");
    }
    if (std::string e = rdv_.barrier(); !e.empty()) die(e);

    const double t0 = now_s();
    if (o_.workload == "latency") latency();
    else if (o_.workload == "bandwidth") bandwidth();
    else if (o_.workload == "allreduce") allreduce();
    else if (o_.workload == "multirecv") multirecv();
    else die("unknown workload " + o_.workload);
    const double elapsed = now_s() - t0;

    if (std::string e = rdv_.barrier(); !e.empty()) die(e);
    for (void *c : send_comms_) check_nccl(net_.close_send(c), "closeSend");
    for (void *c : recv_comms_) check_nccl(net_.close_recv(c), "closeRecv");
    if (tuning_) tuner_.finalize(); // NCCL finalizes the tuner in commFree, before the net plugin
    check_nccl(net_.finalize(), "finalize");
    if (profiling_) prof_.finalize(); // NCCL finalizes the profiler at comm destroy
    bool tuner_agree = true;
    if (tuning_) { // every rank must have made the same decisions (NCCL would hang otherwise)
        std::vector<uint8_t> digests;
        if (std::string e = rdv_.allgather(&tuner_digest_, sizeof(tuner_digest_), &digests); !e.empty()) die(e);
        for (int r = 0; r < o_.nranks; ++r)
            tuner_agree = tuner_agree && std::memcmp(digests.data() + static_cast<size_t>(r) * 8, &tuner_digest_, 8) == 0;
        if (!tuner_agree) {
            std::fprintf(stderr, "vigil-netbench rank %d: tuner decisions differ between ranks\n", o_.rank);
            ++errors_;
        }
    }

    rusage ru{};
    getrusage(RUSAGE_SELF, &ru); // this process's CPU time, all threads (plugin's included)
    const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                       static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    struct Result {
        uint64_t bytes, errors, retries, msgs, verified;
        double cpu_s, stall_s;
    } mine{bytes_sent_, errors_, null_retries_, msgs_, bytes_verified_, cpu, stall_max_s_};
    std::vector<uint8_t> all;
    if (std::string e = rdv_.allgather(&mine, sizeof(mine), &all); !e.empty()) die(e);
    Result total{0, 0, 0, 0, 0, 0, 0};
    for (int r = 0; r < o_.nranks; ++r) {
        Result x;
        std::memcpy(&x, all.data() + static_cast<size_t>(r) * sizeof(x), sizeof(x));
        total.bytes += x.bytes;
        total.errors += x.errors;
        total.retries += x.retries;
        total.cpu_s += x.cpu_s;
        total.msgs += x.msgs;
        total.verified += x.verified;
        total.stall_s = std::max(total.stall_s, x.stall_s);
    }
    char progress[192] = "";
    if (o_.progress)
        std::snprintf(progress, sizeof(progress),
                      ",\"iters\":%d,\"msgs\":%" PRIu64 ",\"bytes_verified\":%" PRIu64
                      ",\"stall_max_s\":%.6f",
                      iters_done_, total.msgs, total.verified, total.stall_s);
    if (o_.rank == 0) {
        std::printf("{\"ok\":%s,\"workload\":\"%s\",\"plugin\":\"%s\",\"api_version\":%d,"
                    "\"ranks\":%d,\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"gbps\":%.4f,"
                    "\"busbw_gbps\":%.4f,\"lat_p50_us\":%.2f,\"lat_p99_us\":%.2f,"
                    "\"errors\":%" PRIu64 ",\"null_retries\":%" PRIu64 ",\"connect_polls\":%" PRIu64 ",\"elapsed_s\":%.3f,"
                    "\"cpu_s\":%.3f%s%s}\n",
                    total.errors == 0 ? "true" : "false", o_.workload.c_str(), net_.name(),
                    net_.version(), o_.nranks, total.bytes, seconds_, gbps_, busbw_, lat_p50_us_,
                    lat_p99_us_, total.errors, total.retries, polls, elapsed, total.cpu_s, progress,
                    tuning_ ? (",\"tuner_api\":" + std::to_string(tuner_.version()) + ",\"tuner_agree\":" +
                               (tuner_agree ? "true" : "false"))
                                  .c_str()
                            : "");
    }
    std::fflush(stdout);
    return total.errors == 0 ? 0 : 1;
}

// Ping-pong between ranks 0 and 1; rank 0 times each round trip and reports half of it.
// With --recv-ahead 1 each rank keeps a receive posted ahead of the message it waits for, in
// two buffers, as NCCL's proxy posts the receives of its next steps as soon as their slots
// are free: a receiver-driven plugin's clear-to-send for the next message then travels while
// the rank waits, not between a message and its answer. Rank 0 posts the receive of answer
// it+1 right after sending ping it; rank 1 reposts a buffer right after answering from it.
// With 0, the plain ping-pong: each receive is posted once the previous message is in, rank 0
// before its next ping and rank 1 after its answer.
void Bench::latency()
{
    if (o_.nranks != 2) die("latency needs --nranks 2");
    const size_t size = static_cast<size_t>(o_.bytes < 0 ? 8 : o_.bytes);
    const int iters = o_.iters < 0 ? 20000 : o_.iters;
    const int warmup = o_.warmup < 0 ? 1000 : o_.warmup;
    const int total = warmup + iters;
    Buffer sb;
    std::array<Buffer, 2> rb;
    reg(sb, size);
    for (Buffer &b : rb) reg(b, size);
    std::vector<double> rtt;
    rtt.reserve(static_cast<size_t>(iters));
    int tag = 1 - o_.rank;
    std::array<void *, 2> rreq{};
    auto post = [&](int it) { // the receive of message `it` (into buffer it % 2)
        Buffer &b = rb[static_cast<size_t>(it % 2)];
        void *d = b.mem.data();
        size_t sz = size;
        rreq[static_cast<size_t>(it % 2)] = post_recv(1, &d, &sz, &tag, &b.mh_recv[0]);
    };
    const bool ahead = o_.recv_ahead;
    post(0);
    if (ahead && o_.rank == 1 && total > 1) post(1);
    for (int it = 0; it < total; ++it) {
        if (o_.check) fill(sb.mem.data(), size, static_cast<uint64_t>(it * 2 + o_.rank));
        const Buffer &in = rb[static_cast<size_t>(it % 2)];
        int got = 0;
        if (o_.rank == 0) {
            const double t = now_s();
            void *sreq = post_send(sb.mem.data(), size, sb.mh_send[0]);
            if (ahead && it + 1 < total) post(it + 1);
            wait(rreq[static_cast<size_t>(it % 2)], &got);
            const double dt = now_s() - t;
            if (it >= warmup) rtt.push_back(dt);
            if (o_.check) errors_ += count_bad(in.mem.data(), size, static_cast<uint64_t>(it * 2 + 1));
            if (!ahead && it + 1 < total) post(it + 1);
            wait(sreq, nullptr);
        } else {
            wait(rreq[static_cast<size_t>(it % 2)], &got);
            if (o_.check) errors_ += count_bad(in.mem.data(), size, static_cast<uint64_t>(it * 2));
            void *sreq = post_send(sb.mem.data(), size, sb.mh_send[0]);
            if (const int next = it + (ahead ? 2 : 1); next < total) post(next);
            wait(sreq, nullptr);
        }
        if (static_cast<size_t>(got) != size) ++errors_;
        bytes_sent_ += size;
    }
    if (o_.rank == 0) {
        std::sort(rtt.begin(), rtt.end());
        double sum = 0;
        for (double d : rtt) sum += d;
        lat_p50_us_ = rtt[rtt.size() / 2] * 1e6 / 2;
        lat_p99_us_ = rtt[rtt.size() * 99 / 100] * 1e6 / 2;
        seconds_ = sum;
        std::printf("# latency: %zu-byte ping-pong, %d iterations (half round trip)\n", size, iters);
        std::printf("%12s %10s %10s %10s %10s\n", "bytes", "avg_us", "p50_us", "p99_us", "max_us");
        std::printf("%12zu %10.2f %10.2f %10.2f %10.2f\n", size, sum / static_cast<double>(rtt.size()) * 1e6 / 2,
                    lat_p50_us_, lat_p99_us_, rtt.back() * 1e6 / 2);
    }
    dereg(sb);
    for (Buffer &b : rb) dereg(b);
}

// Unidirectional stream rank 0 -> rank 1 with `window` requests in flight, for each size.
void Bench::bandwidth()
{
    if (o_.nranks != 2) die("bandwidth needs --nranks 2");
    std::vector<size_t> sizes;
    if (o_.bytes >= 0) sizes.push_back(static_cast<size_t>(o_.bytes));
    else {
        if (o_.min_bytes == 0) sizes.push_back(0);
        for (int64_t s = std::max<int64_t>(o_.min_bytes, 1); s <= o_.max_bytes; s *= o_.factor)
            sizes.push_back(static_cast<size_t>(s));
    }
    const bool sender = o_.rank == 0;
    if (sender) {
        std::printf("# bandwidth: rank 0 -> rank 1, window %d%s\n", o_.window, o_.check ? ", checked" : "");
        std::printf("%12s %8s %12s %10s %10s\n", "bytes", "iters", "time_us", "GB/s", "us/msg");
    }
    double best = 0;
    for (size_t size : sizes) {
        // Up to 1 GiB of buffers per side; each buffer carries one message in flight.
        const int nbuf = static_cast<int>(std::clamp<size_t>(size ? (1ull << 30) / size : o_.window, 1, o_.window));
        int iters = o_.iters;
        if (iters < 0) iters = static_cast<int>(std::clamp<uint64_t>(size ? (2ull << 30) / size : 2000, 8, 20000));
        const int warmup = o_.warmup < 0 ? std::min(iters / 10 + 1, 50) : o_.warmup;
        std::vector<Buffer> bufs(static_cast<size_t>(nbuf));
        for (Buffer &b : bufs) reg(b, size);
        std::vector<void *> reqs(static_cast<size_t>(nbuf), nullptr);
        std::vector<int> msg_of(static_cast<size_t>(nbuf), -1);
        const int total = warmup + iters;
        int posted = 0, completed = 0;
        double t0 = 0;
        int tag = 0; // the sender's rank
        if (std::string e = rdv_.barrier(); !e.empty()) die(e);
        while (completed < total) {
            const int before = posted + completed;
            for (int b = 0; b < nbuf; ++b) {
                const size_t bi = static_cast<size_t>(b);
                // The timed part starts with an empty pipe: post past the warm-up only once
                // every warm-up message completed.
                const bool drain = posted == warmup && completed < warmup;
                if (reqs[bi] == nullptr && posted < total && posted - completed < nbuf && !drain) {
                    Buffer &buf = bufs[bi];
                    if (sender) {
                        if (o_.check && msg_of[bi] != posted)
                            fill(buf.mem.data(), size, static_cast<uint64_t>(posted));
                        msg_of[bi] = posted;
                        reqs[bi] = try_send(buf.mem.data(), size, buf.mh_send[0]);
                    } else {
                        void *d = buf.mem.data();
                        size_t sz = size;
                        msg_of[bi] = posted;
                        reqs[bi] = try_recv(1, &d, &sz, &tag, &buf.mh_recv[0]);
                    }
                    if (reqs[bi] != nullptr) ++posted;
                }
                if (reqs[bi] != nullptr) {
                    int got = 0;
                    if (poll(reqs[bi], &got)) {
                        reqs[bi] = nullptr;
                        if (static_cast<size_t>(got) != size) ++errors_;
                        if (!sender && o_.check)
                            errors_ += count_bad(bufs[bi].mem.data(), size, static_cast<uint64_t>(msg_of[bi]));
                        if (sender && msg_of[bi] >= warmup) bytes_sent_ += size;
                        if (++completed == warmup) t0 = now_s();
                    }
                }
            }
            if (o_.yield && posted + completed == before) std::this_thread::yield();
        }
        const double dt = now_s() - t0;
        if (std::string e = rdv_.barrier(); !e.empty()) die(e);
        for (Buffer &b : bufs) dereg(b);
        if (sender) {
            const double gbps = static_cast<double>(size) * iters / dt / 1e9;
            best = std::max(best, gbps);
            seconds_ += dt;
            std::printf("%12zu %8d %12.1f %10.3f %10.2f\n", size, iters, dt * 1e6, gbps, dt * 1e6 / iters);
            std::fflush(stdout);
        }
    }
    gbps_ = best;
}

// Ring all-reduce (reduce-scatter then all-gather) of float32 sums, validated exactly.
void Bench::allreduce()
{
    const size_t bytes = static_cast<size_t>(o_.bytes < 0 ? (64 << 20) : o_.bytes);
    const size_t count = bytes / sizeof(float);
    const int iters = o_.iters < 0 ? (o_.loop ? INT_MAX : 5) : o_.iters;
    const int n = o_.nranks, r = o_.rank;
    const int prev = (r + n - 1) % n, next = (r + 1) % n;
    auto chunk_begin = [&](int c) { return count * static_cast<size_t>(c) / static_cast<size_t>(n); };
    if (o_.loop && count < static_cast<size_t>(n))
        die("--loop needs --bytes of at least 4 bytes per rank");
    size_t max_chunk = 0;
    for (int c = 0; c < n; ++c) max_chunk = std::max(max_chunk, chunk_begin(c + 1) - chunk_begin(c));
    Buffer data, tmp;
    reg(data, count * sizeof(float));
    reg(tmp, max_chunk * sizeof(float));
    auto *x = reinterpret_cast<float *>(data.mem.data());
    auto *t = reinterpret_cast<float *>(tmp.mem.data());
    // Integer-valued inputs keep every partial sum exact in float32 (|sum| < 2^24).
    auto value = [](int rank, size_t i, int it) {
        return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 13 + static_cast<size_t>(it) * 5) % 1024) - 512);
    };
    const size_t slice = static_cast<size_t>(o_.slice) / sizeof(float) * sizeof(float);
    if (r == 0) {
        std::printf("# allreduce: ring of %d ranks, %zu bytes per rank, slice %zu, window %d, %zu channels\n", n,
                    count * sizeof(float), slice, o_.window, send_comms_.size());
        std::printf("%6s %12s %12s %10s %10s %10s %12s\n", "iter", "bytes", "time_us", "algbw", "busbw", "errors",
                    "end_mono_s");
    }
    // One ring step: send [sptr, +slen) to next, receive into [rptr, +rlen) from prev, both
    // cut into slices with up to `window` requests in flight per direction.
    // Profiler: per iteration one ProxyOp per channel and direction; step numbers run on
    // across the ring steps of the iteration, like NCCL's per-op step counter.
    std::vector<void *> op_send(send_comms_.size(), nullptr), op_recv(recv_comms_.size(), nullptr);
    std::vector<int> nstep_send(send_comms_.size(), 0), nstep_recv(recv_comms_.size(), 0);
    auto step = [&](float *sptr, size_t scount, float *rptr, size_t rcount, bool reduce) {
        const size_t sbytes = scount * sizeof(float), rbytes = rcount * sizeof(float);
        const size_t ns = sbytes ? (sbytes + slice - 1) / slice : 0, nr = rbytes ? (rbytes + slice - 1) / slice : 0;
        std::vector<void *> sreq(ns, nullptr), rreq(nr, nullptr);
        std::vector<void *> sstep(ns, nullptr), rstep(nr, nullptr); // profiler ProxyStep handles
        size_t s_posted = 0, r_posted = 0, s_done = 0, r_done = 0;
        uint8_t *dst = reinterpret_cast<uint8_t *>(reduce ? t : rptr);
        int tag = prev;
        waiting_since_ = now_s();
        while (s_done < ns || r_done < nr) {
            size_t moved = 0; // requests posted or completed in this pass
            while (r_posted < nr && r_posted - r_done < static_cast<size_t>(o_.window)) {
                void *d = dst + r_posted * slice;
                size_t sz = std::min(slice, rbytes - r_posted * slice);
                const int ch = static_cast<int>(r_posted % recv_comms_.size());
                const auto c = static_cast<size_t>(ch);
                // NCCL starts the step before each irecv attempt, so a NULL request leaves a
                // started step behind that is never stopped
                // (docs/nccl-abi.md, "Profiler calls and handles").
                if (profiling_) rstep[r_posted] = prof_.step_start(op_recv[c], nstep_recv[c]);
                rreq[r_posted] = try_recv(1, &d, &sz, &tag, reduce ? &tmp.mh_recv[c] : &data.mh_recv[c], ch,
                                          &rstep[r_posted]);
                if (rreq[r_posted] == nullptr) break;
                if (profiling_) prof_.state(rstep[r_posted], ncclProfilerProxyStepRecvWait, 0);
                ++moved;
                ++nstep_recv[c];
                ++r_posted;
            }
            while (s_posted < ns && s_posted - s_done < static_cast<size_t>(o_.window)) {
                const size_t sz = std::min(slice, sbytes - s_posted * slice);
                const int ch = static_cast<int>(s_posted % send_comms_.size());
                const auto c = static_cast<size_t>(ch);
                if (profiling_ && sstep[s_posted] == nullptr) { // kept across NULL-request retries
                    sstep[s_posted] = prof_.step_start(op_send[c], nstep_send[c]);
                    prof_.state(sstep[s_posted], ncclProfilerProxyStepSendGPUWait, 0);
                }
                if (profiling_) prof_.state(sstep[s_posted], ncclProfilerProxyStepSendPeerWait_v4, 0);
                sreq[s_posted] = try_send(reinterpret_cast<uint8_t *>(sptr) + s_posted * slice, sz,
                                          data.mh_send[c], ch, sstep[s_posted]);
                if (sreq[s_posted] == nullptr) break;
                if (profiling_) prof_.state(sstep[s_posted], ncclProfilerProxyStepSendWait, sz);
                ++moved;
                ++nstep_send[c];
                ++s_posted;
                bytes_sent_ += sz;
            }
            for (size_t i = r_done; i < r_posted; ++i) {
                if (rreq[i] == nullptr) continue;
                int got = 0;
                const int ch = static_cast<int>(i % recv_comms_.size());
                if (!poll(rreq[i], &got, prev, ch)) continue;
                rreq[i] = nullptr;
                ++moved;
                if (o_.progress) progressed(now_s());
                const size_t expect = std::min(slice, rbytes - i * slice);
                if (static_cast<size_t>(got) != expect) ++errors_;
                if (profiling_) {
                    prof_.state(rstep[i], ncclProfilerProxyStepRecvFlushWait, static_cast<size_t>(got));
                    prof_.state(rstep[i], ncclProfilerProxyStepRecvGPUWait, 0);
                }
                if (reduce) {
                    const size_t f0 = i * slice / sizeof(float), nf = expect / sizeof(float);
                    for (size_t k = 0; k < nf; ++k) rptr[f0 + k] += t[f0 + k];
                }
                if (profiling_) prof_.stop(rstep[i]);
            }
            while (r_done < r_posted && rreq[r_done] == nullptr) ++r_done;
            for (size_t i = s_done; i < s_posted; ++i) {
                const int ch = static_cast<int>(i % send_comms_.size());
                if (sreq[i] != nullptr && poll(sreq[i], nullptr, next, ch)) {
                    sreq[i] = nullptr;
                    ++moved;
                    if (o_.progress) progressed(now_s());
                    if (profiling_) prof_.stop(sstep[i]);
                }
            }
            while (s_done < s_posted && sreq[s_done] == nullptr) ++s_done;
            if (o_.yield && moved == 0) std::this_thread::yield();
        }
        waiting_since_ = 0;
    };
    double total_time = 0;
    // --loop: the last element carries each rank's stop vote instead of data; its sum tells
    // every rank the same thing after the same iteration.
    const size_t vote_at = o_.loop ? count - 1 : count;
    for (int it = 0; it < iters; ++it) {
        for (size_t i = 0; i < count; ++i) x[i] = value(r, i, it);
        const float my_vote = g_stop_requested ? 1.0f : 0.0f;
        if (o_.loop) x[vote_at] = my_vote;
        if (r == o_.delay_rank && o_.delay_us > 0) usleep(static_cast<useconds_t>(o_.delay_us));
        if (tuning_) { // NCCL asks the tuner at enqueue, before the collective runs
            const auto d = tuner_.collective(4 /* ncclFuncAllReduce */, count * sizeof(float),
                                             static_cast<int>(send_comms_.size()));
            for (uint64_t v : {static_cast<uint64_t>(it), static_cast<uint64_t>(d.algo + 1),
                               static_cast<uint64_t>(d.proto + 1), static_cast<uint64_t>(d.channels), d.chunk})
                tuner_digest_ = (tuner_digest_ ^ v) * 0x100000001b3ull;
            std::printf("# tuner rank %d iter %d: allreduce %zu B -> algo %d proto %d channels %d chunk %llu\n", r, it,
                        count * sizeof(float), d.algo, d.proto, d.channels, static_cast<unsigned long long>(d.chunk));
        }
        // The rank "arrives" (calls the collective) before it can know whether the others
        // have: the Coll event starts here, before the barrier, as NCCL's starts at enqueue.
        void *coll = profiling_ ? prof_.coll(static_cast<uint64_t>(it), "AllReduce", count, "ncclFloat32",
                                             static_cast<int>(send_comms_.size()))
                                : nullptr;
        if (!o_.loop)
            if (std::string e = rdv_.barrier(); !e.empty()) die(e);
        const double t0 = now_s();
        if (profiling_) {
            const int per_ch = static_cast<int>(2 * (n - 1) * ((max_chunk * sizeof(float) + slice - 1) / slice) /
                                                send_comms_.size()) + 1;
            for (size_t c = 0; c < send_comms_.size(); ++c) {
                op_send[c] = prof_.op_start(coll, static_cast<int>(c), (r + 1) % n, per_ch, static_cast<int>(slice), true);
                op_recv[c] = prof_.op_start(coll, static_cast<int>(c), prev, per_ch, static_cast<int>(slice), false);
                nstep_send[c] = nstep_recv[c] = 0;
            }
        }
        for (int s = 0; s < n - 1; ++s) { // reduce-scatter
            const int sc = (r - s + n) % n, rc = (r - s - 1 + 2 * n) % n;
            step(x + chunk_begin(sc), chunk_begin(sc + 1) - chunk_begin(sc),
                 x + chunk_begin(rc), chunk_begin(rc + 1) - chunk_begin(rc), true);
        }
        for (int s = 0; s < n - 1; ++s) { // all-gather
            const int sc = (r + 1 - s + n) % n, rc = (r - s + n) % n;
            step(x + chunk_begin(sc), chunk_begin(sc + 1) - chunk_begin(sc),
                 x + chunk_begin(rc), chunk_begin(rc + 1) - chunk_begin(rc), false);
        }
        const double dt = now_s() - t0;
        total_time += dt;
        for (size_t c = 0; profiling_ && c < send_comms_.size(); ++c) {
            prof_.stop(op_send[c]);
            prof_.stop(op_recv[c]);
        }
        uint64_t bad = 0;
        for (size_t i = 0; i < vote_at; ++i) {
            float expect = 0;
            for (int k = 0; k < n; ++k) expect += value(k, i, it);
            bad += x[i] != expect;
        }
        bool stop = false;
        if (o_.loop) { // a sum of 0/1 votes that includes ours
            const float v = x[vote_at];
            const bool integral = v == static_cast<float>(static_cast<int>(v));
            bad += !(v >= my_vote && v <= static_cast<float>(n) && integral);
            stop = v >= 1.0f;
        }
        errors_ += bad;
        iters_done_ = it + 1;
        bytes_verified_ += count * sizeof(float);
        if (o_.progress) {
            std::printf("{\"type\":\"progress\",\"rank\":%d,\"iter\":%d,\"mono_s\":%.6f,"
                        "\"msgs\":%" PRIu64 ",\"bytes_verified\":%" PRIu64 ",\"wrong\":%" PRIu64
                        ",\"stall_s\":%.6f,\"stall_from_s\":%.6f,\"stall_max_s\":%.6f,"
                        "\"stall_max_from_s\":%.6f,\"null_retries\":%" PRIu64 "}\n",
                        r, it, now_s(), msgs_, bytes_verified_, errors_, stall_iter_s_,
                        stall_iter_from_s_, stall_max_s_, stall_from_s_, null_retries_);
            std::fflush(stdout);
        }
        stall_iter_s_ = stall_iter_from_s_ = 0;
        if (r == 0) {
            const double algbw = static_cast<double>(count * sizeof(float)) / dt / 1e9;
            timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts); // same clock as the plugin's log timestamps
            std::printf("%6d %12zu %12.1f %10.3f %10.3f %10" PRIu64 " %12.6f\n", it, count * sizeof(float), dt * 1e6,
                        algbw, algbw * 2.0 * (n - 1) / n, bad,
                        static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9);
            std::fflush(stdout);
        }
        if (stop) break;
    }
    seconds_ = total_time;
    gbps_ = static_cast<double>(count * sizeof(float)) * iters_done_ / total_time / 1e9;
    busbw_ = gbps_ * 2.0 * (n - 1) / n;
    dereg(data);
    dereg(tmp);
}

// Rank 1 posts irecv(n = maxRecvs) with tags, rank 0 sends n messages; every message must
// land in the buffer its tag selects (distinct tags, reversed order) or, with equal tags,
// in sequence order. Sizes differ per message so test()'s sizes are checked too.
void Bench::multirecv()
{
    if (o_.nranks != 2) die("multirecv needs --nranks 2");
    const int k = std::min(max_recvs_, 8);
    const int iters = o_.iters < 0 ? 200 : o_.iters;
    const size_t cap = static_cast<size_t>(o_.bytes < 0 ? 64 * 1024 : o_.bytes) + 64 * 8;
    std::vector<Buffer> bufs(static_cast<size_t>(k));
    for (Buffer &b : bufs) reg(b, cap);
    if (o_.rank == 0) std::printf("# multirecv: %d receives per irecv, %d iterations\n", k, iters);
    for (int it = 0; it < iters; ++it) {
        const bool same_tags = it % 2 == 1;
        auto msg_size = [&](int j) { return cap - 64 * 8 + static_cast<size_t>((j * 37 + it) % 64) * 8; };
        if (o_.rank == 0) {
            std::vector<void *> reqs;
            for (int j = 0; j < k; ++j) {
                Buffer &b = bufs[static_cast<size_t>(j)];
                fill(b.mem.data(), msg_size(j), static_cast<uint64_t>(it * 16 + j));
                void *req = nullptr;
                const int tag = same_tags ? 7 : j;
                for (;;) {
                    check_nccl(net_.isend(send_comms_[0], b.mem.data(), msg_size(j), tag, b.mh_send[0], &req), "isend");
                    if (req) break;
                    ++null_retries_;
                }
                reqs.push_back(req);
                bytes_sent_ += msg_size(j);
            }
            for (void *req : reqs) wait(req, nullptr);
        } else {
            std::vector<void *> data(static_cast<size_t>(k));
            std::vector<size_t> sizes(static_cast<size_t>(k), cap);
            std::vector<int> tags(static_cast<size_t>(k));
            std::vector<void *> mhs(static_cast<size_t>(k));
            for (int i = 0; i < k; ++i) {
                data[static_cast<size_t>(i)] = bufs[static_cast<size_t>(i)].mem.data();
                mhs[static_cast<size_t>(i)] = bufs[static_cast<size_t>(i)].mh_recv[0];
                tags[static_cast<size_t>(i)] = same_tags ? 7 : k - 1 - i; // buffer i wants message k-1-i
            }
            void *req = post_recv(k, data.data(), sizes.data(), tags.data(), mhs.data());
            int got[NCCL_PROXY_MAX_SUBS] = {};
            wait(req, got);
            for (int i = 0; i < k; ++i) {
                const int j = same_tags ? i : k - 1 - i;
                if (static_cast<size_t>(got[i]) != msg_size(j)) ++errors_;
                errors_ += count_bad(bufs[static_cast<size_t>(i)].mem.data(), msg_size(j), static_cast<uint64_t>(it * 16 + j));
            }
        }
        if (std::string e = rdv_.barrier(); !e.empty()) die(e);
    }
    for (Buffer &b : bufs) dereg(b);
}

int g_timeout_rank = -1;
void on_stop_request(int)
{
    g_stop_requested = 1;
}
void on_alarm(int)
{
    static const char msg[] = "{\"ok\":false,\"error\":\"timeout\"}\n";
    [[maybe_unused]] ssize_t w = write(1, msg, sizeof(msg) - 1);
    _exit(3);
}

} // namespace

int main(int argc, char **argv)
{
    Options o = parse(argc, argv);
    std::signal(SIGALRM, on_alarm);
    alarm(static_cast<unsigned>(o.timeout_s));
    if (o.loop) std::signal(SIGUSR1, on_stop_request);
    g_timeout_rank = o.rank;
    Bench b(std::move(o));
    return b.run();
}
