#!/usr/bin/python3
"""PyTorch 1.13 twin of the examples' data-parallel training (apps/train_mlp, apps/train_resnet),
for side-by-side runs on the same (emulated) cluster: scripts/cluster_bench.py.

Same as the examples: the model (MLP 784-512-256-10, or ResNet-20 from
tests/golden_resnet/torch_resnet.py with one input channel), Fashion-MNIST normalised with mean
0.2860 and std 0.3530, the training subset (the first --train-subset images), the data order
(hsgd's DataLoader: a Fisher-Yates shuffle drawn from hsgd's Generator(seed + epoch), then
rank r takes positions r, r + W, r + 2W, ... padded by cycling so every rank has ceil(n / W),
batches of --batch-size with a short last one), SGD with momentum 0.9 and L2 weight decay, the
per-step cosine schedule annealed to 0 over the run, and the evaluation of the average of the
replicas (parameters and floating-point buffers) on the first --max-eval test images at each
epoch end, the clock stopped meanwhile. Not the same: the initial weights (PyTorch's default
initialisation from torch.manual_seed(seed), the same distribution as hsgd's but other draws)
and, for ResNet-20, the crop + flip augmentation (same padding of 2, other draws).

Distributed (under hsgd-run, which sets RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT): gloo, initialised over tcp:// at MASTER_ADDR and --store-port (default
MASTER_PORT + 1, next to hsgd's rendezvous server on node 0); one thread per rank;
GLOO_SOCKET_IFNAME, when unset, becomes this network namespace's first device other than lo.
  --mode ddp           DistributedDataParallel.
  --mode hierarchical  DDP with post_localSGD_hook (start_localSGD_iter = --warmup-steps; after it
                       gradients are averaged in groups of --subgroup-size contiguous ranks, none
                       with 1, the node's ranks with 0) and HierarchicalModelAverager(--hierarchy,
                       --warmup-steps) after each optimizer step, as hsgd's --mode hierarchical.
Without RANK it trains alone (a world of one on 127.0.0.1, --mode ddp only).

Rank 0 prints, like the examples, at each epoch end
  eval: epoch E step S train_s T test_accuracy A%
(T: training seconds so far, evaluations excluded) and at the end
  final test accuracy: A%

  hsgd-run --nproc-per-node 2 -- /usr/bin/python3 apps/bench/train_torch.py --model mlp
  /usr/bin/python3 apps/bench/train_torch.py --model mlp --train-subset 1024 --max-steps 5
"""

import argparse
import collections
import datetime
import gzip
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import (PostLocalSGDState,
                                                                          post_localSGD_hook)
from torch.distributed.algorithms.model_averaging.hierarchical_model_averager import (
    HierarchicalModelAverager)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "golden_resnet"))
sys.path.insert(0, HERE)
# torch 1.13's dist.new_subgroups refuses to run without CUDA; the same contiguous groups are
# built with dist.new_group (as the averaging benchmark does), for the hook and the averager.
from averaging_bench_torch import new_subgroups_via_new_group  # noqa: E402

MEAN, STD = 0.2860, 0.3530
MASK = (1 << 64) - 1
# The examples' defaults (apps/train_mlp, apps/train_resnet: TrainingFlags).
DEFAULTS = {"mlp": {"batch_size": 64, "lr": 0.05, "weight_decay": 0.0},
            "resnet20": {"batch_size": 128, "lr": 0.1, "weight_decay": 1e-4}}


class HsgdGenerator:
    """hsgd::Generator (framework/tensor/generator.h): xoshiro256** seeded by splitmix64, and
    next_below by rejection sampling, so the shuffle is hsgd's."""

    def __init__(self, seed):
        x = seed & MASK
        self.s = []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & MASK
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
            self.s.append(z ^ (z >> 31))

    @staticmethod
    def _rotl(x, k):
        return ((x << k) | (x >> (64 - k))) & MASK

    def next_u64(self):
        s = self.s
        result = (self._rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self._rotl(s[3], 45)
        return result

    def next_below(self, n):
        limit = MASK - MASK % n
        while True:
            x = self.next_u64()
            if x < limit:
                return x % n


def rank_order(n, seed, epoch, rank, world):
    """The example indices rank `rank` trains on in `epoch`, in order (hsgd's DataLoader)."""
    order = list(range(n))
    gen = HsgdGenerator(seed + epoch)
    for i in range(n - 1, 0, -1):
        j = gen.next_below(i + 1)
        order[i], order[j] = order[j], order[i]
    if world == 1:
        return order
    per_rank = (n + world - 1) // world
    return [order[(k * world + rank) % n] for k in range(per_rank)]


def read_idx(path):
    """An IDX file (optionally .gz) as a uint8 tensor of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load_split(data_dir, prefix):
    def find(name):
        for candidate in (name + ".gz", name):
            if os.path.exists(os.path.join(data_dir, candidate)):
                return os.path.join(data_dir, candidate)
        raise FileNotFoundError(f"--data-dir {data_dir}: no {name}(.gz)")
    images = read_idx(find(f"{prefix}-images-idx3-ubyte")).float().div_(255)
    labels = read_idx(find(f"{prefix}-labels-idx1-ubyte")).long()
    return images.sub_(MEAN).div_(STD).unsqueeze(1), labels


def make_model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                             nn.ReLU(), nn.Linear(256, 10))
    import torch_resnet
    return torch_resnet.ResNet((3, 3, 3), (16, 32, 64), in_channels=1, num_classes=10)


def crop_flip(x, gen):
    """Pads 2 pixels of black (normalised), crops back to 28x28 at a random offset and flips
    left-right with probability 1/2, per image."""
    padded = F.pad(x, (2, 2, 2, 2), value=-MEAN / STD)
    offsets = torch.randint(0, 5, (x.shape[0], 2), generator=gen)
    flips = torch.randint(0, 2, (x.shape[0],), generator=gen)
    out = torch.empty_like(x)
    for i in range(x.shape[0]):
        dy, dx = int(offsets[i, 0]), int(offsets[i, 1])
        image = padded[i, :, dy:dy + 28, dx:dx + 28]
        out[i] = image.flip(-1) if flips[i] else image
    return out


def evaluate_average(model, world, test, max_eval, keep):
    """Rank 0's test accuracy of the average of the replicas (parameters and floating-point
    buffers; collective). keep: every rank keeps the average, else restores its own."""
    tensors = [t for t in list(model.parameters()) + list(model.buffers())
               if t.is_floating_point()]
    with torch.no_grad():
        own = [t.detach().clone() for t in tensors]
        if world > 1:
            flat = torch.cat([t.reshape(-1) for t in tensors])
            dist.all_reduce(flat)
            flat.div_(world)
            offset = 0
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
        accuracy = None
        if dist.get_rank() == 0:
            images, labels = test
            limit = min(max_eval, len(labels)) if max_eval > 0 else len(labels)
            model.eval()
            correct = 0
            for begin in range(0, limit, 500):
                end = min(begin + 500, limit)
                correct += (model(images[begin:end]).argmax(1) == labels[begin:end]).sum().item()
            model.train()
            accuracy = 100.0 * correct / limit
        if not keep:
            for t, saved in zip(tensors, own):
                t.copy_(saved)
    return accuracy


def parse_hierarchy(text, world):
    """'1:2,16:4' -> OrderedDict {1: 2, 16: 4}; 'world' (or 0) is the world size."""
    levels = collections.OrderedDict()
    for part in text.split(","):
        period, _, size = part.partition(":")
        try:
            levels[int(period)] = world if size in ("world", "0") else int(size)
        except ValueError:
            sys.exit(f"train_torch: --hierarchy '{text}': expected period:group_size,... "
                     f"(e.g. 1:2,16:4), got '{part}'")
    return levels


def init_distributed(args):
    if "RANK" not in os.environ:
        if args.mode != "ddp":
            sys.exit("train_torch: --mode hierarchical needs several ranks (run under hsgd-run)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=1)
        return 0, 1, 1
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if "GLOO_SOCKET_IFNAME" not in os.environ:
        devices = [name for _, name in socket.if_nameindex() if name != "lo"]
        if devices:
            os.environ["GLOO_SOCKET_IFNAME"] = devices[0]
    port = args.store_port or int(os.environ["MASTER_PORT"]) + 1
    dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port}",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    return rank, world, local_world


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.split("\n")[2:]))
    parser.add_argument("--model", choices=sorted(DEFAULTS), default="mlp")
    parser.add_argument("--mode", choices=["ddp", "hierarchical"], default="ddp")
    parser.add_argument("--hierarchy", default="1:2,16:4",
                        help="hierarchical: period:group_size pairs (default: 1:2,16:4)")
    parser.add_argument("--warmup-steps", type=int, default=0)
    parser.add_argument("--subgroup-size", type=int, default=0,
                        help="hierarchical: ranks that average gradients after warm-up (0: the "
                        "node's LOCAL_WORLD_SIZE ranks; 1: none)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, help="per rank (default: mlp 64, resnet20 128)")
    parser.add_argument("--lr", type=float, help="default: mlp 0.05, resnet20 0.1")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, help="default: mlp 0, resnet20 1e-4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-subset", type=int, default=0, help="first N images (0: all)")
    parser.add_argument("--max-eval", type=int, default=0, help="test images (0: all)")
    parser.add_argument("--max-steps", type=int, default=0, help="0: epochs x batches")
    parser.add_argument("--no-augment", action="store_true", help="resnet20: no crop + flip")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--store-port", type=int, default=0,
                        help="port of the TCPStore on MASTER_ADDR (0: MASTER_PORT + 1)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per collective")
    args = parser.parse_args()
    for key, value in DEFAULTS[args.model].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    for name in ("epochs", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected >= 1")
    for name in ("warmup_steps", "subgroup_size", "train_subset", "max_eval", "max_steps"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected >= 0")

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    rank, world, local_world = init_distributed(args)
    torch.manual_seed(args.seed)
    train_x, train_y = load_split(args.data_dir, "train")
    test = load_split(args.data_dir, "t10k")
    if args.train_subset:
        train_x, train_y = train_x[:args.train_subset], train_y[:args.train_subset]
    n = len(train_y)
    batches = math.ceil(math.ceil(n / world) / args.batch_size)
    total_steps = args.epochs * batches
    if args.max_steps:
        total_steps = min(total_steps, args.max_steps)

    model = make_model(args.model)
    ddp = nn.parallel.DistributedDataParallel(model)
    averager = None
    if args.mode == "hierarchical":
        dist.new_subgroups = new_subgroups_via_new_group
        subgroup = None
        size = args.subgroup_size or local_world
        if size > 1:
            subgroup, _ = dist.new_subgroups(group_size=size)
        state = PostLocalSGDState(process_group=None, subgroup=subgroup,
                                  start_localSGD_iter=args.warmup_steps,
                                  post_local_gradient_allreduce=size > 1)
        ddp.register_comm_hook(state, post_localSGD_hook)
        averager = HierarchicalModelAverager(parse_hierarchy(args.hierarchy, world),
                                             warmup_steps=args.warmup_steps)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=args.momentum,
                                weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    augment = args.model != "mlp" and not args.no_augment
    if rank == 0:
        print(f"train_torch: {args.model}, {args.mode}"
              f"{' ' + args.hierarchy if averager else ''}, {world} ranks, {n} train images, "
              f"batch {args.batch_size}, lr {args.lr}, {batches} batches per rank per epoch, "
              f"torch {torch.__version__}, GLOO_SOCKET_IFNAME "
              f"{os.environ.get('GLOO_SOCKET_IFNAME', '-')}", flush=True)

    step, train_s, accuracy = 0, 0.0, None
    for epoch in range(args.epochs):
        if step >= total_steps:
            break
        order = torch.tensor(rank_order(n, args.seed, epoch, rank, world))
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + epoch * 1009 + rank)
        start = time.perf_counter()
        for b in range(batches):
            if step >= total_steps:
                break
            index = order[b * args.batch_size:(b + 1) * args.batch_size]
            x, y = train_x[index], train_y[index]
            if augment:
                x = crop_flip(x, gen)
            optimizer.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            if averager is not None:
                averager.average_parameters(ddp.parameters())
            scheduler.step()
            step += 1
            if not math.isfinite(loss.item()):
                sys.exit(f"train_torch: the training loss is {loss.item()} at step {step}")
        train_s += time.perf_counter() - start
        last = epoch + 1 == args.epochs or step >= total_steps
        accuracy = evaluate_average(model, world, test, args.max_eval, keep=last)
        if rank == 0:
            print(f"eval: epoch {epoch + 1} step {step} train_s {train_s:.3f} "
                  f"test_accuracy {accuracy:.2f}%", flush=True)
        if not last:
            dist.barrier()
    if rank == 0:
        print(f"final test accuracy: {accuracy:.2f}%", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
