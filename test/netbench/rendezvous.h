// SPDX-License-Identifier: Apache-2.0
// Where vigil-netbench processes meet: rank 0 listens on a Unix socket path ("unix:/path",
// which works across network namespaces of one host) or "HOST:PORT"; the others connect.
// Blocking, for set-up and result collection only (never on the measured path).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace vigil::bench {

class Rendezvous
{
public:
    ~Rendezvous();
    /// Forms the group. Returns "" or the reason it could not within timeout_s.
    std::string open(const std::string &addr, int rank, int nranks, double timeout_s);
    /// Every rank contributes `len` bytes; `all` gets nranks * len bytes in rank order.
    std::string allgather(const void *mine, size_t len, std::vector<uint8_t> *all);
    std::string barrier();

private:
    int rank_ = 0, nranks_ = 0;
    std::vector<int> peers_; // rank 0: fd per rank (index 0 unused); others: [0] = root
    int listen_fd_ = -1;
    std::string unix_path_;
};

} // namespace vigil::bench
