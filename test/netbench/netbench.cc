// SPDX-License-Identifier: Apache-2.0
// vigil-netbench: nccl-tests for the network layer, no GPU needed. Loads any ncclNet plugin
// the way NCCL does, makes NCCL's call sequences (non-blocking connect/accept loops,
// NULL-request retries, test polling, multi-recv) across processes that meet at a rendezvous
// address, and runs validated workloads: latency ping-pong, bandwidth sweep, ring all-reduce
// of float32 on host memory, multi-recv tag matching.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>
#include <utility>
#include <vector>

#include "bench.h"
#include "options.h"

namespace vigil::bench {

volatile sig_atomic_t g_stop_requested = 0; // --loop: SIGUSR1 seen, vote to stop

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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
    // connect and accept both polled until each returns a comm (neither may block). A fanout
    // connects rank 0 to rank 1 only: rank 0 holds the send comms, rank 1 the receive comms.
    const bool fanout = o_.workload == "fanout";
    const bool want_send = !fanout || o_.rank == 0, want_recv = !fanout || o_.rank == 1;
    const int nch = o_.workload == "allreduce" || o_.workload == "bandwidth" || fanout ? o_.channels : 1;
    base_rss_kib_ = rss_kib();
    base_fds_ = open_fds();
    std::vector<uint8_t> my_handles(static_cast<size_t>(nch) * NCCL_NET_HANDLE_MAXSIZE, 0);
    std::vector<void *> listen_comms(static_cast<size_t>(nch), nullptr);
    std::vector<int> ch_dev(static_cast<size_t>(nch));
    for (int c = 0; c < nch; ++c) {
        ch_dev[static_cast<size_t>(c)] = (o_.dev + c) % ndev;
        if (!want_recv) continue;
        check_nccl(net_.listen(ch_dev[static_cast<size_t>(c)], my_handles.data() + static_cast<size_t>(c) * NCCL_NET_HANDLE_MAXSIZE,
                               &listen_comms[static_cast<size_t>(c)]), "listen");
        if (listen_comms[static_cast<size_t>(c)] == nullptr) die("listen returned a NULL listenComm");
    }
    std::vector<uint8_t> handles;
    if (std::string e = rdv_.allgather(my_handles.data(), my_handles.size(), &handles); !e.empty()) die(e);
    const int next = (o_.rank + 1) % o_.nranks;
    send_comms_.assign(want_send ? static_cast<size_t>(nch) : 0, nullptr);
    recv_comms_.assign(want_recv ? static_cast<size_t>(nch) : 0, nullptr);
    const double t_connect = now_s();
    uint64_t polls = 0;
    for (int c = 0; c < nch; ++c) {
        uint8_t peer_handle[NCCL_NET_HANDLE_MAXSIZE];
        std::memcpy(peer_handle, handles.data() + (static_cast<size_t>(next) * nch + c) * NCCL_NET_HANDLE_MAXSIZE,
                    sizeof(peer_handle));
        void *sc = nullptr, *rc = nullptr;
        while ((want_send && sc == nullptr) || (want_recv && rc == nullptr)) {
            if (want_send && sc == nullptr) check_nccl(net_.connect(ch_dev[static_cast<size_t>(c)], peer_handle, &sc), "connect");
            if (want_recv && rc == nullptr) check_nccl(net_.accept(listen_comms[static_cast<size_t>(c)], &rc), "accept");
            ++polls;
            if (now_s() - t_connect > 60 + nch / 50.0) die("connect/accept did not complete in time");
        }
        if (want_send) send_comms_[static_cast<size_t>(c)] = sc;
        if (want_recv) {
            recv_comms_[static_cast<size_t>(c)] = rc;
            check_nccl(net_.close_listen(listen_comms[static_cast<size_t>(c)]), "closeListen");
        }
    }
    setup_s_ = now_s() - t_connect;
    if (std::string e = rdv_.barrier(); !e.empty()) die(e);

    const double t0 = now_s();
    if (o_.workload == "latency") latency();
    else if (o_.workload == "bandwidth") bandwidth();
    else if (o_.workload == "allreduce") allreduce();
    else if (o_.workload == "multirecv") multirecv();
    else if (fanout) fanout_run();
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

    const double cpu = cpu_s();
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

} // namespace vigil::bench

namespace {

using vigil::bench::Bench;
using vigil::bench::g_stop_requested;
using vigil::bench::Options;
using vigil::bench::parse;

// The line a rank that ran past --timeout prints, made before the alarm can fire (a signal
// handler may only write()).
char g_timeout_line[96];
size_t g_timeout_len = 0;
void on_stop_request(int)
{
    g_stop_requested = 1;
}
void on_alarm(int)
{
    [[maybe_unused]] ssize_t w = write(1, g_timeout_line, g_timeout_len);
    _exit(3);
}

} // namespace

int main(int argc, char **argv)
{
    Options o = parse(argc, argv);
    const int n = std::snprintf(g_timeout_line, sizeof(g_timeout_line),
                                "{\"ok\":false,\"rank\":%d,\"error\":\"timeout\"}\n", o.rank);
    g_timeout_len = n > 0 ? std::min(static_cast<size_t>(n), sizeof(g_timeout_line) - 1) : 0;
    std::signal(SIGALRM, on_alarm);
    alarm(static_cast<unsigned>(o.timeout_s));
    if (o.loop) std::signal(SIGUSR1, on_stop_request);
    Bench b(std::move(o));
    return b.run();
}
