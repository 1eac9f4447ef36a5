#pragma once
// The backward engine. Tensor::backward() calls it; applications rarely need it directly.
//
// Algorithm: count, for every node reachable from the root, how many edges point at it; start
// with the root and its gradient; run a ready node (all its incoming gradients summed), hand its
// outputs to the nodes it points at, and release it. Among ready nodes the latest created runs
// first, and AccumulateGrad nodes run as soon as they are ready, so each leaf's grad-ready hooks
// fire right after its gradient is final for the pass. Runs on the calling thread with grad mode
// off.

#include "framework/tensor/tensor.h"

namespace hsgd::autograd {

// Back-propagates grad_output (root's shape) from root to every leaf that requires grad.
// InvalidArgument when root does not require grad or the shapes differ; hsgd::Error when the
// graph was already released by an earlier backward. retain_graph keeps every node's saved
// tensors and edges, so the same graph can be back-propagated again.
void run_backward(const Tensor& root, const Tensor& grad_output, bool retain_graph = false);

}  // namespace hsgd::autograd
