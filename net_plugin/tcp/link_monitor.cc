// SPDX-License-Identifier: Apache-2.0
// rtnetlink link-state listener.
#include "link_monitor.h"

#include <cerrno>
#include <cstring>
#include <linux/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"

namespace vigil::net::tcp {

int LinkMonitor::start(std::vector<std::string> ifnames, Callback on_change)
{
    if (thread_.running()) return -EBUSY;
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd < 0) return -errno;
    fd_.reset(fd);
    sockaddr_nl sa{};
    sa.nl_family = AF_NETLINK;
    sa.nl_groups = RTMGRP_LINK;
    if (bind(fd, reinterpret_cast<sockaddr *>(&sa), sizeof(sa)) != 0) {
        int rc = -errno;
        fd_.reset();
        return rc;
    }
    names_ = std::move(ifnames);
    up_ = std::make_unique<std::atomic<bool>[]>(names_.size());
    for (size_t i = 0; i < names_.size(); ++i) up_[i].store(true);
    cb_ = std::move(on_change);
    if (int rc = thread_.start(fd, "vigil-links", "link monitor", [this] { drain(); }); rc != 0) {
        fd_.reset();
        return rc;
    }
    return 0;
}

void LinkMonitor::stop() noexcept
{
    if (!thread_.running()) return;
    thread_.stop();
    fd_.reset();
}

bool LinkMonitor::up(int dev) const
{
    return dev < 0 || static_cast<size_t>(dev) >= names_.size() || up_[static_cast<size_t>(dev)].load();
}

void LinkMonitor::drain()
{
    alignas(nlmsghdr) char buf[16384];
    for (;;) {
        ssize_t n = recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == ENOBUFS) // overrun: events were lost; the data path still catches failures
                VLOG_WARN("link monitor: netlink overrun, some port events were lost");
            return;
        }
        if (n == 0) return;
        size_t len = static_cast<size_t>(n);
        for (auto *h = reinterpret_cast<nlmsghdr *>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
            if (h->nlmsg_type != RTM_NEWLINK && h->nlmsg_type != RTM_DELLINK) continue;
            if (h->nlmsg_len < NLMSG_LENGTH(sizeof(ifinfomsg))) continue; // bounded before use
            auto *ifi = static_cast<ifinfomsg *>(NLMSG_DATA(h));
            std::string name;
            int alen = static_cast<int>(IFLA_PAYLOAD(h));
            for (auto *a = IFLA_RTA(ifi); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
                if (a->rta_type != IFLA_IFNAME) continue;
                const char *p = static_cast<const char *>(RTA_DATA(a));
                name.assign(p, strnlen(p, RTA_PAYLOAD(a)));
            }
            const bool now_up = h->nlmsg_type == RTM_NEWLINK && (ifi->ifi_flags & IFF_UP) &&
                                (ifi->ifi_flags & IFF_RUNNING);
            for (size_t d = 0; d < names_.size(); ++d) {
                if (names_[d] != name) continue;
                if (up_[d].exchange(now_up) == now_up) continue;
                VLOG_INFO(NCCL_NET, "link monitor: %s is %s (monotonic %.6f s)", name.c_str(),
                          now_up ? "up" : "down", static_cast<double>(now_ns()) / 1e9);
                try {
                    if (cb_) cb_(static_cast<int>(d), now_up);
                } catch (const std::exception &e) {
                    VLOG_WARN("link monitor: handling %s %s failed: %s", name.c_str(), now_up ? "up" : "down", e.what());
                } catch (...) {
                    VLOG_WARN("link monitor: handling %s %s failed", name.c_str(), now_up ? "up" : "down");
                }
            }
        }
    }
}

} // namespace vigil::net::tcp
