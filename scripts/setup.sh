#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs every Debian package Vigil's build, tests, demo and benchmarks need, and builds
# the project into ./build. Idempotent and quiet when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(g++ meson ninja-build pkg-config catch2 libibverbs-dev iproute2 python3 iperf3 sockperf
      nlohmann-json3-dev libcpp-httplib-dev python3-matplotlib libbenchmark-dev
      redis-server libhiredis-dev clang libclang-rt-14-dev llvm-14 stress-ng
      prometheus python3-yaml debhelper dpkg-dev lintian)

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        echo "setup: missing packages: ${missing[*]} (run as root or install them)" >&2
        exit 2
    fi
    echo "setup: installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# An older glibc (Debian 11's 2.31, from Debian's own archive) for test/tools/old_glibc.sh,
# which runs the plugins through its loader: unpacked, never installed. Optional: without
# network or as non-root the test skips.
OLD_GLIBC=/var/cache/vigil/glibc-2.31
fetch_old_glibc() {
    local tmp
    tmp=$(mktemp -d /tmp/vigil-glibc.XXXXXX) || return 1
    mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bullseye main" \
        >"$tmp/sources.list"
    local apt=(-q -o "Dir::Etc::sourcelist=$tmp/sources.list" -o Dir::Etc::sourceparts=-
               -o "Dir::State=$tmp" -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache"
               -o APT::Sandbox::User=root)
    if apt-get "${apt[@]}" update >/dev/null 2>&1 &&
        (cd "$tmp" && apt-get "${apt[@]}" download libc6/bullseye >/dev/null 2>&1) &&
        mkdir -p "$OLD_GLIBC.new" && dpkg-deb -x "$tmp"/libc6_*.deb "$OLD_GLIBC.new"; then
        rm -rf "$OLD_GLIBC" && mv "$OLD_GLIBC.new" "$OLD_GLIBC"
    else
        rm -rf "$OLD_GLIBC.new"
        echo "setup: could not fetch Debian 11's glibc; the old-glibc test will skip" >&2
    fi
    rm -rf "$tmp"
}
if [[ $(id -u) -eq 0 && ! -x $OLD_GLIBC/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 ]]; then
    fetch_old_glibc
fi

if [[ ! -f build/build.ninja ]]; then
    meson setup build -Dwerror=true >/dev/null
fi
ninja -C build >/dev/null
