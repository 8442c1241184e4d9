#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sets up the RDMA lab (idempotent): the Debian packages the qemu guest and its tests use,
# Debian's stock kernel (which has rdma_rxe, the kernel's Soft-RoCE) unpacked into a cache
# directory outside the checkout, and the small initramfs that boots it on the host's own
# root filesystem. Run as root. Each step is skipped when its result is already there.
#
# Exit status: 0 ready; 77 the lab cannot exist here (qemu or the kernel package cannot be
# installed: the reason is printed); 1 anything else went wrong.
#
# Environment:
#   VIGIL_RXE_CACHE     cache directory (default /var/tmp/vigil-rxe)
#   VIGIL_RXE_KPKG      kernel package to use (default: what linux-image-amd64 depends on)
#   VIGIL_RXE_NO_APT=1  never call apt-get (the packages must already be installed)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${VIGIL_RXE_CACHE:-/var/tmp/vigil-rxe}
say() { echo "rxe-setup: $*" >&2; }
skip() { say "cannot set up the lab: $*"; exit 77; }

[[ $(id -u) -eq 0 ]] || { say "must run as root (apt-get, depmod, qemu with the host's /)"; exit 1; }
mkdir -p "$cache"
# Several worktrees may set up at once: one at a time, the others find the work done.
exec 9>"$cache/.setup.lock"
flock 9

# qemu and the guest's tools. The guest runs the host's own binaries (its root filesystem is
# the host's /), so rdma-core, perftest and iproute2 are installed here, on the host.
lab_pkgs=(qemu-system-x86 busybox-static kmod cpio rdma-core ibverbs-providers ibverbs-utils
          perftest iproute2 libibverbs-dev)
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }
missing=()
for p in "${lab_pkgs[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
    [[ ${VIGIL_RXE_NO_APT:-0} == 1 ]] && skip "missing packages ${missing[*]} and VIGIL_RXE_NO_APT=1"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    for try in 1 2 3 4 5 6; do   # another engineer's apt may hold the dpkg lock for a while
        if apt-get update -qq >/dev/null 2>&1 &&
           apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$cache/apt.log" 2>&1; then
            break
        fi
        ((try == 6)) && { tail -5 "$cache/apt.log" >&2; }
        ((try == 6)) && { installed qemu-system-x86 || skip "qemu-system-x86 cannot be installed"; exit 1; }
        sleep 10
    done
fi
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 is not on PATH after installing qemu-system-x86"

# The guest kernel: Debian removes old ABI packages from the archive, so the package name is
# resolved through the linux-image-amd64 metapackage each time it is fetched.
kenv=$cache/kernel.env
if [[ ! -s $kenv ]]; then
    kpkg=${VIGIL_RXE_KPKG:-}
    if [[ -z $kpkg ]]; then
        kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
               sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -1)
        if [[ -z $kpkg && ${VIGIL_RXE_NO_APT:-0} != 1 ]]; then
            apt-get update -qq >/dev/null 2>&1 || true
            kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
                   sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*\)$/\1/p' | head -1)
        fi
    fi
    [[ -n $kpkg ]] || skip "apt cannot resolve linux-image-amd64 to a kernel package"
    say "fetching $kpkg"
    rm -rf "$cache/deb" "$cache/kroot.new"
    mkdir -p "$cache/deb"
    # apt's sandbox user cannot write into a root-only directory; the download then runs as
    # root and apt says so on stderr, which is harmless.
    (cd "$cache/deb" && apt-get download "$kpkg" >"$cache/download.log" 2>&1) ||
        { tail -3 "$cache/download.log" >&2; skip "the kernel package $kpkg cannot be downloaded"; }
    deb=$(find "$cache/deb" -name '*.deb' | head -1)
    dpkg-deb -x "$deb" "$cache/kroot.new"
    kver=$(ls "$cache/kroot.new/lib/modules")
    # The package's postinst would run depmod; it is not installed, so run it on the tree.
    depmod -b "$cache/kroot.new" "$kver"
    grep -q '^CONFIG_RDMA_RXE=m' "$cache/kroot.new/boot/config-$kver" ||
        skip "$kpkg has no rdma_rxe module (CONFIG_RDMA_RXE)"
    rm -rf "$cache/kroot"
    mv "$cache/kroot.new" "$cache/kroot"
    {
        echo "KPKG=$kpkg"
        echo "KPKG_VERSION=$(dpkg-deb -f "$deb" Version)"
        echo "KVER=$kver"
        echo "KROOT=$cache/kroot"
        echo "VMLINUZ=$cache/kroot/boot/vmlinuz-$kver"
    } >"$kenv.tmp"
    mv "$kenv.tmp" "$kenv"
    rm -rf "$cache/deb"   # 70 MB; only the unpacked tree is used
fi
# shellcheck disable=SC1090
. "$kenv"

# The initramfs: busybox plus the modules that reach the 9p shares. It is rebuilt when its
# /init script changes.
initrd=$cache/initramfs.cpio.gz
if [[ ! -s $initrd || $here/initramfs-init -nt $initrd ]]; then
    say "building the initramfs"
    tree=$(mktemp -d)
    trap 'rm -rf "$tree"' EXIT
    mkdir -p "$tree"/{bin,dev,proc,sys,lib/mods}
    cp /bin/busybox "$tree/bin/busybox"
    ln -s busybox "$tree/bin/sh"
    install -m 0755 "$here/initramfs-init" "$tree/init"
    # modprobe prints the insmod lines in dependency order; keep that order, once each.
    modprobe -d "$KROOT" -S "$KVER" --show-depends -a \
        virtio_pci virtio_console 9pnet_virtio 9p overlay |
        awk '$1 == "insmod" && !seen[$2]++ {print $2}' |
        while read -r ko; do
            cp "$ko" "$tree/lib/mods/"
            basename "$ko" >>"$tree/lib/mods/order"
        done
    [[ -s $tree/lib/mods/order ]] || { say "no modules found for the initramfs"; exit 1; }
    (cd "$tree" && find . | cpio -o -H newc --quiet | gzip -1) >"$initrd.tmp"
    mv "$initrd.tmp" "$initrd"
fi
say "ready: $KPKG $KPKG_VERSION ($KVER) in $cache"
