#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Second-stage init of the RDMA lab guest (PID 1 after switch_root onto the overlay of the
# host's /). Runs the job vm.sh described in the job directory and powers the guest off.
#   in:  JOB/cmd (a bash command line), JOB/cwd, JOB/env (KEY=VALUE lines, shell-quoted)
#   out: JOB/rc (the command's exit status; absent when the guest died first),
#        JOB/uptime-start, JOB/uptime-end (guest uptime in seconds around the command),
#        JOB/modprobe.log
# The command's stdout and stderr go to the virtio console hvc0, which vm.sh streams.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=dumb

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mountpoint -q /dev || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts -o mode=0620,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
# A fresh /run: the host's pid files, sockets and netns handles mean nothing here.
mount -t tmpfs tmpfs /run
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null

job=$(sed -n 's/.*vigil\.job=\([^ ]*\).*/\1/p' /proc/cmdline)
out=/dev/hvc0
[[ -c $out ]] || out=/dev/console

poweroff_now() {
    sync
    echo o >/proc/sysrq-trigger
    sleep 5
    poweroff -f
}
[[ -d $job ]] || { echo "vigil-guest: no job directory" >/dev/console; poweroff_now; }

hostname vigil-rxe
ip link set lo up
ulimit -l unlimited   # registered memory is pinned: no limit in the lab
# The RDMA stack and what the lab's topology and shaping need, from the guest kernel's tree.
modprobe -a rdma_rxe ib_uverbs veth sch_tbf sch_netem >"$job/modprobe.log" 2>&1

cd "$(cat "$job/cwd")" 2>/dev/null || cd /
if [[ -s $job/env ]]; then
    set -a
    . "$job/env"
    set +a
fi
cut -d' ' -f1 /proc/uptime >"$job/uptime-start"
# Through a pipe, not the console itself: the command sees no terminal (no progress bars,
# no colour), as under CI.
bash -c "$(cat "$job/cmd")" </dev/null 2>&1 | cat >"$out"
rc=${PIPESTATUS[0]}
cut -d' ' -f1 /proc/uptime >"$job/uptime-end"
echo "$rc" >"$job/rc"
poweroff_now
