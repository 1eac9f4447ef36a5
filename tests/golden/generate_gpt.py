#!/usr/bin/python3
"""PyTorch reference values for models::GPT: a small GPT (models/gpt_torch.py, dropout 0) with
random weights, its logits for a batch of ids, the next-token cross_entropy and the gradient of
every parameter.

Run with Debian's python3-torch (1.13):   /usr/bin/python3 tests/golden/generate_gpt.py
Output: tests/golden/data/gpt_small.txt (committed; the C++ tests never run Python).
"""
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "models"))
from generate import OUT_DIR, Writer  # noqa: E402
from gpt_torch import GPT  # noqa: E402


def gen_gpt_small():
    torch.manual_seed(900)
    vocab, context, t = 11, 8, 6
    model = GPT(vocab_size=vocab, context=context, d_model=8, n_layers=2, n_heads=2, dropout=0.0)
    with torch.no_grad():  # weights large enough that every op matters
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) * 0.3)
    ids = torch.randint(0, vocab, (2, t + 1))
    x, y = ids[:, :-1], ids[:, 1:]
    w = Writer("gpt_small", "models/gpt_torch.py GPT(vocab 11, context 8, d_model 8, 2 layers, "
               "2 heads, dropout 0), weights N(0, 0.3): logits of ids (2,6), cross_entropy against "
               "the next tokens, and every parameter's gradient")
    for k, v in model.state_dict().items():
        w.put("param." + k, v)
    w.put("ids", x)
    w.put("targets", y)
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
    loss.backward()
    w.put("logits", logits)
    w.put("loss", loss)
    for k, p in model.named_parameters():
        w.put("grad." + k, p.grad)
    w.close()


if __name__ == "__main__":
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.set_num_threads(1)
    gen_gpt_small()
