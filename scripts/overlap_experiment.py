#!/usr/bin/python3
"""Does overlap hide the slow link? The MLP on 2 emulated nodes x 2 workers
(scripts/emulated_cluster.sh), hierarchical averaging 1:2,16:4 with bf16 on the top level
(error feedback with --error-feedback), no warm-up, for each --overlaps value at each --rates
value. The jobs run in rounds, every (overlap, rate) once per round in the same order, so that
each pair meets about the same machine load; the table gives medians over the rounds.

Per job it reads rank 0's --metrics-out record at the end of the epoch: training seconds
(evaluations excluded), test accuracy, and the top level's averagings (calls, bytes this rank
sent between the nodes, seconds, overlap_wait_seconds: the time a step waited for an overlapped
averaging that had not arrived by its merge step). From them:
  window    overlap steps x the step time of the same overlap without a rate limit: the
            computation an averaging has to hide behind;
  transfer  the bytes rank 0 (node 0's leader) sent per averaging / the link's rate: the least
            time one averaging keeps the link busy;
  ratio     s / epoch at the limited rate / s / epoch without limit (medians).
Overlap can hide the link only when window >= transfer.

  sudo scripts/overlap_experiment.py                          # overlaps 0,8,16; 3 rounds
  sudo scripts/overlap_experiment.py --overlaps 8 --rounds 5
Needs root (network namespaces). About 25 s per job on an idle 2-core machine.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import cluster_bench as cb  # noqa: E402  (rate parsing)
import hierarchy_experiment as hx  # noqa: E402  (the job runner)

STEPS_PER_EPOCH = 235  # the MLP's epoch: 60,000 images / (4 workers x batch 64), rounded up


def program(args, overlap, metrics_path):
    return [os.path.join(args.build, "apps/train_mlp/train_mlp"), "--epochs", "1",
            "--seed", str(args.seed), "--mode", "hierarchical", "--subgroup-size", "1",
            "--hierarchy", args.hierarchy, "--warmup-steps", "0",
            "--overlap-steps", str(overlap), "--compression", "bf16",
            "--metrics-out", metrics_path] + (["--error-feedback"] if args.error_feedback else [])


def run_job(args, overlap, rate, round_index):
    name = f"overlap{overlap}_{rate}_round{round_index}"
    log_path = os.path.join(args.log_dir, name + ".log")
    metrics_path = os.path.join(args.log_dir, name + ".jsonl")
    if os.path.exists(metrics_path):
        os.unlink(metrics_path)
    load = os.getloadavg()[0]
    link = hx.run_on_cluster(["--rate", rate, "--nproc-per-node", "2"],
                             program(args, overlap, metrics_path), args, log_path, name)
    with open(metrics_path) as f:
        last = [json.loads(line) for line in f if line.strip()][-1]
    top = last["averaging"][-1]
    return {"overlap": overlap, "rate": rate, "round": round_index,
            "train_s": last["train_s"], "accuracy": 100 * last["test_accuracy"],
            "top_calls": top["count"], "top_bytes": top["bytes"], "top_seconds": top["seconds"],
            "overlap_wait_s": top.get("overlap_wait_seconds", 0.0),
            "mb_across_link": (int(link["bytes_node0_to_node1"]) +
                               int(link["bytes_node1_to_node0"])) / 1e6,
            "load": round(load, 1)}


def median(rows, key):
    return statistics.median(r[key] for r in rows)


def table(args, results):
    lines = ["| overlap | link | s / epoch (median, min-max) | ratio to no limit | waited for "
             "overlapped averagings, s | window ms | transfer ms | test acc. | load |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for overlap in args.overlaps:
        unlimited = [r for r in results if r["overlap"] == overlap and r["rate"] == "none"]
        base = median(unlimited, "train_s") if unlimited else None
        for rate in args.rates:
            rows = [r for r in results if r["overlap"] == overlap and r["rate"] == rate]
            if not rows:
                continue
            s = median(rows, "train_s")
            spread = f"{min(r['train_s'] for r in rows):.2f}-{max(r['train_s'] for r in rows):.2f}"
            ratio = f"{s / base:.2f}x" if base and rate != "none" else ""
            window = (f"{1e3 * overlap * base / STEPS_PER_EPOCH:.0f}"
                      if base and overlap else "")
            bits = cb.rate_bits(rate)
            per_call = median(rows, "top_bytes") / max(1, rows[0]["top_calls"])
            transfer = f"{1e3 * per_call * 8 / bits:.0f}" if bits else ""
            lines.append(
                f"| {overlap} | {rate} | {s:.2f} ({spread}) | {ratio} | "
                f"{median(rows, 'overlap_wait_s'):.3f} | {window} | {transfer} | "
                f"{median(rows, 'accuracy'):.2f}% | {median(rows, 'load'):.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--overlaps", default="0,8,16",
                        help="top-level overlap_steps values, comma-separated (default 0,8,16)")
    parser.add_argument("--rates", default="100mbit,none",
                        help="link rates, tc syntax or 'none' (default 100mbit,none)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all jobs (default 3)")
    parser.add_argument("--hierarchy", default="1:2,16:4",
                        help="--hierarchy of the jobs (default 1:2,16:4)")
    parser.add_argument("--error-feedback", action="store_true",
                        help="the top level adds its rounding error to the next averaging")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--port", type=int, default=29460)
    parser.add_argument("--run-timeout", type=int, default=600,
                        help="seconds before a job is stopped (default 600)")
    parser.add_argument("--log-dir", default=None,
                        help="job logs and metrics (default: a new directory under /tmp)")
    parser.add_argument("--out", default=None, help="also write the rows as JSON to this file")
    args = parser.parse_args()
    try:
        args.overlaps = [int(v) for v in args.overlaps.split(",")]
    except ValueError:
        parser.error(f"--overlaps: expected comma-separated integers, got '{args.overlaps}'")
    if any(v < 0 for v in args.overlaps):
        parser.error(f"--overlaps: expected values >= 0, got {args.overlaps}")
    args.rates = args.rates.split(",")
    for rate in args.rates:
        try:
            cb.rate_bits(rate)
        except ValueError as e:
            parser.error(f"--rates: {e}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix="hsgd-overlap-")
    os.makedirs(args.log_dir, exist_ok=True)

    results = []
    for round_index in range(1, args.rounds + 1):
        for overlap in args.overlaps:
            for rate in args.rates:
                row = run_job(args, overlap, rate, round_index)
                results.append(row)
                print(f"round {round_index}: overlap {overlap}, {rate}: {row['train_s']:.2f} s, "
                      f"waited {row['overlap_wait_s']:.3f} s, {row['accuracy']:.2f}%, "
                      f"load {row['load']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print()
    print(f"MLP, 2 emulated nodes x 2 workers, --hierarchy {args.hierarchy} --warmup-steps 0 "
          f"--compression bf16{' --error-feedback' if args.error_feedback else ''}; "
          f"{args.rounds} round(s); logs in {args.log_dir}")
    print(table(args, results))


if __name__ == "__main__":
    main()
