#pragma once
// resnet_step_bench's per-op view: the op kinds and shapes of one ResNet-20 step (the list
// resnet_step_bench_torch.py keeps too), the forward flop count derived from them, and the table
// of each op's time in hsgd and PyTorch.

#include <cstdint>
#include <string>

namespace resnet_bench {

// Multiply-adds x 2 of one forward pass of one sample of `model` (resnet20 or mlp). Throws
// hsgd::InvalidArgument naming any other model.
double forward_flops_per_sample(const std::string& model);

// Prints the per-op table at batch `batch` and `threads` threads: hsgd's forward and backward
// time of each op (best of `reps` calls), next to PyTorch's from `script` unless no_torch.
// Throws hsgd::Error when the PyTorch script fails.
void print_op_table(const std::string& script, int64_t batch, int reps, bool no_torch, int threads);

}  // namespace resnet_bench
