#!/usr/bin/python3
"""PyTorch reference for allreduce_bench: dist.all_reduce on the gloo backend over 127.0.0.1.

Run by allreduce_bench (with Debian's /usr/bin/python3, which has torch). Spawns --ranks
processes; rank 0 prints one line per message size: RESULT <bytes> <median us>.
"""
import argparse
import os
import socket
import statistics
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, sizes, iters, warmup):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    for nbytes, n_iter in zip(sizes, iters):
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        for _ in range(warmup):
            dist.all_reduce(t)
        times = []
        for _ in range(n_iter):
            start = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - start)
        if rank == 0:
            print("RESULT %d %.4f" % (nbytes, statistics.median(times) * 1e6), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, required=True)
    parser.add_argument("--sizes", required=True, help="comma-separated byte counts")
    parser.add_argument("--iters", required=True, help="comma-separated, one per size")
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    iters = [int(s) for s in args.iters.split(",")]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(args.ranks, free_port(), sizes, iters, args.warmup), nprocs=args.ranks,
             join=True)


if __name__ == "__main__":
    main()
