#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# netlab.sh: emulate H hosts x P NIC ports with network namespaces to test the network plugin across "hosts".
set -euo pipefail

readonly STATE_DIR=/run/vigil-netlab
SELF=$(readlink -f "${BASH_SOURCE[0]}")
LAB="" HOSTS="" PORTS=""
TCP_CC=""   # congestion control create_lab selected in the hosts ("": the machine's)
TEARDOWN="" # lab destroyed by the EXIT trap (partial creation, run, self-test)
CREATING=0  # 1 while create_lab is half-way
CHILD=""    # pid of the command started by `run`

usage() {
    cat >&2 <<'EOF'
usage: netlab.sh COMMAND [ARGS...]

Emulates H hosts x P NIC ports on one machine with network namespaces: hosts
L-h0..L-h<H-1> and a switch L-sw holding one bridge br<j> per port index.
Port j of host i is eth<j> in L-h<i> with address 10.77.<j>.<i+1>/24.

  up [-H hosts] [-P ports] [--routed] [--lab NAME]   create a lab, print its name on stdout
  run [-H hosts] [-P ports] [--routed] [--lab NAME] -- CMD [ARGS...]
                   create a lab, run CMD with NETLAB, NETLAB_HOSTS and
                   NETLAB_PORTS exported, always tear the lab down, exit
                   with CMD's status
  down             delete the lab (kills processes still inside it)
  fail HOST PORT   take eth<PORT> of host HOST down
  restore HOST PORT        bring it up again (re-adds the address, waits <= 2 s)
  degrade HOST PORT RATE   limit both directions of the port with tbf (e.g. 100mbit)
  undegrade HOST PORT      remove that limit
  exec HOST -- CMD [ARGS...]   run CMD inside host HOST's namespace
  addr HOST PORT   print the IPv4 address of the port
  list             print the names of the labs present
  self-test        build a 3x2 lab and check connectivity, fail/restore,
                   degrade/undegrade and down; prints "netlab self-test: ok"

With --routed the switch also routes between the ports' subnets (a spine): bridge j gets
10.77.<j>.254, and every host reaches subnet k from each of its ports through that port's
gateway, so port i of one host reaches port j != i of another (cross-rail traffic).

The hosts' TCP congestion control is $NETLAB_TCP_CC (default cubic, the distributions'
default; "host" keeps this machine's), so what the lab measures does not depend on this
machine's sysctl: with BBR, which paces every socket from kernel timers, a saturated 2-core
host holds a socket's bytes unsent for tens of ms. An algorithm the namespaces may not use
is added to net.ipv4.tcp_allowed_congestion_control (once, logged); when the default cannot
be had, the hosts keep the machine's (logged).

$NETLAB_GSO_MAX (bytes, 1500..65536; unset: the veths' own, 64 KiB) caps the GSO packets
every port hands its qdisc, so degrade's bucket (at least 3/2 of that, below) can be smaller:
a 64 KiB GSO packet needs a 98,304-byte bucket, which a port cut to 25 Mbit/s empties at the
veth's speed after 31 ms idle, so a short burst crosses it far faster than the rate.

The lab is taken from --lab NAME or $NETLAB (up/run make a fresh unique name
unless --lab is given). Hosts 2..16 (default 2), ports 1..8 (default 2).
Everything but addr, list and help needs root. State: /run/vigil-netlab/NAME.env
EOF
}

log() { echo "netlab: $*" >&2; }
die() { local rc=$1; shift; log "$*"; exit "$rc"; }
need_root() { [[ $EUID -eq 0 ]] || die 2 "must be run as root (network namespaces need CAP_SYS_ADMIN)"; }
valid_name() { [[ $1 =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,23}$ ]]; }

# int_in WHAT VALUE LO HI: die unless VALUE is a decimal integer in [LO, HI].
int_in() {
    if [[ ! $2 =~ ^[0-9]{1,3}$ ]] || ((10#$2 < $3 || 10#$2 > $4)); then
        die 2 "bad $1 '$2' (want an integer in $3..$4)"
    fi
}

# Names of the namespaces that exist for lab $1.
lab_namespaces() {
    local name
    while read -r name _; do
        if [[ $name == "$1-sw" || ( $name == "$1-h"* && ${name#"$1-h"} =~ ^[0-9]+$ ) ]]; then
            echo "$name"
        fi
    done < <(ip netns list 2>/dev/null)
}

# Pids of the processes inside the namespaces given as arguments (never ourselves).
ns_pids() {
    local ns
    for ns in "$@"; do ip netns pids "$ns" 2>/dev/null || true; done | grep -vx -e "$$" -e "$BASHPID" || true
}

destroy_lab() {
    local lab=$1 ns i
    local -a nss pids
    mapfile -t nss < <(lab_namespaces "$lab")
    if ((${#nss[@]})); then
        mapfile -t pids < <(ns_pids "${nss[@]}")
        ((${#pids[@]})) && { kill -TERM "${pids[@]}" 2>/dev/null || true; }
        for ((i = 0; i < 20 && ${#pids[@]}; i++)); do
            sleep 0.1
            mapfile -t pids < <(ns_pids "${nss[@]}")
        done
        ((${#pids[@]})) && { kill -KILL "${pids[@]}" 2>/dev/null || true; }
        for ns in "${nss[@]}"; do
            ip netns del "$ns" || log "could not delete namespace $ns"
        done
    fi
    rm -f "$STATE_DIR/$lab.env" "$STATE_DIR/$lab.env.tmp"
}

# ns_sysctl NS path=value...: set sysctls inside NS (missing ones, e.g. without IPv6, are skipped).
ns_sysctl() {
    local ns=$1; shift
    # shellcheck disable=SC2016 # expanded by the inner sh
    ip netns exec "$ns" sh -c 'for kv; do f=/proc/sys/${kv%%=*}; [ -e "$f" ] || continue
        echo "${kv#*=}" > "$f" || exit 1; done' sh "$@"
}

# lab_tcp_cc: the congestion control the lab's hosts use ($NETLAB_TCP_CC, default cubic;
# "host": empty, the namespaces keep what they inherit). A namespace may only select one the
# root namespace allows: it is allowed here if it is not yet (root), and loaded if need be.
# The default falls back to the machine's with a note when it cannot be had; a choice
# given in NETLAB_TCP_CC fails instead.
lab_tcp_cc() {
    local cc=${NETLAB_TCP_CC:-cubic} sys=/proc/sys/net/ipv4 why=""
    [[ $cc == host ]] && return 0
    [[ $cc =~ ^[a-z0-9_]{1,15}$ ]] || die 2 "bad NETLAB_TCP_CC '$cc' (a congestion control name, or host)"
    if ! grep -qw -- "$cc" "$sys/tcp_available_congestion_control"; then
        modprobe "tcp_$cc" 2>/dev/null || true
        grep -qw -- "$cc" "$sys/tcp_available_congestion_control" || why="is not available here"
    fi
    if [[ -z $why ]] && ! grep -qw -- "$cc" "$sys/tcp_allowed_congestion_control"; then
        log "allowing TCP congestion control $cc in network namespaces (net.ipv4.tcp_allowed_congestion_control)"
        { echo "$(cat "$sys/tcp_allowed_congestion_control") $cc" >"$sys/tcp_allowed_congestion_control"; } 2>/dev/null ||
            why="cannot be allowed in network namespaces"
    fi
    if [[ -n $why ]]; then
        [[ -z ${NETLAB_TCP_CC:-} ]] || die 1 "TCP congestion control '$cc' $why (NETLAB_TCP_CC=host keeps the machine's)"
        log "TCP congestion control $cc $why: the hosts keep the machine's, $(cat "$sys/tcp_congestion_control")"
        return 0
    fi
    echo "$cc"
}

# wait_up NS DEV: wait (<= 2 s) until DEV in NS is operationally UP.
wait_up() {
    local i
    for ((i = 0; i < 20; i++)); do
        [[ $(ip -n "$1" -br link show dev "$2" 2>/dev/null) =~ [[:space:]]UP[[:space:]] ]] && return 0
        sleep 0.1
    done
    return 1
}
addr_of() { echo "10.77.$2.$(($1 + 1))"; }

new_name() {
    local name
    while :; do
        name=$(printf 'vl%d%04x' "$$" "$RANDOM")
        [[ -e $STATE_DIR/$name.env ]] || [[ -n $(lab_namespaces "$name") ]] || break
    done
    echo "$name"
}

# create_lab LAB HOSTS PORTS [ROUTED]; the caller must have installed the EXIT trap.
create_lab() {
    local lab=$1 hosts=$2 ports=$3 routed=${4:-0} i j k ns sw=$1-sw cc
    mkdir -p "$STATE_DIR"
    cc=$(lab_tcp_cc)
    local gso=${NETLAB_GSO_MAX:-}
    [[ -z $gso ]] || { [[ $gso =~ ^[0-9]{4,5}$ ]] && ((10#$gso >= 1500 && 10#$gso <= 65536)); } ||
        die 2 "bad NETLAB_GSO_MAX '$gso' (bytes, 1500..65536)"
    [[ -z $(lab_namespaces "$lab") ]] || die 2 "lab '$lab' already exists (namespaces present)"
    # Claim the name atomically (O_EXCL) so two creators of the same name cannot collide.
    (set -C; : >"$STATE_DIR/$lab.env") 2>/dev/null || die 2 "lab '$lab' already exists ($STATE_DIR/$lab.env)"
    TEARDOWN=$lab CREATING=1
    ip netns add "$sw" || die 1 "cannot create namespace $sw"
    ns_sysctl "$sw" net/ipv6/conf/all/disable_ipv6=1 net/ipv6/conf/default/disable_ipv6=1
    ip -n "$sw" link set lo up
    for ((j = 0; j < ports; j++)); do
        ip -n "$sw" link add "br$j" type bridge forward_delay 0 stp_state 0
        ip -n "$sw" link set "br$j" up
    done
    for ((i = 0; i < hosts; i++)); do
        ns=$lab-h$i
        ip netns add "$ns" || die 1 "cannot create namespace $ns"
        ns_sysctl "$ns" net/ipv4/conf/all/rp_filter=0 net/ipv4/conf/default/rp_filter=0 \
            net/ipv6/conf/all/accept_dad=0 net/ipv6/conf/default/accept_dad=0 \
            net/ipv6/conf/default/dad_transmits=0
        [[ -z $cc ]] || ns_sysctl "$ns" "net/ipv4/tcp_congestion_control=$cc" ||
            die 1 "cannot select TCP congestion control $cc in $ns"
        ip -n "$ns" link set lo up
        for ((j = 0; j < ports; j++)); do
            # Both ends are created directly in their namespaces: the root namespace never sees them.
            ip link add "eth$j" netns "$ns" type veth peer name "h${i}p$j" netns "$sw"
            if [[ -n $gso ]]; then
                ip -n "$ns" link set "eth$j" gso_max_size "$((10#$gso))" &&
                    ip -n "$sw" link set "h${i}p$j" gso_max_size "$((10#$gso))" ||
                    die 1 "cannot set gso_max_size $gso on host $i port $j"
            fi
            ip -n "$ns" addr add "$(addr_of "$i" "$j")/24" dev "eth$j"
            ip -n "$ns" link set "eth$j" up
            ip -n "$sw" link set "h${i}p$j" master "br$j" up
        done
    done
    for ((i = 0; i < hosts * ports; i++)); do
        wait_up "$lab-h$((i / ports))" "eth$((i % ports))" || die 1 "eth$((i % ports)) of host $((i / ports)) did not come up"
    done
    if ((routed)); then
        ns_sysctl "$sw" net/ipv4/ip_forward=1 net/ipv4/conf/all/rp_filter=0 net/ipv4/conf/default/rp_filter=0
        for ((j = 0; j < ports; j++)); do
            ns_sysctl "$sw" "net/ipv4/conf/br$j/rp_filter=0"
            ip -n "$sw" addr add "10.77.$j.254/24" dev "br$j"
        done
        for ((i = 0; i < hosts; i++)); do
            for ((j = 0; j < ports; j++)); do
                for ((k = 0; k < ports; k++)); do
                    # One route per port (metric 100 + port): a socket bound to port j takes its own.
                    ((k == j)) || ip -n "$lab-h$i" route add "10.77.$k.0/24" via "10.77.$j.254" dev "eth$j" metric $((100 + j))
                done
            done
        done
    fi
    printf 'LAB=%s HOSTS=%d PORTS=%d\n' "$lab" "$hosts" "$ports" >"$STATE_DIR/$lab.env.tmp"
    mv -f "$STATE_DIR/$lab.env.tmp" "$STATE_DIR/$lab.env"
    LAB=$lab HOSTS=$hosts PORTS=$ports TCP_CC=$cc CREATING=0
}

load_lab() {
    local f kv
    local -a words
    [[ -n $LAB ]] || die 2 "no lab given (use --lab NAME or set NETLAB)"
    valid_name "$LAB" || die 2 "invalid lab name '$LAB'"
    f=$STATE_DIR/$LAB.env
    [[ -s $f ]] || die 2 "unknown lab '$LAB' (no $f)"
    read -ra words <"$f"
    for kv in "${words[@]}"; do
        case $kv in HOSTS=*) HOSTS=${kv#*=} ;; PORTS=*) PORTS=${kv#*=} ;; esac
    done
    [[ $HOSTS =~ ^[0-9]+$ && $PORTS =~ ^[0-9]+$ ]] || die 2 "corrupt state file $f"
}

# host_port HOST PORT: validate against the loaded lab.
host_port() { int_in host "$1" 0 $((HOSTS - 1)); int_in port "$2" 0 $((PORTS - 1)); }

# tbf burst for RATE (tc syntax): 10 ms worth of traffic, and at least FLOOR bytes (16 KiB when
# not given). degrade passes 3/2 of the port's largest GSO packet as FLOOR: tbf segments a GSO
# packet bigger than its bucket when it is queued, but a packet queued under a faster rate's
# bigger bucket stays whole, and once the rate is lowered below it that packet never gathers
# the tokens it needs (net/sched/sch_tbf.c, tbf_dequeue): the port stops sending for good.
# Measured here: iperf3 at 100mbit, lowered mid-flow to 25mbit (10 ms = 31,250 bytes) with 8
# packets of 68,130 bytes queued, sent nothing more for 6 s, by `replace` or `change` alike.
tbf_burst() {
    local r=${1,,} floor=${2:-16384} n mult=1 bytes
    [[ $r =~ ^([0-9]{1,9})([kmgt]?)(bit|bps)?$ ]] || return 1
    n=${BASH_REMATCH[1]}
    case ${BASH_REMATCH[2]} in k) mult=1000 ;; m) mult=1000000 ;; g) mult=1000000000 ;; t) mult=1000000000000 ;; esac
    bytes=$((10#$n * mult))                                    # per second
    [[ ${BASH_REMATCH[3]} == bps ]] || bytes=$((bytes / 8))    # bare number or *bit: bits/s
    ((bytes > 0)) || return 1
    echo $((bytes / 100 > floor ? bytes / 100 : floor))
}

# gso_max NS DEV: the largest GSO packet DEV in namespace NS hands its qdisc, in bytes (64 KiB
# when ip does not say).
gso_max() {
    local g
    g=$(ip -n "$1" -d -j link show dev "$2" 2>/dev/null | grep -o '"gso_max_size":[0-9]*' | head -1)
    echo "${g#*:}" | grep -qE '^[0-9]+$' && echo "${g#*:}" || echo 65536
}

on_exit() {
    local rc=$?
    trap - EXIT INT TERM HUP
    ((!CREATING)) || log "creating lab $TEARDOWN failed; removing what was created"
    if [[ -n $TEARDOWN ]]; then destroy_lab "$TEARDOWN" || true; fi
    exit "$rc"
}

on_signal() { # SIGNAME SIGNUM: stop the child of `run` (bounded), then exit, which tears down
    local rc=$((128 + $2)) i
    trap '' INT TERM HUP
    if [[ -n $CHILD ]]; then
        kill -"$1" "$CHILD" 2>/dev/null || true
        for ((i = 0; i < 50; i++)); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$CHILD" 2>/dev/null || true
        wait "$CHILD" 2>/dev/null || rc=$?
    fi
    exit "$rc"
}

install_traps() {
    trap on_exit EXIT
    trap 'on_signal INT 2' INT
    trap 'on_signal TERM 15' TERM
    trap 'on_signal HUP 1' HUP
}

# reach NS IP: does IP answer from inside NS? ping if installed, else a TCP connect to a
# closed port, which a reachable host answers with a RST ("Connection refused").
reach() {
    local out
    ip -n "$1" route get "$2" >/dev/null 2>&1 || return 1
    if command -v ping >/dev/null 2>&1; then
        ip netns exec "$1" ping -c1 -W1 "$2" >/dev/null 2>&1
        return
    fi
    # shellcheck disable=SC2016 # expanded by the inner bash
    out=$(ip netns exec "$1" timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/9"' _ "$2" 2>&1) && return 0
    [[ $out == *refused* ]]
}

check() { "${@:2}" || die 1 "self-test FAILED: $1"; } # check WHAT CMD...
not() { ! "$@"; }

self_test() {
    local h p nl=("$BASH" "$SELF") qd out rc
    install_traps
    create_lab "$(new_name)" 3 2
    export NETLAB=$LAB
    log "self-test: lab $LAB"
    for p in 0 1; do
        for h in 1 2; do
            check "h0 -> h$h port $p" reach "$LAB-h0" "$(addr_of "$h" "$p")"
            out=$(ip -n "$LAB-h0" route get "$(addr_of "$h" "$p")")
            check "route to h$h port $p goes via eth$p" grep -q "dev eth$p " <<<"$out"
        done
    done
    check "addr 2 1" [ "$("${nl[@]}" addr 2 1)" = 10.77.1.3 ]
    if [[ -n $TCP_CC ]]; then
        check "hosts use TCP congestion control $TCP_CC" \
            [ "$(ip netns exec "$LAB-h1" cat /proc/sys/net/ipv4/tcp_congestion_control)" = "$TCP_CC" ]
    fi
    out=$("${nl[@]}" exec 2 -- sh -c 'ip -4 -o addr show dev eth1; exit 7') && rc=0 || rc=$?
    check "exec runs inside host 2" grep -q ' 10.77.1.3/24 ' <<<"$out"
    check "exec passes the exit status through" [ "$rc" = 7 ]
    "${nl[@]}" fail 1 0
    check "h0 must not reach 10.77.0.2 after fail 1 0" not reach "$LAB-h0" 10.77.0.2
    check "h0 -> 10.77.1.2 after fail 1 0" reach "$LAB-h0" 10.77.1.2
    "${nl[@]}" restore 1 0
    check "h0 -> 10.77.0.2 after restore 1 0" reach "$LAB-h0" 10.77.0.2
    "${nl[@]}" degrade 1 1 100mbit
    qd=$(tc -n "$LAB-h1" qdisc show dev eth1; tc -n "$LAB-sw" qdisc show dev h1p1)
    check "degrade installs tbf on both ends" [ "$(grep -c '^qdisc tbf ' <<<"$qd")" = 2 ]
    check "h0 -> 10.77.1.2 while degraded" reach "$LAB-h0" 10.77.1.2
    "${nl[@]}" degrade 1 1 10mbit
    local burst
    burst=$(tc -n "$LAB-h1" -j qdisc show dev eth1 | grep -o '"burst":[0-9]*' | head -1)
    check "a slow port's bucket holds the largest GSO packet (${burst#*:} bytes)" \
        [ "${burst#*:}" -ge "$(gso_max "$LAB-h1" eth1)" ]
    "${nl[@]}" undegrade 1 1
    qd=$(tc -n "$LAB-h1" qdisc show dev eth1; tc -n "$LAB-sw" qdisc show dev h1p1)
    check "undegrade removes tbf" not grep -q '^qdisc tbf ' <<<"$qd"
    "${nl[@]}" down
    check "down leaves no namespace" [ -z "$(lab_namespaces "$LAB")" ]
    check "down removes the state file" [ ! -e "$STATE_DIR/$LAB.env" ]
    echo "netlab self-test: ok" >&2
}

main() {
    local cmd=${1:-} hosts=2 ports=2 hp_set=0 lab_opt="" dashdash=0 routed=0 rc
    local -a pos=() rest=()
    (($#)) && shift
    LAB=${NETLAB:-}
    while (($#)); do
        case $1 in
        -H | -P | --lab) (($# >= 2)) || die 2 "option $1 needs a value" ;;&
        -H) hosts=$2 hp_set=1; shift 2 ;;
        -P) ports=$2 hp_set=1; shift 2 ;;
        --lab) lab_opt=$2; shift 2 ;;
        --lab=*) lab_opt=${1#--lab=}; shift ;;
        --routed) routed=1 hp_set=1; shift ;;
        -h | --help) usage; exit 0 ;;
        --) shift; rest=("$@"); dashdash=1; break ;;
        -*) die 2 "unknown option '$1' (see netlab.sh --help)" ;;
        *) pos+=("$1"); shift ;;
        esac
    done
    [[ -z $lab_opt ]] || valid_name "$lab_opt" || die 2 "invalid lab name '$lab_opt' (letters, digits, _ . -; max 24)"
    [[ -z $lab_opt ]] || LAB=$lab_opt
    case $cmd in up | run) ;; *) ((!hp_set)) || die 2 "-H/-P/--routed only apply to up and run" ;; esac
    case $cmd in run | exec) ;; *) ((!dashdash)) || die 2 "'--' only applies to run and exec" ;; esac
    nargs() { ((${#pos[@]} == $1)) || die 2 "$cmd: expected $1 argument(s), got ${#pos[@]} (see netlab.sh --help)"; }

    case $cmd in
    up | run)
        need_root
        nargs 0
        int_in hosts "$hosts" 2 16; int_in ports "$ports" 1 8
        [[ $cmd == up ]] || ((${#rest[@]})) || die 2 "run: missing '-- CMD [ARGS...]'"
        install_traps
        create_lab "${lab_opt:-$(new_name)}" $((10#$hosts)) $((10#$ports)) "$routed"
        if [[ $cmd == up ]]; then
            TEARDOWN=""
            echo "$LAB"
            return 0
        fi
        export NETLAB=$LAB NETLAB_HOSTS=$HOSTS NETLAB_PORTS=$PORTS
        log "lab $LAB (${HOSTS}x$PORTS) up; running: ${rest[*]}"
        # Async so that our traps run at once; restore SIGINT/SIGQUIT and stdin for the command.
        (trap - INT QUIT; exec "${rest[@]}") <&0 &
        CHILD=$!
        rc=0
        wait "$CHILD" || rc=$?
        CHILD=""
        exit "$rc"
        ;;
    down)
        need_root; nargs 0
        [[ -n $LAB ]] || die 2 "no lab given (use --lab NAME or set NETLAB)"
        valid_name "$LAB" || die 2 "invalid lab name '$LAB'"
        if [[ ! -e $STATE_DIR/$LAB.env && -z $(lab_namespaces "$LAB") ]]; then
            log "lab '$LAB' not present, nothing to do"
            return 0
        fi
        destroy_lab "$LAB"
        ;;
    fail | restore | undegrade | addr)
        [[ $cmd == addr ]] || need_root
        nargs 2; load_lab; host_port "${pos[@]}"
        local h=$((10#${pos[0]})) p=$((10#${pos[1]})) ns a out
        ns=$LAB-h$h a=$(addr_of "$h" "$p")
        case $cmd in
        addr) echo "$a" ;;
        fail) ip -n "$ns" link set "eth$p" down ;;
        restore)
            ip -n "$LAB-sw" link set "h${h}p$p" up
            ip -n "$ns" link set "eth$p" up
            out=$(ip -n "$ns" -4 -o addr show dev "eth$p")
            [[ $out == *" $a/24 "* ]] || ip -n "$ns" addr add "$a/24" dev "eth$p"
            wait_up "$ns" "eth$p" || die 1 "eth$p of host $h did not come up within 2 s"
            ;;
        undegrade)
            tc -n "$ns" qdisc del dev "eth$p" root 2>/dev/null || true
            tc -n "$LAB-sw" qdisc del dev "h${h}p$p" root 2>/dev/null || true
            out=$(tc -n "$ns" qdisc show dev "eth$p"; tc -n "$LAB-sw" qdisc show dev "h${h}p$p")
            [[ $out != *"qdisc tbf "* ]] || die 1 "could not remove the tbf qdisc of host $h port $p"
            ;;
        esac
        ;;
    degrade)
        need_root; nargs 3; load_lab; host_port "${pos[0]}" "${pos[1]}"
        local h=$((10#${pos[0]})) p=$((10#${pos[1]})) rate=${pos[2]} burst gso
        gso=$(gso_max "$LAB-h$h" "eth$p")
        burst=$(tbf_burst "$rate" $((gso * 3 / 2))) || die 2 "bad rate '$rate' (e.g. 100mbit, 1gbit, 500kbit, 10mbps)"
        tc -n "$LAB-h$h" qdisc replace dev "eth$p" root tbf rate "$rate" burst "$burst" latency 50ms
        tc -n "$LAB-sw" qdisc replace dev "h${h}p$p" root tbf rate "$rate" burst "$burst" latency 50ms
        ;;
    exec)
        ((dashdash && ${#rest[@]})) || die 2 "exec: usage: exec HOST -- CMD [ARGS...]"
        need_root; nargs 1; load_lab
        int_in host "${pos[0]}" 0 $((HOSTS - 1))
        exec ip netns exec "$LAB-h$((10#${pos[0]}))" "${rest[@]}"
        ;;
    list)
        nargs 0
        local f
        for f in "$STATE_DIR"/*.env; do
            if [[ -e $f ]]; then basename "$f" .env; fi
        done
        ;;
    self-test) need_root; nargs 0; self_test ;;
    help | -h | --help) usage ;;
    "") usage; exit 2 ;;
    *) log "unknown command '$cmd'"; usage; exit 2 ;;
    esac
}

main "$@"
