#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# vm.sh COMMAND...  Boots the RDMA lab's qemu guest once (Debian's stock kernel with rdma_rxe
# loaded, the host's / as its root through a read-only 9p share and a tmpfs overlay), runs
# COMMAND there with bash, as root, in the current directory, streams its output, and exits
# with its status. Build on the host first: the guest sees the host's files as they are, and
# everything it writes is lost at poweroff except in the directories VIGIL_RXE_SHARE_RW names.
#
# Exit status: COMMAND's own; or
#   77   cannot run here (lab not set up, qemu missing, or VIGIL_RXE_REQUIRE_KVM=1 without
#        hardware KVM); the reason is printed
#   124  the guest did not finish within VIGIL_RXE_TIMEOUT seconds (it is killed)
#   125  the guest died without reporting a status (kernel panic, init failure); the tail of
#        its console log is printed
# Timing goes to stderr as one line: "vm: boot S s, command S s, total S s (ACCEL)".
#
# Environment:
#   VIGIL_RXE_CACHE      where setup.sh put the kernel and initramfs (/var/tmp/vigil-rxe)
#   VIGIL_RXE_TIMEOUT    seconds before the guest is killed (default 1800)
#   VIGIL_RXE_MEM        guest memory (default 2G; the overlay's writes live in it)
#   VIGIL_RXE_CPUS       guest vCPUs (default: host cores, at most 4)
#   VIGIL_RXE_ACCEL      auto (default) | kvm | tcg. auto takes KVM only when /dev/kvm is
#                        usable and backed by hardware virtualisation (kvm_intel or kvm_amd):
#                        a /dev/kvm from kvm_pvm runs only PVM-enlightened guest kernels,
#                        which Debian does not ship. Otherwise TCG, which needs no /dev/kvm.
#   VIGIL_RXE_REQUIRE_KVM=1  exit 77 rather than run under TCG
#   VIGIL_RXE_ENV        names of variables to pass into the guest, space-separated
#   VIGIL_RXE_SHARE_RW   host directories to share read-write at the same path, space-separated
#   VIGIL_RXE_KEEP=1     keep the job directory (console log, timings) and print its path
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${VIGIL_RXE_CACHE:-/var/tmp/vigil-rxe}
(($#)) || { echo "usage: vm.sh COMMAND..." >&2; exit 2; }
cannot() { echo "vm: cannot run the lab here: $*" >&2; exit 77; }

[[ -s $cache/kernel.env && -s $cache/initramfs.cpio.gz ]] ||
    cannot "not set up (run scripts/rxe/setup.sh as root)"
# shellcheck disable=SC1090
. "$cache/kernel.env"
command -v qemu-system-x86_64 >/dev/null || cannot "qemu-system-x86_64 is not installed"
[[ $(id -u) -eq 0 ]] || cannot "needs root (the guest shares the host's / and loads modules)"

hw_kvm() {
    [[ -c /dev/kvm && -r /dev/kvm && -w /dev/kvm ]] &&
        { [[ -d /sys/module/kvm_intel ]] || [[ -d /sys/module/kvm_amd ]]; }
}
case ${VIGIL_RXE_ACCEL:-auto} in
kvm) accel=kvm ;;
tcg) accel=tcg ;;
auto) if hw_kvm; then accel=kvm; else accel=tcg; fi ;;
*) echo "vm: VIGIL_RXE_ACCEL must be auto, kvm or tcg" >&2; exit 2 ;;
esac
if [[ $accel == tcg && ${VIGIL_RXE_REQUIRE_KVM:-0} == 1 ]]; then
    cannot "no hardware-backed /dev/kvm and VIGIL_RXE_REQUIRE_KVM=1"
fi
if [[ $accel == kvm ]]; then
    accel_args=(-accel kvm -cpu host)
else
    # shellcheck disable=SC2054 # the commas belong to qemu's option syntax
    accel_args=(-accel tcg,thread=multi,tb-size=256 -cpu max)
fi

cpus=${VIGIL_RXE_CPUS:-$(nproc)}
((cpus > 4)) && cpus=4
mkdir -p "$cache/jobs"
job=$(mktemp -d "$cache/jobs/job.XXXXXX")
qemu_pid=
finish() {
    [[ -n $qemu_pid ]] && kill "$qemu_pid" 2>/dev/null
    if [[ ${VIGIL_RXE_KEEP:-0} == 1 ]]; then
        echo "vm: job directory kept: $job" >&2
    else
        rm -rf "$job"
    fi
}
trap finish EXIT
trap 'exit 130' INT TERM

printf '%s' "$*" >"$job/cmd"
pwd >"$job/cwd"
: >"$job/env"
for v in ${VIGIL_RXE_ENV:-}; do
    [[ -n ${!v+x} ]] && printf '%s=%q\n' "$v" "${!v}" >>"$job/env"
done

share_args=() rw_list=
n=0
for d in ${VIGIL_RXE_SHARE_RW:-}; do
    d=$(cd "$d" 2>/dev/null && pwd) || { echo "vm: VIGIL_RXE_SHARE_RW: no directory $d" >&2; exit 2; }
    [[ $d == *[,\ ]* ]] && { echo "vm: VIGIL_RXE_SHARE_RW: no commas or spaces in $d" >&2; exit 2; }
    share_args+=(-fsdev "local,id=rw$n,path=$d,security_model=none,multidevs=remap"
                 -device "virtio-9p-pci,fsdev=rw$n,mount_tag=rw$n")
    rw_list+=${rw_list:+,}$d
    n=$((n + 1))
done

# Kernel messages (boot, oopses) go to ttyS0 -> the job's console.log; the command's output
# goes to the virtio console -> qemu's stdio -> our stdout. panic=-1 with -no-reboot turns a
# guest panic into qemu exiting, which is then reported as a dead guest. Under TCG the kernel
# marks the TSC unstable and reads the emulated HPET instead, an MMIO exit per clock read
# (measured 1.5 us per read from Python); the TSC qemu gives every vCPU is the host's, so it
# is used as is: the plugin reads the clock on every progress call.
cmdline="console=ttyS0 loglevel=4 quiet panic=-1 mitigations=off tsc=reliable clocksource=tsc"
cmdline+=" vigil.job=$job vigil.kroot=$KROOT vigil.init=$here/guest-init.sh"
[[ -n $rw_list ]] && cmdline+=" vigil.rw=$rw_list"

limit=${VIGIL_RXE_TIMEOUT:-1800}
t0=$(date +%s.%N)
timeout -k 10 "$limit" qemu-system-x86_64 "${accel_args[@]}" -smp "$cpus" -m "${VIGIL_RXE_MEM:-2G}" \
    -machine q35 -nodefaults -no-user-config -nographic -no-reboot \
    -kernel "$VMLINUZ" -initrd "$cache/initramfs.cpio.gz" -append "$cmdline" \
    -serial "file:$job/console.log" \
    -device virtio-serial-pci -chardev stdio,id=out,signal=off -device virtconsole,chardev=out \
    -fsdev local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap \
    -device virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot \
    -fsdev "local,id=job,path=$job,security_model=none,multidevs=remap" \
    -device virtio-9p-pci,fsdev=job,mount_tag=job \
    "${share_args[@]}" </dev/null &
qemu_pid=$!   # timeout(1)'s PID: killing it ends qemu too
wait "$qemu_pid"
qrc=$?
qemu_pid=
t1=$(date +%s.%N)

if [[ -s $job/rc ]]; then
    rc=$(cat "$job/rc")
    awk -v t0="$t0" -v t1="$t1" -v a="$(cat "$job/uptime-start" 2>/dev/null)" \
        -v b="$(cat "$job/uptime-end" 2>/dev/null)" -v accel="$accel" \
        'BEGIN { printf "vm: boot %.1f s, command %.1f s, total %.1f s (%s)\n", a, b - a, t1 - t0, accel }' >&2
elif ((qrc == 124 || qrc == 137)); then
    echo "vm: the guest did not finish within ${limit} s and was killed" >&2
    rc=124
else
    echo "vm: the guest died without a status (qemu exit $qrc); console tail:" >&2
    tail -n 30 "$job/console.log" >&2
    rc=125
fi
exit "$rc"
