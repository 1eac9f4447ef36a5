#!/usr/bin/python3
"""Draws --metrics-out files of train_mlp / train_resnet into one PNG.

Usage: scripts/plot_metrics.py FILE.jsonl... [-o OUT.png] [--title TEXT]

Four panels, one line per file (legend: the file name without .jsonl):
  test accuracy against steps, test accuracy against wall seconds, training loss against steps,
  and the bytes sent by each model averaging level against steps (cumulative; one line per level
  and file, dashed for the second level, dotted for the third, ...).
Each file is JSON lines as written by apps/common/metrics_log.h. A line cut short by a killed run
is skipped with a warning. Needs matplotlib (Debian's python3-matplotlib: run with /usr/bin/python3).
"""

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt  # noqa: E402

LEVEL_STYLES = ["-", "--", ":", "-."]


def read_records(path):
    records = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                print(f"{path}:{number}: skipped, not JSON ({e})", file=sys.stderr)
    if not records:
        raise SystemExit(f"{path}: no records")
    return records


def label_of(path):
    name = os.path.basename(path)
    return name[:-len(".jsonl")] if name.endswith(".jsonl") else name


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", metavar="FILE.jsonl")
    parser.add_argument("-o", "--output", default="metrics.png", help="PNG to write")
    parser.add_argument("--title", default=None, help="figure title")
    args = parser.parse_args()

    fig, axes = plt.subplots(2, 2, figsize=(12, 8.5))
    (acc_steps, acc_wall), (loss_ax, bytes_ax) = axes
    any_levels = False
    for index, path in enumerate(args.files):
        records = read_records(path)
        label = label_of(path)
        color = f"C{index % 10}"
        evals = [r for r in records if r.get("test_accuracy") is not None]
        if evals:
            acc = [100 * r["test_accuracy"] for r in evals]
            acc_steps.plot([r["step"] for r in evals], acc, "o-", ms=3, color=color, label=label)
            acc_wall.plot([r["wall_s"] for r in evals], acc, "o-", ms=3, color=color, label=label)
        losses = [r for r in records if r.get("train_loss") is not None]
        if losses:
            loss_ax.plot([r["step"] for r in losses], [r["train_loss"] for r in losses],
                         color=color, label=label)
        # level (period, group size) -> [(step, bytes)]
        levels = {}
        for r in records:
            for level in r.get("averaging", []):
                key = (level["period"], level["group_size"])
                levels.setdefault(key, []).append((r["step"], level["bytes"]))
        for number, ((period, group), points) in enumerate(levels.items()):
            any_levels = True
            bytes_ax.plot([p[0] for p in points], [p[1] / 1e6 for p in points],
                          LEVEL_STYLES[number % len(LEVEL_STYLES)], color=color,
                          label=f"{label}: every {period} steps, groups of {group}")

    acc_steps.set(xlabel="step", ylabel="test accuracy (%)", title="test accuracy vs steps")
    acc_wall.set(xlabel="wall seconds", ylabel="test accuracy (%)",
                 title="test accuracy vs wall time")
    loss_ax.set(xlabel="step", ylabel="training loss (rank 0, mean since previous record)",
                title="training loss")
    bytes_ax.set(xlabel="step", ylabel="MB sent (cumulative, per rank)",
                 title="model averaging bytes per level")
    if not any_levels:
        bytes_ax.text(0.5, 0.5, "no model averaging\n(--mode ddp averages gradients)",
                      ha="center", va="center", transform=bytes_ax.transAxes, color="gray")
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
