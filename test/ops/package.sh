#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The Debian package as an operator gets it: `dpkg-buildpackage -b` builds it from a copy of
# the source tree (tests off, DEB_BUILD_OPTIONS parallel=2), lintian finds no error in it, and
# it installs with dpkg into a throw-away root: /usr, /etc and /var overlaid in a mount
# namespace of this script's own, so the machine is not changed. There the installed tree is
# checked (the libraries in the multiarch directory, the tools, the rules, the dashboard, the
# unit), the installed libraries pass the portability check, promtool accepts the installed
# rules and systemd the unit, and a lab ring all-reduce runs on the installed vigil-netbench
# with nothing set but NCCL_NET_PLUGIN=vigil (and PATH): NCCL's dlopen("libnccl-net-vigil.so")
# must find the installed library, and the installed `vigil export` sees the job.
#   usage: package.sh SOURCE_ROOT     (as root; skips without dpkg-buildpackage or lintian)
#   VIGIL_PACKAGE_DEB=FILE   judge this .deb instead of building one
#   VIGIL_PACKAGE_KEEP=DIR   keep the built .deb and the build log there
set -euo pipefail
SRC=$(cd "${1:?usage: package.sh SOURCE_ROOT}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*" >&2; exit 77; }

if [[ ${1:-} != --inside ]] && [[ ${2:-} != --inside ]]; then
    [[ $(id -u) -eq 0 ]] || skip "the package test needs root (dpkg in a mount namespace, the lab)"
    for t in dpkg-buildpackage dh lintian unshare; do
        command -v "$t" >/dev/null || skip "$t is not installed (scripts/setup.sh installs it)"
    done
    WORK=$(mktemp -d /tmp/vigil-package.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
    # A copy of the tree as a fresh clone has it: no build directories, no git metadata.
    mkdir "$WORK/vigil"
    tar -C "$SRC" --exclude=./.git --exclude='./build*' --exclude='./obj-*' --exclude=./debian/vigil \
        --exclude=./debian/.debhelper --exclude=./debian/tmp -cf - . | tar -C "$WORK/vigil" -xf -
    version=$(cd "$WORK/vigil" && dpkg-parsechangelog -S Version)
    meson_version=$(sed -n "s/^  version: '\(.*\)',$/\1/p" "$SRC/meson.build")
    [[ $version == "$meson_version" ]] || fail "debian/changelog says $version, meson.build $meson_version"
    deb=$WORK/vigil_${version}_amd64.deb
    if [[ -n ${VIGIL_PACKAGE_DEB:-} ]]; then
        cp "$VIGIL_PACKAGE_DEB" "$deb"
    else
        t0=$SECONDS
        (cd "$WORK/vigil" && DEB_BUILD_OPTIONS="nocheck noautodbgsym parallel=2" \
            nice -n 10 dpkg-buildpackage -b -us -uc >"$WORK/build.log" 2>&1) ||
            { tail -40 "$WORK/build.log" >&2; fail "dpkg-buildpackage failed"; }
        echo "dpkg-buildpackage -b: $((SECONDS - t0)) s"
    fi
    [[ -f $deb ]] || fail "no $deb"
    [[ -n ${VIGIL_PACKAGE_KEEP:-} ]] && mkdir -p "$VIGIL_PACKAGE_KEEP" && cp "$deb" "$WORK/build.log" "$VIGIL_PACKAGE_KEEP/"
    lintian --fail-on error --suppress-tags-from-file /dev/null "$deb" >"$WORK/lintian.txt" 2>&1 ||
        { cat "$WORK/lintian.txt" >&2; fail "lintian reports errors"; }
    echo "lintian: no error ($(grep -c '^W:' "$WORK/lintian.txt" || true) warnings, $(grep -c '^I:' "$WORK/lintian.txt" || true) notes)"
    sed 's/^/  /' "$WORK/lintian.txt"
    unshare --mount --propagation private -- "$0" "$SRC" --inside "$deb" "$WORK"
    exit $?
fi

# ---- inside our own mount namespace --------------------------------------------------------
deb=$3 WORK=$4
root=$WORK/root
mkdir -p "$root"
mount -t tmpfs -o size=2g tmpfs "$root" # overlay's upper layers, on a file system that takes them
for d in usr etc var; do
    mkdir -p "$root/$d.up" "$root/$d.work"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$root/$d.up,workdir=$root/$d.work" "/$d"
    [[ $(findmnt -n -o FSTYPE "/$d") == overlay ]] || fail "/$d is not overlaid: refusing to install"
done
dpkg -i "$deb" >"$WORK/dpkg.log" 2>&1 || { cat "$WORK/dpkg.log" >&2; fail "dpkg -i failed"; }
echo "installed: $(dpkg-query -W -f='${Package} ${Version} ${Status}' vigil)"

lib=/usr/lib/x86_64-linux-gnu
for f in "$lib"/libnccl-{net,tuner,profiler}-vigil.so /usr/bin/vigil /usr/bin/vigil-netbench \
    /usr/share/vigil/vigil_plot.py /usr/share/vigil/prometheus/vigil-alerts.yml \
    /usr/share/vigil/prometheus/vigil-alerts.test.yml /usr/share/vigil/prometheus/prometheus.yml \
    /usr/share/vigil/grafana/vigil-dashboard.json /usr/share/vigil/grafana/provisioning/vigil.yml \
    /lib/systemd/system/vigil-exporter.service /etc/default/vigil-exporter /usr/share/doc/vigil/operations.md; do
    [[ -e $f ]] || fail "the package does not install $f"
done
grep -qx /etc/default/vigil-exporter /var/lib/dpkg/info/vigil.conffiles || fail "/etc/default/vigil-exporter is not a conffile"
bash "$SRC/test/tools/portable.sh" "$lib"/libnccl-{net,tuner,profiler}-vigil.so || fail "the installed libraries are not portable"
if command -v promtool >/dev/null; then
    promtool check rules /usr/share/vigil/prometheus/vigil-alerts.yml >/dev/null || fail "installed rules"
    (cd /usr/share/vigil/prometheus && promtool test rules vigil-alerts.test.yml >/dev/null) || fail "installed rule tests"
    promtool check config --syntax-only /usr/share/vigil/prometheus/prometheus.yml >/dev/null || fail "installed config"
    echo "promtool: installed rules, their tests and the configuration pass"
fi
if command -v systemd-analyze >/dev/null; then
    systemd-analyze verify /lib/systemd/system/vigil-exporter.service || fail "systemd-analyze verify"
    echo "systemd-analyze verify vigil-exporter.service: ok"
fi

# The lab all-reduce on the installed tree alone.
"$SRC/scripts/netlab.sh" run -H 2 -P 2 -- "$HERE/package_lab.sh" "$WORK" ||
    { tail -n 5 "$WORK"/rank*.err >&2; fail "the lab all-reduce on the installed package"; }
python3 - "$WORK/rank0.out" <<'PY' || fail "the all-reduce result"
import json, sys
s = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert s["ok"] and s["errors"] == 0, s
print(f"lab all-reduce on the installed package: ok, {s['gbps']:.2f} GB/s, plugin {s['plugin']}")
PY
sort -u "$WORK/mapped" | grep -qx "$lib/libnccl-net-vigil.so" || fail "ranks mapped $(sort -u "$WORK/mapped" | tr '\n' ' ')"
[[ $(sort -u "$WORK/mapped" | wc -l) == 1 ]] || fail "ranks mapped $(sort -u "$WORK/mapped" | tr '\n' ' ')"
echo "both ranks dlopened $lib/libnccl-net-vigil.so with no LD_LIBRARY_PATH"
echo "package: ok"
