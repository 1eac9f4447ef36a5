#!/usr/bin/python3
"""PyTorch side of apps/bench/sgemm_bench: GFLOP/s of torch.mm on the same shapes.

    /usr/bin/python3 apps/bench/sgemm_bench_torch.py --threads 1 --reps 7 "square 1024:0:0:1024:1024:1024:1"

Each shape is NAME:TRANS_A:TRANS_B:M:N:K:BATCH; a transposed operand is a transposed view of
row-major storage, as hsgd's matmul passes it. A measurement is the median time of --reps
batches of BATCH calls after one warm-up batch. Prints one machine-readable line per shape:
    RESULT <name> <GFLOP/s>
"""
import argparse
import os
import statistics
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--threads", type=int, default=1)
parser.add_argument("--reps", type=int, default=7)
parser.add_argument("shapes", nargs="+")
args = parser.parse_args()
# torch.set_num_threads does not reach the OpenBLAS that torch.mm calls here; OpenBLAS reads its
# thread count when it is loaded.
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
import torch  # noqa: E402

torch.set_num_threads(args.threads)
torch.manual_seed(1)


def operand(rows, cols, trans, batch):
    """batch matrices (rows, cols), stored transposed when trans."""
    if trans:
        return [torch.randn(cols, rows).t() for _ in range(batch)]
    return [torch.randn(rows, cols) for _ in range(batch)]


for spec in args.shapes:
    name, ta, tb, m, n, k, batch = spec.split(":")
    m, n, k, batch = int(m), int(n), int(k), int(batch)
    a = operand(m, k, ta == "1", batch)
    b = operand(k, n, tb == "1", batch)
    c = [torch.empty(m, n) for _ in range(batch)]

    def run():
        for i in range(batch):
            torch.mm(a[i], b[i], out=c[i])

    run()
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    print("RESULT %s %.3f" % (name.replace(" ", "_"), 2.0 * m * n * k * batch / statistics.median(times) / 1e9))
    sys.stdout.flush()
