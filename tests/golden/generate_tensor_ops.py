#!/usr/bin/python3
"""PyTorch reference values for the tensor ops of a transformer: masked_fill, where, tril / triu,
split / chunk, broadcasting matmul, scaled dot-product attention and cross_entropy with int64
targets of a (N,C,d) input.

Run with Debian's python3-torch (1.13):   /usr/bin/python3 tests/golden/generate_tensor_ops.py
Output: tests/golden/data/<case>.txt (committed; the C++ tests never run Python). The file
format and Writer are generate.py's (imported from there).

A file may hold several cases, each written by put_case under a prefix ("k1.out", "k1.grad_x"):
the inputs, an upstream gradient "gout" per output and the gradients of sum(out * gout) for
every differentiable input. Masks are written as float 0/1 tensors (hsgd has no bool dtype) and
turned into bool here. Products and attention are computed in float64 and written as float32,
so the references carry no float32 rounding of their own.

scaled_dot_product_attention is PyTorch 2's; 1.13 lacks it, so its reference is the unfused
composition softmax(q k^T / sqrt(D) + causal mask) v that it is defined as.
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import OUT_DIR, Writer, rnd  # noqa: E402


def mask01(*shape, p=0.5):
    """A float 0/1 tensor, about a fraction p of ones."""
    return (torch.rand(*shape) < p).to(torch.float32)


def put_case(w, prefix, fn, inputs, constants=None, double=False):
    """Writes inputs and constants, runs outs = fn(**inputs, **constants) (one tensor or a list),
    and writes each output with a random gout and the gradients of sum(out * gout).
    Constants (masks) get no gradient. double: compute in float64."""
    constants = constants or {}
    dtype = torch.float64 if double else torch.float32
    leaves = {}
    for k, v in inputs.items():
        w.put(prefix + k, v)
        leaves[k] = v.clone().to(dtype).requires_grad_(True)
    for k, v in constants.items():
        w.put(prefix + k, v)
    outs = fn(**leaves, **constants)
    single = torch.is_tensor(outs)
    outs = [outs] if single else list(outs)
    loss = 0
    for i, out in enumerate(outs):
        suffix = "" if single else str(i)
        gout = torch.randn(out.shape).to(dtype)
        w.put(prefix + "gout" + suffix, gout)
        w.put(prefix + "out" + suffix, out)
        loss = loss + (out * gout).sum()
    loss.backward()
    for k, leaf in leaves.items():
        w.put(prefix + "grad_" + k, leaf.grad)


def single_case(name, comment, fn, inputs, constants=None, double=False):
    w = Writer(name, comment)
    put_case(w, "", fn, inputs, constants, double)
    w.close()


# ---- masking and selection ----

def gen_masking():
    torch.manual_seed(501)
    single_case("masked_fill_broadcast",
                "masked_fill(x (2,3,4,5), mask (3,1,5) float 0/1, -2.5): mask broadcast over x",
                lambda x, mask: x.masked_fill(mask.bool(), -2.5),
                {"x": rnd(2, 3, 4, 5)}, {"mask": mask01(3, 1, 5)})
    torch.manual_seed(502)
    single_case("masked_fill_expand",
                "masked_fill(x (4,5), mask (2,4,5), 7.0): the output takes the broadcast shape "
                "(2,4,5), grad_x sums over the new dim",
                lambda x, mask: x.masked_fill(mask.bool(), 7.0),
                {"x": rnd(4, 5)}, {"mask": mask01(2, 4, 5)})
    torch.manual_seed(503)
    single_case("where_broadcast",
                "where(condition (3,1,5) float 0/1, a (2,1,4,5), b (4,1)) -> (2,3,4,5)",
                lambda a, b, condition: torch.where(condition.bool(), a, b),
                {"a": rnd(2, 1, 4, 5), "b": rnd(4, 1)}, {"condition": mask01(3, 1, 5)})

    torch.manual_seed(504)
    w = Writer("tril_triu", "tril(x, k) and triu(x, k) of x (2,3,5,4) for several k; "
               "prefix tril_k<k>. / triu_k<k>. (m for minus)")
    x = rnd(2, 3, 5, 4)
    for op in ("tril", "triu"):
        for k in (0, 1, -2, 4, -6):
            prefix = "%s_k%s%d." % (op, "m" if k < 0 else "", abs(k))
            put_case(w, prefix, lambda x: getattr(torch, op)(x, k), {"x": x})
    w.close()


# ---- split and chunk ----

def gen_split():
    torch.manual_seed(511)
    w = Writer("split_chunk",
               "pieces of split / chunk, each with its gout, and grad_x of sum_i(piece_i * gout_i); "
               "'unused' cases leave pieces out of the loss")
    x = rnd(4, 7, 3)
    put_case(w, "size3_dim1.", lambda x: torch.split(x, 3, dim=1), {"x": x})
    put_case(w, "size3_dim1_unused.", lambda x: [torch.split(x, 3, dim=1)[i] for i in (0, 2)],
             {"x": x})
    put_case(w, "sizes214_dim1.", lambda x: torch.split(x, [2, 4, 1], dim=1), {"x": x})
    put_case(w, "sizes_dimm1.", lambda x: torch.split(x, [1, 0, 2], dim=-1), {"x": x})
    put_case(w, "chunk3_dim1.", lambda x: torch.chunk(x, 3, dim=1), {"x": x})
    put_case(w, "chunk4_dim0.", lambda x: torch.chunk(x, 4, dim=0), {"x": x})
    put_case(w, "chunk3_dim2.", lambda x: torch.chunk(x, 3, dim=2), {"x": x})
    w.close()


# ---- matmul ----

MATMUL_CASES = [
    ("batch_broadcast", (2, 3, 4, 5), (3, 5, 4)),
    ("batch_ones", (2, 1, 4, 5), (1, 3, 5, 2)),
    ("matrix_at_batch", (3, 4), (2, 3, 4, 5)),
    ("batch_at_matrix", (2, 3, 4, 5), (5, 2)),
    ("batch_equal", (2, 3, 4), (2, 4, 3)),
    ("vector_at_batch", (5,), (2, 5, 3)),
    ("batch_at_vector", (2, 3, 4, 5), (5,)),
    ("vector_at_matrix", (4,), (4, 3)),
    ("matrix_at_vector", (4, 5), (5,)),
    ("dot", (5,), (5,)),
]


def gen_matmul():
    torch.manual_seed(521)
    w = Writer("matmul", "torch.matmul a @ b with broadcast batch dims and 1-D operands, "
               "float64; prefix <case>.")
    for name, sa, sb in MATMUL_CASES:
        put_case(w, name + ".", lambda a, b: torch.matmul(a, b), {"a": rnd(*sa), "b": rnd(*sb)},
                 double=True)
    w.close()


# ---- attention ----

def attention_reference(q, k, v, is_causal):
    """PyTorch 2's scaled_dot_product_attention(q, k, v, is_causal=is_causal) composed from 1.13
    ops: query i attends keys j <= i when causal (top-left aligned)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if is_causal:
        keep = torch.ones(s.size(-2), s.size(-1), dtype=torch.bool).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def gen_attention():
    cases = [
        ("sdpa", "q (2,3,5,4), k (2,3,7,4), v (2,3,7,6), not causal", (2, 3, 5, 4), 7, 6, False),
        ("sdpa_causal", "q, k (2,2,6,8), v (2,2,6,3), causal", (2, 2, 6, 8), 6, 3, True),
        ("sdpa_causal_rect", "q (1,2,5,4), k (1,2,8,4), v (1,2,8,3), causal (top-left)",
         (1, 2, 5, 4), 8, 3, True),
        ("sdpa_causal_long", "q, k, v (1,2,70,4), causal: more than one block of 64 rows",
         (1, 2, 70, 4), 70, 4, True),
    ]
    for i, (name, comment, qs, s, dv, causal) in enumerate(cases):
        torch.manual_seed(531 + i)
        ks = qs[:-2] + (s, qs[-1])
        vs = qs[:-2] + (s, dv)
        single_case(name, "scaled_dot_product_attention " + comment +
                    " (1.13 composition in float64)",
                    lambda q, k, v: attention_reference(q, k, v, causal),
                    {"q": rnd(*qs), "k": rnd(*ks), "v": rnd(*vs)}, double=True)


# ---- integer index tensors ----

def gen_index():
    """cross_entropy with class dimension 1 of a (N,C,d) input and (N,d) int64 targets, plain
    and with weight, ignore_index and label smoothing; targets are written as float values
    (small exact integers) and read into an IndexTensor."""
    torch.manual_seed(541)
    w = Writer("cross_entropy_kdim",
               "F.cross_entropy(logits (2,5,3), targets (2,3) int64): mean over the 6 targets; "
               "prefix plain. and options. (weight (5), ignore_index 2, label_smoothing 0.1)")
    logits = rnd(2, 5, 3)
    targets = torch.tensor([[0, 4, 2], [3, 1, 4]])
    weight = torch.rand(5) + 0.5
    w.put("targets", targets)
    w.put("weight", weight)
    put_case(w, "plain.", lambda x: torch.nn.functional.cross_entropy(x, targets), {"x": logits})
    put_case(w, "options.",
             lambda x: torch.nn.functional.cross_entropy(x, targets, weight=weight, ignore_index=2,
                                                         label_smoothing=0.1), {"x": logits})
    w.close()


if __name__ == "__main__":
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.set_num_threads(1)
    gen_masking()
    gen_split()
    gen_matmul()
    gen_attention()
    gen_index()
