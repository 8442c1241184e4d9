#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Regenerates the seed corpora in test/fuzz/corpus/ from Vigil's own encoders and writers:
# build-fuzz's fuzz-seeds writes the seeds of every target but the report's; those are cut
# from the files that a 2-rank all-reduce over loopback through the plugin writes (./build's
# vigil-netbench with the library's own profiler, and the telemetry writer on). Needs ./build
# (scripts/setup.sh) and build-fuzz (scripts/fuzz.sh).
#   usage: test/fuzz/make_corpus.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=test/fuzz/corpus
bench=build/test/netbench/vigil-netbench
plugin=build/net_plugin/libnccl-net-vigil.so
for f in build-fuzz/test/fuzz/fuzz-seeds "$bench" "$plugin"; do
    [[ -x $f || -f $f ]] || { echo "make_corpus.sh: $f is missing (build it first)" >&2; exit 2; }
done
tmp=$(mktemp -d /tmp/vigil-corpus.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

rm -rf "$out"
mkdir -p "$out"
build-fuzz/test/fuzz/fuzz-seeds "$out"

# A real job's files: profiler summary and trace, and telemetry, of two ranks.
mkdir -p "$tmp/files"
export VIGIL_SOCKET_IFNAME="=lo" VIGIL_PROFILE_DIR=$tmp/files VIGIL_TELEMETRY_DIR=$tmp/files
for r in 1 0; do
    "$bench" --plugin "$plugin" --rank "$r" --nranks 2 --rendezvous "unix:$tmp/rdv.sock" \
        --workload allreduce --bytes 1M --iters 12 --profile net >"$tmp/rank$r.log" 2>&1 &
    pids+=($!)
done
for p in "${pids[@]}"; do
    if ! wait "$p"; then
        echo "make_corpus.sh: a rank failed:" >&2
        cat "$tmp"/rank*.log >&2
        exit 1
    fi
done
pids=()

python3 - "$tmp/files" "$out/report" <<'PY'
import glob, os, re, sys

src, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
SEP = b"\x1e"  # the fuzz target's file separator (fuzz_report.cc)


def lines(path, n):
    with open(path, "rb") as f:
        return b"".join(f.readlines()[:n])


def records(path, per_type):
    """The first `per_type` lines of each record type, in file order, and its last line."""
    seen, out = {}, []
    with open(path, "rb") as f:
        all_lines = f.readlines()
    for ln in all_lines:
        m = re.search(rb'"type":"([a-z_]+)"', ln)
        t = m.group(1) if m else b""
        if seen.get(t, 0) < per_type:
            seen[t] = seen.get(t, 0) + 1
            out.append(ln)
    if all_lines and all_lines[-1] not in out:
        out.append(all_lines[-1])
    return b"".join(out)


summaries = sorted(glob.glob(f"{src}/vigil-prof-*.jsonl"))
traces = sorted(glob.glob(f"{src}/vigil-prof-*.trace.json"))
tele = sorted(p for p in glob.glob(f"{src}/vigil-*.jsonl") if "/vigil-prof-" not in p)
assert len(summaries) == 2 and len(traces) == 2 and len(tele) == 2, (summaries, traces, tele)


def seed(name, parts):
    with open(f"{out}/{name}", "wb") as f:
        f.write(SEP.join(parts))


# Rank A's summary, trace, telemetry; rank B's summary, rotated telemetry (fuzz_report.cc).
a_sum, b_sum = records(summaries[0], 1), records(summaries[1], 1)
a_trace = lines(traces[0], 4)  # cut: not valid JSON, salvaged line by line
a_tel, b_tel = records(tele[0], 1), records(tele[1], 1)
seed("run-heads", [a_sum, a_trace, a_tel, b_sum, b_tel])
seed("summaries", [records(summaries[0], 3), b"", b"", records(summaries[1], 3)])
seed("telemetry", [b"", b"", records(tele[0], 3), b"", records(tele[1], 3)])
# A whole trace: its first events closed as the writer closes the file.
seed("trace-closed", [b"", lines(traces[0], 8).rstrip().rstrip(b",") + b"\n]}\n"])
# Near-valid: a truncated last line, a record of an unknown type, bytes that are not
# UTF-8 in a name, numbers at the ends of a double's range.
seed("near-truncated", [a_sum[:-40], b"", a_tel[:-25], b_sum])
seed("near-odd-values", [
    a_sum.replace(b'"type":"coll"', b'"type":"coll","nranks":1e308', 1)
    + b'{"type":"future","x":1}\n',
    b"",
    a_tel.replace(b'"device":"', b'"device":"\xff\xfe', 1),
    b_sum.replace(b'"start_us":', b'"start_us":-1e308,"x":', 1),
])
PY
find "$out" -type f | sort | while read -r f; do printf '%6d %s\n' "$(stat -c %s "$f")" "$f"; done
