# SPDX-License-Identifier: Apache-2.0
# Sourced by the side-by-side benchmark scripts (run from the repository root).

# run_in WHERE CMD...: WHERE is "local" or a lab host index (scripts/netlab.sh exec).
run_in() { local w=$1; shift; if [[ $w == local ]]; then "$@"; else scripts/netlab.sh exec "$w" -- "$@"; fi; }
# median X...: the median of the numbers.
median() { python3 -c 'import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }
# jget FILE KEY: KEY of the last JSON line of FILE (vigil-netbench's summary).
jget() { python3 -c 'import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])[sys.argv[2]])' "$1" "$2"; }
