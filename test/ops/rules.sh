#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The operator's files without a server: promtool accepts the alert rules and the server
# configuration, the rules' unit tests pass (promtool test rules), the Grafana dashboard is
# well-formed for provisioning, and every metric the rules and the dashboard name is one the
# exporter serves (docs/operations.md's table) or a recording rule of the rules file.
#   usage: rules.sh SOURCE_ROOT
set -euo pipefail
SRC=${1:?usage: rules.sh SOURCE_ROOT}
command -v promtool >/dev/null || { echo "SKIP: promtool is not installed (scripts/setup.sh installs it)" >&2; exit 77; }
TMP=$(mktemp -d /tmp/vigil-rules.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
P=$SRC/deploy/prometheus

promtool check rules "$P/vigil-alerts.yml" || fail "promtool check rules"
(cd "$P" && promtool test rules vigil-alerts.test.yml) || fail "promtool test rules"
# The shipped server configuration, with the rules where this tree has them.
sed "s|/usr/share/vigil/prometheus/vigil-alerts.yml|$P/vigil-alerts.yml|" "$P/prometheus.yml" >"$TMP/prometheus.yml"
promtool check config --syntax-only "$TMP/prometheus.yml" || fail "promtool check config"

python3 - "$SRC" <<'PY' || fail "the dashboard or the names"
import json, re, sys
src = sys.argv[1]
sys.path.insert(0, f"{src}/test/ops")
import prom_lab
d = json.load(open(f"{src}/deploy/grafana/vigil-dashboard.json"))
prom_lab.check_dashboard(d)
documented = set(re.findall(r"^\| `(vigil_\w+)` \|", open(f"{src}/docs/operations.md").read(), re.M))
rules = open(f"{src}/deploy/prometheus/vigil-alerts.yml").read()
recorded = set(re.findall(r"record: (\S+)", rules))
exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
exprs += [v["query"]["query"] for v in d["templating"]["list"] if v["type"] == "query"]
named = set(re.findall(r"\bvigil[_:][\w:]+", rules + "\n".join(exprs)))
unknown = sorted(n for n in named if n not in documented and n not in recorded)
assert not unknown, f"rules or dashboard name metrics the exporter does not serve: {unknown}"
alerts = re.findall(r"alert: (\w+)", rules)
tests = open(f"{src}/deploy/prometheus/vigil-alerts.test.yml").read()
untested = [a for a in alerts if f"alertname: {a}" not in tests]
assert not untested, f"alerts without a unit test: {untested}"
documented_alerts = set(re.findall(r"^\| `(Vigil\w+)` \|", open(f"{src}/docs/operations.md").read(), re.M))
assert documented_alerts == set(alerts), f"docs/operations.md alerts {sorted(documented_alerts)} vs {sorted(alerts)}"
panels = [p for p in d["panels"] if p["type"] != "row"]
print(f"dashboard: {len(panels)} panels, {len(exprs)} queries; {len(named)} metric names, all served; "
      f"{len(alerts)} alerts, each unit-tested and documented")
PY
echo "rules: ok"
