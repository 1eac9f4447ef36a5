"""models::GPT's PyTorch twin (models/gpt.h): the same layout, parameter names and
initialisation, for golden tests (tests/golden/generate_gpt.py) and benchmarks
(apps/bench/gpt_step_bench_torch.py). Runs on Debian's python3-torch (1.13), which has no
scaled_dot_product_attention: attention is the composition softmax(q k^T / sqrt(D) + causal
mask) v it is defined as."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_layers):
        super().__init__()
        self.n_heads = n_heads
        self.c_attn = nn.Linear(d_model, 3 * d_model)
        self.c_proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (y.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for y in (q, k, v))
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
        y = F.softmax(s, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.c_fc = nn.Linear(d_model, 4 * d_model)
        self.c_proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d_model, n_heads, n_layers, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, n_layers)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)
        self.attn_dropout = nn.Dropout(dropout)
        self.mlp_dropout = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.attn_dropout(self.attn(self.ln_1(x)))
        return x + self.mlp_dropout(self.mlp(self.ln_2(x)))


class GPT(nn.Module):
    def __init__(self, vocab_size=256, context=128, d_model=128, n_layers=4, n_heads=4,
                 dropout=0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, d_model)
        self.wpe = nn.Embedding(context, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            [Block(d_model, n_heads, n_layers, dropout) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layers))
            elif name.endswith(".weight") and "ln_" not in name:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith(".bias") and "ln_" not in name:
                nn.init.zeros_(p)

    def forward(self, ids):
        t = ids.size(1)
        x = self.drop(self.wte(ids) + self.wpe.weight[:t])
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))
