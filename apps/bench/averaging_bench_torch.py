#!/usr/bin/python3
"""PyTorch side of apps/bench/averaging_bench: times HierarchicalModelAverager.average_parameters
over the same tensor shapes, per level of the hierarchy, at `--world` ranks on gloo.

torch 1.13's dist.new_subgroups refuses to run without CUDA, so the averager's subgroups are
built with dist.new_group over the same contiguous ranks (patched in before construction).

Prints one line: RESULT <level-0 median ms> <level-1 median ms> (max over ranks of each rank's
median), as averaging_bench parses it.
"""
import argparse
import multiprocessing as mp
import os
import statistics
import time
from collections import OrderedDict

import torch
import torch.distributed as dist
import torch.distributed.algorithms.model_averaging.hierarchical_model_averager as hier


def new_subgroups_via_new_group(group_size=None, group=None):
    world, rank = dist.get_world_size(), dist.get_rank()
    mine, groups = None, []
    for start in range(0, world, group_size):
        ranks = list(range(start, start + group_size))
        g = dist.new_group(ranks)
        groups.append(g)
        if rank in ranks:
            mine = g
    return mine, groups


def worker(rank, args, shapes, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=rank,
                            world_size=args.world)
    dist.new_subgroups = new_subgroups_via_new_group
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.full(shape, float(rank)))
        p.grad = torch.ones(shape)
        params.append(p)
    averager = hier.HierarchicalModelAverager(
        OrderedDict([(1, args.world // 2), (2, args.world)]), warmup_steps=0)
    for _ in range(2 * args.warmup):
        averager.average_parameters(params)
    times = {0: [], 1: []}
    for _ in range(2 * args.iters):
        level = 1 if averager.step % 2 == 0 else 0
        start = time.perf_counter()
        averager.average_parameters(params)
        times[level].append((time.perf_counter() - start) * 1e3)
    medians = torch.tensor([statistics.median(times[0]), statistics.median(times[1])])
    dist.all_reduce(medians, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put(medians.tolist())
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", required=True, help="file: one shape per line, dims by spaces")
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--iters", type=int, default=20, help="timed calls per level")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per level")
    parser.add_argument("--store", required=True, help="path of a file for the rendezvous")
    args = parser.parse_args()
    with open(args.shapes) as f:
        shapes = [[int(d) for d in line.split()] for line in f if line.strip()]
    if os.path.exists(args.store):
        os.remove(args.store)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, shapes, out)) for r in range(args.world)]
    for p in procs:
        p.start()
    result = out.get(timeout=1200)
    for p in procs:
        p.join(timeout=60)
    print("RESULT %.4f %.4f" % (result[0], result[1]), flush=True)


if __name__ == "__main__":
    main()
