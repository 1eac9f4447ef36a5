// Micro-benchmark of the tensor ops (not a test; nothing asserts on time). Prints the median
// (bench_util.h) of 20 calls after one warm-up call, in ms; ops_bench_torch.py prints the same
// table for PyTorch. The GELU, softmax and attention rows use the shapes of a GPT training step
// (d_model 128, 4 heads, context 128, batch 32): GELU on the MLP's (4096, 512) hidden layer,
// softmax over the (128 batch-heads, 128, 128) attention scores. Single-threaded comparison:
//   OPENBLAS_NUM_THREADS=1 build/apps/bench/ops_bench
//   OMP_NUM_THREADS=1 /usr/bin/python3 apps/bench/ops_bench_torch.py

#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "apps/bench/bench_util.h"
#include "framework/kernels/vec_math.h"
#include "hsgd.h"

namespace {

// Median wall time of one call of f over reps calls, after one warm-up call.
double time_ms(const std::function<void()>& f, int reps = 20) {
  f();
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    f();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  return median(times);
}

void row(const char* name, const std::function<void()>& f) {
  std::printf("%-40s %10.3f ms\n", name, time_ms(f));
}

}  // namespace

int main() {
  using namespace hsgd;
  std::printf("openblas core: %s, threads %d, vecmath isa %s; median ms per call of 20\n",
              openblas_get_corename(), openblas_get_num_threads(),
              kernels::simd::isa_name(kernels::simd::conv_isa()));
  Generator gen(0);
  // MLP 784-512-256-10 on a batch of 128.
  Tensor x = randn({128, 784}, gen);
  Tensor w1 = randn({512, 784}, gen).set_requires_grad(true);
  Tensor b1 = randn({512}, gen).set_requires_grad(true);
  Tensor w2 = randn({256, 512}, gen).set_requires_grad(true);
  Tensor b2 = randn({256}, gen).set_requires_grad(true);
  Tensor w3 = randn({10, 256}, gen).set_requires_grad(true);
  Tensor b3 = randn({10}, gen).set_requires_grad(true);
  std::vector<int64_t> targets(128);
  for (int i = 0; i < 128; ++i) targets[i] = i % 10;
  Tensor a = randn({512, 512}, gen), b = randn({512, 512}, gen);
  Tensor big = randn({128, 64, 16, 16}, gen), bias = randn({64, 1, 1}, gen);  // 2M elements

  row("matmul 512x512x512", [&] { matmul(a, b); });
  row("matmul 512x512x512 (a^T b^T views)", [&] { matmul(a.t(), b.t()); });
  row("add same shape 2M", [&] { add(big, big); });
  row("add bias (128,64,16,16)+(64,1,1)", [&] { add(big, bias); });
  row("relu 2M", [&] { relu(big); });
  row("sum 2M", [&] { sum(big); });
  // The GPT's hot elementwise ops.
  Tensor h = randn({4096, 512}, gen).set_requires_grad(true);
  Tensor gh = randn({4096, 512}, gen);
  Tensor scores = randn({128, 128, 128}, gen).set_requires_grad(true);
  Tensor gs = randn({128, 128, 128}, gen);
  Tensor q = randn({128, 128, 32}, gen).set_requires_grad(true);
  Tensor k = randn({128, 128, 32}, gen).set_requires_grad(true);
  Tensor v = randn({128, 128, 32}, gen).set_requires_grad(true);
  Tensor gq = randn({128, 128, 32}, gen);
  row("gelu fwd (4096,512)", [&] { gelu(h.detach()); });
  row("gelu fwd+bwd (4096,512)", [&] { gelu(h).backward(gh); });
  row("gelu tanh fwd+bwd (4096,512)", [&] { gelu(h, "tanh").backward(gh); });
  row("softmax fwd (128,128,128) dim -1", [&] { softmax(scores.detach(), -1); });
  row("softmax fwd+bwd (128,128,128) dim -1", [&] { softmax(scores, -1).backward(gs); });
  row("sdpa causal fwd+bwd (128,128,32)",
      [&] { scaled_dot_product_attention(q, k, v, true).backward(gq); });
  row("mlp fwd+bwd 128x784-512-256-10", [&] {
    Tensor h = relu(linear(x, w1, b1));
    h = relu(linear(h, w2, b2));
    cross_entropy(linear(h, w3, b3), targets).backward();
  });
}
