#!/usr/bin/python3
"""Does streaming hide the slow link? The MLP on 2 emulated nodes x 2 workers
(scripts/emulated_cluster.sh), hierarchical averaging 1:2,16:4 with no warm-up, the top level
with each of --configs' options (the hierarchy text after '@': 'fragments=4,int4,ef',
'overlap=8,bf16', '' for plain float32), at each --rates value. The jobs run in rounds, every
(config, rate) once per round in the same order, so that each pair meets about the same machine
load; the table gives medians over the rounds.

Per job it reads rank 0's last --metrics-out record (training seconds, evaluations excluded; test
accuracy; the top level's averagings: bytes this rank sent and the busiest 100 ms of its link use)
and the link statistics (bytes across the link both ways, the whole job: every averaging
including a level's first, handshakes, TCP and TLS overhead). From them:
  ratio       s / epoch at the rate / s / epoch of the same config without limit (medians);
  link bytes  the job's bytes across the link / those of plain float32 '16:4' (the first config
              that has no options, run at any rate), when that config is among --configs.

  sudo scripts/streaming_experiment.py      # plain; overlap=8,bf16; fragments=4,overlap=4,int8
  sudo scripts/streaming_experiment.py --configs ';fragments=4,overlap=4,int4,ef' \\
      --rates 25mbit,none --rounds 3
--configs separates the configs with ';' (a config's options are separated by ',').
Needs root (network namespaces). About 20-40 s per job on an idle 2-core machine.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import experiment_args as ea  # noqa: E402  (the options every experiment shares)
import hierarchy_experiment as hx  # noqa: E402  (the job runner)


def hierarchy(config):
    return "1:2,16:4" + (f"@{config}" if config else "")


def program(args, config, metrics_path):
    return [os.path.join(args.build, "apps/train_mlp/train_mlp"), "--epochs", str(args.epochs),
            "--seed", str(args.seed), "--mode", "hierarchical", "--subgroup-size", "1",
            "--hierarchy", hierarchy(config), "--warmup-steps", "0",
            "--metrics-out", metrics_path]


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
        last = [json.loads(line) for line in f if line.strip()][-1]
    top = last["averaging"][-1]
    return {"config": config, "rate": rate, "round": round_index,
            "s_per_epoch": last["train_s"] / args.epochs,
            "accuracy": 100 * last["test_accuracy"],
            "top_calls": top["count"], "top_bytes": top["bytes"],
            "top_peak_mb_s": top.get("peak_mb_per_s"),
            "overlap_wait_s": top.get("overlap_wait_seconds", 0.0),
            "mb_across_link": (int(link["bytes_node0_to_node1"]) +
                               int(link["bytes_node1_to_node0"])) / 1e6,
            "load": round(load, 1)}


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
                f"{'' if peak is None else f'{peak:.1f}'} | {ea.median(rows, 'accuracy'):.2f}% | "
                f"{ea.median(rows, 'load'):.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default=";overlap=8,bf16;fragments=4,overlap=4,int8",
                        help="';'-separated option lists of the top level 16:4 ('' = plain "
                             "float32; default: plain, whole-model overlap 8 bf16, 4 fragments "
                             "int8)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per job (default 1)")
    ea.add_job_arguments(parser, rates="100mbit,none", port=29480, run_timeout=900)
    args = parser.parse_args()
    args.configs = args.configs.split(";")
    if args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    ea.check_job_arguments(parser, args, "hsgd-streaming-")

    results = []
    for round_index in range(1, args.rounds + 1):
        for index, config in enumerate(args.configs):
            for rate in args.rates:
                row = run_job(args, index, config, rate, round_index)
                results.append(row)
                print(f"round {round_index}: 16:4@{config}, {rate}: {row['s_per_epoch']:.2f} s "
                      f"per epoch, {row['mb_across_link']:.1f} MB across, "
                      f"{row['accuracy']:.2f}%, load {row['load']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print()
    print(f"MLP, 2 emulated nodes x 2 workers, --hierarchy 1:2,16:4@... --warmup-steps 0, "
          f"{args.epochs} epoch(s); {args.rounds} round(s); logs in {args.log_dir}")
    print(table(args, results))


if __name__ == "__main__":
    main()
