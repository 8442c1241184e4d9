#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The installed tree: `meson install --destdir` of this build puts exactly the three plugin
# libraries in LIBDIR, the user-facing tools in BINDIR, the report's plot script and the
# operator's files (deploy/) in DATADIR/vigil (no test, benchmark or static library); each
# installed library loads with dlopen (RTLD_NOW, as NCCL opens plugins), exports exactly its
# plugin symbols and does not point into the build tree.
#   usage: install.sh MESON BUILD_ROOT SOURCE_ROOT TOOLS...   (TOOLS: the programs in BINDIR)
set -uo pipefail
MESON=${1:?usage: install.sh MESON BUILD_ROOT SOURCE_ROOT TOOLS...}
BUILD=${2:?}
SRC=${3:?}
shift 3
TOOLS=("$@")
WORK=$(mktemp -d /tmp/vigil-install.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
DEST=$WORK/root
fail() { echo "FAIL: $*" >&2; exit 1; }

"$MESON" install -C "$BUILD" --no-rebuild --destdir "$DEST" >"$WORK/log" 2>&1 ||
    { cat "$WORK/log" >&2; fail "meson install failed"; }
# prefix, libdir, bindir and datadir as this build was configured.
eval "$("$MESON" introspect --buildoptions "$BUILD" | python3 -c '
import json, shlex, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
for k in ("prefix", "libdir", "bindir", "datadir"):
    print(f"{k}={shlex.quote(o[k])}")')"
root=$DEST$prefix
lib=$root/$libdir

expected=()
for l in net tuner profiler; do expected+=("$lib/libnccl-$l-vigil.so"); done
for t in "${TOOLS[@]}"; do expected+=("$root/$bindir/$t"); done
expected+=("$root/$datadir/vigil/vigil_plot.py")
# What an operator deploys (deploy/): Prometheus rules, their tests and a server configuration,
# the Grafana dashboard and its provisioning file, the exporter's service and options.
for f in prometheus/vigil-alerts.yml prometheus/vigil-alerts.test.yml prometheus/prometheus.yml \
    grafana/vigil-dashboard.json grafana/provisioning/vigil.yml systemd/vigil-exporter.service \
    systemd/vigil-exporter.default; do
    expected+=("$root/$datadir/vigil/$f")
done
mapfile -t have < <(find "$DEST" \( -type f -o -type l \) | sort)
mapfile -t want < <(printf '%s\n' "${expected[@]}" | sort)
if [[ ${have[*]} != "${want[*]}" ]]; then
    diff <(printf '%s\n' "${want[@]#"$DEST"}") <(printf '%s\n' "${have[@]#"$DEST"}") >&2
    fail "installed files differ from the expected tree (< expected, > installed)"
fi
echo "installed: ${have[*]#"$DEST"}"

# plugin_symbols LIB MAP REGEX: the library's dynamic exports must be exactly the globals of
# its version script MAP, each matching REGEX (an NCCL plugin table name).
plugin_symbols() {
    local so=$1 map=$2 re=$3 s
    local -a exported declared
    mapfile -t exported < <(nm -D --defined-only "$so" | awk '{print $3}' | sort)
    mapfile -t declared < <(sed -n '/global:/,/local:/p' "$map" |
                            grep -oE '^\s*[A-Za-z_][A-Za-z0-9_]*;' | tr -d ' \t;' | sort)
    ((${#exported[@]})) || fail "$so exports nothing"
    [[ ${exported[*]} == "${declared[*]}" ]] ||
        fail "$so exports [${exported[*]}], its version script declares [${declared[*]}]"
    for s in "${exported[@]}"; do
        [[ $s =~ $re ]] || fail "$so exports $s, not a plugin symbol"
    done
    echo "$(basename "$so"): exports ${exported[*]}"
}
plugin_symbols "$lib/libnccl-net-vigil.so" "$SRC/net_plugin/exports.map" \
    '^(ncclNetPlugin|ncclTunerPlugin|ncclProfiler)_v[0-9]+$'
plugin_symbols "$lib/libnccl-tuner-vigil.so" "$SRC/tuner_plugin/exports.map" \
    '^ncclTunerPlugin_v[0-9]+$'
plugin_symbols "$lib/libnccl-profiler-vigil.so" "$SRC/profiler_plugin/exports.map" \
    '^ncclProfiler_v[0-9]+$'
for v in 8 9 10 11 12; do # every ncclNet version the README promises
    nm -D --defined-only "$lib/libnccl-net-vigil.so" | grep -q " ncclNetPlugin_v$v\$" ||
        fail "libnccl-net-vigil.so lacks ncclNetPlugin_v$v"
done

for so in "$lib"/libnccl-*-vigil.so; do
    ! readelf -d "$so" | grep -E 'R(UN)?PATH' | grep -qF "$BUILD" ||
        fail "$so keeps an RPATH into the build tree"
    # A sanitized build's libraries need their runtime loaded first (the ASan/TSan runtime
    # must be the first DSO); a release build's need nothing.
    preload=""
    for rt in asan tsan ubsan; do
        if readelf -d "$so" | grep -q "NEEDED.*lib$rt\.so"; then
            preload=$(gcc -print-file-name="lib$rt.so")
            break
        fi
    done
    # dlopen with RTLD_NOW|RTLD_LOCAL as NCCL does, then dlsym each exported table.
    LD_PRELOAD=$preload ASAN_OPTIONS=detect_leaks=0 python3 - "$so" <<'PY' ||
import ctypes, os, subprocess, sys
so = sys.argv[1]
h = ctypes.CDLL(so, mode=os.RTLD_NOW | os.RTLD_LOCAL)
names = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True,
                       check=True).stdout.split()[2::3]
for n in names:
    ctypes.c_void_p.in_dll(h, n)  # dlsym; raises ValueError when absent
print(f"{os.path.basename(so)}: dlopen RTLD_NOW ok, {len(names)} symbols resolved")
PY
        fail "$so does not load"
done
# The installed vigil draws its plots with the script installed beside it, not with the one in
# the source tree it was built from: a stand-in script there must be the one that runs.
if [[ " ${TOOLS[*]} " == *" vigil "* ]]; then
    cat >"$root/$datadir/vigil/vigil_plot.py" <<'PY'
import pathlib, sys
pathlib.Path(sys.argv[2], "installed-script-ran").write_text("yes\n")
PY
    mkdir -p "$WORK/in"
    : >"$WORK/in/vigil-prof-host-1.jsonl"
    "$root/$bindir/vigil" report --out "$WORK/report" "$WORK/in" >"$WORK/report.log" 2>&1 ||
        { cat "$WORK/report.log" >&2; fail "the installed vigil report failed"; }
    [[ -f $WORK/report/installed-script-ran ]] ||
        { cat "$WORK/report.log" >&2; fail "installed vigil ignored the installed plot script"; }
    echo "installed vigil report: plots through $datadir/vigil/vigil_plot.py"
fi
echo "install: ok"
