#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The tuner through its ABI, on loopback: vigil-netbench loads libnccl-tuner-vigil.so (or
# the net library's copy) like NCCL, per tuner version NCCL may pick (v7 .. v3), and every
# rank must make the same decisions. Rules pick ring/ll128 with 2 channels and, under
# v6/v7, a chunk; NCCL_PROTO=^LL128 (a -1 entry) makes that rule fall through; a rejected
# rules file leaves NCCL's choice (and fails init with VIGIL_TUNER_STRICT=1).
source "$(dirname "$0")/../functional/lib.sh"
TUNER_SO=${TUNER_SO:?TUNER_SO not set}
export VIGIL_SOCKET_IFNAME="=lo" VIGIL_TUNER_STORE=shm VIGIL_TUNER_BLOCK=2
rules=$TMP/rules.conf
printf '# forced choice\nallreduce,0,-1,ring,ll128,2,-1,-1,-1,-1,any,100000\n' >"$rules"
export NCCL_TUNER_CONFIG_FILE=$rules

decision() { grep -m1 "^# tuner rank 0 iter 0:" "$1" | sed 's/.*-> //'; }

for v in 7 6 5 4 3; do
    out=$(VIGIL_BENCH_TUNER_API=$v NCCL_DEBUG=INFO run_ranks 2 --workload allreduce --bytes 1M --iters 3 --tuner "$TUNER_SO")
    expect_ok "$out"
    [[ $(json_get "$out" tuner_agree) == True ]] || fail "v$v: ranks disagree"
    [[ $(json_get "$out" tuner_api) == "$v" ]] || fail "v$v: driver used another version"
    got=$(decision "$out")
    case $v in
    7 | 6) want="algo 1 proto 1 channels 2 chunk 99840" ;; # 100000 rounded down to the LL128 grain (1920)
    *) want="algo 1 proto 1 channels 2 chunk 230400" ;;    # no getChunkSize before v6: NCCL's chunk
    esac
    [[ $got == "$want" ]] || fail "v$v: expected '$want', got '$got'"
    if ((v <= 4)); then
        grep -q "passes no communicator id: rules apply, health steering is off" "$out.err.0" ||
            fail "v$v: no 'steering off' line"
    else
        grep -q "agreed health view through shm" "$out.err.0" || fail "v$v: no agreement"
    fi
    echo "v$v: $got"
done

# The same from the net plugin's library (NCCL's fallback when no tuner library opens).
out=$(run_ranks 2 --workload allreduce --bytes 1M --iters 2 --tuner net)
expect_ok "$out"
[[ $(decision "$out") == "algo 1 proto 1 channels 2 chunk 99840" ]] || fail "net library: $(decision "$out")"

# NCCL_PROTO=^LL128: the rule's entry is -1, so it is skipped and NCCL's choice stands.
out=$(NCCL_PROTO=^LL128 run_ranks 2 --workload allreduce --bytes 1M --iters 2 --tuner "$TUNER_SO")
expect_ok "$out"
got=$(decision "$out")
[[ $got != *"proto 1 "* && $got == *"channels 1 "* ]] || fail "NCCL_PROTO=^LL128: got '$got'"

# A rejected file: one WARN naming file:line, NCCL's choice; strict mode fails init.
printf 'allreduce,0,-1,ring,ll128,2,-1,-1\nallreduce,0,-1,warp,ll,2,-1,-1\n' >"$rules"
out=$(NCCL_DEBUG=WARN run_ranks 2 --workload allreduce --bytes 1M --iters 2 --tuner "$TUNER_SO")
expect_ok "$out"
grep -q "rules file rejected whole: $rules:2: unknown algorithm 'warp'" "$out.err.0" || fail "no WARN for the bad file"
[[ $(grep -c "rules file rejected" "$out.err.0") == 1 ]] || fail "more than one WARN for the bad file"
[[ $(decision "$out") != *"proto 1 channels 2"* ]] || fail "a rejected file still steered"
if (VIGIL_TUNER_STRICT=1 run_ranks 2 --workload allreduce --bytes 1M --iters 1 --tuner "$TUNER_SO") >"$TMP/strict.out" 2>&1; then
    fail "VIGIL_TUNER_STRICT=1 with a bad rules file did not fail init"
fi
grep -q "tuner init returned ncclResult 5" "$TMP/strict.out" || { cat "$TMP/strict.out" >&2; fail "strict: init did not fail with ncclInvalidUsage"; }
echo "tuner abi: ok"
