// SPDX-License-Identifier: Apache-2.0
// Port hardware counters.
#include "hw_counters.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

namespace vigil::net::ib {

bool parse_counter(std::string_view text, int64_t *value) noexcept
{
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
    if (text.empty() || text.size() > 19) return false;
    uint64_t v = 0; // 19 decimal digits always fit in 64 unsigned bits
    for (char c : text) {
        if (c < '0' || c > '9') return false;
        v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    if (v > static_cast<uint64_t>(INT64_MAX)) return false;
    *value = static_cast<int64_t>(v);
    return true;
}

PortCounters summarize_counters(const std::vector<std::pair<std::string, int64_t>> &raw)
{
    PortCounters pc;
    auto add = [&](int64_t *field, std::initializer_list<std::string_view> names,
                   int64_t scale = 1) {
        for (const auto &[name, value] : raw)
            for (std::string_view n : names)
                if (name == n) *field = (*field < 0 ? 0 : *field) + value * scale;
    };
    add(&pc.retransmits, {"completer_retry_err", "local_ack_timeout_err", "roce_adp_retrans"});
    add(&pc.seq_errors, {"rcvd_seq_err", "packet_seq_err", "implied_nak_seq_err"});
    add(&pc.out_of_sequence, {"out_of_seq_request", "out_of_sequence"});
    add(&pc.duplicate_requests, {"duplicate_request"});
    add(&pc.rnr_naks, {"rcvd_rnr_err", "rnr_nak_retry_err"});
    add(&pc.retry_exceeded, {"retry_exceeded_err", "retry_rnr_exceeded_err"});
    // hw_counters/link_downed and counters/link_downed count the same thing: take one.
    add(&pc.link_downed, {"link_downed"});
    if (pc.link_downed < 0) add(&pc.link_downed, {"counters/link_downed"});
    add(&pc.tx_packets, {"sent_pkts"});
    if (pc.tx_packets < 0) add(&pc.tx_packets, {"counters/port_xmit_packets"});
    add(&pc.rx_packets, {"rcvd_pkts"});
    if (pc.rx_packets < 0) add(&pc.rx_packets, {"counters/port_rcv_packets"});
    add(&pc.tx_bytes, {"counters/port_xmit_data"}, 4);
    add(&pc.rx_bytes, {"counters/port_rcv_data"}, 4);
    return pc;
}

HwCounterReader::~HwCounterReader()
{
    close_all();
}

HwCounterReader::HwCounterReader(HwCounterReader &&other) noexcept : files_(std::move(other.files_))
{
    other.files_.clear();
}

HwCounterReader &HwCounterReader::operator=(HwCounterReader &&other) noexcept
{
    if (this != &other) {
        close_all();
        files_ = std::move(other.files_);
        other.files_.clear();
    }
    return *this;
}

void HwCounterReader::close_all() noexcept
{
    for (auto &f : files_) ::close(f.second);
    files_.clear();
}

int HwCounterReader::open(std::string_view device, int port, std::string_view sysfs_root)
{
    close_all();
    const std::string base = std::string(sysfs_root) + "/class/infiniband/" + std::string(device) +
                             "/ports/" + std::to_string(port) + "/";
    for (std::string_view sub : {"hw_counters", "counters"}) {
        const std::string dir = base + std::string(sub);
        DIR *d = opendir(dir.c_str());
        if (d == nullptr) continue;
        std::vector<std::string> names;
        while (dirent *e = readdir(d)) {
            const std::string_view n = e->d_name;
            if (n.empty() || n[0] == '.' || n == "lifespan") continue;
            names.emplace_back(n);
        }
        closedir(d);
        std::sort(names.begin(), names.end());
        for (const std::string &n : names) {
            const int fd = ::open((dir + "/" + n).c_str(), O_RDONLY | O_CLOEXEC);
            if (fd < 0) continue; // e.g. write-only or permission-restricted entries
            files_.emplace_back(sub == "counters" ? "counters/" + n : n, fd);
        }
    }
    return files_.empty() ? -ENOENT : 0;
}

int HwCounterReader::read(std::vector<std::pair<std::string, int64_t>> *raw) const
{
    raw->clear();
    for (const auto &[name, fd] : files_) {
        char text[32];
        const ssize_t n = ::pread(fd, text, sizeof text, 0);
        int64_t v = 0;
        if (n <= 0 || n == sizeof text ||
            !parse_counter(std::string_view(text, static_cast<size_t>(n)), &v))
            continue;
        raw->emplace_back(name, v);
    }
    return static_cast<int>(raw->size());
}

PortCounters HwCounterReader::read_summary() const
{
    std::vector<std::pair<std::string, int64_t>> raw;
    read(&raw);
    return summarize_counters(raw);
}

} // namespace vigil::net::ib
