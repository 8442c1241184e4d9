# SPDX-License-Identifier: Apache-2.0
"""Scrapes http://127.0.0.1:PORT/metrics, checks the Prometheus text exposition strictly
(HELP/TYPE lines, one TYPE per family before its samples, label syntax, numeric values), has
promtool lint it when promtool is installed, and checks that each FAMILY given has a sample
whose value sum is > 0 (name prefixed with '+') or that merely exists. A quick check for the
lab tests that read the exporter; what a Prometheus server makes of it is test/ops/'s.
Usage: prom_check.py [--save FILE] PORT [+]FAMILY...   (--save: the exposition checked, for
further checks of the same scrape)"""
import re
import shutil
import subprocess
import sys
import time
import urllib.request

args = sys.argv[1:]
save = None
if args[:1] == ["--save"]:
    save, args = args[1], args[2:]
port, wanted = args[0], args[1:]
text = ""
for _ in range(50):  # the exporter may still be starting
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        break
    except OSError:
        time.sleep(0.1)
assert text, "no exposition"
if save:
    open(save, "w").write(text)
name = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
label = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
sample = re.compile(rf"^({name})(\{{{label}(,{label})*\}})? (-?[0-9.eE+-]+|NaN|[+-]Inf)$")
types, sums = {}, {}
for line in text.splitlines():
    if line.startswith("# HELP "):
        assert re.match(rf"^# HELP {name} .+$", line), line
    elif line.startswith("# TYPE "):
        m = re.match(rf"^# TYPE ({name}) (counter|gauge|histogram|summary|untyped)$", line)
        assert m and m.group(1) not in types, line
        types[m.group(1)] = m.group(2)
    else:
        m = sample.match(line)
        assert m, f"bad sample line: {line!r}"
        assert m.group(1) in types, f"sample before its TYPE: {line!r}"
        sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(4))
if shutil.which("promtool"):
    lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert lint.returncode == 0, f"promtool check metrics: {lint.stdout}{lint.stderr}"
for w in wanted:
    fam = w.lstrip("+")
    assert fam in sums, f"{fam} missing"
    assert not w.startswith("+") or sums[fam] > 0, f"{fam} is 0"
print(f"exposition ok: {len(types)} families, {len(text.splitlines())} lines")
