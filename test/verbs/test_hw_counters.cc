// SPDX-License-Identifier: Apache-2.0
// Port hardware counters: value parsing, the names of rxe and mlx5, reading a sysfs tree.
#include <catch2/catch.hpp>

#include "hw_counters.h"
#include "tmpdir.h"

using namespace vigil::net::ib;

TEST_CASE("counters: values are plain decimal numbers", "[counters]")
{
    int64_t v = -1;
    CHECK(parse_counter("0\n", &v));
    CHECK(v == 0);
    CHECK(parse_counter("5026\n", &v));
    CHECK(v == 5026);
    CHECK(parse_counter("9223372036854775807", &v));
    CHECK(v == INT64_MAX);
    for (const char *bad : {"", "\n", "-1", "+1", "12a", "0x10", "9223372036854775808",
                            "99999999999999999999", "1 2"}) {
        INFO(bad);
        CHECK_FALSE(parse_counter(bad, &v));
    }
}

TEST_CASE("counters: rxe's names", "[counters]")
{
    const PortCounters pc = summarize_counters({{"sent_pkts", 5026},
                                                {"rcvd_pkts", 5000},
                                                {"duplicate_request", 5},
                                                {"out_of_seq_request", 3},
                                                {"rcvd_rnr_err", 0},
                                                {"send_rnr_err", 0},
                                                {"rcvd_seq_err", 2},
                                                {"ack_deferred", 9},
                                                {"retry_exceeded_err", 1},
                                                {"retry_rnr_exceeded_err", 0},
                                                {"completer_retry_err", 8},
                                                {"send_err", 0},
                                                {"link_downed", 1},
                                                {"rdma_sends", 10},
                                                {"rdma_recvs", 10}});
    CHECK(pc.retransmits == 8);
    CHECK(pc.seq_errors == 2);
    CHECK(pc.out_of_sequence == 3);
    CHECK(pc.duplicate_requests == 5);
    CHECK(pc.rnr_naks == 0);
    CHECK(pc.retry_exceeded == 1);
    CHECK(pc.link_downed == 1);
    CHECK(pc.tx_packets == 5026);
    CHECK(pc.rx_packets == 5000);
    CHECK(pc.tx_bytes == -1); // rxe does not count bytes
}

TEST_CASE("counters: mlx5's names and the IB port counters", "[counters]")
{
    const PortCounters pc = summarize_counters({{"local_ack_timeout_err", 4},
                                                {"roce_adp_retrans", 6},
                                                {"packet_seq_err", 1},
                                                {"implied_nak_seq_err", 2},
                                                {"out_of_sequence", 7},
                                                {"rnr_nak_retry_err", 3},
                                                {"counters/link_downed", 2},
                                                {"counters/port_xmit_data", 1000},
                                                {"counters/port_rcv_data", 10},
                                                {"counters/port_xmit_packets", 50},
                                                {"counters/port_rcv_packets", 40}});
    CHECK(pc.retransmits == 10);
    CHECK(pc.seq_errors == 3);
    CHECK(pc.out_of_sequence == 7);
    CHECK(pc.rnr_naks == 3);
    CHECK(pc.link_downed == 2);
    CHECK(pc.tx_bytes == 4000); // 4-byte words
    CHECK(pc.rx_bytes == 40);
    CHECK(pc.tx_packets == 50);
    CHECK(pc.rx_packets == 40);
    CHECK(pc.duplicate_requests == -1);
}

TEST_CASE("counters: the reader lists once, re-reads values, skips what is no counter",
          "[counters]")
{
    vigil::test::TempDir root;
    const std::string port = "class/infiniband/rxe_a0/ports/1/";
    root.write(port + "hw_counters/sent_pkts", "10\n");
    root.write(port + "hw_counters/completer_retry_err", "0\n");
    root.write(port + "hw_counters/lifespan", "10\n");
    root.write(port + "hw_counters/broken", "not a number\n");
    root.write(port + "counters/port_xmit_data", "25\n");
    HwCounterReader r;
    REQUIRE(r.open("rxe_a0", 1, root.path()) == 0);
    CHECK(r.size() == 4); // lifespan is a setting, not a counter
    std::vector<std::pair<std::string, int64_t>> raw;
    CHECK(r.read(&raw) == 3); // "broken" is left out
    CHECK(raw == std::vector<std::pair<std::string, int64_t>>{{"completer_retry_err", 0},
                                                              {"sent_pkts", 10},
                                                              {"counters/port_xmit_data", 25}});
    root.write(port + "hw_counters/sent_pkts", "12\n");
    root.write(port + "hw_counters/completer_retry_err", "3\n");
    // Rewritten in place: the open descriptors read the new values (the VM suite checks the
    // same on rxe's sysfs files, which the kernel regenerates on every read at offset 0).
    const PortCounters pc = r.read_summary();
    CHECK(pc.tx_packets == 12);
    CHECK(pc.retransmits == 3);
    CHECK(pc.tx_bytes == 100);
    HwCounterReader moved = std::move(r);
    CHECK(moved.size() == 4);
    CHECK(r.size() == 0); // NOLINT(bugprone-use-after-move): moved-from is empty by contract
    HwCounterReader none;
    CHECK(none.open("rxe_zz", 1, root.path()) == -ENOENT);
}
