#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Vigil under stock NCCL on a GPU: an unchanged PyTorch program (test/gpu/torch_check.py) on
# the NCCL that PyTorch ships, ranks on one GPU made to look like hosts (distinct
# NCCL_HOSTID, P2P and SHM off) so every byte crosses the net plugin, with Vigil's three
# plugins from their paths and NCCL_NET=vigil (a load failure is fatal, never a silent
# fallback to NCCL's own transport). Phases (--only picks some):
#   collectives  every torch.distributed collective exact against the CPU, 2 and 4 ranks
#   ddp          DistributedDataParallel training bit-identical under Vigil and NCCL Socket
#   tuner        a rules file visibly changes NCCL's algorithm, protocol and channels
#   timing       the profiler's durations against CUDA events, 4 B to 256 MiB, 4 collectives
#   bandwidth    Vigil (default progress threads) against NCCL Socket tuned to 4 helper threads
#                of 4 sockets, all-reduce bus bandwidth at 2, 4, 8 and 16 channels
#   lab          2 hosts x 2 ports in network namespaces: a validated all-reduce loop through
#                a port failure (4 s) and a degraded port (300 Mbit/s, 4 s), Vigil and NCCL
#                Socket under the same faults; the degraded port must be flagged
# Writes OUT/gpu_check.json (every figure and verdict), OUT/gpu_check.txt (the same for a
# reader) and OUT/logs.tar.gz (every rank's log and result, the profiler's files: the
# recorded event sequences). Exit 0 all checks passed, 1 a check failed, 77 no GPU.
#   usage: scripts/gpu_check.sh [--kit DIR] [--out DIR] [--only PHASE[,PHASE...]] [--cpu]
#   --kit DIR   what scripts/gpu_kit.sh packed (plugins, vigil, ip/tc); default: ./build and
#               the system's ip/tc
#   --cpu       dry run without a GPU (gloo backend, CPU tensors): checks this script and
#               the program, not Vigil (no NCCL: tuner, timing, bandwidth are skipped)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
KIT="" ONLY="collectives,ddp,tuner,timing,bandwidth,lab" CPU=0
OUT=${OUT:-/tmp/vigil-gpu}
while (($#)); do
    case $1 in
    --kit) KIT=$(readlink -f "${2:?--kit DIR}"); shift 2 ;;
    --out) OUT=${2:?--out DIR}; shift 2 ;;
    --only) ONLY=${2:?--only PHASES}; shift 2 ;;
    --cpu) CPU=1; shift ;;
    -h | --help) sed -n '3,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
PY=${PYTHON:-python3}
WORK=${TMPDIR:-/tmp}/vigil-gpu-work # what OUT gets: the three files at the end
rm -rf "$WORK"
mkdir -p "$WORK/res" "$WORK/log" "$OUT"
say() { echo "gpu_check: $*" >&2; }
phase_on() { [[ ",$ONLY," == *",$1,"* ]]; }

if ((CPU)); then
    DEVICE=cpu
    "$PY" -c 'import torch.distributed' 2>/dev/null || { say "SKIP: no torch"; exit 77; }
else
    DEVICE=cuda
    if ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        say "SKIP: no CUDA device visible to $PY's torch"
        exit 77
    fi
fi
if [[ -n $KIT ]]; then
    LIB=$KIT/lib
    export PATH=$KIT/bin:$PATH
    VIGIL_BIN=$KIT/bin/vigil
else
    LIB=""
    VIGIL_BIN=$ROOT/build/tools/vigil
fi
NET=${LIB:-$ROOT/build/net_plugin}/libnccl-net-vigil.so
TUNER=${LIB:-$ROOT/build/tuner_plugin}/libnccl-tuner-vigil.so
PROF=${LIB:-$ROOT/build/profiler_plugin}/libnccl-profiler-vigil.so
for f in "$NET" "$TUNER" "$PROF"; do [[ -f $f ]] || { say "missing $f (build, or scripts/gpu_kit.sh)"; exit 2; }; done
"$PY" -c 'import torch; print("torch", torch.__version__, "nccl", getattr(torch.cuda, "nccl", None) and
          ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-")' \
    >"$WORK/versions.txt" 2>&1
nvidia-smi -L >>"$WORK/versions.txt" 2>/dev/null || true
say "$(tr '\n' ' ' <"$WORK/versions.txt")"

# Environment of every GPU rank: each its own host, nothing but the network between them.
COMMON=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,ENV,TUNING,PROFILE
        CUBLAS_WORKSPACE_CONFIG=:4096:8 PYTHONUNBUFFERED=1 PYTHONHASHSEED=0)
VIGIL=(NCCL_NET=vigil "NCCL_NET_PLUGIN=$NET" "NCCL_TUNER_PLUGIN=$TUNER" "NCCL_PROFILER_PLUGIN=$PROF"
       NCCL_NET_PLUGIN_REF_COUNT=1)
SOCKET=(NCCL_NET=Socket NCCL_TUNER_PLUGIN=none NCCL_PROFILER_PLUGIN=none)
LOOPBACK=("VIGIL_SOCKET_IFNAME==lo" "NCCL_SOCKET_IFNAME==lo")

PORT=$((29500 + RANDOM % 2000))
# ranks NAME N CASE [--in LAB] [VAR=VALUE...] [-- CASE ARGS...]: N ranks of torch_check.py (rank
# r in lab host r when --in is given), each ended after 240 s. Status 0 when all succeed.
ranks() {
    local name=$1 n=$2 case=$3 in_lab="" r p rc=0
    shift 3
    if [[ ${1:-} == --in ]]; then in_lab=$2; shift 2; fi
    local envs=() args=()
    while (($#)) && [[ $1 != -- ]]; do envs+=("$1"); shift; done
    [[ ${1:-} == -- ]] && { shift; args=("$@"); }
    PORT=$((PORT + 1))
    local master=127.0.0.1 pids=()
    [[ -n $in_lab ]] && master=10.77.0.1
    for ((r = 0; r < n; r++)); do
        local cmd=(timeout -k 5 240 env "${COMMON[@]}" "${envs[@]}" RANK=$r WORLD_SIZE=$n LOCAL_RANK=0
                   MASTER_ADDR=$master MASTER_PORT=$PORT "NCCL_HOSTID=vigil-$name-$r"
                   "$PY" "$ROOT/test/gpu/torch_check.py" "$case" --device "$DEVICE"
                   --out "$WORK/res/$name.rank$r.json" "${args[@]}")
        [[ -n $in_lab ]] && cmd=(env "NETLAB=$in_lab" "$ROOT/scripts/netlab.sh" exec "$r" -- "${cmd[@]}")
        "${cmd[@]}" >"$WORK/log/$name.rank$r.log" 2>&1 &
        pids+=($!)
    done
    # A rank that fails leaves the others waiting in a collective: end them 10 s later.
    # (Polled: `wait -n -p` would need bash 5.1.)
    local alive=("${pids[@]}") still failed_at=0
    while ((${#alive[@]})); do
        still=()
        for p in "${alive[@]}"; do
            if kill -0 "$p" 2>/dev/null; then
                still+=("$p")
            elif ! wait "$p"; then
                rc=1
                ((failed_at)) || failed_at=$SECONDS
            fi
        done
        alive=("${still[@]}")
        if ((failed_at && SECONDS - failed_at >= 10 && ${#alive[@]})); then
            kill -TERM "${alive[@]}" 2>/dev/null
            failed_at=$((SECONDS + 1000000)) # once
        fi
        ((${#alive[@]})) && sleep 0.2
    done
    ((rc == 0)) || say "$name: a rank failed (logs: $WORK/log/$name.rank*.log)"
    return $rc
}
gpu_only() { ((CPU == 0)) || { say "$1: skipped in --cpu (needs NCCL)"; return 1; }; }

if phase_on collectives; then
    say "collectives: 2 and 4 ranks"
    ranks coll2 2 collectives "${VIGIL[@]}" "${LOOPBACK[@]}"
    ranks coll4 4 collectives "${VIGIL[@]}" "${LOOPBACK[@]}"
fi
if phase_on ddp; then
    say "ddp: Vigil, then NCCL Socket"
    ranks ddp-vigil 2 ddp "${VIGIL[@]}" "${LOOPBACK[@]}"
    if gpu_only ddp-socket; then ranks ddp-socket 2 ddp "${SOCKET[@]}" "${LOOPBACK[@]}"; fi
fi
if phase_on tuner && gpu_only tuner; then
    say "tuner: without and with a rules file"
    printf '# every all-reduce: ring, LL, 2 channels\nallreduce,0,-1,ring,ll,2,-1,-1\n' >"$WORK/rules.conf"
    ranks tuner-none 2 tuner "${VIGIL[@]}" "${LOOPBACK[@]}" NCCL_TUNER_CONFIG_FILE=/nonexistent \
        "VIGIL_PROFILE_DIR=$WORK/prof-tuner-none"
    ranks tuner-rules 2 tuner "${VIGIL[@]}" "${LOOPBACK[@]}" "NCCL_TUNER_CONFIG_FILE=$WORK/rules.conf" \
        "VIGIL_PROFILE_DIR=$WORK/prof-tuner-rules"
fi
if phase_on timing && gpu_only timing; then
    say "timing: the profiler against CUDA events"
    ranks timing 2 timing "${VIGIL[@]}" "${LOOPBACK[@]}" "VIGIL_PROFILE_DIR=$WORK/prof-timing"
    [[ -x $VIGIL_BIN ]] && "$VIGIL_BIN" report --no-plots --out "$WORK/report-timing" "$WORK/prof-timing" \
        >"$WORK/log/report-timing.txt" 2>&1
fi
if phase_on bandwidth && gpu_only bandwidth; then
    say "bandwidth: Vigil and NCCL Socket (4 threads x 4 sockets), alternating, 2-16 channels"
    for ch in 2 4 8 16; do
        ranks "bw-socket-$ch" 2 bandwidth "${SOCKET[@]}" "${LOOPBACK[@]}" NCCL_MIN_NCHANNELS=$ch NCCL_MAX_NCHANNELS=$ch \
            NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4
        ranks "bw-vigil-$ch" 2 bandwidth "${VIGIL[@]}" "${LOOPBACK[@]}" NCCL_MIN_NCHANNELS=$ch NCCL_MAX_NCHANNELS=$ch
        # The same with one progress thread: what the threads add.
        ranks "bw-vigil1-$ch" 2 bandwidth "${VIGIL[@]}" "${LOOPBACK[@]}" NCCL_MIN_NCHANNELS=$ch NCCL_MAX_NCHANNELS=$ch \
            VIGIL_SOCKET_NTHREADS=1
    done
fi

# lab_run NAME TRANSPORT-ENV...: the validated loop in a fresh 2x2 lab. From the loop's first
# iteration (rank 0 writes NAME.started): port 0 of host 1 down at 3 s, up at 7 s, shaped to
# 300 Mbit/s at 10 s, whole again at 14 s; the loop runs 18 s. Fault times go to NAME.faults.
lab_run() {
    local name=$1 lab
    shift
    lab=$("$ROOT/scripts/netlab.sh" up -H 2 -P 2) || { say "$name: no lab (root, ip, tc?)"; return 1; }
    local mark=$WORK/res/$name.started faults=$WORK/res/$name.faults
    (
        for ((i = 0; i < 1200; i++)); do [[ -e $mark ]] && break; sleep 0.1; done
        [[ -e $mark ]] || exit 0
        t0=$(date +%s%N)
        at() { # AT SECONDS after the loop began
            local ms=$(((t0 + $1 * 1000000000 - $(date +%s%N)) / 1000000))
            ((ms > 0)) && sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
        }
        lab_do() { NETLAB=$lab "$ROOT/scripts/netlab.sh" "$@"; }
        at 3; echo "fail $(date +%s.%N)" >>"$faults"; lab_do fail 1 0
        at 7; lab_do restore 1 0; echo "restore $(date +%s.%N)" >>"$faults"
        at 10; echo "degrade $(date +%s.%N)" >>"$faults"; lab_do degrade 1 0 300mbit
        at 14; lab_do undegrade 1 0; echo "undegrade $(date +%s.%N)" >>"$faults"
    ) >"$WORK/log/$name.faults.log" 2>&1 &
    local fpid=$!
    ranks "$name" 2 loop --in "$lab" "$@" -- --seconds 18 --mark "$mark"
    local rc=$?
    wait "$fpid" 2>/dev/null
    NETLAB=$lab "$ROOT/scripts/netlab.sh" down >/dev/null 2>&1
    return $rc
}
if phase_on lab; then
    # The kit's ip and tc are the build host's: they need its glibc or a newer one.
    if [[ $EUID -ne 0 ]] || ! ip -V >/dev/null 2>&1 || ! tc -V >/dev/null 2>&1; then
        say "lab: skipped (needs root and working ip and tc; scripts/gpu_kit.sh packs them:" \
            "$(ip -V 2>&1 | head -1))"
    else
        say "lab: a port failure and a degraded port, Vigil then NCCL Socket"
        # NCCL's bootstrap (and gloo's, in --cpu) on eth0
        LABNET=(NCCL_SOCKET_IFNAME==eth0 VIGIL_SOCKET_IFNAME=eth GLOO_SOCKET_IFNAME=eth0)
        lab_run lab-vigil "${VIGIL[@]}" "${LABNET[@]}" NCCL_PROFILER_PLUGIN=none \
            "VIGIL_TELEMETRY_DIR=$WORK/lab-telemetry"
        if gpu_only lab-socket; then
            lab_run lab-socket "${SOCKET[@]}" NCCL_SOCKET_IFNAME=eth
        fi
    fi
fi

"$PY" "$ROOT/test/gpu/gpu_report.py" "$WORK" "$OUT/gpu_check.json" "$OUT/gpu_check.txt" --phases "$ONLY" \
    --device "$DEVICE"
status=$?
cat "$OUT/gpu_check.txt"
tar -C "$WORK" -czf "$OUT/logs.tar.gz" . 2>/dev/null
if (($(stat -c %s "$OUT/logs.tar.gz") > 15 * 1024 * 1024)); then # the device tool returns <= 16 MiB a file
    tar -C "$WORK" -czf "$OUT/logs.tar.gz" --exclude='*.trace.json' . 2>/dev/null
fi
exit $status
