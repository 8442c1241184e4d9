# SPDX-License-Identifier: Apache-2.0
# Helpers for the driver-based functional tests: run vigil-netbench ranks, check their JSON.
# Expects NETBENCH_BIN and NETBENCH_PLUGIN (set by meson), and optionally NETLAB (lab name).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NETLAB_SH="$HERE/../../scripts/netlab.sh"
TMP=$(mktemp -d /tmp/vigil-ft.XXXXXX)
trap '[[ -n ${KEEP_TMP:-} ]] || rm -rf "$TMP"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# json_get FILE KEY: value of KEY in the last JSON line of FILE.
json_get() {
    python3 -c 'import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])[sys.argv[2]])' "$1" "$2"
}

# expect_ok FILE: the summary says ok with zero errors.
expect_ok() {
    local f=$1
    [[ -s $f ]] || fail "no output in $f"
    [[ $(json_get "$f" ok) == True ]] || { cat "$f" >&2; fail "run not ok: $(tail -1 "$f")"; }
    [[ $(json_get "$f" errors) == 0 ]] || fail "errors: $(tail -1 "$f")"
}

# run_ranks N HOSTS_OR_EMPTY -- ARGS...: start N ranks (in lab hosts 0..N-1 when NETLAB is set,
# else on this host) with a fresh rendezvous; rank 0's stdout goes to $TMP/out.<id>.
# Prints the output file name. Fails when any rank fails.
RUN_ID=0
run_ranks() {
    local n=$1; shift
    RUN_ID=$((RUN_ID + 1))
    local rdv="unix:$TMP/rdv.$RUN_ID.sock" out="$TMP/out.$RUN_ID" pids=() r rc=0
    for ((r = n - 1; r >= 0; r--)); do
        local cmd=("$NETBENCH_BIN" --plugin "$NETBENCH_PLUGIN" --rank "$r" --nranks "$n" --rendezvous "$rdv" --timeout 240 "$@")
        if [[ -n ${NETLAB:-} ]]; then cmd=("$NETLAB_SH" exec "$r" -- "${cmd[@]}"); fi
        if ((r == 0)); then
            "${cmd[@]}" >"$out" 2>"$out.err.$r" &
        else
            "${cmd[@]}" >"$out.rank$r" 2>"$out.err.$r" &
        fi
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    if ((rc)); then
        cat "$out" "$out".err.* "$out".rank* >&2 2>/dev/null || true
        fail "a rank failed: $*"
    fi
    echo "$out"
}

# ranks_fail_init WHAT VAR=VALUE...: two ranks (this host) run with those variables; both
# must fail init.
# Their stderr goes to $TMP/WHAT.err.<rank>.
ranks_fail_init() {
    local what=$1 rdv="unix:$TMP/rdv.$1.sock" pids=() envs=() r p failed=0
    shift
    while [[ $# -gt 0 && $1 != -- ]]; do envs+=("$1"); shift; done
    for r in 1 0; do
        env "${envs[@]}" "$NETBENCH_BIN" --plugin "$NETBENCH_PLUGIN" --rank "$r" --nranks 2 \
            --rendezvous "$rdv" --workload bandwidth --bytes 8 --iters 1 --timeout 30 \
            >"$TMP/$what.out.$r" 2>"$TMP/$what.err.$r" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
    ((failed == 2)) || fail "$what (${envs[*]}): $failed of 2 ranks failed init, wanted 2"
}

need_root_lab() {
    if [[ $(id -u) -ne 0 ]] || ! ip netns list >/dev/null 2>&1; then
        echo "SKIP: lab tests need root and network namespaces" >&2
        exit 77
    fi
}

# netbench_pids RDV: the vigil-netbench processes started with `--rendezvous RDV` (a test's
# own $TMP names it: other jobs on the host have registries too and must not count).
netbench_pids() {
    pgrep -f -- "--rendezvous $1" | while read -r p; do
        [[ $(cat "/proc/$p/comm" 2>/dev/null) == vigil-netbench ]] && echo "$p"
    done
}

# judging PID...: the newest window of every PID's send primary path carries a baseline (its
# detector is past its warm-up and would flag the path), read with `$VIGIL_BIN dump`. False
# without a PID.
judging() {
    (($# > 0)) || return 1
    "${VIGIL_BIN:?VIGIL_BIN not set}" dump --windows 1 | python3 -c '
import json, sys
ours, paths, judged = set(sys.argv[1:]), {}, set()
for line in sys.stdin:
    r = json.loads(line)
    pid = str(r.get("pid"))
    if pid not in ours:
        continue
    if r["type"] == "path":
        paths[(pid, r["path"])] = (r["kind"], r["slot"])
    elif paths.get((pid, r["path"])) == ("send", "primary") and r["baseline_Bps"] > 0:
        judged.add(pid)
sys.exit(0 if judged == ours else 1)' "$@"
}
