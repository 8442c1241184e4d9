// SPDX-License-Identifier: Apache-2.0
// What both halves of a TCP path do with their stream sockets beyond send and recv: report a
// failure in a PathStatus, ask the kernel for receive timestamps and read with them, and bound
// how long stamped data has waited (the wait time, tcp_path.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/types.h>

#include "../fabric.h"

namespace vigil::net::tcp {

/// "what: strerror(err)", for a PathStatus detail.
std::string errno_detail(const char *what, int err);

/// Marks `st` failed with `err` (-errno) and `detail`; `fatal` when no other path can fix it.
void fail(PathStatus *st, int err, std::string detail, bool fatal = false);

/// A receive on a data stream failed with `err` (errno). ECONNRESET is the peer's socket
/// closing with data of ours still unread, which a process killed mid-run does as often as it
/// ends the stream: both are its end gone without a goodbye (PathStatus::peer_eof), so the
/// receiving comm fails at once when every path ends so, instead of after the fatal timeout.
void lost_stream(PathStatus *st, int err);

/// Asks the kernel to timestamp what `fd` receives (SO_TIMESTAMPNS, CLOCK_REALTIME; TCP
/// reports the newest segment a read consumed). Without it wait time is just not measured.
void want_rx_timestamps(int fd);

/// recv() without blocking that also raises *rx_ns to the arrival time of the newest byte it
/// read (CLOCK_REALTIME ns) when the kernel tells it: the same one system call as recv().
/// Returns what recvmsg() returns (errno set on -1).
ssize_t recv_stamped(int fd, uint8_t *to, size_t n, uint64_t *rx_ns);

/// This host's CLOCK_REALTIME, ns (the clock of the kernel's receive timestamps).
uint64_t realtime_ns();

/// How long data that arrived at `rx_ns` (CLOCK_REALTIME, 0: unknown) has waited by now, ns.
/// At most `bound`: nothing read now arrived before the previous progress() emptied the
/// socket, whatever the wall clock did meanwhile (a step makes the difference meaningless,
/// not large).
uint64_t waited_ns(uint64_t rx_ns, uint64_t bound);

} // namespace vigil::net::tcp
