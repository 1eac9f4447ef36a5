#!/usr/bin/python3
"""What does encryption cost a training job? The MLP on 2 emulated nodes x 2 workers
(scripts/emulated_cluster.sh), DDP and hierarchical averaging (1:2,16:4, as
scripts/hierarchy_experiment.py runs them), each over TLS 1.3 (the default) and over plain TCP
(--insecure), at each --rates value. The jobs run in rounds, every (mode, rate, transport) once
per round with TLS and plain TCP next to each other, so that the two meet about the same machine
load; the table gives medians over the rounds.

Per job it reads rank 0's --metrics-out record at the end of the epoch (training seconds,
evaluations excluded; test accuracy) and the link statistics (bytes across the link, both ways).
  cost      s / epoch over TLS / s / epoch over plain TCP - 1 (medians), the targets being at
            most 10% (DDP) and 3% (hierarchical) at 1 Gbit/s and nothing measurable at 100 Mbit/s;
  AES CPU   the link's bytes x the CPU seconds per GB of AES-128-GCM on this machine
            (`openssl speed -evp aes-128-gcm`, 16 KiB blocks, one core): the least CPU time
            encryption adds to the job, spread over its 4 processes and both directions.

  sudo scripts/encryption_cost.py                          # 1gbit,100mbit; 3 rounds
  sudo scripts/encryption_cost.py --rates 1gbit --modes ddp --rounds 5
Needs root (network namespaces). About 20-60 s per job on an idle 2-core machine.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import experiment_args as ea  # noqa: E402  (the options every experiment shares)
import hierarchy_experiment as hx  # noqa: E402  (the job runner and the modes)

TRANSPORTS = ("tls", "plain")


def aes_gcm_seconds_per_gb():
    """CPU seconds one core spends encrypting 1 GB with AES-128-GCM (OpenSSL's EVP, 16 KiB
    blocks), or None when `openssl speed` cannot be run."""
    try:
        out = subprocess.run(["openssl", "speed", "-evp", "aes-128-gcm", "-bytes", "16384",
                              "-seconds", "2"], capture_output=True, text=True, timeout=60,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    # The last line: "AES-128-GCM  <bytes per second in thousands>k"
    m = re.search(r"^aes-128-gcm\s+([0-9.]+)k\s*$", out, re.MULTILINE | re.IGNORECASE)
    return 1e9 / (float(m[1]) * 1e3) if m else None


def program(args, mode, metrics_path):
    return [os.path.join(args.build, "apps/train_mlp/train_mlp"), "--epochs", "1",
            "--seed", str(args.seed), "--metrics-out", metrics_path] + hx.MODES[mode][1]


def run_job(args, mode, rate, transport, round_index):
    name = f"{mode}_{rate}_{transport}_round{round_index}"
    log_path = os.path.join(args.log_dir, name + ".log")
    metrics_path = os.path.join(args.log_dir, name + ".jsonl")
    if os.path.exists(metrics_path):
        os.unlink(metrics_path)
    load = os.getloadavg()[0]
    flags = ["--rate", rate, "--nproc-per-node", "2"]
    if transport == "plain":
        flags.append("--insecure")
    link = hx.run_on_cluster(flags, program(args, mode, metrics_path), args, log_path, name)
    with open(metrics_path) as f:
        last = [json.loads(line) for line in f if line.strip()][-1]
    return {"mode": mode, "rate": rate, "transport": transport, "round": round_index,
            "train_s": last["train_s"], "accuracy": 100 * last["test_accuracy"],
            "mb_across_link": (int(link["bytes_node0_to_node1"]) +
                               int(link["bytes_node1_to_node0"])) / 1e6,
            "load": round(load, 1)}


def table(args, results, aes_s_per_gb):
    lines = ["| mode | link | TLS s / epoch (min-max) | plain s / epoch (min-max) | cost | "
             "MB across the link | AES CPU s | test acc. TLS / plain | load |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for mode in args.modes:
        for rate in args.rates:
            rows = {t: [r for r in results if (r["mode"], r["rate"], r["transport"]) ==
                        (mode, rate, t)] for t in TRANSPORTS}
            if not rows["tls"] or not rows["plain"]:
                continue
            cells = []
            for t in TRANSPORTS:
                times = [r["train_s"] for r in rows[t]]
                cells.append(f"{statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f})")
            cost = ea.median(rows["tls"], "train_s") / ea.median(rows["plain"], "train_s") - 1
            mb = ea.median(rows["tls"], "mb_across_link")
            aes = f"{mb / 1e3 * aes_s_per_gb:.2f}" if aes_s_per_gb else ""
            lines.append(
                f"| {mode} | {rate} | {cells[0]} | {cells[1]} | {100 * cost:+.1f}% | {mb:.0f} | "
                f"{aes} | {ea.median(rows['tls'], 'accuracy'):.2f}% / "
                f"{ea.median(rows['plain'], 'accuracy'):.2f}% | "
                f"{ea.median(rows['tls'] + rows['plain'], 'load'):.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="ddp,hierarchical",
                        help="subset of ddp,hierarchical (default both)")
    ea.add_job_arguments(parser, rates="1gbit,100mbit", port=29470, run_timeout=600)
    args = parser.parse_args()
    args.modes = args.modes.split(",")
    for mode in args.modes:
        if mode not in ("ddp", "hierarchical"):
            parser.error(f"--modes: expected ddp or hierarchical, got '{mode}'")
    ea.check_job_arguments(parser, args, "hsgd-encryption-")

    aes_s_per_gb = aes_gcm_seconds_per_gb()
    results = []
    for round_index in range(1, args.rounds + 1):
        for mode in args.modes:
            for rate in args.rates:
                # Alternate which transport goes first, so that neither always meets the
                # machine right after the other's job.
                order = TRANSPORTS if round_index % 2 else tuple(reversed(TRANSPORTS))
                for transport in order:
                    row = run_job(args, mode, rate, transport, round_index)
                    results.append(row)
                    print(f"round {round_index}: {mode}, {rate}, {transport}: "
                          f"{row['train_s']:.2f} s, {row['mb_across_link']:.0f} MB, "
                          f"{row['accuracy']:.2f}%, load {row['load']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print()
    aes = (f"AES-128-GCM: {aes_s_per_gb:.3f} CPU s per GB on one core"
           if aes_s_per_gb else "AES-128-GCM: openssl speed could not be run")
    print(f"MLP, 2 emulated nodes x 2 workers, 1 epoch; {args.rounds} round(s); {aes}; "
          f"logs in {args.log_dir}")
    print(table(args, results, aes_s_per_gb))


if __name__ == "__main__":
    main()
