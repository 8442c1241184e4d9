# SPDX-License-Identifier: Apache-2.0
# Sourced by scripts and tests that start background processes: start a process so that its
# PID is known exactly (also inside a lab namespace), and end only that PID. Never kill by
# name pattern: on a shared node another user's sockperf or netbench has the same name.

# bg_start WHERE CMD [ARGS...]: starts CMD in the background, in the current namespace when
# WHERE is "local", else inside lab host WHERE (scripts/netlab.sh exec). Sets BG_PID to CMD's
# own PID: the background child execs netlab.sh, which execs `ip netns exec`, which execs
# CMD (no fork on the way), so $! is CMD once it started. Redirections given to bg_start
# apply to CMD.
bg_start() {
    local where=$1
    shift
    if [[ $where == local ]]; then
        "$@" &
    else
        "${NETLAB_SH:-$(dirname "${BASH_SOURCE[0]}")/netlab.sh}" exec "$where" -- "$@" &
    fi
    BG_PID=$!
}

# pid_is PID NAME: true when PID is alive and runs the program NAME (its comm, at most 15
# characters), i.e. it is still the process that was started and not a reused PID or the
# wrapper it was started through.
pid_is() {
    [[ $(cat "/proc/$1/comm" 2>/dev/null) == "${2:0:15}" ]]
}

# pid_stop PID NAME [SIGNAL]: sends SIGNAL (default TERM) to PID if it still is NAME, then
# reaps it when it is our child. Returns 1, killing nothing, when PID is no longer NAME.
pid_stop() {
    pid_is "$1" "$2" || return 1
    kill "-${3:-TERM}" "$1" 2>/dev/null || return 1
    wait "$1" 2>/dev/null || true
}

# Servers started in command substitutions (subshells) cannot hand BG_PID back: each records
# "PID NAME" in a file instead, so that an interrupted run still ends exactly what it started.
# pid_record FILE NAME: appends $BG_PID NAME to FILE. pid_stop_recorded FILE: pid_stop of
# every line of FILE (a missing FILE is nothing to stop).
pid_record() {
    echo "$BG_PID $2" >>"$1"
}
pid_stop_recorded() {
    local pid name
    [[ -f $1 ]] || return 0
    while read -r pid name; do pid_stop "$pid" "$name" || true; done <"$1"
}
