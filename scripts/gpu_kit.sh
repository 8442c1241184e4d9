#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packs what scripts/gpu_check.sh needs on a GPU machine where nothing can be installed:
# the three plugin libraries of ./build (debug info stripped), the `vigil` tool, and `ip`,
# `tc` and `bridge` (the network-namespace lab), each program with the libraries it links
# that are not glibc's. A program runs through the host's own dynamic loader with
# --library-path, which its children (`ip netns exec CMD`) do not inherit.
#   usage: scripts/gpu_kit.sh [DIR]   (default gpu-kit; ignored by git)
# Then, on the GPU machine, from the repository root: scripts/gpu_check.sh --kit DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${1:-gpu-kit}
scripts/setup.sh >/dev/null
rm -rf "$KIT"
mkdir -p "$KIT/lib" "$KIT/bin" "$KIT/libexec" "$KIT/deps"

for so in build/net_plugin/libnccl-net-vigil.so build/tuner_plugin/libnccl-tuner-vigil.so \
          build/profiler_plugin/libnccl-profiler-vigil.so; do
    strip --strip-debug -o "$KIT/lib/$(basename "$so")" "$so"
done
test/tools/portable.sh "$KIT"/lib/*.so >/dev/null

# pack NAME PATH: the program, its non-glibc libraries and a wrapper in bin/.
pack() {
    local name=$1 path=$2 lib
    strip --strip-debug -o "$KIT/libexec/$name" "$path"
    while read -r lib; do
        case $(basename "$lib") in
        libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux* | libresolv.so.*) ;;
        *) cp -L "$lib" "$KIT/deps/" ;;
        esac
    done < <(ldd "$path" | awk '$3 ~ /^\// {print $3}')
    cat >"$KIT/bin/$name" <<EOF
#!/bin/sh
# $name from the kit, with the kit's libraries (scripts/gpu_kit.sh)
k=\$(dirname "\$(readlink -f "\$0")")/..
exec /lib64/ld-linux-x86-64.so.2 --library-path "\$k/deps" "\$k/libexec/$name" "\$@"
EOF
    chmod +x "$KIT/bin/$name"
}
pack ip "$(command -v ip)"
pack tc "$(command -v tc)"
pack bridge "$(command -v bridge)"
[[ -x build/tools/vigil ]] && pack vigil build/tools/vigil
for t in "$KIT"/bin/ip "$KIT"/bin/tc; do "$t" -V >/dev/null || { echo "gpu_kit: $t does not run" >&2; exit 1; }; done
echo "gpu_kit: $(du -sh "$KIT" | cut -f1) in $KIT ($(ls "$KIT/lib" "$KIT/libexec" | grep -c .) files)"
