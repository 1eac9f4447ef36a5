#!/usr/bin/python3
"""PyTorch side of apps/bench/resnet_step_bench: the training step of the same ResNet
(tests/golden_resnet/torch_resnet.py) or MLP, and the time of each op at ResNet-20's shapes.

    /usr/bin/python3 apps/bench/resnet_step_bench_torch.py --model resnet20 --threads 1 --batch-size 128
    /usr/bin/python3 apps/bench/resnet_step_bench_torch.py --ops-only --batch-size 32

Prints machine-readable lines that resnet_step_bench parses:
    RESULT <median step, ms> <peak resident memory above the process's before the model was
           built, MB>
    RESULT <op name> <fwd ms> <bwd ms> <count>    (--ops-only: the best of --op-reps calls, one
                                                   line per op kind and shape)
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "golden_resnet"))
import torch_resnet  # noqa: E402


def status_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024.0
    return 0.0


def reset_peak_mb():
    """Resets VmHWM to the current resident size (Linux >= 4.0); returns that size in MB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return status_mb("VmRSS:")


def make_model(name):
    if name == "mlp":  # as hsgd's models::MLP: 784-512-256-10 with ReLU
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                   torch.nn.Linear(512, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 10))
    return torch_resnet.MODELS[name]()


def step_time(args):
    """(median step in s, peak MB above the process's before the model was built)."""
    torch.manual_seed(0)
    before = reset_peak_mb()
    model = make_model(args.model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    shape = (1, 28, 28) if args.model == "mlp" else (3, 32, 32)
    x = torch.randn(args.batch_size, *shape)
    t = torch.randint(0, 10, (args.batch_size,))
    times = []
    for i in range(args.warmup + args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), t).backward()
        opt.step()
        if i >= args.warmup:
            times.append(time.perf_counter() - start)
    times.sort()
    n = len(times)
    med = times[n // 2] if n % 2 else 0.5 * (times[n // 2 - 1] + times[n // 2])
    return med, status_mb("VmHWM:") - before


def timed(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def op_times(args):
    """(name, fwd_s, bwd_s, count) per op kind and shape of ResNet-20 at the batch size."""
    n = args.batch_size
    out = []

    def conv(cin, cout, k, stride, hw, count):
        x = torch.randn(n, cin, hw, hw, requires_grad=True)
        w = torch.randn(cout, cin, k, k, requires_grad=True)
        pad = k // 2
        y = F.conv2d(x, w, None, stride, pad)
        g = torch.randn_like(y)
        fwd = timed(lambda: F.conv2d(x, w, None, stride, pad), args.op_reps)
        bwd = timed(lambda: torch.autograd.grad(F.conv2d(x, w, None, stride, pad), (x, w), g),
                    args.op_reps) - fwd
        out.append(("conv%dx%d_%d_%d_s%d_%dpx" % (k, k, cin, cout, stride, hw), fwd, bwd, count))

    def pointwise(name, c, hw, count):
        x = torch.randn(n, c, hw, hw, requires_grad=True)
        if name == "batch_norm":
            wt, b = torch.ones(c, requires_grad=True), torch.zeros(c, requires_grad=True)
            rm, rv = torch.zeros(c), torch.ones(c)
            f = lambda: F.batch_norm(x, rm, rv, wt, b, True, 0.1, 1e-5)  # noqa: E731
            leaves = (x, wt, b)
        elif name == "relu":
            f, leaves = (lambda: F.relu(x)), (x,)
        else:  # add
            x2 = torch.randn(n, c, hw, hw, requires_grad=True)
            f, leaves = (lambda: x + x2), (x, x2)
        g = torch.randn_like(f())
        fwd = timed(f, args.op_reps)
        bwd = timed(lambda: torch.autograd.grad(f(), leaves, g), args.op_reps) - fwd
        out.append(("%s_%d_%dpx" % (name, c, hw), fwd, bwd, count))

    for spec in RESNET20_OPS:
        if spec[0] == "conv":
            conv(*spec[1:])
        else:
            pointwise(*spec)
    return out


# ResNet-20's ops: (conv, cin, cout, k, stride, input hw, count) or (op, channels, hw, count).
RESNET20_OPS = [
    ("conv", 3, 16, 3, 1, 32, 1), ("conv", 16, 16, 3, 1, 32, 6),
    ("conv", 16, 32, 3, 2, 32, 1), ("conv", 32, 32, 3, 1, 16, 5), ("conv", 16, 32, 1, 2, 32, 1),
    ("conv", 32, 64, 3, 2, 16, 1), ("conv", 64, 64, 3, 1, 8, 5), ("conv", 32, 64, 1, 2, 16, 1),
    ("batch_norm", 16, 32, 7), ("batch_norm", 32, 16, 7), ("batch_norm", 64, 8, 7),
    ("relu", 16, 32, 7), ("relu", 32, 16, 6), ("relu", 64, 8, 6),
    ("add", 16, 32, 3), ("add", 32, 16, 3), ("add", 64, 8, 3),
]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet20")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--op-reps", type=int, default=5)
    p.add_argument("--ops-only", action="store_true", help="time each op kind instead of a step")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.ops_only:
        for name, fwd, bwd, count in op_times(args):
            print("RESULT %s %.4f %.4f %d" % (name, 1e3 * fwd, 1e3 * bwd, count))
        return
    s, peak = step_time(args)
    print("RESULT %.3f %.1f" % (1e3 * s, peak))


if __name__ == "__main__":
    main()
