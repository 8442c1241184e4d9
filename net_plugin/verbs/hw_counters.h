// SPDX-License-Identifier: Apache-2.0
// The hardware counters of an HCA port (sysfs hw_counters/ and counters/), read for
// telemetry so that a lossy link shows up (retransmissions, sequence errors) before it fails.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vigil::net::ib {

/// The counters every device names differently, summed from the names each driver uses.
/// A field is -1 when the device exposes none of its counters. Plain data.
struct PortCounters {
    /// Requests sent again: rxe completer_retry_err; mlx5 local_ack_timeout_err +
    /// roce_adp_retrans.
    int64_t retransmits = -1;
    /// NAKs for a sequence error received (the peer saw a gap): rxe rcvd_seq_err; mlx5
    /// packet_seq_err + implied_nak_seq_err.
    int64_t seq_errors = -1;
    /// Packets received out of sequence: rxe out_of_seq_request; mlx5 out_of_sequence.
    int64_t out_of_sequence = -1;
    /// Duplicate requests received (the peer retransmitted): duplicate_request.
    int64_t duplicate_requests = -1;
    /// RNR NAKs received: rxe rcvd_rnr_err; mlx5 rnr_nak_retry_err.
    int64_t rnr_naks = -1;
    /// Requests that exhausted their retries: rxe retry_exceeded_err + retry_rnr_exceeded_err.
    int64_t retry_exceeded = -1;
    /// The link went down: link_downed (hw_counters or counters).
    int64_t link_downed = -1;
    /// Packets: rxe sent_pkts / rcvd_pkts; IB counters port_xmit_packets / port_rcv_packets.
    int64_t tx_packets = -1;
    int64_t rx_packets = -1;
    /// Bytes: IB counters port_xmit_data / port_rcv_data (which count 4-byte words).
    int64_t tx_bytes = -1;
    int64_t rx_bytes = -1;
};

/// Parses one counter file's text (a decimal number, optional trailing newline). False for
/// anything else (empty, signs, letters, overflow beyond int64).
bool parse_counter(std::string_view text, int64_t *value) noexcept;

/// Maps raw (name, value) pairs to PortCounters. Names from counters/ are prefixed
/// "counters/"; hw_counters/ names are bare. Pure.
PortCounters summarize_counters(const std::vector<std::pair<std::string, int64_t>> &raw);

/// Reads one port's counters. open() lists the counter files once and keeps them open;
/// read() re-reads each (pread at offset 0 makes sysfs regenerate the value; rdma hw
/// counters are refreshed at most every `lifespan` ms, 10 by default). Files that are not
/// counters (lifespan) are skipped. Owns its file descriptors; move-only; one thread at a
/// time. Cost: one pread per counter (rxe: 15).
class HwCounterReader {
public:
    HwCounterReader() = default;
    ~HwCounterReader();
    HwCounterReader(HwCounterReader &&other) noexcept;
    HwCounterReader &operator=(HwCounterReader &&other) noexcept;
    HwCounterReader(const HwCounterReader &) = delete;
    HwCounterReader &operator=(const HwCounterReader &) = delete;

    /// Opens the counters of `device` port `port` under `sysfs_root`/class/infiniband.
    /// Returns 0, or -ENOENT when the port exposes no counter at all (some devices have
    /// none; telemetry then goes without them).
    [[nodiscard]] int open(std::string_view device, int port, std::string_view sysfs_root = "/sys");
    /// Reads every counter: raw (name, value) pairs in a stable order. A counter whose file
    /// cannot be read or parsed is left out. Returns how many were read.
    int read(std::vector<std::pair<std::string, int64_t>> *raw) const;
    /// read() then summarize_counters().
    PortCounters read_summary() const;
    size_t size() const noexcept { return files_.size(); }

private:
    void close_all() noexcept;
    std::vector<std::pair<std::string, int>> files_; // name, fd
};

} // namespace vigil::net::ib
