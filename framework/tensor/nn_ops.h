#pragma once
// Differentiable neural-network ops: convolution, pooling, batch and layer normalisation,
// dropout, GELU / SiLU, embedding lookup and scaled dot-product attention.
// They follow torch.nn.functional (conv2d without groups/dilation, pooling with ceil_mode=False,
// avg_pool2d with count_include_pad=True) and, like everything in ops.h, record autograd history
// when grad mode is on and an input requires grad. Bad input (wrong rank, channel mismatch, a
// kernel larger than the padded input, p outside [0,1), ...) throws hsgd::InvalidArgument naming
// the values. Inputs may be non-contiguous; they are copied once when they are.
//
// The raw kernels are in conv_kernels.h, pool_kernels.h and batch_norm_kernels.h.
//
// Usage:
//   Tensor w = randn({16, 3, 3, 3}, gen), b = zeros({16});   // x is (N,3,32,32)
//   Tensor gamma = ones({16}), beta = zeros({16}), mean = zeros({16}), var = ones({16});
//   Tensor h = conv2d(x, w, b, {1, 1}, {1, 1});              // (N,16,32,32)
//   h = relu(batch_norm(h, gamma, beta, mean, var, true));   // training: updates mean, var
//   h = max_pool2d(h, {2, 2});                               // (N,16,16,16)
//   h = adaptive_avg_pool2d(h, {1, 1});                      // (N,16,1,1)

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "framework/tensor/generator.h"
#include "framework/tensor/index_tensor.h"
#include "framework/tensor/tensor.h"

namespace hsgd {

using Size2 = std::array<int64_t, 2>;  // (height, width)

// 2-D cross-correlation, as torch.nn.functional.conv2d. x is (N,C,H,W), w is (O,C,kh,kw),
// b is (O) or undefined (no bias). Output (N,O,OH,OW), OH = (H + 2*padding[0] - kh) / stride[0]
// + 1. Computed with im2col + OpenBLAS sgemm; 1x1 stride-1 unpadded convolutions skip the unfold.
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b = Tensor(), Size2 stride = {1, 1},
              Size2 padding = {0, 0});

// Max over kernel windows of each plane of x, (N,C,H,W) or (C,H,W). stride {0,0} means
// stride = kernel (torch's default). Padding (at most half the kernel) counts as -inf. A NaN in
// a window wins. The gradient goes to the position of the maximum.
Tensor max_pool2d(const Tensor& x, Size2 kernel, Size2 stride = {0, 0}, Size2 padding = {0, 0});

// Mean over kernel windows; zero padding is included in the divisor (count_include_pad=True),
// so every window divides by kernel[0]*kernel[1]. stride {0,0} means stride = kernel.
Tensor avg_pool2d(const Tensor& x, Size2 kernel, Size2 stride = {0, 0}, Size2 padding = {0, 0});

// Mean pooling to a fixed output size: output row i averages input rows
// floor(i*H/OH) .. ceil((i+1)*H/OH) - 1, likewise for columns. x is (N,C,H,W) or (C,H,W).
Tensor adaptive_avg_pool2d(const Tensor& x, Size2 output_size);

// Batch normalisation over dim 1 of x, (N,C), (N,C,L) or (N,C,H,W), as
// torch.nn.functional.batch_norm:
//   training: normalises with the batch mean and BIASED batch variance, and when running_mean /
//             running_var are defined updates them IN PLACE (not recorded by autograd):
//             running = (1 - momentum) * running + momentum * batch_stat, using the UNBIASED
//             batch variance for running_var. Needs more than one value per channel.
//   eval:     normalises with running_mean and running_var, which must be defined.
// y = (x - mean) / sqrt(var + eps) * weight + bias; weight and bias are (C) or undefined
// (meaning 1 and 0). Gradients flow to x, weight and bias, never to the running statistics.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor running_mean,
                  Tensor running_var, bool training, double momentum = 0.1, double eps = 1e-5);

// relu(batch_norm(...)) with the same arguments, values and gradients, in one pass over memory
// forward and backward (the pair that follows most convolutions of a ResNet).
Tensor batch_norm_relu(const Tensor& x, const Tensor& weight, const Tensor& bias,
                       Tensor running_mean, Tensor running_var, bool training,
                       double momentum = 0.1, double eps = 1e-5);

// relu(batch_norm(x, ...) + residual), residual of x's shape, with the same values and gradients
// as those three ops, in one pass over memory forward and backward (the end of a ResNet block).
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& weight,
                           const Tensor& bias, Tensor running_mean, Tensor running_var,
                           bool training, double momentum = 0.1, double eps = 1e-5);

// Inverted dropout: in training each element is zeroed with probability p and the survivors are
// scaled by 1/(1-p), so the expected value is unchanged; the mask is drawn from gen, so the same
// generator state gives the same mask. In eval (or with p == 0) returns x itself.
// p must be in [0, 1).
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);

// Layer normalisation over the trailing dimensions, as torch.nn.functional.layer_norm: x's last
// dims must equal normalized_shape (InvalidArgument naming both shapes otherwise); each slice
// x[..., :] of shape normalized_shape is normalised with its mean and BIASED variance,
// y = (x - mean) / sqrt(var + eps) * weight + bias; weight and bias have shape normalized_shape
// or are undefined (1 and 0). Gradients flow to x, weight and bias.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

// x * Phi(x), Phi the standard normal CDF (approximate "none", exact with erf), or its tanh
// approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (approximate "tanh"), as
// torch.nn.functional.gelu. Another approximate is InvalidArgument.
Tensor gelu(const Tensor& x, const std::string& approximate = "none");

// x * sigmoid(x) (torch.nn.functional.silu, a.k.a. swish).
Tensor silu(const Tensor& x);

// Rows of weight (V, D) picked by indices: the output has shape indices_shape + (D), as
// torch.nn.functional.embedding. indices holds shape_numel(indices_shape) values in [0, V)
// (InvalidArgument naming the position and value otherwise). The gradient of weight adds up the
// output gradients of every position that picked a row (dense, V x D).
Tensor embedding(const Tensor& weight, const std::vector<int64_t>& indices,
                 const Shape& indices_shape);

// embedding with the indices in an IndexTensor: the output is (*indices.shape, D).
Tensor embedding(const Tensor& weight, const IndexTensor& indices);

// Attention softmax(query key^T * scale, causally masked when is_causal) value over the last two
// dims, as PyTorch 2's torch.nn.functional.scaled_dot_product_attention without its attn_mask
// and dropout_p (so is_causal is the FOURTH argument here; for another mask compose masked_fill,
// softmax and matmul). query is (...,T,D), key (...,S,D), value (...,S,Dv), with EQUAL leading
// (batch, head) dims (no broadcasting); the output is (...,T,Dv). scale defaults to 1/sqrt(D).
// is_causal lets query i attend to keys j <= i (torch's top-left alignment, also when T != S).
// S must be >= 1. Gradients flow to query, key and value.
// Fused: per batch-head the (T,S) scores exist only one block of 64 query rows at a time, in the
// forward and in the backward, which recomputes them from each row's saved log-sum-exp; the
// extra memory is (...,T) floats plus one block. Heads are read in place when the last dim is
// unit-stride (a (B,H,T,D) transpose of a (B,T,H*D) projection needs no copy); the output and the
// gradients are laid out in memory as query (resp. key, value) is, so the output of such a query
// is a (B,H,T,Dv) view of a (B,T,H,Dv) buffer (not contiguous, like torch's transposed results).
Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);

}  // namespace hsgd
