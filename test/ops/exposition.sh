#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `vigil export` as a node exporter, without a lab: two ranks over loopback through the net
# plugin (with its tuner and profiler), each with RANK set as a launcher sets it, and beside
# them a dead process's segment and an unreadable one. The exposition must pass `promtool
# check metrics`, declare exactly the families docs/operations.md lists, label every process's
# series with pid and rank and every port's with device (as node_exporter names NICs), and
# report the exporter's own health: segments read, the dead one removed, the unreadable one
# counted as a scrape error and named once on stderr.
#   usage: exposition.sh DOCS_OPERATIONS_MD   (VIGIL_BIN, NETBENCH_BIN, NETBENCH_PLUGIN from meson)
source "$(dirname "$0")/../functional/lib.sh"
DOC=${1:?usage: exposition.sh DOCS_OPERATIONS_MD}
VIGIL=${VIGIL_BIN:?VIGIL_BIN not set}
command -v promtool >/dev/null || { echo "SKIP: promtool is not installed (scripts/setup.sh installs it)" >&2; exit 77; }
command -v flock >/dev/null || { echo "SKIP: flock (util-linux) is not installed" >&2; exit 77; }
export VIGIL_SOCKET_IFNAME="=lo" VIGIL_FABRIC=tcp

# A dead process's registry (nobody holds its lock), and one a live process holds but that is
# not a segment of this build (junk): the first is removed, the second counted as an error.
shm=/dev/shm/vigil-$(id -u)
dead=$shm-2147483-$(printf '%016x' $((RANDOM * 65536 + RANDOM)))
junk=$shm-2147484-$(printf '%016x' $((RANDOM * 65536 + RANDOM)))
head -c 8192 /dev/zero | tr '\0' 'j' >"$dead"
cp "$dead" "$junk"
touch -d '-1 min' "$dead" "$junk"
exec {lockfd}<"$junk"
flock -s "$lockfd" # held by this shell's open file, as a live owner holds its segment
trap 'rm -f "$junk" "$dead"; rm -rf "$TMP"' EXIT

rdv="unix:$TMP/rdv.sock"
pids=()
for r in 1 0; do
    RANK=$r "$NETBENCH_BIN" --plugin "$NETBENCH_PLUGIN" --rank "$r" --nranks 2 --rendezvous "$rdv" --timeout 120 \
        --workload allreduce --bytes 1M --iters 100000 --loop --tuner net --tuner-nodes 1 --profile net \
        >"$TMP/rank$r.out" 2>"$TMP/rank$r.err" &
    pids+=($!)
done
stop_ranks() {
    kill -USR1 "${pids[0]}" 2>/dev/null || true
    local p rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

# Scrape until both ranks' collectives are counted (the profiler writes its counters from its
# writer thread): each look is one `vigil export --once`.
got=""
for _ in $(seq 600); do
    "$VIGIL" export --once >"$TMP/exposition.txt" 2>"$TMP/export.err" || fail "vigil export --once failed"
    mine=$(netbench_pids "$rdv" | paste -sd'|')
    if [[ -n $mine ]] && (($(grep -cE "^vigil_coll_total\{pid=\"($mine)\"" "$TMP/exposition.txt") >= 2)) &&
        (($(grep -cE "^vigil_tuner_calls_total\{pid=\"($mine)\"" "$TMP/exposition.txt") >= 2)); then
        got=1
        break
    fi
    sleep 0.2
done
# A second scrape by the same exporter is what a server sees: --once is one scrape, so the
# health counters are checked on it (one error, one removal) and the lint on both.
stop_ranks || { cat "$TMP"/rank*.err >&2; fail "a rank failed"; }
[[ -n $got ]] || { cat "$TMP/exposition.txt" >&2; fail "the ranks' collectives and tuner calls never showed"; }
expect_ok "$TMP/rank0.out"

promtool check metrics <"$TMP/exposition.txt" || fail "promtool check metrics rejects the exposition"
echo "promtool check metrics: ok ($(grep -c '^# TYPE' "$TMP/exposition.txt") families)"

python3 - "$TMP/exposition.txt" "$DOC" "$mine" "$dead" "$junk" "$TMP/export.err" <<'PY' || fail "the exposition"
import re, sys
text, doc, mine, dead, junk, err = sys.argv[1:]
mine = set(mine.split("|"))
lines = open(text).read().splitlines()
declared = [l.split()[2] for l in lines if l.startswith("# TYPE ")]
samples = []
for l in lines:
    if l.startswith("#"):
        continue
    m = re.match(r'^(\w+)(?:\{(.*)\})? (\S+)$', l)
    assert m, f"bad sample line {l!r}"
    labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
    samples.append((m.group(1), labels, float(m.group(3))))

# The documentation's table lists exactly the families the exporter declares.
documented = re.findall(r"^\| `(vigil_\w+)` \|", open(doc).read(), re.M)
assert sorted(documented) == sorted(declared), (
    f"docs/operations.md and the exporter differ: only documented {sorted(set(documented) - set(declared))}, "
    f"only declared {sorted(set(declared) - set(documented))}")

ours = [(n, l, v) for n, l, v in samples if l.get("pid") in mine]
ranks = {l["pid"]: l.get("rank") for n, l, v in ours}
assert sorted(ranks.values()) == ["0", "1"], f"ranks by pid: {ranks}"
for n, l, v in ours:
    assert "host" not in l and "instance" not in l and "job" not in l, f"{n} {l}: the server owns those"
    if n.startswith(("vigil_port_", "vigil_path_")):
        assert l.get("device") == "lo", f"{n} {l}: device"
fams = {n for n, l, v in ours}
for want in ("vigil_port_bytes_total", "vigil_port_failovers_total", "vigil_port_failbacks_total",
             "vigil_port_degraded_total", "vigil_path_connections", "vigil_path_rate_bytes", "vigil_path_share",
             "vigil_path_latency_p99_seconds", "vigil_connections_without_path", "vigil_coll_total",
             "vigil_coll_busbw_bytes", "vigil_profiler_events_total", "vigil_tuner_view_state", "vigil_tuner_calls_total"):
    assert want in fams, f"no {want} for the ranks"
sent = sum(v for n, l, v in ours if n == "vigil_port_bytes_total" and l["kind"] == "send")
assert sent > 0, "no bytes counted"
coll = [l for n, l, v in ours if n == "vigil_coll_total"]
assert all(l.get("comm_rank") in ("0", "1") and l.get("coll") == "allreduce" for l in coll), coll

health = {(n, l.get("kind")): v for n, l, v in samples if n.startswith(("vigil_exporter_", "vigil_build_info"))}
assert health[("vigil_exporter_scrapes_total", None)] == 1, health
assert health[("vigil_exporter_segments", "registry")] >= 2, health
assert health[("vigil_exporter_segments", "profiler")] >= 2, health
assert health[("vigil_exporter_segments", "tuner")] >= 2, health
print(f"exposition: {len(declared)} families as documented, {len(ours)} samples of ranks {sorted(ranks.values())}")
PY

# The exporter's health. Each `--once` is a fresh exporter: one scrape. The dead process's
# segment is gone (removed by the first scrape); the held junk one is still there, and each
# scrape counts it as an error and names it (other tests' segments may add to the counts).
[[ ! -e $dead ]] || fail "the dead process's segment was not removed"
[[ -e $junk ]] || fail "a held segment was removed"
"$VIGIL" export --once >"$TMP/again.txt" 2>"$TMP/again.err"
count() { awk -v n="$2" '$1 == n { print $2 }' "$1"; }
(($(count "$TMP/again.txt" vigil_exporter_scrape_errors_total) >= 1)) ||
    fail "the unreadable segment is not a scrape error: $(grep scrape_errors "$TMP/again.txt")"
grep -q "skipping $junk" "$TMP/again.err" || fail "the unreadable segment is not named on stderr"
exec {lockfd}<&- # released: the segment is now a dead process's
touch -d '-1 min' "$junk"
"$VIGIL" export --once >"$TMP/third.txt" 2>/dev/null
(($(count "$TMP/third.txt" 'vigil_exporter_segments_removed_total{kind="registry"}') >= 1)) ||
    fail "the released segment was not counted as removed: $(grep segments_removed "$TMP/third.txt")"
[[ ! -e $junk ]] || fail "the released segment was not removed"
echo "exposition: ok"
