#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The plugin libraries load on any x86_64 GPU node with glibc >= 2.28 (RHEL 8, Ubuntu 20.04
# and newer): each LIB may need only glibc's own libraries (NEEDED), only GLIBC_2.x versions
# up to GLIBC_2.28 from them, and nothing of the C++ runtime (no GLIBCXX_, CXXABI_ or GCC_
# version; the runtime is linked in) or of optional libraries (libibverbs, hiredis and libnl
# are opened with dlopen when needed). Exports are checked by install.sh.
#   usage: portable.sh LIB...
set -uo pipefail
(($#)) || { echo "usage: portable.sh LIB..." >&2; exit 2; }
fail() { echo "FAIL: $*" >&2; exit 1; }

ALLOWED_NEEDED=(libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 ld-linux-x86-64.so.2)
MAX_MINOR=28 # GLIBC_2.28

for so in "$@"; do
    [[ -f $so ]] || fail "$so: no such file"
    name=$(basename "$so")
    mapfile -t needed < <(readelf -d "$so" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    for n in "${needed[@]}"; do
        [[ " ${ALLOWED_NEEDED[*]} " == *" $n "* ]] ||
            fail "$name needs $n (allowed: ${ALLOWED_NEEDED[*]})"
    done
    # The version needs: "File: X" lines name the library, "Name: V" lines the versions.
    newest=""
    while read -r kind value; do
        case $kind in
        File:)
            [[ " ${ALLOWED_NEEDED[*]} " == *" $value "* ]] ||
                fail "$name needs versions of $value"
            ;;
        Name:)
            [[ $value =~ ^GLIBC_2\.([0-9]+)(\.[0-9]+)?$ ]] ||
                fail "$name needs symbol version $value (only GLIBC_2.x allowed)"
            ((BASH_REMATCH[1] <= MAX_MINOR)) ||
                fail "$name needs $value, newer than GLIBC_2.$MAX_MINOR: $(objdump -T "$so" |
                    awk -v v="$value" '$0 ~ "[( ]" v "[) ]" {print $NF}' | sort -u | tr '\n' ' ')"
            if [[ -z $newest ]] || ((BASH_REMATCH[1] > ${newest#GLIBC_2.})); then
                newest=GLIBC_2.${BASH_REMATCH[1]}
            fi
            ;;
        esac
    done < <(readelf -V "$so" | sed -n '/Version needs section/,$p' |
             grep -oE '(File|Name): [^ ]+' | tr -s ' ')
    [[ -n $newest ]] || fail "$name: no version needs found (readelf output changed?)"
    echo "$name: NEEDED ${needed[*]}; newest version needed $newest"
done
echo "portable: ok"
