#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What an operator sees, through a real Prometheus. A lab of 3 hosts x 3 ports: ports 0 and 1
# carry NCCL's traffic (shaped to 300 Mbit/s), port 2 is the management network. Each host is
# a node of its own (lab_host.sh: its own /dev/shm and host name) running `vigil export
# --all-users` on its management address, port 9464, as the vigil-exporter service does, and
# one rank of a looping ring all-reduce through libnccl-net-vigil.so with its tuner (agreeing
# through a Redis on host 0's management address) and profiler driven as NCCL drives them;
# each rank's RANK is set as a launcher sets it. Prometheus (Debian's, in the lab's switch on
# the management network) runs deploy/prometheus/prometheus.yml with 1 s intervals, this lab's
# targets and deploy/prometheus/vigil-alerts.yml. Host 1's port 0 is then degraded (to a
# quarter, as scripts/demo.sh does), failed and restored,
# and prom_lab.py judges every phase through Prometheus's HTTP API (the degraded, failover and
# failback counters, alerts and shares), then the whole run (every family present, no counter
# going down, every dashboard query returning series); `promtool check metrics` judges an
# exporter's exposition.
#   OPS_PNG=FILE   also draw the dashboard's panels from the same queries into FILE
#   OPS_KEEP=DIR   keep the run's files (ranks' and exporters' logs, Prometheus's config)
source "$(dirname "$0")/../functional/lib.sh"
need_root_lab
for t in prometheus promtool redis-server; do
    command -v "$t" >/dev/null || { echo "SKIP: $t is not installed (scripts/setup.sh installs it)" >&2; exit 77; }
done
if [[ ${NETLAB:-} == "" ]]; then exec "$NETLAB_SH" run -H 3 -P 3 -- "$0" "$@"; fi
VIGIL=${VIGIL_BIN:?VIGIL_BIN not set}
OPS=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$OPS/../.." && pwd)
# Debian's python3 (python3-yaml, python3-matplotlib) where another one comes first in PATH.
PY=python3
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import yaml' 2>/dev/null && PY=/usr/bin/python3
H=3
RATE=300mbit
CUT=75mbit # a quarter: the port, not the CPUs, sets its pace even on a loaded host
SW=$NETLAB-sw
mgmt() { echo "10.77.2.$(($1 + 1))"; }
for h in 0 1 2; do for p in 0 1; do "$NETLAB_SH" degrade "$h" "$p" "$RATE"; done; done
ip -n "$SW" addr add 10.77.2.254/24 dev br2 # Prometheus's address on the management network

PIDS=() redis="" prom=""
cleanup() {
    local p
    for p in "${PIDS[@]}" $prom $redis; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}" $prom $redis; do wait "$p" 2>/dev/null || true; done
    [[ -n ${OPS_KEEP:-} ]] && rm -rf "$OPS_KEEP" && cp -r "$TMP" "$OPS_KEEP"
    rm -rf "$TMP"
}
trap cleanup EXIT

"$NETLAB_SH" exec 0 -- redis-server --bind "$(mgmt 0)" --port 6379 --save "" --appendonly no \
    --protected-mode no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
redis=$!

# The ranks, each on its own node with its exporter.
rdv="unix:$TMP/rdv.sock"
# 4 MiB slices, as scripts/demo.sh: 16 pieces a message, so multipath can give the cut port
# fewer. A message then takes tens of ms; 20 ms windows make the detector's spans (32 windows)
# hold the 5 completions it learns a baseline from.
export NCCL_DEBUG=INFO VIGIL_SOCKET_IFNAME==eth0,eth1 VIGIL_FAILBACK_HOLD_MS=500 VIGIL_WINDOW_US=20000 \
    VIGIL_TUNER_STORE="redis://$(mgmt 0):6379" VIGIL_TUNER_BLOCK=8
for ((r = H - 1; r >= 0; r--)); do
    "$NETLAB_SH" exec "$r" -- env RANK="$r" "$OPS/lab_host.sh" "node$r" "$(mgmt "$r"):9464" "$VIGIL" \
        "$TMP/export.$r.log" -- "$NETBENCH_BIN" --plugin "$NETBENCH_PLUGIN" --rank "$r" --nranks "$H" \
        --rendezvous "$rdv" --timeout 600 --workload allreduce --loop --bytes 16M --slice 4M --channels 2 \
        --tuner net --profile net >"$TMP/rank$r.out" 2>"$TMP/rank$r.err" &
    PIDS[r]=$!
done

# Prometheus, from the shipped configuration: only the intervals, the rule file's path and the
# target list change.
"$PY" - "$SRC/deploy/prometheus/prometheus.yml" "$TMP" "$SRC/deploy/prometheus/vigil-alerts.yml" \
    "$(mgmt 0)" "$(mgmt 1)" "$(mgmt 2)" <<'PY'
import sys, yaml
conf, tmp, rules, *targets = sys.argv[1:]
c = yaml.safe_load(open(conf))
c["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
c["rule_files"] = [rules]
job, = [j for j in c["scrape_configs"] if j["job_name"] == "vigil"]
job["file_sd_configs"] = [{"files": [f"{tmp}/targets.yml"]}]
yaml.safe_dump(c, open(f"{tmp}/prometheus.yml", "w"))
yaml.safe_dump([{"targets": [f"{t}:9464" for t in targets]}], open(f"{tmp}/targets.yml", "w"))
PY
promtool check config "$TMP/prometheus.yml" >/dev/null || fail "promtool rejects the configuration"
ip netns exec "$SW" prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
    --web.listen-address=127.0.0.1:9090 --log.level=warn >"$TMP/prometheus.log" 2>&1 &
prom=$!

lab() { ip netns exec "$SW" "$PY" "$OPS/prom_lab.py" "$@" --state "$TMP/state.json" \
    --exposition "$TMP/exposition.txt" --hosts "$H" --host 1 --port 0 --instance "$(mgmt 1)" \
    --netlab "$NETLAB_SH" --rate "$RATE" --cut-rate "$CUT"; }
t0=$SECONDS
lab phases || { tail -n 5 "$TMP"/rank*.err "$TMP/prometheus.log" >&2; fail "the phases"; }

# promtool lints the exposition as one exporter served it mid-run.
promtool check metrics <"$TMP/exposition.txt" || fail "promtool check metrics rejects the exposition"
echo "promtool check metrics: $(grep -c '^# TYPE' "$TMP/exposition.txt") families accepted"

# The job stops as it would: the ranks agree to end after one iteration (SIGUSR1 to one).
kill -USR1 "$(netbench_pids "$rdv" | head -1)"
rc=0
for r in 0 1 2; do wait "${PIDS[r]}" || rc=1; done
PIDS=()
((rc == 0)) || { tail -n 20 "$TMP"/rank*.err >&2; fail "a rank failed"; }
python3 - "$TMP/rank0.out" <<'PY' || fail "the all-reduce was not exact"
import json, sys
s = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert s["ok"] and s["errors"] == 0, s
print(f"all-reduce: {s['bytes'] >> 20} MiB per rank reduced, every byte exact")
PY
lab final --dashboard "$SRC/deploy/grafana/vigil-dashboard.json" ${OPS_PNG:+--png "$OPS_PNG"} ||
    fail "the run as Prometheus saw it"
grep -h "scrape errors\|skipping" "$TMP"/export.*.log && fail "an exporter could not read a segment"
echo "prometheus lab: ok ($((SECONDS - t0)) s from the first scrape to the last check)"
