#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The RDMA lab's topology, run INSIDE the guest as root: two "hosts" with two ports each,
# Soft-RoCE (rxe) devices on veth pairs, all in one network namespace.
#
#     host A                              host B
#     rxe_a0 on veth a0  <----------->  veth b0, rxe_b0      10.10.0.1 <-> 10.10.0.2
#     rxe_a1 on veth a1  <----------->  veth b1, rxe_b1      10.11.0.1 <-> 10.11.0.2
#
# One namespace, because rdma_rxe in Linux 6.1 ignores network namespaces (its UDP port 4791
# socket and its route lookups use the initial namespace). With all four addresses local,
# the kernel would carry A->B packets over lo, and rxe drops what does not arrive on its own
# netdev; so each port gets a policy rule "oif PORT -> table PORT" routing the peer's subnet
# out of that port, the local table moves behind those rules, and reverse-path filtering is
# off. rxe's route lookups name the outgoing interface, so RoCE packets really cross the
# veth (the netdev's packet counters show it). Plain TCP sockets between the addresses still
# use lo, which suits the side channels of perftest and of tests.
#
# Usage:
#   topo.sh up                 build it (idempotent) and wait until all four ports are ACTIVE
#   topo.sh down               remove it
#   topo.sh status             one line per rxe port: device, netdev, state, address
#   topo.sh port NETDEV up|down  take a port's netdev up or down (a port failure)
#   topo.sh shape NETDEV RATE [LATENCY]  shape a port's egress with tbf (e.g. 10mbit); the
#                              queue holds LATENCY (default 100ms) at RATE, beyond it drops
#   topo.sh loss NETDEV PCT    drop PCT % of a port's egress packets (netem)
#   topo.sh unshape NETDEV     remove the shaping or loss
#   topo.sh wait NETDEV active|down [SECONDS]  wait until rxe_NETDEV port 1 is in that state
# Environment: VIGIL_RXE_MTU (veth MTU, default 1500, giving an RDMA MTU of 1024).
set -euo pipefail

pairs=("a0 b0 10.10.0" "a1 b1 10.11.0")
mtu=${VIGIL_RXE_MTU:-1500}

port_state() { # rxe device -> ACTIVE / DOWN / ... (empty when the device does not exist)
    local f=/sys/class/infiniband/$1/ports/1/state
    [[ -r $f ]] && sed 's/^[0-9]*: *//' "$f" || true
}

wait_state() { # device, ACTIVE|DOWN, seconds
    local deadline=$((SECONDS + $3))
    while [[ $(port_state "$1") != "$2" ]]; do
        ((SECONDS < deadline)) || { echo "topo: $1 port 1 is '$(port_state "$1")', not $2" >&2; return 1; }
        sleep 0.1
    done
}

up() {
    modprobe -a rdma_rxe veth sch_tbf
    sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
        net.ipv4.conf.all.accept_local=1 net.ipv4.conf.default.accept_local=1
    ip rule show | grep -q '^1000:.*lookup local' || ip rule add pref 1000 lookup local
    ip rule show | grep -q '^0:.*lookup local' && ip rule del pref 0 lookup local
    local table=100 p x y net
    for p in "${pairs[@]}"; do
        read -r x y net <<<"$p"
        if ! ip link show "$x" >/dev/null 2>&1; then
            ip link add "$x" mtu "$mtu" type veth peer name "$y" mtu "$mtu"
        fi
        local d
        for d in "$x" "$y"; do
            # IPv6 off keeps each GID table to the MAC-derived and the IPv4 entries.
            sysctl -qw "net.ipv6.conf.$d.disable_ipv6=1" "net.ipv4.conf.$d.rp_filter=0" \
                "net.ipv4.conf.$d.accept_local=1"
        done
        ip addr replace "$net.1/24" dev "$x"
        ip addr replace "$net.2/24" dev "$y"
        ip link set "$x" up
        ip link set "$y" up
        ip route replace "$net.0/24" dev "$x" table "$table"
        ip route replace "$net.0/24" dev "$y" table $((table + 1))
        ip rule show | grep -q "oif $x lookup $table" || ip rule add pref 100 oif "$x" lookup "$table"
        ip rule show | grep -q "oif $y lookup $((table + 1))" ||
            ip rule add pref 100 oif "$y" lookup $((table + 1))
        # A port's packets to its own address stay local (a QP connected to itself, as a
        # flush QP is): without this the rule above would send them out of the veth.
        ip rule show | grep -q "from all to $net.1 oif $x lookup local" ||
            ip rule add pref 50 to "$net.1" oif "$x" lookup local
        ip rule show | grep -q "from all to $net.2 oif $y lookup local" ||
            ip rule add pref 50 to "$net.2" oif "$y" lookup local
        # Static neighbours: ARP between two local addresses would not be answered.
        ip neigh replace "$net.2" lladdr "$(cat "/sys/class/net/$y/address")" dev "$x" nud permanent
        ip neigh replace "$net.1" lladdr "$(cat "/sys/class/net/$x/address")" dev "$y" nud permanent
        table=$((table + 2))
        for d in "$x" "$y"; do
            [[ -e /sys/class/infiniband/rxe_$d ]] || rdma link add "rxe_$d" type rxe netdev "$d"
        done
    done
    for p in "${pairs[@]}"; do
        read -r x y net <<<"$p"
        wait_state "rxe_$x" ACTIVE 10
        wait_state "rxe_$y" ACTIVE 10
    done
}

down() {
    local p x y net
    for p in "${pairs[@]}"; do
        read -r x y net <<<"$p"
        rdma link delete "rxe_$x" 2>/dev/null || true
        rdma link delete "rxe_$y" 2>/dev/null || true
        ip link del "$x" 2>/dev/null || true
    done
}

status() {
    local p x y net d
    for p in "${pairs[@]}"; do
        read -r x y net <<<"$p"
        for d in "$x" "$y"; do
            printf '%-8s %-3s %-8s %s\n' "rxe_$d" "$d" "$(port_state "rxe_$d")" \
                "$(ip -4 -o addr show dev "$d" 2>/dev/null | awk '{print $4}')"
        done
    done
}

check_netdev() {
    case $1 in a0 | a1 | b0 | b1) ;; *) echo "topo: unknown port $1 (a0, a1, b0, b1)" >&2; exit 2 ;; esac
}

case ${1:-} in
up) up ;;
down) down ;;
status) status ;;
port)
    check_netdev "${2:-}"
    case ${3:-} in up | down) ip link set "$2" "$3" ;; *) echo "topo: port NETDEV up|down" >&2; exit 2 ;; esac
    ;;
shape)
    check_netdev "${2:-}"
    [[ -n ${3:-} ]] || { echo "topo: shape NETDEV RATE [LATENCY]" >&2; exit 2; }
    # burst: at least one RoCE packet and a few ms at the rate; latency bounds the queue.
    tc qdisc replace dev "$2" root tbf rate "$3" burst 32kbit latency "${4:-100ms}"
    ;;
loss)
    check_netdev "${2:-}"
    [[ -n ${3:-} ]] || { echo "topo: loss NETDEV PCT" >&2; exit 2; }
    tc qdisc replace dev "$2" root netem loss "$3%"
    ;;
unshape)
    check_netdev "${2:-}"
    tc qdisc del dev "$2" root 2>/dev/null || true
    ;;
wait)
    check_netdev "${2:-}"
    case ${3:-} in active) want=ACTIVE ;; down) want=DOWN ;; *) echo "topo: wait NETDEV active|down" >&2; exit 2 ;; esac
    wait_state "rxe_$2" "$want" "${4:-10}"
    ;;
*)
    sed -n '/^# Usage:/,/^# Environment/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
