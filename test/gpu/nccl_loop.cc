// SPDX-License-Identifier: Apache-2.0
// vigil-nccl-loop: stock NCCL all-reduce loop for a GPU machine (the one check that needs
// one: NCCL itself loading Vigil's plugins). N processes, each its own rank, meet through a
// file holding NCCL's unique id; every iteration is validated; prints one JSON line per size
// on rank 0. Exit 77 (skip) when there is no CUDA device.
//
//   vigil-nccl-loop --rank R --nranks N --id-file PATH [--bytes 1M,16M] [--iters 50]
//                   [--warmup 5] [--device D]
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void die(const std::string &what)
{
    std::fprintf(stderr, "vigil-nccl-loop: %s\n", what.c_str());
    std::exit(1);
}

void cuda_ok(cudaError_t e, const char *what)
{
    if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

void nccl_ok(ncclResult_t r, const char *what)
{
    if (r != ncclSuccess) die(std::string(what) + ": " + ncclGetErrorString(r));
}

size_t parse_size(const std::string &s)
{
    char *end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    switch (end && *end ? *end : ' ') {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return static_cast<size_t>(v);
}

double now_s()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

} // namespace

int main(int argc, char **argv)
{
    int rank = -1, nranks = 2, iters = 50, warmup = 5, device = 0;
    std::string id_file, sizes = "1M,16M,128M";
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) die("missing value after " + a);
            return argv[++i];
        };
        if (a == "--rank") rank = std::atoi(next().c_str());
        else if (a == "--nranks") nranks = std::atoi(next().c_str());
        else if (a == "--id-file") id_file = next();
        else if (a == "--bytes") sizes = next();
        else if (a == "--iters") iters = std::atoi(next().c_str());
        else if (a == "--warmup") warmup = std::atoi(next().c_str());
        else if (a == "--device") device = std::atoi(next().c_str());
        else die("unknown option " + a);
    }
    if (rank < 0 || rank >= nranks || id_file.empty() || iters < 1) die("usage: --rank R --nranks N --id-file PATH");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        std::fprintf(stderr, "vigil-nccl-loop: no CUDA device, skipping\n");
        return 77;
    }
    cuda_ok(cudaSetDevice(device % ndev), "cudaSetDevice");

    ncclUniqueId id;
    if (rank == 0) {
        nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
        const std::string tmp = id_file + ".tmp";
        std::ofstream(tmp, std::ios::binary).write(reinterpret_cast<const char *>(&id), sizeof(id));
        if (std::rename(tmp.c_str(), id_file.c_str()) != 0) die("cannot write " + id_file);
    } else {
        const double t0 = now_s();
        for (;;) {
            std::ifstream f(id_file, std::ios::binary);
            if (f && f.read(reinterpret_cast<char *>(&id), sizeof(id)) && f.gcount() == sizeof(id)) break;
            if (now_s() - t0 > 120) die("no unique id in " + id_file + " after 120 s");
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }
    ncclComm_t comm;
    nccl_ok(ncclCommInitRank(&comm, nranks, id, rank), "ncclCommInitRank");
    cudaStream_t stream;
    cuda_ok(cudaStreamCreate(&stream), "cudaStreamCreate");

    size_t pos = 0;
    int bad_total = 0;
    while (pos <= sizes.size()) {
        const size_t comma = sizes.find(',', pos);
        const std::string one = sizes.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        pos = comma == std::string::npos ? sizes.size() + 1 : comma + 1;
        const size_t bytes = parse_size(one) / sizeof(float) * sizeof(float);
        if (bytes == 0) continue;
        const size_t count = bytes / sizeof(float);
        float *buf = nullptr;
        cuda_ok(cudaMalloc(&buf, bytes), "cudaMalloc");
        std::vector<float> host(count, static_cast<float>(rank + 1));
        double total = 0;
        int bad = 0;
        for (int it = -warmup; it < iters; ++it) {
            cuda_ok(cudaMemcpyAsync(buf, host.data(), bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpy");
            cuda_ok(cudaStreamSynchronize(stream), "sync");
            const double t0 = now_s();
            nccl_ok(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, stream), "ncclAllReduce");
            cuda_ok(cudaStreamSynchronize(stream), "sync");
            if (it >= 0) total += now_s() - t0;
            float first = 0, last = 0;
            cuda_ok(cudaMemcpy(&first, buf, sizeof(float), cudaMemcpyDeviceToHost), "check");
            cuda_ok(cudaMemcpy(&last, buf + count - 1, sizeof(float), cudaMemcpyDeviceToHost), "check");
            const float expect = static_cast<float>(nranks * (nranks + 1) / 2);
            bad += (first != expect) + (last != expect);
        }
        cuda_ok(cudaFree(buf), "cudaFree");
        bad_total += bad;
        const double t = total / iters, algbw = static_cast<double>(bytes) / t / 1e9;
        if (rank == 0)
            std::printf("{\"bytes\":%zu,\"iters\":%d,\"time_us\":%.1f,\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,\"wrong\":%d}\n",
                        bytes, iters, t * 1e6, algbw, algbw * 2.0 * (nranks - 1) / nranks, bad);
        std::fflush(stdout);
    }
    nccl_ok(ncclCommDestroy(comm), "ncclCommDestroy");
    return bad_total ? 1 : 0;
}
