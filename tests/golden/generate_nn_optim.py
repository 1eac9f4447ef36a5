#!/usr/bin/python3
"""PyTorch reference values for LayerNorm, GELU, SiLU, BatchNorm1d, Embedding, cross_entropy with
options, clip_grad_norm_, nn.init and Adam / AdamW trajectories.

Run with Debian's python3-torch (1.13):   /usr/bin/python3 tests/golden/generate_nn_optim.py
Output: tests/golden/data/<case>.txt (committed; the C++ tests never run Python). The file
format, Writer and the optimizer trajectory helper are generate.py's (imported from there).
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import OUT_DIR, Writer, layer_case, mlp, rnd, sgd_case  # noqa: E402


# ---- layers ----

def gen_layers():
    torch.manual_seed(301)
    layer_case("layer_norm_affine",
               "layer_norm x (3,4,5) normalized_shape (4,5) eps 1e-5, weight/bias (4,5)",
               lambda x, weight, bias: F.layer_norm(x, (4, 5), weight, bias, 1e-5),
               {"x": rnd(3, 4, 5, scale=2.0) + 1.0, "weight": rnd(4, 5), "bias": rnd(4, 5)}).close()
    torch.manual_seed(302)
    layer_case("layer_norm_plain",
               "layer_norm x (2,3,6) normalized_shape (6) eps 1e-3, no affine",
               lambda x: F.layer_norm(x, (6,), None, None, 1e-3),
               {"x": rnd(2, 3, 6, scale=3.0)}).close()

    torch.manual_seed(303)
    layer_case("gelu_none", "gelu(x) exact (erf) x (5,7)", lambda x: F.gelu(x),
               {"x": rnd(5, 7, scale=3.0)}).close()
    torch.manual_seed(304)
    layer_case("gelu_tanh", "gelu(x, approximate='tanh') x (5,7)",
               lambda x: F.gelu(x, approximate="tanh"), {"x": rnd(5, 7, scale=3.0)}).close()
    torch.manual_seed(305)
    layer_case("silu", "silu(x) x (4,9)", lambda x: F.silu(x), {"x": rnd(4, 9, scale=4.0)}).close()

    # BatchNorm1d: (N,C) and (N,C,L) in training (running stats updated, momentum 0.2) and eval.
    for name, shape, seed in (("batchnorm1d_train_nc", (6, 3), 306),
                              ("batchnorm1d_train_ncl", (4, 3, 5), 307)):
        torch.manual_seed(seed)
        x, weight, bias = rnd(*shape, scale=2.0) + 0.5, rnd(3), rnd(3)
        rm0, rv0 = rnd(3), torch.rand(3) + 0.5
        rm, rv = rm0.clone(), rv0.clone()
        w = layer_case(name, "batch_norm training x %s momentum 0.2 eps 1e-5" % (shape,),
                       lambda x, weight, bias: F.batch_norm(x, rm, rv, weight, bias, True, 0.2,
                                                            1e-5),
                       {"x": x, "weight": weight, "bias": bias})
        w.put("running_mean0", rm0)
        w.put("running_var0", rv0)
        w.put("running_mean", rm)
        w.put("running_var", rv)
        w.close()
    torch.manual_seed(308)
    x, weight, bias = rnd(3, 2, 4), rnd(2), rnd(2)
    rm, rv = rnd(2), torch.rand(2) + 0.5
    w = layer_case("batchnorm1d_eval_ncl", "batch_norm eval x (3,2,4) eps 1e-5",
                   lambda x, weight, bias: F.batch_norm(x, rm, rv, weight, bias, False, 0.1, 1e-5),
                   {"x": x, "weight": weight, "bias": bias})
    w.put("running_mean", rm)
    w.put("running_var", rv)
    w.close()

    # Embedding: indices (2,4) with repeats, so the weight gradient accumulates.
    torch.manual_seed(309)
    weight = rnd(7, 3)
    indices = torch.tensor([[0, 3, 3, 6], [1, 0, 3, 5]])
    w = Writer("embedding", "embedding(indices (2,4), weight (7,3)); indices repeat")
    leaf = weight.clone().requires_grad_(True)
    out = F.embedding(indices, leaf)
    gout = rnd(*out.shape)
    (out * gout).sum().backward()
    w.put("weight", weight)
    w.put("indices", indices)
    w.put("gout", gout)
    w.put("out", out)
    w.put("grad_weight", leaf.grad)
    w.close()


def gen_cross_entropy():
    cases = [
        ("ce_weight", dict(weight=True)),
        ("ce_ignore", dict(ignore_index=2)),
        ("ce_ignore_default", dict(default_ignore=True)),
        ("ce_smoothing", dict(label_smoothing=0.1)),
        ("ce_all", dict(weight=True, ignore_index=1, label_smoothing=0.25)),
        ("ce_weight_default_ignore_smoothing", dict(weight=True, default_ignore=True,
                                                    label_smoothing=0.3)),
    ]
    for i, (name, c) in enumerate(cases):
        torch.manual_seed(400 + i)
        n, k = 7, 5
        logits = rnd(n, k, scale=2.0)
        targets = torch.tensor([0, 1, 2, 4, 1, 3, 2])
        if c.get("default_ignore"):
            targets[3] = -100
            targets[5] = -100
        kwargs = {}
        if "ignore_index" in c:
            kwargs["ignore_index"] = c["ignore_index"]
        if "label_smoothing" in c:
            kwargs["label_smoothing"] = c["label_smoothing"]
        weight = torch.rand(k) + 0.25 if c.get("weight") else None
        leaf = logits.clone().requires_grad_(True)
        loss = F.cross_entropy(leaf, targets, weight=weight, **kwargs)
        loss.backward()
        w = Writer(name, "cross_entropy(logits (7,5), targets, %s) mean reduction" %
                   ", ".join("%s=%s" % kv for kv in sorted(kwargs.items()) +
                             ([("weight", "rand(5)+0.25")] if weight is not None else [])))
        w.put("logits", logits)
        w.put("targets", targets)
        if weight is not None:
            w.put("weight", weight)
        w.put("ignore_index", torch.tensor(kwargs.get("ignore_index", -100)))
        w.put("label_smoothing", torch.tensor(kwargs.get("label_smoothing", 0.0)))
        w.put("loss", loss)
        w.put("grad_logits", leaf.grad)
        w.close()


def gen_clip_grad_norm():
    # Three gradients (one parameter without a gradient is skipped); for each norm type the total
    # norm returned and the gradients after clipping, with max_norm below (clips) and above
    # (leaves them, up to the factor max_norm / (norm + 1e-6) clamped to 1).
    torch.manual_seed(500)
    shapes = [(3, 4), (5,), (2, 2, 3)]
    grads = [rnd(*s) for s in shapes]
    w = Writer("clip_grad_norm", "clip_grad_norm_ of 3 gradients (3,4), (5), (2,2,3)")
    for i, g in enumerate(grads):
        w.put("grad%d" % i, g)
    for tag, norm_type in (("l2", 2.0), ("l1", 1.0), ("l3", 3.0), ("linf", math.inf)):
        for mtag, max_norm in (("small", 0.5), ("large", 1000.0)):
            params = [torch.zeros(s, requires_grad=True) for s in shapes] + [
                torch.zeros(2, requires_grad=True)]
            for p, g in zip(params, grads):
                p.grad = g.clone()
            total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type)
            key = "%s_%s" % (tag, mtag)
            w.put(key + ".norm_type", torch.tensor(norm_type if norm_type != math.inf else -1.0))
            w.put(key + ".max_norm", torch.tensor(max_norm))
            w.put(key + ".total_norm", total)
            for i, p in enumerate(params[:3]):
                w.put(key + ".clipped%d" % i, p.grad)
    w.close()


def gen_init():
    # The gain and fan torch uses; the C++ test checks its own values against them and the
    # empirical std / bound of the drawn tensors against gain / sqrt(fan).
    I = torch.nn.init
    w = Writer("init", "torch.nn.init gains, fans and the resulting std / bound")
    w.put("gain_linear", torch.tensor(I.calculate_gain("linear")))
    w.put("gain_relu", torch.tensor(I.calculate_gain("relu")))
    w.put("gain_tanh", torch.tensor(I.calculate_gain("tanh")))
    w.put("gain_sigmoid", torch.tensor(I.calculate_gain("sigmoid")))
    w.put("gain_leaky_relu_default", torch.tensor(I.calculate_gain("leaky_relu")))
    w.put("gain_leaky_relu_0.2", torch.tensor(I.calculate_gain("leaky_relu", 0.2)))
    w.put("gain_selu", torch.tensor(I.calculate_gain("selu")))
    for name, shape in (("linear", (300, 200)), ("conv", (64, 16, 3, 3))):
        t = torch.empty(shape)
        fan_in, fan_out = I._calculate_fan_in_and_fan_out(t)
        w.put(name + ".shape", torch.tensor(shape))
        w.put(name + ".fan_in", torch.tensor(fan_in))
        w.put(name + ".fan_out", torch.tensor(fan_out))
        # kaiming_normal_ defaults (a=0, fan_in, leaky_relu): std = sqrt(2) / sqrt(fan_in).
        w.put(name + ".kaiming_normal_std",
              torch.tensor(I.calculate_gain("leaky_relu", 0) / math.sqrt(fan_in)))
        w.put(name + ".kaiming_normal_relu_fan_out_std",
              torch.tensor(I.calculate_gain("relu") / math.sqrt(fan_out)))
        # kaiming_uniform_ defaults: bound = sqrt(3) * std.
        w.put(name + ".kaiming_uniform_bound",
              torch.tensor(math.sqrt(3.0) * I.calculate_gain("leaky_relu", 0) / math.sqrt(fan_in)))
        w.put(name + ".kaiming_uniform_a5_bound",
              torch.tensor(math.sqrt(3.0) * I.calculate_gain("leaky_relu", math.sqrt(5)) /
                           math.sqrt(fan_in)))
        w.put(name + ".xavier_uniform_bound",
              torch.tensor(math.sqrt(3.0) * math.sqrt(2.0 / (fan_in + fan_out))))
        w.put(name + ".xavier_uniform_gain2_bound",
              torch.tensor(2.0 * math.sqrt(3.0) * math.sqrt(2.0 / (fan_in + fan_out))))
        # What torch draws, for its empirical std (checks the formulas above are what torch uses).
        torch.manual_seed(600)
        w.put(name + ".torch_kaiming_normal_empirical_std", I.kaiming_normal_(t.clone()).std())
        w.put(name + ".torch_kaiming_uniform_empirical_max",
              I.kaiming_uniform_(t.clone()).abs().max())
        w.put(name + ".torch_xavier_uniform_empirical_max",
              I.xavier_uniform_(t.clone()).abs().max())
    w.close()


# ---- Adam / AdamW: 10 steps on generate.py's MLP ----

def gen_adam():
    A = torch.optim
    sgd_case("adam_mlp", "MLP 6-8-5-3, Adam lr 1e-2 (betas 0.9/0.999, eps 1e-8)",
             mlp(), lambda m: A.Adam(m.parameters(), lr=1e-2), (5, 6), 3, seed=701)
    sgd_case("adam_mlp_wd_amsgrad",
             "MLP 6-8-5-3, Adam lr 5e-3 betas (0.8, 0.99) eps 1e-6 weight_decay 1e-2 amsgrad",
             mlp(), lambda m: A.Adam(m.parameters(), lr=5e-3, betas=(0.8, 0.99), eps=1e-6,
                                     weight_decay=1e-2, amsgrad=True), (5, 6), 3, seed=702)
    sgd_case("adamw_mlp", "MLP 6-8-5-3, AdamW lr 1e-2 weight_decay 0.1",
             mlp(), lambda m: A.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1), (5, 6), 3,
             seed=703)
    sgd_case("adamw_mlp_amsgrad", "MLP 6-8-5-3, AdamW lr 2e-2 amsgrad (weight_decay 1e-2)",
             mlp(), lambda m: A.AdamW(m.parameters(), lr=2e-2, amsgrad=True), (5, 6), 3,
             seed=704)

    def groups(m):
        first = list(m[0].parameters())
        rest = [p for i in (2, 4) for p in m[i].parameters()]
        return A.AdamW([
            {"params": first, "lr": 3e-3, "weight_decay": 0.0, "betas": (0.8, 0.9)},
            {"params": rest, "amsgrad": True, "eps": 1e-4},
        ], lr=1e-2, weight_decay=0.05)
    sgd_case("adamw_mlp_groups",
             "MLP 6-8-5-3, AdamW two groups: layer 0 {lr 3e-3, wd 0, betas (0.8, 0.9)}, "
             "layers 2,4 {amsgrad, eps 1e-4}; defaults lr 1e-2 wd 0.05",
             mlp(), groups, (5, 6), 3, seed=705)


# ---- a small model of the new pieces, trained with AdamW and clip_grad_norm_ ----

class TinyTokenModel(nn.Module):
    """Embedding(11,6) -> LayerNorm(6) -> Linear(6,8) -> GELU(tanh) -> Linear(8,5) -> SiLU ->
    mean over the sequence -> Linear(5,3, bias=False) -> BatchNorm1d(3). (A bias in front of
    BatchNorm has a zero gradient up to rounding, which Adam would blow up to full steps.)"""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.norm = nn.LayerNorm(6)
        self.blocks = nn.ModuleList([nn.Linear(6, 8), nn.Linear(8, 5)])
        self.head = nn.Linear(5, 3, bias=False)
        self.bn = nn.BatchNorm1d(3)

    def forward(self, idx):
        h = self.norm(self.emb(idx))
        h = F.gelu(self.blocks[0](h), approximate="tanh")
        h = F.silu(self.blocks[1](h))
        return self.bn(self.head(h.mean(dim=1)))


def gen_token_model():
    torch.manual_seed(800)
    model = TinyTokenModel()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05)
    w = Writer("token_model_adamw",
               "TinyTokenModel (Embedding, LayerNorm, ModuleList, GELU tanh, SiLU, BatchNorm1d), "
               "AdamW lr 1e-2 wd 0.05, clip_grad_norm_(1.0), cross_entropy(label_smoothing 0.1, "
               "ignore_index 0), 8 steps")
    for k, v in model.state_dict().items():
        w.put("init." + k, v)
    for step in range(8):
        idx = torch.randint(0, 11, (4, 5))
        t = torch.randint(0, 3, (4,))
        t[step % 4] = 1 + step % 2  # never a batch of ignored targets only (the loss is NaN)
        w.put("x%d" % step, idx)
        w.put("t%d" % step, t)
        opt.zero_grad()
        loss = F.cross_entropy(model(idx), t, ignore_index=0, label_smoothing=0.1)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        w.put("loss%d" % step, loss)
        w.put("norm%d" % step, norm)
    for k, v in model.state_dict().items():
        w.put("final." + k, v)
    w.close()


if __name__ == "__main__":
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.set_num_threads(1)
    gen_layers()
    gen_cross_entropy()
    gen_clip_grad_norm()
    gen_init()
    gen_adam()
    gen_token_model()
    print("wrote", sorted(os.listdir(OUT_DIR)))
