#!/usr/bin/python3
"""The DiLoCo pitch, measured: a GPT (apps/train_gpt) on 2 emulated nodes x 2 workers joined by a
slow link (scripts/emulated_cluster.sh), trained with DDP (gradients of all 4 workers averaged
every step, across the link) and with hierarchical averaging and an outer optimizer (gradients
averaged within each node every step, through shared memory; every --period steps the two nodes
average their models across the link and take an outer Nesterov step). The same steps, batch
and seed for both. Writes under --out:
  gpt_diloco.csv          one row per evaluation: mode, step, training seconds (evaluations
                          excluded), validation loss
  gpt_diloco_summary.csv  one row per run: steps, training seconds, final validation loss, MB
                          across the link
  gpt_diloco.png          validation loss against training seconds, and against steps
and prints the summary as a Markdown table. Needs root (network namespaces); run with Debian's
/usr/bin/python3 (matplotlib). Results: docs/transformers.md.

  sudo /usr/bin/python3 scripts/gpt_diloco.py                       # 100 Mbit/s, 300 steps
  sudo /usr/bin/python3 scripts/gpt_diloco.py --rate 1gbit --steps 100 --eval-every 25
"""

import argparse
import csv
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hierarchy_experiment import ROOT, run_on_cluster  # noqa: E402

EVAL_LINE = re.compile(r"\[rank 0\] eval: epoch (\d+) step (\d+) train_s ([0-9.]+) "
                       r"test_accuracy ([0-9.]+)% test_loss ([0-9.]+)")


def modes(period, outer):
    return {
        "ddp": ("DDP: gradients of all 4 averaged every step", ["--mode", "ddp"]),
        "diloco": (f"hierarchical: node gradients every step, models across the link every "
                   f"{period} steps + outer Nesterov {outer}",
                   ["--mode", "hierarchical", "--hierarchy", f"{period}:world@outer={outer}",
                    "--warmup-steps", "0"]),
    }


def eval_rows(log_path):
    rows = []
    with open(log_path) as log:
        for line in log:
            m = EVAL_LINE.search(line)
            if m:
                rows.append({"step": int(m[2]), "train_s": float(m[3]),
                             "val_loss": float(m[5])})
    return rows


def plot(rows, labels, rate, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_time, ax_steps) = plt.subplots(1, 2, figsize=(12, 5))
    for mode, label in labels.items():
        points = [r for r in rows if r["mode"] == mode]
        ax_time.plot([p["train_s"] for p in points], [p["val_loss"] for p in points], "o-",
                     label=label, markersize=3)
        ax_steps.plot([p["step"] for p in points], [p["val_loss"] for p in points], "o-",
                      label=label, markersize=3)
    ax_time.set_xlabel("training seconds (rank 0, evaluations excluded)")
    ax_steps.set_xlabel("steps")
    for ax in (ax_time, ax_steps):
        ax.set_ylabel("validation loss (nats per byte)")
        ax.grid(alpha=0.3)
    handles, names = ax_time.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=1, fontsize=9)
    fig.suptitle(f"GPT on 2 emulated nodes x 2 workers, {rate} between the nodes")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", default="100mbit", help="link rate between the nodes (tc syntax)")
    p.add_argument("--steps", type=int, default=300, help="training steps of each run")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--period", type=int, default=16, help="steps between averagings across the link")
    p.add_argument("--outer", default="0.7/0.9/nesterov", help="outer optimizer: lr/momentum[/nesterov]")
    p.add_argument("--modes", default="ddp,diloco")
    p.add_argument("--max-eval", type=int, default=128, help="validation windows per evaluation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpt-flags", default="", help="more train_gpt flags, space-separated")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "results"))
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--port", type=int, default=29460)
    p.add_argument("--run-timeout", type=int, default=3600)
    p.add_argument("--plot-only", action="store_true",
                   help="redraw gpt_diloco.png from the gpt_diloco.csv under --out")
    args = p.parse_args()
    all_modes = modes(args.period, args.outer)
    chosen = args.modes.split(",")
    for m in chosen:
        if m not in all_modes:
            sys.exit(f"gpt_diloco: unknown mode '{m}'; expected one of {', '.join(all_modes)}")
    os.makedirs(args.out, exist_ok=True)
    if args.plot_only:
        with open(os.path.join(args.out, "gpt_diloco.csv")) as f:
            rows = [{"mode": r["mode"], "step": int(r["step"]), "train_s": float(r["train_s"]),
                     "val_loss": float(r["val_loss"])} for r in csv.DictReader(f)]
        present = [m for m in chosen if any(r["mode"] == m for r in rows)]
        plot(rows, {m: all_modes[m][0] for m in present}, args.rate,
             os.path.join(args.out, "gpt_diloco.png"))
        return
    # --epochs large enough that --max-steps ends the run (an epoch of the Bible at batch 32 on
    # 4 workers is 227 steps).
    program = [os.path.join(args.build, "apps/train_gpt/train_gpt"), "--epochs", "100",
               "--max-steps", str(args.steps), "--eval-every", str(args.eval_every), "--max-eval",
               str(args.max_eval), "--seed", str(args.seed), "--threads", "1",
               "--sample-tokens", "0"] + args.gpt_flags.split()
    rows, summary = [], []
    for mode in chosen:
        log_path = os.path.join(args.out, f"gpt_diloco_{mode}.log")
        print(f"gpt_diloco: {mode} at {args.rate} ...", flush=True)
        link = run_on_cluster(["--rate", args.rate, "--nproc-per-node", "2"],
                              program + all_modes[mode][1], args, log_path, mode)
        these = [dict({"mode": mode}, **r) for r in eval_rows(log_path)]
        if not these:
            sys.exit(f"gpt_diloco: {mode}: no 'eval:' lines in {log_path}")
        rows += these
        mb = (int(link.get("bytes_node0_to_node1", 0)) + int(link.get("bytes_node1_to_node0", 0))) / 1e6
        summary.append({"mode": mode, "steps": these[-1]["step"], "train_s": these[-1]["train_s"],
                        "final_val_loss": these[-1]["val_loss"], "mb_across_link": round(mb, 1)})
    with open(os.path.join(args.out, "gpt_diloco.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["mode", "step", "train_s", "val_loss"])
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(args.out, "gpt_diloco_summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    plot(rows, {m: all_modes[m][0] for m in chosen}, args.rate,
         os.path.join(args.out, "gpt_diloco.png"))
    print(f"\n| mode ({args.rate}) | steps | training s | final validation loss | MB across "
          "the link |\n|---|---|---|---|---|")
    for s in summary:
        print(f"| {s['mode']} | {s['steps']} | {s['train_s']:.1f} | {s['final_val_loss']:.4f} "
              f"| {s['mb_across_link']} |")


if __name__ == "__main__":
    main()
