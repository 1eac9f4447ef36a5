#!/usr/bin/python3
"""PyTorch side of apps/bench/checkpoint_bench: times torch.save of a state dict of the given
shapes (float32 tensors, as hsgd's Checkpointer holds them) to files in --dir.

Two ways, --rounds timed saves each after one warm-up, a new file name per save and the file of
two saves ago deleted (as the Checkpointer keeps its last 2 checkpoints):
  fsync   hsgd's protocol: torch.save into a temporary file, flush, os.fsync, rename to the final
          name, fsync of the directory (what the Checkpointer's write does; fair on durability)
  nosync  torch.save(state, path): what a PyTorch training script usually does (the data may
          still be in the page cache when it returns)

Prints one line: RESULT <nosync median ms> <fsync median ms> <file bytes>, which
checkpoint_bench parses.
"""
import argparse
import collections
import os
import statistics
import time

import torch


def save_fsync(state, path):
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_nosync(state, path):
    torch.save(state, path)


def timed(save, state, directory, tag, rounds):
    times, paths = [], []
    for i in range(rounds + 1):
        path = os.path.join(directory, "%s_%d.pt" % (tag, i))
        start = time.perf_counter()
        save(state, path)
        elapsed = time.perf_counter() - start
        if i > 0:
            times.append(1e3 * elapsed)
        paths.append(path)
        if len(paths) > 2:
            os.remove(paths.pop(0))
    size = os.path.getsize(paths[-1])
    for p in paths:
        os.remove(p)
    return statistics.median(times), size


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True, help="lines: <name> <dim0> <dim1> ...")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    state = collections.OrderedDict()
    with open(args.spec) as f:
        for line in f:
            fields = line.split()
            if fields:
                shape = [int(d) for d in fields[1:]]
                state[fields[0]] = torch.randn(shape, generator=gen, dtype=torch.float32)
    nosync_ms, size = timed(save_nosync, state, args.dir, "nosync", args.rounds)
    fsync_ms, _ = timed(save_fsync, state, args.dir, "fsync", args.rounds)
    print("RESULT %.4f %.4f %d" % (nosync_ms, fsync_ms, size))


if __name__ == "__main__":
    main()
