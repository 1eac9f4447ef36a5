#!/usr/bin/python3
"""PyTorch side of apps/bench/ddp_bench: DDP (gloo, CPU) training-step time at --world ranks for
the MLP 784-512-256-10 (batch 64 per rank) or ResNet-20 (batch 32 of 3x32x32 per rank, the
model from tests/golden_resnet/torch_resnet.py). One thread per rank.

Prints: RESULT <median step ms> (max over ranks of each rank's median).
"""
import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "golden_resnet"))


def make(model):
    if model == "mlp":
        net = nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                            nn.ReLU(), nn.Linear(256, 10))
        return net, (64, 1, 28, 28)
    import torch_resnet
    return torch_resnet.resnet_cifar(20), (32, 3, 32, 32)


def worker(rank, args, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=rank,
                            world_size=args.world)
    torch.manual_seed(rank)
    net, shape = make(args.model)
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(shape)
    y = torch.randint(0, 10, (shape[0],))
    times = []
    for i in range(args.warmup + args.iters):
        start = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if i >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    med = torch.tensor([statistics.median(times)])
    dist.all_reduce(med, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put(med.item())
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["mlp", "resnet20"], required=True)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--store", required=True)
    args = parser.parse_args()
    if os.path.exists(args.store):
        os.remove(args.store)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, out)) for r in range(args.world)]
    for p in procs:
        p.start()
    result = out.get(timeout=1200)
    for p in procs:
        p.join(timeout=60)
    print("RESULT %.4f" % result, flush=True)


if __name__ == "__main__":
    main()
