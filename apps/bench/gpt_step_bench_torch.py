#!/usr/bin/python3
"""PyTorch side of apps/bench/gpt_step_bench: the training step of models::GPT's twin
(models/gpt_torch.py) with AdamW on a fixed random batch of byte ids.

    /usr/bin/python3 apps/bench/gpt_step_bench_torch.py --threads 1 --batch-size 32

--cpu-time times the steps in the process's CPU time (time.process_time, every thread's) instead
of the wall clock, as gpt_step_bench --cpu-time does.

Prints the line that gpt_step_bench parses:
    RESULT <median step, ms> <peak resident memory above the process's before the model was
           built, MB>
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "models"))
from gpt_torch import GPT  # noqa: E402
from resnet_step_bench_torch import reset_peak_mb, status_mb  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--cpu-time", dest="cpu_time", action="store_true")
    p.add_argument("--wall-time", dest="cpu_time", action="store_false")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    before = reset_peak_mb()
    model = GPT(vocab_size=256, context=args.context, d_model=args.d_model, n_layers=args.layers,
                n_heads=args.heads, dropout=args.dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    ids = torch.randint(0, 256, (args.batch_size, args.context + 1))
    x, y = ids[:, :-1], ids[:, 1:].reshape(-1)
    clock = time.process_time if args.cpu_time else time.perf_counter
    times = []
    for i in range(args.warmup + args.steps):
        start = clock()
        opt.zero_grad()
        F.cross_entropy(model(x).reshape(-1, 256), y).backward()
        opt.step()
        if i >= args.warmup:
            times.append(clock() - start)
    times.sort()
    n = len(times)
    med = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    print("RESULT %.3f %.1f" % (1e3 * med, status_mb("VmHWM:") - before))


if __name__ == "__main__":
    main()
