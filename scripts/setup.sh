#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs every Debian package Vigil's build, tests, demo and benchmarks need, and builds
# the project into ./build. Idempotent and quiet when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(g++ meson ninja-build pkg-config catch2 libibverbs-dev iproute2 python3 iperf3 sockperf
      nlohmann-json3-dev libcpp-httplib-dev python3-matplotlib libbenchmark-dev
      redis-server libhiredis-dev clang libclang-rt-14-dev llvm-14 stress-ng)

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

if [[ ! -f build/build.ninja ]]; then
    meson setup build -Dwerror=true >/dev/null
fi
ninja -C build >/dev/null
