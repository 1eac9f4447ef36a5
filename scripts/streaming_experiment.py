#!/usr/bin/python3
"""Streaming levels on the emulated cluster: time per epoch, bytes across the link, accuracy.

Does streaming hide the slow link, and what does it cost in accuracy? The MLP (or, with
--model resnet20, ResNet-20) on 2 emulated nodes x 2 workers (scripts/emulated_cluster.sh),
hierarchical averaging 1:2,16:4 with no warm-up, the top level with each of --configs'
options (the hierarchy text after '@': 'fragments=4,int4,ef', 'overlap=8,bf16', '' for plain
float32), at each --rates value. The jobs run in rounds, every (config, rate) once per round in
the same order, so that each pair meets about the same machine load; the table gives medians
over the rounds.

Per job it reads rank 0's last --metrics-out record (training seconds, evaluations excluded; test
accuracy; the top level's averagings: bytes this rank sent and the busiest 100 ms of its link use)
and the link statistics (bytes across the link both ways, the whole job: every averaging
including a level's first, handshakes, TCP and TLS overhead). From them:
  ratio       s / epoch at the rate / s / epoch of the same config without limit (medians);
  link bytes  the job's bytes across the link / those of plain float32 '16:4' (the first config
              that has no options, run at any rate), when that config is among --configs;
  test acc.   the median over the rounds, with min-max when the rounds differ (a job is
              deterministic for a seed when they do not).

The models run as scripts/hierarchy_experiment.py runs them (its MODELS): the MLP (train_mlp)
on all of Fashion-MNIST, ResNet-20 (train_resnet, 1x28x28 Fashion-MNIST, crop + flip, batch 32
per worker) on all of it too unless --train-subset / --max-eval shorten it; test accuracy at
the end of the last epoch (on the whole test set unless --max-eval).

  sudo scripts/streaming_experiment.py      # plain; overlap=8,bf16; fragments=4,overlap=4,int8
  sudo scripts/streaming_experiment.py --configs ';fragments=4,overlap=4,int4,ef' \\
      --rates 25mbit,none --rounds 3
  sudo scripts/streaming_experiment.py --model resnet20 --epochs 2 --configs ';fragments=4,int8' \\
      --rates none --rounds 1 --run-timeout 1800             # accuracy only, ~10 min a job
--configs separates the configs with ';' (a config's options are separated by ','). A job that
fails is reported (its log names the cause), the others still run, and the exit code is 1.
Needs root (network namespaces). About 20-40 s per MLP job (one epoch) on an idle 2-core
machine; ResNet-20 about 3.5 minutes per epoch on all 60,000 images.
"""

import argparse
import json
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import experiment_args as ea  # noqa: E402  (the options every experiment shares)
import hierarchy_experiment as hx  # noqa: E402  (the job runner)


def hierarchy(config):
    return "1:2,16:4" + (f"@{config}" if config else "")


def program(args, config, metrics_path):
    # --eval-every 0: the test set is evaluated at the epoch ends only.
    common = types.SimpleNamespace(build=args.build, model=args.model, epochs=args.epochs,
                                   eval_every=0, seed=args.seed, train_subset=args.train_subset,
                                   max_eval=args.max_eval)
    return hx.program_of(common) + [
        "--mode", "hierarchical", "--subgroup-size", "1", "--hierarchy", hierarchy(config),
        "--warmup-steps", "0", "--metrics-out", metrics_path]


def run_job(args, index, config, rate, round_index):
    name = f"config{index}_{rate}_round{round_index}"
    log_path = os.path.join(args.log_dir, name + ".log")
    metrics_path = os.path.join(args.log_dir, name + ".jsonl")
    if os.path.exists(metrics_path):
        os.unlink(metrics_path)
    load = os.getloadavg()[0]
    link = hx.run_on_cluster(["--rate", rate, "--nproc-per-node", "2"],
                             program(args, config, metrics_path), args, log_path, name)
    with open(metrics_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    last = records[-1]
    top = last["averaging"][-1]
    return {"config": config, "rate": rate, "round": round_index,
            "s_per_epoch": last["train_s"] / args.epochs,
            "accuracy": 100 * last["test_accuracy"],
            "epoch_accuracies": [100 * r["test_accuracy"] for r in records
                                 if "test_accuracy" in r],
            "top_calls": top["count"], "top_bytes": top["bytes"],
            "top_peak_mb_s": top.get("peak_mb_per_s"),
            "overlap_wait_s": top.get("overlap_wait_seconds", 0.0),
            "mb_across_link": (int(link["bytes_node0_to_node1"]) +
                               int(link["bytes_node1_to_node0"])) / 1e6,
            "load": round(load, 1)}


def accuracy_cell(rows):
    """The median test accuracy of rows, with min-max when they differ."""
    values = [r["accuracy"] for r in rows]
    text = f"{ea.median(rows, 'accuracy'):.2f}%"
    if max(values) != min(values):
        text += f" ({min(values):.2f}-{max(values):.2f})"
    return text


def table(args, results):
    plain = [r for r in results if r["config"] == ""]
    plain_mb = ea.median(plain, "mb_across_link") if plain else None
    lines = ["| top level | link | s / epoch (median, min-max) | ratio to no limit | waited for "
             "overlapped averagings, s | MB across the link | of float32 16:4 | busiest 100 ms, "
             "MB/s | test acc. | load |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for config in args.configs:
        unlimited = [r for r in results if r["config"] == config and r["rate"] == "none"]
        base = ea.median(unlimited, "s_per_epoch") if unlimited else None
        for rate in args.rates:
            rows = [r for r in results if r["config"] == config and r["rate"] == rate]
            if not rows:
                continue
            s = ea.median(rows, "s_per_epoch")
            spread = (f"{min(r['s_per_epoch'] for r in rows):.2f}-"
                      f"{max(r['s_per_epoch'] for r in rows):.2f}")
            ratio = f"{s / base:.2f}x" if base and rate != "none" else ""
            mb = ea.median(rows, "mb_across_link")
            share = f"1/{plain_mb / mb:.1f}" if plain_mb and config else ""
            peak = ea.median(rows, "top_peak_mb_s")
            lines.append(
                f"| 16:4{'@' + config if config else ''} | {rate} | {s:.2f} ({spread}) | "
                f"{ratio} | {ea.median(rows, 'overlap_wait_s'):.3f} | {mb:.1f} | {share} | "
                f"{'' if peak is None else f'{peak:.1f}'} | {accuracy_cell(rows)} | "
                f"{ea.median(rows, 'load'):.1f} |")
    return "\n".join(lines)


def plot(args, results, path):
    """Per config (one group of bars each): seconds per epoch at each rate (medians, the rounds'
    spread as error bars), labelled with the ratio to the unlimited link; beside it the job's MB
    across the link. From `results` (the rows that ran), so --from-json can redraw a run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (times, sizes) = plt.subplots(1, 2, figsize=(12, 4.5),
                                       gridspec_kw={"width_ratios": [2, 1]})
    width = 0.8 / max(1, len(args.rates))
    names = [f"16:4@{c}" if c else "16:4 (float32)" for c in args.configs]
    for j, rate in enumerate(args.rates):
        for i, config in enumerate(args.configs):
            rows = [r for r in results if r["config"] == config and r["rate"] == rate]
            if not rows:
                continue
            s = ea.median(rows, "s_per_epoch")
            low = s - min(r["s_per_epoch"] for r in rows)
            high = max(r["s_per_epoch"] for r in rows) - s
            x = i + (j - (len(args.rates) - 1) / 2) * width
            times.bar(x, s, width, yerr=[[low], [high]], color=f"C{j}",
                      label=(rate if rate != "none" else "no limit") if i == 0 else None,
                      capsize=3)
            base = [r for r in results if r["config"] == config and r["rate"] == "none"]
            if base and rate != "none":
                times.annotate(f"{s / ea.median(base, 's_per_epoch'):.2f}x", (x, s + high),
                               ha="center", va="bottom", fontsize=8)
    times.set_xticks(range(len(names)))
    times.set_xticklabels(names, rotation=15, ha="right", fontsize=8)
    times.set_ylabel("s per epoch (training, median)")
    times.legend(title="link")
    times.set_title("Epoch time; labels: ratio to the unlimited link")
    mb = [ea.median([r for r in results if r["config"] == c], "mb_across_link")
          if any(r["config"] == c for r in results) else 0 for c in args.configs]
    sizes.bar(range(len(names)), mb, color="C7")
    for i, value in enumerate(mb):
        sizes.annotate(f"{value:.1f}", (i, value), ha="center", va="bottom", fontsize=8)
    sizes.set_xticks(range(len(names)))
    sizes.set_xticklabels(names, rotation=15, ha="right", fontsize=8)
    sizes.set_ylabel("MB across the link, both ways, whole job")
    sizes.set_title("Bytes")
    fig.suptitle(f"{hx.MODELS[args.model]['label']}, 2 emulated nodes x 2 workers, "
                 f"--hierarchy 1:2,16:4@..., no warm-up, {args.epochs} epoch(s), "
                 f"{args.rounds} round(s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.split("\n")[2:]))
    parser.add_argument("--configs", default=";overlap=8,bf16;fragments=4,overlap=4,int8",
                        help="';'-separated option lists of the top level 16:4 ('' = plain "
                             "float32; default: plain, whole-model overlap 8 bf16, 4 fragments "
                             "int8)")
    parser.add_argument("--model", choices=sorted(hx.MODELS), default="mlp",
                        help="mlp: train_mlp; resnet20: train_resnet --model resnet20, batch 32 "
                        "per worker (default mlp)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per job (default 1)")
    parser.add_argument("--train-subset", type=int, default=0,
                        help="train on the first N training images (default 0: all)")
    parser.add_argument("--max-eval", type=int, default=0,
                        help="test images per evaluation (default 0: all 10,000)")
    ea.add_job_arguments(parser, rates="100mbit,none", port=29480, run_timeout=900)
    parser.add_argument("--plot", default=None, metavar="PNG",
                        help="also draw the epoch times and bytes per config to this file")
    parser.add_argument("--from-json", default=None, metavar="FILE",
                        help="run nothing: print the table (and --plot) of the rows an earlier "
                             "--out wrote, with this run's --configs, --rates, --rounds")
    args = parser.parse_args()
    args.configs = args.configs.split(";")
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    for name in ("train_subset", "max_eval"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.from_json:
        if isinstance(args.rates, str):
            args.rates = args.rates.split(",")
        with open(args.from_json) as f:
            results = json.load(f)
        print(table(args, results))
        if args.plot:
            plot(args, results, args.plot)
        return
    ea.check_job_arguments(parser, args, "hsgd-streaming-")

    results, failed = [], []
    for round_index in range(1, args.rounds + 1):
        for index, config in enumerate(args.configs):
            for rate in args.rates:
                try:
                    row = run_job(args, index, config, rate, round_index)
                except RuntimeError as e:  # one failed job does not lose the others
                    failed.append(f"round {round_index}: 16:4@{config}, {rate}: {e}")
                    print("FAILED " + failed[-1], flush=True)
                    continue
                results.append(row)
                print(f"round {round_index}: 16:4@{config}, {rate}: {row['s_per_epoch']:.2f} s "
                      f"per epoch, {row['mb_across_link']:.1f} MB across, "
                      f"{row['accuracy']:.2f}% (per epoch: "
                      f"{', '.join(f'{a:.2f}' for a in row['epoch_accuracies'])}), "
                      f"load {row['load']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print()
    print(f"{hx.MODELS[args.model]['label']}, 2 emulated nodes x 2 workers, --hierarchy "
          f"1:2,16:4@... --warmup-steps 0, {hx.shortened(args)}; {args.rounds} round(s); "
          f"logs in {args.log_dir}")
    print(table(args, results))
    if args.plot:
        plot(args, results, args.plot)
    if failed:
        print(f"\n{len(failed)} job(s) failed (not in the table):\n" + "\n".join(failed))
        sys.exit(1)


if __name__ == "__main__":
    main()
