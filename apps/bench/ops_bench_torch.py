# PyTorch counterpart of ops_bench.cpp (same shapes, same table: median ms per call of 20).
import statistics, time, torch
torch.manual_seed(0)
print("torch", torch.__version__, "threads", torch.get_num_threads(), "; median ms per call of 20")
def tm(f, reps=20):
    f(); times = []
    for _ in range(reps):
        t0 = time.perf_counter(); f(); times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3
x = torch.randn(128, 784); w1 = torch.randn(512, 784, requires_grad=True); b1 = torch.randn(512, requires_grad=True)
w2 = torch.randn(256, 512, requires_grad=True); b2 = torch.randn(256, requires_grad=True)
w3 = torch.randn(10, 256, requires_grad=True); b3 = torch.randn(10, requires_grad=True)
t = torch.arange(128) % 10
a = torch.randn(512, 512); b = torch.randn(512, 512)
big = torch.randn(128, 64, 16, 16); bias = torch.randn(64, 1, 1)
F = torch.nn.functional
def mlp():
    h = F.relu(F.linear(x, w1, b1)); h = F.relu(F.linear(h, w2, b2))
    F.cross_entropy(F.linear(h, w3, b3), t).backward()
h = torch.randn(4096, 512, requires_grad=True); gh = torch.randn(4096, 512)
scores = torch.randn(128, 128, 128, requires_grad=True); gs = torch.randn(128, 128, 128)
q, k, v = (torch.randn(128, 128, 32, requires_grad=True) for _ in range(3)); gq = torch.randn(128, 128, 32)
causal = torch.ones(128, 128, dtype=torch.bool).triu(1)
def sdpa():  # torch 1.13 has no fused scaled_dot_product_attention: the same math in ops
    s = (q @ k.transpose(-2, -1) * 32 ** -0.5).masked_fill(causal, float("-inf"))
    (F.softmax(s, -1) @ v).backward(gq)
for name, f in [("gelu fwd (4096,512)", lambda: F.gelu(h.detach())),
                ("gelu fwd+bwd (4096,512)", lambda: F.gelu(h).backward(gh)),
                ("gelu tanh fwd+bwd (4096,512)", lambda: F.gelu(h, approximate="tanh").backward(gh)),
                ("softmax fwd (128,128,128) dim -1", lambda: F.softmax(scores.detach(), -1)),
                ("softmax fwd+bwd (128,128,128) dim -1", lambda: F.softmax(scores, -1).backward(gs)),
                ("sdpa causal fwd+bwd (128,128,32)", sdpa)]:
    print("%-40s %10.3f ms" % (name, tm(f)))
for name, f in [("matmul 512x512x512", lambda: a @ b), ("matmul 512x512x512 (a^T b^T views)", lambda: a.t() @ b.t()),
                ("add same shape 2M", lambda: big + big), ("add bias (128,64,16,16)+(64,1,1)", lambda: big + bias),
                ("relu 2M", lambda: F.relu(big)), ("sum 2M", lambda: big.sum()), ("mlp fwd+bwd 128x784-512-256-10", mlp)]:
    print("%-40s %10.3f ms" % (name, tm(f)))
