#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Plots for `vigil report`: duration and bus bandwidth of every collective over time, one
# line per rank, from the "series" of report.json.
#   usage: vigil_plot.py REPORT_JSON OUT_DIR
#   writes OUT_DIR/duration_over_time.png and OUT_DIR/busbw_over_time.png
#   exit 0 done, 2 usage or unreadable report, 3 matplotlib cannot be imported (the report
#   then says the plots were skipped; this script prints nothing in that case)
import json
import os
import sys

MAX_LEGEND = 16  # more ranks than this: no legend, the lines alone


def plot(series, key, ylabel, title, path, plt, skip_zero=False):
    fig, ax = plt.subplots(figsize=(10, 5))
    comms = {s.get("comm") for s in series}
    drawn = 0
    for s in series:
        pts = [(t, y) for t, y in zip(s.get("t_s", []), s.get(key, []))
               if isinstance(t, (int, float)) and isinstance(y, (int, float)) and not (skip_zero and y <= 0)]
        if not pts:
            continue
        label = f"rank {s.get('rank')}"
        if len(comms) > 1:
            label += f" comm {str(s.get('comm'))[-6:]}"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", markersize=3, linewidth=0.8, label=label)
        drawn += 1
    ax.set_xlabel("time since first collective (s)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if drawn == 0:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center")
    elif drawn <= MAX_LEGEND:
        ax.legend(fontsize="small", ncol=2 if drawn > 8 else 1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv):
    if len(argv) != 3:
        print("usage: vigil_plot.py REPORT_JSON OUT_DIR", file=sys.stderr)
        return 2
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # missing, or broken (numpy ABI): the caller reports the skip
        return 3
    try:
        with open(argv[1]) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        print(f"vigil_plot: cannot read {argv[1]}: {e}", file=sys.stderr)
        return 2
    series = report.get("series") or []
    os.makedirs(argv[2], exist_ok=True)
    plot(series, "duration_us", "duration (us)", "collective duration per rank",
         os.path.join(argv[2], "duration_over_time.png"), plt)
    plot(series, "busbw_GBps", "bus bandwidth (GB/s)", "collective bus bandwidth per rank",
         os.path.join(argv[2], "busbw_over_time.png"), plt, skip_zero=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
