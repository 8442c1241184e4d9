// SPDX-License-Identifier: Apache-2.0
// vigil-netbench's driver: the Bench that makes NCCL's call sequences on a loaded ncclNet
// plugin and runs the workloads (the workloads themselves are in workloads.cc).
#pragma once

#include <csignal>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loader.h"
#include "options.h"
#include "prof_driver.h"
#include "rendezvous.h"
#include "tuner_driver.h"

namespace vigil::bench {

/// --loop: set (to 1) by the SIGUSR1 handler when this rank votes to stop; the all-reduce
/// reads it once per iteration. Written only from the signal handler.
extern volatile sig_atomic_t g_stop_requested;

/// Now, in seconds of std::chrono::steady_clock (CLOCK_MONOTONIC, the plugin log's clock).
double now_s();

/// Host buffer with its registration on every channel's send and receive comm.
struct Buffer {
    std::vector<uint8_t> mem;
    std::vector<void *> mh_send, mh_recv; // per channel
};

/// One rank of a vigil-netbench run: loads the plugin (and the profiler and tuner asked for),
/// meets the other ranks at the rendezvous, connects the ring, runs `Options::workload` and
/// prints the results. Not thread-safe: single-threaded, like one NCCL proxy thread; one
/// instance per process (the profiler's net callback is global).
class Bench
{
public:
    explicit Bench(Options o) : o_(std::move(o)) {}
    /// Runs the whole benchmark. Returns the exit status: 0 when no rank saw an error, else 1
    /// (a failing plugin call or rendezvous exits the process with status 1 instead).
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
    void *try_recv(int n, void **data, size_t *sizes, int *tags, void **mhs, int ch = 0,
                   void **phandles = nullptr);
    void *post_send(void *data, size_t size, void *mh);
    void *post_recv(int n, void **data, size_t *sizes, int *tags, void **mhs);
    bool poll(void *req, int *sizes, int peer = -1, int ch = -1);
    void wait(void *req, int *sizes);
    void reg(Buffer &b, size_t n);
    void dereg(Buffer &b);

    // The workloads (workloads.cc); each records its results in the members below.
    void latency();
    void bandwidth();
    void allreduce();
    void multirecv();
    void fanout_run(); // --workload fanout

    /// CPU seconds this process has used, every thread (the plugin's included): getrusage.
    static double cpu_s();
    /// Times this process's threads went to sleep (voluntary context switches, every thread):
    /// each is a wake-up later. getrusage.
    static uint64_t sleeps();
    /// This process's resident memory, KiB (/proc/self/statm); 0 when unreadable.
    static uint64_t rss_kib();
    /// This process's open file descriptors (/proc/self/fd); 0 when unreadable.
    static uint64_t open_fds();

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
    double setup_s_ = 0;          // connect/accept of every channel, this rank
    uint64_t base_rss_kib_ = 0;   // before the first listen
    uint64_t base_fds_ = 0;
    uint64_t msgs_ = 0;
    uint64_t bytes_verified_ = 0;
    int iters_done_ = 0;
    double waiting_since_ = 0;
    double stall_max_s_ = 0, stall_from_s_ = 0;   // the run so far
    double stall_iter_s_ = 0, stall_iter_from_s_ = 0; // the current iteration
    void progressed(double now);
};

} // namespace vigil::bench
