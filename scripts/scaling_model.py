#!/usr/bin/env python3
"""An alpha-beta model of the time per training step of hsgd's modes (docs/scaling.md).

Modes: DDP (gradients allreduced every step, bucketed, overlapping the backward pass), post-local
SGD (gradients allreduced within the node every step, models averaged globally every H steps),
hierarchical averaging (models averaged per level, each with its period) and the top level's
options: outer (DiLoCo-style outer optimizer; it changes the period, not the bytes), overlap=K
(the averaging is merged K steps later while training continues), the codecs bf16, int8 and int4
(2, 33/32 and 17/32 bytes a value between the nodes, on a ring of node leaders; the first
averaging of a level is float32 unless the averager knows the common start) and fragments=F
(streaming: F runs of whole tensors with balanced bytes, fragment f averaged at step f H / F of
each period and merged after `overlap` steps, H / F by default).

Communication follows hsgd (docs/communication.md): within a node an allreduce goes through
shared memory; a group spanning N nodes with w >= 2 members on each and at most 64 ranks uses
the two-level allreduce (reduce in the node, shard i of w allreduced over TCP by member i of
every node, assemble in the node: each node's link carries 2 (N-1)/N x the buffer per direction
for a ring); any other group is flat Gloo with kAuto's choice (Net.gloo_latency_msgs: the direct
exchange while each of p ranks sends (p - 1) x the buffer <= 512 KiB, else the direct scatter
up to 1 MiB, the ring above; the direct exchange's bytes are counted
as halving-doubling's).

  scaling_model.py --check   predicted vs measured for the emulated-cluster runs; exit 1 when a
                             checked row is off by more than 15%
  scaling_model.py --table   predicted time per epoch, communication share and bytes per node
                             for 8 ... 1,024 nodes at 1, 10 and 100 Gbit/s
  scaling_model.py --plan    the hierarchy the model recommends for a cluster and a budget for
                             the communication share of a step (see plan() for the rule)
"""

import argparse
import math
import sys

MB = 1e6
MiB = 1 << 20
# kAuto's Gloo algorithm by size, as comm/process_group/process_group.h states it: the direct
# exchange while each rank sends (p - 1) x the buffer <= kDirectAllreduceBytes, the direct scatter
# up to kSmallAllreduceBytes, the ring above.
DIRECT_ALLREDUCE_BYTES = 512 * 1024
SMALL_ALLREDUCE_BYTES = MiB
TOLERANCE = 0.15
# Bytes a value costs between the nodes per codec (docs/averaging.md "What goes on the wire":
# int8 and int4 carry a float32 step per block of 256 values).
VALUE_BYTES = {None: 4.0, "bf16": 2.0, "int8": 33 / 32, "int4": 17 / 32}
# The two-level allreduce: shared memory holds 2 to SHM_MAX_RANKS ranks per node; the number of
# nodes is not limited (TWO_LEVEL_ANY: no limit on the group's size).
SHM_MAX_RANKS = 64
TWO_LEVEL_ANY = 10**9

# ---------------------------------------------------------------------------------------------
# Calibration inputs: measurements recorded in the docs (page, table, date). Seconds per epoch
# are rank 0's training seconds (evaluations excluded) divided by the epochs.
# ---------------------------------------------------------------------------------------------
MLP_PARAMS = 535_818        # docs/emulated_cluster.md "What was measured" (784-512-256-10)
RESNET20_PARAMS = 272_186   # docs/emulated_cluster.md "ResNet-20, shortened" (one input channel)
RESNET18_PARAMS = 11_173_962  # docs/benchmarks.md "Model averaging" (ResNet-18, 10 classes)
# The MLP's parameter tensors in the averager's order (weights and biases of 784-512-256-10):
# what fragments split.
MLP_TENSORS = [784 * 512, 512, 512 * 256, 256, 256 * 10, 10]

# Each experiment: its source, the run's shape, and the rows (mode, link, s/epoch).
EXPERIMENTS = {
    "mlp_nodes_1202": dict(
        source="docs/emulated_cluster.md, 'What was measured' table (hierarchy_experiment.py), "
               "measured 2026-12-02 (AVX-512 CPU)",
        model="mlp", topology="nodes", steps=470, epochs=2,
        rows=[("ddp", "100mbit", 44.1), ("local_sgd", "100mbit", 6.1),
              ("post_local_sgd", "100mbit", 6.4), ("hierarchical", "100mbit", 6.9),
              ("ddp", "1gbit", 5.5), ("local_sgd", "1gbit", 2.4),
              ("post_local_sgd", "1gbit", 3.3), ("hierarchical", "1gbit", 3.5),
              ("ddp", "none", 5.5), ("local_sgd", "none", 2.7),
              ("post_local_sgd", "none", 3.0), ("hierarchical", "none", 3.1)]),
    "mlp_racks_1202": dict(
        source="docs/emulated_cluster.md, '2 racks x 2 nodes' table, measured 2026-12-02",
        model="mlp", topology="racks", steps=470, epochs=2,
        rows=[("ddp", "100mbit", 72.2), ("local_sgd", "100mbit", 8.6),
              ("post_local_sgd", "100mbit", 12.3), ("hierarchical", "100mbit", 12.2),
              ("hierarchical_2_16", "100mbit", 11.1)]),
    "mlp_nodes_options_1203": dict(
        source="docs/emulated_cluster.md, 'Level options' table, measured 2026-12-03 "
               "(AVX2 CPU)",
        model="mlp", topology="nodes", steps=470, epochs=2,
        rows=[("ddp", "100mbit", 44.91), ("hierarchical", "100mbit", 7.23),
              ("outer", "100mbit", 5.39), ("overlap", "100mbit", 6.12),
              ("overlap_16", "100mbit", 4.87), ("bf16", "100mbit", 6.27),
              ("all_three", "100mbit", 4.89), ("no_top", "100mbit", 4.94),
              ("hierarchical", "none", 3.19), ("overlap", "none", 2.62),
              ("overlap_16", "none", 2.80), ("all_three", "none", 2.86)]),
    "mlp_racks_options_1203": dict(
        source="docs/emulated_cluster.md, 'The same modes on 2 racks x 2 nodes' table, "
               "measured 2026-12-03",
        model="mlp", topology="racks", steps=470, epochs=2,
        rows=[("ddp", "100mbit", 72.17), ("hierarchical", "100mbit", 12.26),
              ("outer", "100mbit", 9.27), ("overlap", "100mbit", 9.90),
              ("overlap_16", "100mbit", 8.22), ("bf16", "100mbit", 9.89),
              ("all_three", "100mbit", 8.64), ("no_top", "100mbit", 8.84),
              ("hierarchical", "none", 5.63), ("overlap", "none", 6.00),
              ("overlap_16", "none", 5.99), ("all_three", "none", 5.86)]),
    "resnet20_nodes_options_1203": dict(
        source="docs/emulated_cluster.md, 'ResNet-20, shortened, on 2 nodes' table, "
               "measured 2026-12-03",
        model="resnet20", topology="nodes", steps=234, epochs=1,
        rows=[("ddp", "100mbit", 102.72), ("hierarchical", "100mbit", 92.27),
              ("outer", "100mbit", 87.71), ("overlap", "100mbit", 87.06),
              ("overlap_16", "100mbit", 88.62), ("bf16", "100mbit", 90.40),
              ("all_three", "100mbit", 88.57), ("no_top", "100mbit", 86.93),
              ("hierarchical", "none", 91.66), ("overlap", "none", 92.20),
              ("overlap_16", "none", 95.82), ("all_three", "none", 88.74)]),
    "resnet20_racks_options_1203": dict(
        source="docs/emulated_cluster.md, 'ResNet-20, shortened, on 2 racks x 2 nodes' table, "
               "measured 2026-12-03 (load average up to 7.3: other work on the machine)",
        model="resnet20", topology="racks", steps=234, epochs=1,
        rows=[("ddp", "100mbit", 119.99), ("hierarchical", "100mbit", 99.80),
              ("outer", "100mbit", 99.17), ("overlap", "100mbit", 100.53),
              ("overlap_16", "100mbit", 99.09), ("bf16", "100mbit", 102.62),
              ("all_three", "100mbit", 112.67), ("no_top", "100mbit", 103.00),
              ("hierarchical", "none", 100.87), ("overlap", "none", 100.24),
              ("overlap_16", "none", 98.66), ("all_three", "none", 101.79)]),
    "mlp_streaming_100mbit_1207": dict(
        source="docs/emulated_cluster.md, 'Streaming' table at 100 Mbit/s "
               "(streaming_experiment.py), measured 2026-12-07, first averagings float32",
        model="mlp", topology="nodes", steps=235, epochs=1,
        rows=[("s_plain", "100mbit", 4.91), ("s_plain", "none", 2.01),
              ("s_ov8_bf16", "100mbit", 2.67), ("s_ov8_bf16", "none", 2.07),
              ("s_f4_int8", "100mbit", 2.35), ("s_f4_int8", "none", 2.27),
              ("s_f4_int4", "100mbit", 2.42), ("s_f4_int4", "none", 2.24)]),
    "mlp_streaming_25mbit_1207": dict(
        source="docs/emulated_cluster.md, 'Streaming' table at 25 Mbit/s "
               "(streaming_experiment.py), measured 2026-12-07, with start_from",
        model="mlp", topology="nodes", steps=235, epochs=1,
        rows=[("s_plain", "25mbit", 14.41), ("s_plain", "none", 2.03),
              ("s_f4_int4_sf", "25mbit", 2.93), ("s_f4_int4_sf", "none", 2.37),
              ("s_f4_ov12_int4_sf", "25mbit", 2.30), ("s_f4_ov12_int4_sf", "none", 2.06),
              ("s_f2_ov8_int4_sf", "25mbit", 2.31), ("s_f2_ov8_int4_sf", "none", 2.00)]),
}

# "MB of averagings" of the level-options tables (same pages, same dates): the link's bytes in
# both directions minus those of no_top (start-up, warm-up, evaluations): what the top level's
# averagings sent. Deterministic (the bytes repeat exactly between runs).
AVERAGING_MB = {
    "mlp_nodes_options_1203": {"hierarchical": 120.4, "outer": 30.1, "overlap": 120.4,
                               "overlap_16": 120.5, "bf16": 62.3, "all_three": 17.2},
    "mlp_racks_options_1203": {"hierarchical": 180.7, "outer": 45.2, "overlap": 180.8,
                               "overlap_16": 180.6, "bf16": 93.6, "all_three": 25.7},
    "resnet20_nodes_options_1203": {"hierarchical": 28.6, "outer": 6.6, "overlap": 28.6,
                                    "overlap_16": 28.6, "bf16": 15.4, "all_three": 4.4},
    "resnet20_racks_options_1203": {"hierarchical": 42.7, "outer": 9.7, "overlap": 42.7,
                                    "overlap_16": 42.8, "bf16": 23.0, "all_three": 6.5},
    # The streaming table's top level alone (docs/emulated_cluster.md "Streaming": 64.3 MB of
    # float32 and 8.6 MB of int4 over the epoch's 15 averagings).
    "mlp_streaming_25mbit_1207": {"s_plain": 64.3, "s_f4_int4_sf": 8.6},
}

# Which rows calibrate what (never checked), the rest are checked.
#  - mlp_nodes_1202 / none, modes ddp, local_sgd, hierarchical: solve for the step's computation
#    c, the shared-memory allreduce time x of the model and the TCP CPU time y of the model
#    (this VM: 4 workers and the kernel's TCP on 2 cores). post_local_sgd / none is checked.
#  - every other experiment with 'none' rows: its computation c (other CPU, other model, other
#    load) from the mean of its 'none' rows; x and y scale with the model's bytes.
#  - mlp_racks_1202 has no 'none' rows: it uses mlp_nodes_1202's c (same day, same workers).
# The 100mbit and 1gbit rows are checked.

# Modes of the emulated runs: (top period, top options, level-1 kind, level-1 period). Every mode
# starts with 20 DDP steps across the link (warm-up). "local": the top level averages models of
# all 4; level 1 is "node" (models averaged in the node or rack), "grad" (post-local SGD:
# gradients allreduced in the node or rack every step) or None.
WARMUP = 20
EMULATED_MODES = {
    "ddp": None,
    "local_sgd": dict(top=16, level1=None, l1_period=1),
    "post_local_sgd": dict(top=16, level1="grad", l1_period=1),
    "hierarchical": dict(top=16, level1="node", l1_period=1),
    "hierarchical_2_16": dict(top=16, level1="node", l1_period=2),
    "outer": dict(top=64, level1="node", l1_period=1),
    "overlap": dict(top=16, level1="node", l1_period=1, overlap=8),
    "overlap_16": dict(top=16, level1="node", l1_period=1, overlap=16),
    "bf16": dict(top=16, level1="node", l1_period=1, bf16=True),
    "all_three": dict(top=64, level1="node", l1_period=1, overlap=8, bf16=True),
    "no_top": dict(top=None, level1="node", l1_period=1),
    # streaming_experiment.py: 1:2,16:4@OPTIONS with --warmup-steps 0; "_sf": the runtime's
    # start_from makes the first averaging compressed too.
    "s_plain": dict(top=16, level1="node", l1_period=1, warmup=0),
    "s_ov8_bf16": dict(top=16, level1="node", l1_period=1, warmup=0, overlap=8, codec="bf16"),
    "s_f4_int8": dict(top=16, level1="node", l1_period=1, warmup=0, fragments=4, codec="int8"),
    "s_f4_int4": dict(top=16, level1="node", l1_period=1, warmup=0, fragments=4, codec="int4"),
    "s_f4_int4_sf": dict(top=16, level1="node", l1_period=1, warmup=0, fragments=4,
                         codec="int4", start_from=True),
    "s_f4_ov12_int4_sf": dict(top=16, level1="node", l1_period=1, warmup=0, fragments=4,
                              overlap=12, codec="int4", start_from=True),
    "s_f2_ov8_int4_sf": dict(top=16, level1="node", l1_period=1, warmup=0, fragments=2,
                             overlap=8, codec="int4", start_from=True),
}

# The emulated link (scripts/emulated_cluster.sh): tbf at RATE on each end of the veth, burst
# 10 ms at the rate (at least 32 KiB). tbf charges each TCP segment's frame (qdisc_pkt_len of a
# GSO packet counts the headers of every segment): MSS 1448 B (MTU 1500, TCP timestamps) in a
# 1514 B frame (Ethernet 14 + IP 20 + TCP 32 header bytes), and the peer's delayed ACK (one
# 66 B frame per 2 segments) shares the direction when both directions carry data, as in an
# allreduce. Payload per charged byte: 2 * 1448 / (2 * 1514 + 66).
TBF_PAYLOAD_FRACTION = 2 * 1448 / (2 * 1514 + 66)
RATES_BIT = {"25mbit": 25e6, "100mbit": 100e6, "1gbit": 1e9, "none": math.inf}
RACK_RATE_BIT = 1e9  # --rack-rate of the racks runs
# No netem here: the emulated links have no propagation delay; the per-message cost is the
# TCP path's software (hsgd-tcp at 4 B on 2 ranks: about 100 us per message, benchmarks.md).
EMULATED_ALPHA = 100e-6

# This machine's computation (docs/benchmarks.md, 'One-process training step', 2026-12-03, AVX2):
# ResNet-20 (3x32x32), batch 32, 1 thread: 148.0 ms at 52.9 GFLOP/s (3 x forward multiply-adds
# x 2). FLOPs per sample follow.
MEASURED_FLOP_RATE = 52.9e9
RESNET20_STEP_B32 = 0.148
RESNET20_FLOP_PER_SAMPLE = MEASURED_FLOP_RATE * RESNET20_STEP_B32 / 32
# Shared-memory allreduce of hsgd (docs/benchmarks.md, 'Allreduce', 2026-12-02): 4 ranks,
# 16 MiB in 6,826 us; 4 B in 192 us on the oversubscribed VM, a few us on a quiet core.
SHM_RATE = 16 * MiB / 6826e-6
SHM_ALPHA = 5e-6


def bucket_sizes(nbytes, first_cap=1 * MB, cap=25 * MB):
    """DDP's buckets in the order their gradients are ready (ddp.h: first 1 MB, then 25 MB)."""
    sizes = [min(nbytes, first_cap)]
    rest = nbytes - sizes[0]
    while rest > 0:
        sizes.append(min(rest, cap))
        rest -= sizes[-1]
    return sizes


class Net:
    """What one collective costs. Times are (shm, tcp_cpu, wire): shared-memory copies, CPU of the
    TCP path, time on the bottleneck link (incl. latency terms)."""

    def __init__(self, topology, nodes, per_node, rate, alpha, shm_rate, shm_alpha, tcp_cpu_rate,
                 burst=0.0, rack_rate=None, oversubscribed=False, two_level_max=TWO_LEVEL_ANY):
        self.topology, self.nodes, self.per_node = topology, nodes, per_node
        self.rate, self.alpha = rate, alpha  # payload bytes/s of a node's link, s per message
        self.shm_rate, self.shm_alpha = shm_rate, shm_alpha
        self.tcp_cpu_rate = tcp_cpu_rate  # bytes/s the hosts' TCP path moves (inf: not a limit)
        self.burst = burst  # bytes the link sends at once after an idle period (tbf's bucket)
        self.rack_rate = rack_rate
        self.oversubscribed = oversubscribed  # comm CPU competes with computation
        self.two_level_max = two_level_max

    def shm(self, nbytes):
        return self.shm_alpha + nbytes / self.shm_rate if self.per_node > 1 else 0.0

    def wire(self, nbytes, rate, idle):
        if nbytes <= 0:
            return 0.0
        credit = min(self.burst, idle * rate) if math.isfinite(rate) else 0.0
        return max(nbytes - credit, 0.0) / rate

    @staticmethod
    def gloo_latency_msgs(p, nbytes):
        """Messages in sequence of hsgd's kAuto Gloo allreduce of p ranks."""
        if p <= 1:
            return 0
        if (p - 1) * nbytes <= DIRECT_ALLREDUCE_BYTES:
            return 1  # direct exchange: the whole buffer to every peer in one step
        if nbytes <= SMALL_ALLREDUCE_BYTES:
            return 2  # the direct scatter: reduce-scatter, allgather
        return 2 * (p - 1)  # ring

    def allreduce(self, nbytes, group, idle=0.0, codec=None):
        """(shm, tcp_cpu, wire, bytes per direction on a node's link or between the racks) of an
        allreduce of nbytes (float32) over `group`: 'node' (the workers of a node or, racks
        topology, of a rack) or 'world'. codec: None (float32), or 'bf16', 'int8', 'int4'
        between node leaders (a ring), float32 within the node."""
        N, w = self.nodes, self.per_node
        compressed = codec is not None
        payload = nbytes / 4 * VALUE_BYTES[codec]
        if self.topology == "racks":
            # 2 racks x 2 nodes x 1 worker; every group is flat Gloo over TCP.
            p = 2 if group == "node" else 4
            link_rate = self.rack_rate if group == "node" else self.rate
            per_edge = 2 * (p - 1) / p * payload  # a ring edge; the rack pair: 1 x the buffer
            # 'node': each rank's rack link; 'world': ranks 0-1-2-3-0 cross the racks once per
            # direction, each crossing one ring edge.
            sent_total = p * per_edge * (2 if group == "node" else 1)
            cpu = sent_total / self.tcp_cpu_rate
            msgs = 2 * (p - 1) if compressed else self.gloo_latency_msgs(p, nbytes)
            wire = self.wire(per_edge, link_rate, idle) + msgs * self.alpha
            # bytes between the racks: a rack group sends none
            return 0.0, cpu, wire, (0.0 if group == "node" else per_edge)
        if group == "node":
            return self.shm(nbytes), 0.0, 0.0, 0.0
        if N == 1:
            return self.shm(nbytes), 0.0, 0.0, 0.0
        if compressed:
            per_node = 2 * (N - 1) / N * payload
            msgs = 2 * (N - 1)
            cpu = N * per_node / self.tcp_cpu_rate
            shm = 2 * self.shm(nbytes) if w > 1 else 0.0
            return shm, cpu, self.wire(per_node, self.rate, idle) + msgs * self.alpha, per_node
        per_node = 2 * (N - 1) / N * nbytes
        cpu = N * per_node / self.tcp_cpu_rate
        if 2 <= w <= SHM_MAX_RANKS and N * w <= self.two_level_max:
            # two levels: shm reduce, w shards over TCP in parallel, shm assemble
            msgs = self.gloo_latency_msgs(N, nbytes / w)
            shm = 2 * self.shm(nbytes)
        else:
            # flat Gloo over N*w ranks (contiguous per node: one ring edge leaves each node)
            p = N * w
            per_node = 2 * (p - 1) / p * nbytes
            msgs = self.gloo_latency_msgs(p, nbytes)
            shm = 0.0
        return shm, cpu, self.wire(per_node, self.rate, idle) + msgs * self.alpha, per_node

    def blocking(self, parts):
        shm, cpu, wire = parts[0], parts[1], parts[2]
        return shm + max(cpu, wire)

    def exposed(self, parts, window):
        """Time a step waits for a collective that had `window` seconds of computation to run
        behind. An oversubscribed host cannot hide the collective's CPU."""
        shm, cpu, wire = parts[0], parts[1], parts[2]
        total = shm + max(cpu, wire)
        if self.oversubscribed:
            return max(shm + cpu, total - window)
        return max(0.0, total - window)


def ddp_step_comm(net, nbytes, compute, group="world"):
    """Exposed time of DDP's bucketed allreduce. Buckets become ready during the backward pass
    (2/3 of the step's computation) in proportion to their bytes; each allreduce starts when its
    bucket is ready and the previous one is done; the step ends when the last is done."""
    backward = 2.0 / 3.0 * compute
    forward = compute - backward
    t = 0.0
    done = 0.0
    first = True
    shm_cpu = 0.0
    for b in bucket_sizes(nbytes):
        done += b
        ready = backward * done / nbytes
        # tbf's bucket refills during the forward pass before the first bucket
        parts = net.allreduce(b, group, idle=(forward + ready) if first else 0.0)
        first = False
        start = max(t, ready)
        t = start + net.blocking(parts)
        shm_cpu += parts[0] + parts[1]
    wait = max(0.0, t - backward)
    if net.oversubscribed:
        wait = max(wait, shm_cpu)
    return wait, net.allreduce(nbytes, group)[3]


def fragment_values(tensors, fragments):
    """The values of each fragment: hsgd's split (framework/distributed/model_averaging/
    fragments.h): the cut before fragment f is the tensor boundary closest to f n / F (the
    earlier on a tie), at least one tensor in every fragment."""
    cumulative = [0]
    for t in tensors:
        cumulative.append(cumulative[-1] + t)
    n = cumulative[-1]
    cut = [0] * (fragments + 1)
    cut[-1] = len(tensors)
    for f in range(1, fragments):
        target = f * n / fragments
        lowest, highest = cut[f - 1] + 1, len(tensors) - (fragments - f)
        best = lowest
        for j in range(lowest + 1, highest + 1):
            if abs(cumulative[j] - target) < abs(cumulative[best] - target):
                best = j
        cut[f] = best
    return [cumulative[cut[f + 1]] - cumulative[cut[f]] for f in range(fragments)]


def top_level_time(net, m, nbytes, compute, step, rest, tensors=None):
    """(seconds the steps wait for the top level, bytes per direction it sends) over `rest` steps
    after warm-up. Averaging at steps 0, H, 2H, ... after warm-up (PyTorch's averagers count
    the first step); a fragment f of F at the steps f H / F later; each overlapped by its delay
    (overlap=K, else H / F with F > 1), otherwise blocking. The first averaging of each
    fragment is float32 unless start_from gives the anchor. tensors: the parameter tensors'
    values (None: F fragments of equal bytes)."""
    period, fragments = m["top"], m.get("fragments", 1)
    codec = m.get("codec", "bf16" if m.get("bf16") else None)
    overlap = m.get("overlap", 0)
    delay = overlap or (period // fragments if fragments > 1 else 0)
    if fragments == 1:
        sizes = [nbytes]
    elif tensors is not None:
        sizes = [4 * v for v in fragment_values(tensors, fragments)]
    else:
        sizes = [nbytes / fragments] * fragments
    wait = sent = 0.0
    for f, size in enumerate(sizes):
        offset = f * period // fragments
        count = max(0, math.ceil((rest - offset) / period))
        for i in range(count):
            first_plain = i == 0 and not m.get("start_from")
            parts = net.allreduce(size, "world", idle=compute,
                                  codec=None if first_plain else codec)
            wait += net.exposed(parts, delay * step) if delay else net.blocking(parts)
            sent += parts[3]
    return wait, sent


def run_time(net, mode, nbytes, compute, steps, tensors=None):
    """Seconds for `steps` steps of an emulated run (warm-up included), bytes per direction on
    the slow link, and of those the top level's averagings."""
    ddp_comm, ddp_bytes = ddp_step_comm(net, nbytes, compute)
    if mode == "ddp":
        return steps * (compute + ddp_comm), steps * ddp_bytes, 0.0
    m = EMULATED_MODES[mode]
    warmup = m.get("warmup", WARMUP)
    total = warmup * (compute + ddp_comm)
    sent = warmup * ddp_bytes
    rest = steps - warmup
    # level 1 (node or rack)
    if m["level1"] == "node":
        l1_parts = net.allreduce(nbytes, "node", idle=compute)
        l1 = net.blocking(l1_parts) / m["l1_period"]
        l1_bytes = l1_parts[3] / m["l1_period"]
    elif m["level1"] == "grad":
        l1, l1_bytes = ddp_step_comm(net, nbytes, compute, group="node")
    else:
        l1, l1_bytes = 0.0, 0.0
    step = compute + l1
    total += rest * step
    sent += rest * l1_bytes
    top_sent = 0.0
    if m["top"]:
        if "fragments" in m or "codec" in m or "warmup" in m:
            wait, top_sent = top_level_time(net, m, nbytes, compute, step, rest, tensors)
            return total + wait, sent + top_sent, top_sent
        count = rest // m["top"]
        overlap = m.get("overlap", 0)
        for i in range(count):
            codec = "bf16" if m.get("bf16", False) and i > 0 else None  # the first: the anchor
            parts = net.allreduce(nbytes, "world", idle=compute, codec=codec)
            total += net.exposed(parts, overlap * step) if overlap else net.blocking(parts)
            sent += parts[3]
            top_sent += parts[3]
    return total, sent, top_sent


def emulated_net(topology, link, tcp_cpu_rate, shm_time_per_byte):
    rate = RATES_BIT[link] / 8 * TBF_PAYLOAD_FRACTION
    burst = max(0.010 * RATES_BIT[link] / 8, 32 * 1024) if math.isfinite(rate) else 0.0
    burst *= TBF_PAYLOAD_FRACTION
    if topology == "nodes":
        return Net("nodes", 2, 2, rate, EMULATED_ALPHA, 1.0 / shm_time_per_byte, 0.0,
                   tcp_cpu_rate, burst=burst, oversubscribed=True)
    rack = RACK_RATE_BIT / 8 * TBF_PAYLOAD_FRACTION
    net = Net("racks", 4, 1, rate, EMULATED_ALPHA, 1.0 / shm_time_per_byte, 0.0, tcp_cpu_rate,
              burst=burst, rack_rate=rack, oversubscribed=True)
    return net


def model_bytes(model):
    return 4 * {"mlp": MLP_PARAMS, "resnet20": RESNET20_PARAMS}[model]


def model_tensors(model):
    """The parameter tensors' values where the model knows them (for fragments), else None."""
    return MLP_TENSORS if model == "mlp" else None


def calibrate():
    """The three unknowns of mlp_nodes_1202 from three 'none' rows (a linear system in c, x =
    shm allreduce seconds per byte, y = TCP CPU seconds per byte), then each other experiment's
    computation c. Returns dict name -> c, and (x, y)."""
    exp = EXPERIMENTS["mlp_nodes_1202"]
    n = model_bytes("mlp")
    steps = exp["steps"]
    none = {m: s * exp["epochs"] for m, _, s in [(r[0], r[1], r[2]) for r in exp["rows"]]
            if _ == "none"}
    # Per step on 2 nodes x 2 (unlimited link, oversubscribed): a world allreduce costs
    # 2 shm + TCP CPU of 2 nodes x 2 (N-1)/N x n bytes = 2 n x + 2 n y. DDP (the CPU is not
    # hidden): c + 2nx + 2ny.
    # local_sgd: c + (WARMUP + tops)/steps (2nx + 2ny)
    # hierarchical: c + (steps - WARMUP)/steps n x + (WARMUP + tops)/steps (2nx + 2ny)
    tops = (steps - WARMUP) // 16
    k = (WARMUP + tops) / steps
    rows = [
        (1.0, 2 * n, 2 * n, none["ddp"] / steps),
        (1.0, 2 * n * k, 2 * n * k, none["local_sgd"] / steps),
        (1.0, 2 * n * k + n * (steps - WARMUP) / steps, 2 * n * k, none["hierarchical"] / steps),
    ]
    c, x, y = solve3(rows)
    comps = {"mlp_nodes_1202": c, "mlp_racks_1202": c}
    for name, e in EXPERIMENTS.items():
        if name in comps:
            continue
        nb = model_bytes(e["model"])
        cs = []
        for mode, link, s in e["rows"]:
            if link != "none":
                continue
            # c such that the model gives the measured time: time is c * steps + comm, with the
            # comm independent of c for these modes on an unlimited link (overlap windows aside).
            net = emulated_net(e["topology"], "none", 1.0 / y, x)
            t0, _, _ = run_time(net, mode, nb, 0.0, e["steps"], model_tensors(e["model"]))
            cs.append((s * e["epochs"] - t0) / e["steps"])
        comps[name] = sum(cs) / len(cs)
    return comps, x, y


def solve3(rows):
    a = [list(r[:3]) for r in rows]
    b = [r[3] for r in rows]

    def det(m):
        return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1]) -
                m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0]) +
                m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))

    d = det(a)
    out = []
    for col in range(3):
        m = [row[:] for row in a]
        for i in range(3):
            m[i][col] = b[i]
        out.append(det(m) / d)
    return out


def is_calibration_row(name, mode, link):
    if link != "none":
        return False
    if name == "mlp_nodes_1202":
        return mode in ("ddp", "local_sgd", "hierarchical")
    return True


def check(verbose=True, scale=1.0):
    """0 when every checked row is within TOLERANCE, else 1. scale multiplies the measured values
    of the checked rows (a test shows the check fails on data that is off)."""
    comps, x, y = calibrate()
    if verbose:
        print("Calibration (docs/scaling.md):")
        print(f"  tbf payload fraction {TBF_PAYLOAD_FRACTION:.3f}: 100mbit -> "
              f"{100e6 / 8 * TBF_PAYLOAD_FRACTION / MB:.2f} MB/s, 1gbit -> "
              f"{1e9 / 8 * TBF_PAYLOAD_FRACTION / MB:.1f} MB/s of payload per direction")
        n = model_bytes("mlp")
        print(f"  shared-memory allreduce of the MLP (2.14 MB, 2 ranks, oversubscribed): "
              f"{n * x * 1e3:.2f} ms ({1 / x / 1e9:.2f} GB/s)")
        print(f"  TCP CPU on this VM: {1 / y / MB:.0f} MB/s sent per machine (the MLP's 2-node "
              f"allreduce: {2 * n * y * 1e3:.2f} ms)")
        for name, c in comps.items():
            print(f"  computation per step, {name}: {c * 1e3:.1f} ms")
        print()
        print(f"{'experiment':30s} {'mode':18s} {'link':8s} {'measured':>9s} {'predicted':>9s} "
              f"{'error':>7s}  {'MB/dir pred':>11s}  role")
    worst = 0.0
    failed = []
    for name, e in EXPERIMENTS.items():
        nb = model_bytes(e["model"])
        c = comps[name]
        for mode, link, s in e["rows"]:
            net = emulated_net(e["topology"], link, 1.0 / y, x)
            t, sent, _ = run_time(net, mode, nb, c, e["steps"], model_tensors(e["model"]))
            pred = t / e["epochs"]
            err = pred / s - 1
            calib = is_calibration_row(name, mode, link)
            if not calib:
                s *= scale
                err = pred / s - 1
            role = "calibration" if calib else "checked"
            if not calib:
                worst = max(worst, abs(err))
                if abs(err) > TOLERANCE:
                    failed.append((name, mode, link, err))
                    role += "  MISS"
            if verbose:
                print(f"{name:30s} {mode:18s} {link:8s} {s:9.2f} {pred:9.2f} {err * 100:+6.1f}%  "
                      f"{sent / MB:11.1f}  {role}")
    if verbose:
        print()
        print("Bytes of the top level's averagings across the slow link, both directions "
              "(measured: 'MB of averagings'):")
        print(f"{'experiment':30s} {'mode':18s} {'measured':>9s} {'predicted':>9s} {'error':>7s}")
    for name, rows in AVERAGING_MB.items():
        e = EXPERIMENTS[name]
        for mode, mb in rows.items():
            net = emulated_net(e["topology"], "100mbit", 1.0 / y, x)
            _, _, top = run_time(net, mode, model_bytes(e["model"]), comps[name], e["steps"],
                                 model_tensors(e["model"]))
            pred = 2 * top / MB
            mb *= scale
            err = pred / mb - 1
            worst = max(worst, abs(err))
            miss = abs(err) > TOLERANCE
            if miss:
                failed.append((name, mode, "bytes", err))
            if verbose:
                print(f"{name:30s} {mode:18s} {mb:9.1f} {pred:9.1f} {err * 100:+6.1f}%"
                      + ("  MISS" if miss else ""))
    if verbose:
        print()
        print(f"worst checked error {worst * 100:.1f}% (limit {TOLERANCE * 100:.0f}%); "
              f"{len(failed)} checked rows off by more")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# Predictions at scale
# ---------------------------------------------------------------------------------------------
SAMPLES_PER_EPOCH = 1_281_167  # an ImageNet-1k-sized epoch for every model (weak scaling)
MODELS = {
    # name: (parameters, FLOPs per sample, per-worker batch)
    "ResNet-20": (RESNET20_PARAMS, RESNET20_FLOP_PER_SAMPLE, 32),
    # CIFAR-style ResNet-18 (32x32 input, 10 classes): 0.556 G multiply-adds forward
    "ResNet-18": (RESNET18_PARAMS, 3 * 2 * 0.556e9, 32),
    # a 1 B-parameter transformer on 2,048-token sequences: 6 x params x tokens
    "1B": (1_000_000_000, 6 * 1e9 * 2048, 8),
}
WORKERS_PER_NODE = 8
LATENCY = 25e-6  # per message between nodes (datacentre: 5-50 us with the software path)
ACCEL_SPEEDUP = 100.0  # the assumed accelerator's step is 100x this machine's one-core step
ACCEL_SHM_RATE = 100e9  # and its node's allreduce runs at 100 GB/s (NVLink-class)
NODE_COUNTS = [8, 16, 32, 64, 128, 256, 512, 1024]
LINK_GBIT = [1, 10, 100]
TABLE_MODES = [
    # label, description
    ("ddp", "DDP"),
    ("post_local", "post-local SGD, period 16"),
    ("hier", "hierarchical 2:node,16:world"),
    ("hier_ov", "hierarchical 2:node,16:world@overlap=8"),
    ("hier_ov_bf16", "hierarchical 2:node,16:world@overlap=8,bf16"),
    ("hier_all", "hierarchical 2:node,64:world@outer,overlap=8,bf16"),
    ("hier_f4_int8", "hierarchical 2:node,16:world@fragments=4,int8"),
    ("hier_f4_int4", "hierarchical 2:node,16:world@fragments=4,int4,ef"),
]
# The streaming modes of the table: the top level's options (start_from: every averaging is
# compressed; fragments of equal bytes, each merged H / F steps after it starts).
TABLE_STREAMING = {
    "hier_f4_int8": dict(top=16, fragments=4, codec="int8", start_from=True),
    "hier_f4_int4": dict(top=16, fragments=4, codec="int4", start_from=True),
}


def scale_step(mode, nodes, params, compute, gbit, shm_rate, two_level_max=TWO_LEVEL_ANY):
    """Seconds per step (steady state, after warm-up) and its communication, and bytes per node
    per direction per step across the node's link."""
    net = Net("nodes", nodes, WORKERS_PER_NODE, gbit * 1e9 / 8, LATENCY, shm_rate, SHM_ALPHA,
              math.inf, two_level_max=two_level_max)
    n = 4 * params
    if mode == "ddp":
        comm, sent = ddp_step_comm(net, n, compute)
        return compute + comm, comm, sent
    if mode == "post_local":
        l1, _ = ddp_step_comm(net, n, compute, group="node")
        top = net.allreduce(n, "world")
        comm = l1 + net.blocking(top) / 16
        return compute + comm, comm, top[3] / 16
    if mode in TABLE_STREAMING:
        m = TABLE_STREAMING[mode]
        l1 = net.blocking(net.allreduce(n, "node")) / 2
        # One period in steady state: every fragment averages once.
        wait, sent = top_level_time(net, m, n, compute, compute + l1, m["top"])
        comm = l1 + wait / m["top"]
        return compute + comm, comm, sent / m["top"]
    period, level1_period = (64, 2) if mode == "hier_all" else (16, 2)
    overlap = 8 if mode in ("hier_ov", "hier_ov_bf16", "hier_all") else 0
    bf16 = mode in ("hier_ov_bf16", "hier_all")
    l1 = net.blocking(net.allreduce(n, "node")) / level1_period
    top = net.allreduce(n, "world", codec="bf16" if bf16 else None)
    step = compute + l1
    wait = net.exposed(top, overlap * step) if overlap else net.blocking(top)
    comm = l1 + wait / period
    return compute + comm, comm, top[3] / period


def table(nodes_list=NODE_COUNTS, two_level_max=TWO_LEVEL_ANY, out=sys.stdout):
    print("Weak scaling: per-worker batch fixed; "
          f"{WORKERS_PER_NODE} workers per node; epoch = {SAMPLES_PER_EPOCH:,} samples; "
          f"{LATENCY * 1e6:.0f} us per message between nodes; steady state (no warm-up).",
          file=out)
    print("Cells: seconds per epoch / communication share of the step / GB per node per "
          "direction per epoch across the node's link.", file=out)
    for setname, speedup, shm_rate in (
            ("this machine's computation (one core per worker at "
             f"{MEASURED_FLOP_RATE / 1e9:.1f} GFLOP/s; node allreduce in shared memory at "
             f"{SHM_RATE / 1e9:.1f} GB/s)", 1.0, SHM_RATE),
            (f"an assumed accelerator: each worker's step {ACCEL_SPEEDUP:.0f}x faster; node "
             f"allreduce at {ACCEL_SHM_RATE / 1e9:.0f} GB/s", ACCEL_SPEEDUP, ACCEL_SHM_RATE)):
        print(f"\n## Computation: {setname}", file=out)
        for model, (params, flops, batch) in MODELS.items():
            compute = batch * flops / MEASURED_FLOP_RATE / speedup
            print(f"\n### {model}: {params / 1e6:,.2f} M parameters ({4 * params / MB:,.1f} MB), "
                  f"batch {batch} per worker, computation {compute * 1e3:,.2f} ms per step",
                  file=out)
            header = "| nodes | Gbit/s | " + " | ".join(m for m, _ in TABLE_MODES) + " |"
            print(header, file=out)
            print("|---:|---:|" + "---|" * len(TABLE_MODES), file=out)
            for gbit in LINK_GBIT:
                for nodes in nodes_list:
                    steps = SAMPLES_PER_EPOCH / (nodes * WORKERS_PER_NODE * batch)
                    cells = []
                    for mode, _ in TABLE_MODES:
                        t, comm, sent = scale_step(mode, nodes, params, compute, gbit, shm_rate,
                                                   two_level_max)
                        cells.append(f"{fmt_s(steps * t)} / {100 * comm / t:.0f}% / "
                                     f"{steps * sent / 1e9:.3g}")
                    print(f"| {nodes} | {gbit} | " + " | ".join(cells) + " |", file=out)
    print("\nModes: " + "; ".join(f"{m} = {d}" for m, d in TABLE_MODES) + ".", file=out)


# ---------------------------------------------------------------------------------------------
# Planning: which hierarchy for a cluster and a communication budget
# ---------------------------------------------------------------------------------------------
PLAN_PERIODS = [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]  # 1 would cost no less than DDP
PLAN_NODE_PERIODS = [1, 2, 4]  # the node level's (shared memory); only below the top period
# Options of the top level, in the order they are preferred at one period: each later one
# changes the training more (bf16 rounds the pseudo-gradient; overlap merges an average that
# is K steps old). The outer optimizer is left out: it changes what the top level computes, and
# its longer periods are a question of accuracy, which this model does not know.
PLAN_OPTIONS = [("", 0, False), ("bf16", 0, True), ("overlap", 2, False),
                ("overlap,bf16", 2, True)]


def steady_step(net, n, compute, period, node_period, overlap, bf16):
    """(seconds per step, of which communication, bytes per node per direction per step) of a
    hierarchy node_period:node,period:world after warm-up. overlap: steps (0: blocking)."""
    l1 = net.blocking(net.allreduce(n, "node", idle=compute)) / node_period \
        if net.per_node > 1 else 0.0
    step = compute + l1
    top = net.allreduce(n, "world", idle=compute, codec="bf16" if bf16 else None)
    wait = net.exposed(top, overlap * step) if overlap else net.blocking(top)
    comm = l1 + wait / period
    return compute + comm, comm, top[3] / period


def hierarchy_flag(per_node, node_period, period, options, overlap):
    """The --hierarchy of the examples for a plan row."""
    items = []
    if "overlap" in options:
        items.append(f"overlap={overlap}")
    if "bf16" in options:
        items += ["bf16", "ef"]
    top = f"{period}:world" + ("@" + ",".join(items) if items else "")
    return (f"{node_period}:node,{top}" if per_node > 1 else top)


def plan_candidates(net, n, compute, budget):
    """DDP and every candidate (period x option): (flag, period, seconds per step, of which
    communication, bytes per node per direction per step), and the recommendation among them:
    DDP when it keeps the communication share within `budget`, else the smallest top period (the
    most frequent averaging) at which some node period (smallest first) and option (the first
    of PLAN_OPTIONS) do; None when no period up to the largest does. Overlap is half the period (an
    averaging is merged before the level's next one, so at most the period)."""
    ddp_comm, ddp_sent = ddp_step_comm(net, n, compute)
    rows = [("--mode ddp", 1, compute + ddp_comm, ddp_comm, ddp_sent)]
    best = rows[0] if ddp_comm / (compute + ddp_comm) <= budget else None
    node_periods = PLAN_NODE_PERIODS if net.per_node > 1 else [1]
    for period in PLAN_PERIODS:
        for node_period in (q for q in node_periods if q < period):
            for options, overlap_fraction, bf16 in PLAN_OPTIONS:
                overlap = period // overlap_fraction if overlap_fraction else 0
                t, comm, sent = steady_step(net, n, compute, period, node_period, overlap, bf16)
                flag = "--hierarchy " + hierarchy_flag(net.per_node, node_period, period, options,
                                                       overlap)
                rows.append((flag, period, t, comm, sent))
                if best is None and comm / t <= budget:
                    best = rows[-1]
    return rows, best


def print_plan(rows, best, out=sys.stdout):
    """The candidates up to 4x the recommended period (all when there is none)."""
    last = 4 * best[1] if best is not None else PLAN_PERIODS[-1]
    print("| flags (with --mode hierarchical --subgroup-size 1) | ms per step | communication "
          "share | MB per node per direction per step |", file=out)
    print("|---|---:|---:|---:|", file=out)
    for row in rows:
        flag, period, t, comm, sent = row
        if period > last:
            continue
        mark = " **(recommended)**" if row is best else ""
        print(f"| `{flag}`{mark} | {t * 1e3:.2f} | {100 * comm / t:.1f}% | {sent / MB:.3f} |",
              file=out)


def fmt_s(s):
    if s >= 1e5:
        return f"{s:.3g}"
    if s >= 100:
        return f"{s:,.0f}"
    if s >= 1:
        return f"{s:.1f}"
    return f"{s:.2f}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true",
                   help="predicted vs measured for the emulated runs; exit 1 beyond 15%%")
    p.add_argument("--table", action="store_true", help="predictions for 8 ... 1,024 nodes")
    p.add_argument("--nodes", default=None,
                   help="node counts of --table (comma-separated; default 8,...,1024); with "
                        "--plan: the cluster's nodes (one number)")
    p.add_argument("--two-level-max", type=int, default=TWO_LEVEL_ANY,
                   help="largest group (ranks) that uses the two-level allreduce (hsgd: any size, "
                        "with 2 to 64 ranks per node); e.g. 64: a flat ring above 64 ranks")
    p.add_argument("--scale-measured", type=float, default=1.0, metavar="F",
                   help="multiply the checked measurements by F (a test that --check can fail)")
    plan_args = p.add_argument_group("--plan: the cluster and the budget")
    plan_args.add_argument("--plan", action="store_true",
                           help="recommend a hierarchy for a cluster and a communication budget")
    plan_args.add_argument("--budget", type=float, default=0.10, metavar="SHARE",
                           help="largest share of a step spent communicating (default 0.10)")
    plan_args.add_argument("--workers", type=int, default=WORKERS_PER_NODE,
                           help=f"workers per node (default {WORKERS_PER_NODE})")
    plan_args.add_argument("--gbit", type=float, default=10.0,
                           help="link rate per node and direction, Gbit/s (default 10)")
    plan_args.add_argument("--latency-us", type=float, default=LATENCY * 1e6,
                           help=f"seconds per message between nodes, us (default "
                                f"{LATENCY * 1e6:.0f})")
    plan_args.add_argument("--model", default="ResNet-18", choices=list(MODELS) + ["MLP"],
                           help="the model's parameters and computation (default ResNet-18; MLP: "
                                "the examples' 784-512-256-10 with batch 64 per worker)")
    plan_args.add_argument("--step-ms", type=float, default=None,
                           help="computation per step and worker, ms (default: the model's on "
                                "this machine's one core, or the calibrated MLP step)")
    plan_args.add_argument("--none-step-ms", type=float, default=None,
                           help="with --emulated: the computation is what makes the model give "
                                "this measured ms per step without a rate limit (a run of the "
                                "recommended job at --rate none, at the same time as the check)")
    plan_args.add_argument("--emulated", default=None, metavar="RATE", choices=["100mbit", "1gbit"],
                           help="the emulated cluster instead (scripts/emulated_cluster.sh: 2 "
                                "nodes x 2 workers on this machine, its tbf link at RATE, the "
                                "calibrated shared-memory and TCP costs)")
    args = p.parse_args(argv)
    if not args.scale_measured > 0:
        p.error(f"--scale-measured: expected a factor > 0, got {args.scale_measured}")
    if not (args.check or args.table or args.plan):
        p.error("give --check, --table and/or --plan")
    rc = 0
    if args.check:
        rc = check(scale=args.scale_measured)
    if args.table:
        try:
            nodes = [int(v) for v in (args.nodes or ",".join(map(str, NODE_COUNTS))).split(",")]
        except ValueError:
            p.error(f"--nodes: expected comma-separated integers, got '{args.nodes}'")
        if any(v < 1 for v in nodes):
            p.error(f"--nodes: expected node counts >= 1, got '{args.nodes}'")
        table(nodes, args.two_level_max)
    if args.plan:
        run_plan(p, args)
    return rc


def run_plan(p, args):
    if not 0 < args.budget < 1:
        p.error(f"--budget: expected a share in (0, 1), e.g. 0.1, got {args.budget}")
    if args.step_ms is not None and not args.step_ms > 0:
        p.error(f"--step-ms: expected milliseconds > 0, got {args.step_ms}")
    comps, x, y = calibrate()
    if args.model == "MLP":
        params, compute = MLP_PARAMS, comps["mlp_nodes_options_1203"]
        what = "MLP 784-512-256-10, batch 64 per worker"
    else:
        params, flops, batch = MODELS[args.model]
        compute = batch * flops / MEASURED_FLOP_RATE
        what = f"{args.model}, batch {batch} per worker"
    if args.step_ms is not None:
        compute = args.step_ms / 1e3
    if args.emulated:
        if args.nodes not in (None, "2") or args.workers not in (WORKERS_PER_NODE, 2):
            p.error("--emulated is 2 nodes x 2 workers; leave --nodes and --workers out")
        net = emulated_net("nodes", args.emulated, 1.0 / y, x)
        cluster = (f"the emulated cluster: 2 nodes x 2 workers on this machine, tbf at "
                   f"{args.emulated} between them (calibrated shared-memory and TCP costs)")
    else:
        try:
            nodes = int(args.nodes or 64)
        except ValueError:
            p.error(f"--nodes: expected one node count with --plan, got '{args.nodes}'")
        if nodes < 2 or args.workers < 1 or not args.gbit > 0 or args.latency_us < 0:
            p.error(f"--plan needs --nodes >= 2, --workers >= 1, --gbit > 0 and --latency-us >= "
                    f"0; got {nodes}, {args.workers}, {args.gbit}, {args.latency_us}")
        net = Net("nodes", nodes, args.workers, args.gbit * 1e9 / 8, args.latency_us * 1e-6,
                  SHM_RATE, SHM_ALPHA, math.inf, two_level_max=args.two_level_max)
        cluster = (f"{nodes} nodes x {args.workers} workers, {args.gbit:g} Gbit/s per node and "
                   f"direction, {args.latency_us:g} us per message")
    n = 4 * params
    if args.none_step_ms is not None:
        if not args.emulated or not args.none_step_ms > 0:
            p.error("--none-step-ms needs --emulated and milliseconds > 0")
        unlimited = emulated_net("nodes", "none", 1.0 / y, x)
        for _ in range(3):  # the recommendation and the computation settle in a round or two
            _, best = plan_candidates(net, n, compute, args.budget)
            compute = computation_from(unlimited, n, args.none_step_ms / 1e3, best)
        what += f" (computation from {args.none_step_ms:g} ms per step measured without a limit)"
    print(f"Plan for {cluster}; {what}: {params / 1e6:,.2f} M parameters ({n / MB:,.2f} MB), "
          f"computation {compute * 1e3:.2f} ms per step; budget: communication at most "
          f"{100 * args.budget:.0f}% of a step (steady state, after warm-up).")
    print()
    rows, best = plan_candidates(net, n, compute, args.budget)
    print_plan(rows, best)
    print()
    if best is None:
        print(f"No hierarchy up to period {PLAN_PERIODS[-1]} keeps communication within "
              f"{100 * args.budget:.0f}% of a step; raise the budget, or add the outer optimizer "
              f"(outer=0.7/0.9/nesterov), which kept its accuracy at 4x longer periods here.")
        return
    flag, _, t, comm, sent = best
    print(f"Recommended: {flag}  (predicted {t * 1e3:.2f} ms per step, "
          f"{100 * comm / t:.1f}% communication, {sent / MB:.3f} MB per node per direction per "
          f"step)")
    print("Rule: DDP if it meets the budget; else the smallest top period (the most frequent "
          "averaging) at which some hierarchy does; at that period the smallest node period, "
          "then plain first, bf16, overlap, overlap + bf16.")


def computation_from(unlimited, n, step_s, best):
    """The computation c at which `best`'s step on the unlimited link takes step_s."""
    flag, period = (best[0], best[1]) if best is not None else ("", PLAN_PERIODS[-1])
    overlap = int(flag.split("overlap=")[1].split(",")[0]) if "overlap=" in flag else 0
    node_period = int(flag.split("--hierarchy ")[1].split(":")[0]) if ":node," in flag else 1
    bf16 = "bf16" in flag
    c = step_s
    for _ in range(50):
        if flag.startswith("--mode ddp"):
            comm = ddp_step_comm(unlimited, n, c)[0]
        else:
            comm = steady_step(unlimited, n, c, period, node_period, overlap, bf16)[1]
        c = max(1e-6, step_s - comm)
    return c


if __name__ == "__main__":
    sys.exit(main())
