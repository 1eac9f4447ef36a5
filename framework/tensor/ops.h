#pragma once
// Differentiable tensor functions. Every function here records autograd history when grad mode
// is on and an input requires grad (see framework/autograd/node.h for how ops are written), and
// throws hsgd::InvalidArgument naming the shapes or values when its inputs do not fit.
//
// Binary elementwise ops broadcast like torch: shapes are aligned from the right and each pair of
// sizes must be equal or contain a 1.
//
// Usage:
//   Tensor w = randn({10, 784}, gen), b = zeros({10});
//   Tensor logits = linear(x, w, b);                  // x (N,in), w (out,in), b (out)
//   Tensor loss = cross_entropy(logits, y);           // mean over the batch
//   loss.backward();

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "framework/tensor/index_tensor.h"
#include "framework/tensor/tensor.h"

namespace hsgd {

// ---- broadcasting helpers (also used by backward functions) ----
// The broadcast shape of a and b; InvalidArgument when they do not broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Sums g over the dimensions that broadcasting expanded so the result has shape `shape`
// (the gradient of a broadcast). Returns g itself when the shapes already match.
Tensor sum_to(const Tensor& g, const Shape& shape);
// A contiguous copy of t broadcast to shape.
Tensor expand_copy(const Tensor& t, const Shape& shape);

// ---- elementwise binary (broadcasting) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, float s);
Tensor mul(const Tensor& a, float s);
// a + alpha * b in one pass.
Tensor add(const Tensor& a, const Tensor& b, float alpha);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, float s);
Tensor operator-(const Tensor& a, float s);
Tensor operator*(const Tensor& a, float s);
Tensor operator/(const Tensor& a, float s);
Tensor operator+(float s, const Tensor& a);
Tensor operator-(float s, const Tensor& a);
Tensor operator*(float s, const Tensor& a);
Tensor operator/(float s, const Tensor& a);
Tensor operator-(const Tensor& a);

// ---- elementwise unary ----
Tensor neg(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor pow(const Tensor& x, float exponent);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor abs(const Tensor& x);

// ---- masking and selection (masking.cpp) ----
// hsgd has no bool dtype: a mask or condition is a float tensor whose every element is exactly 0
// (false) or 1 (true), e.g. tril(ones({T, T})) or a padding mask built with from_vector. Any
// other value (0.5, NaN, an additive -inf mask) is InvalidArgument naming its index and value.
// Masks receive no gradient (as torch's bool masks).
//
// x with value wherever mask is 1, as torch.masked_fill. mask and x broadcast together and the
// result has the BROADCAST shape (torch's out-of-place form), e.g. scores (B,H,T,T) with a
// causal mask (T,T). The gradient of x is g where mask is 0, summed back to x's shape.
Tensor masked_fill(const Tensor& x, const Tensor& mask, float value);
// a where condition is 1, b where it is 0, as torch.where: the three shapes broadcast together
// and the result has the broadcast shape. Gradients: a gets g where condition is 1, b where it is
// 0, each summed back to its own shape.
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
// The lower (tril) or upper (triu) triangle of the last two dims of x (..., R, C), batched over
// the leading dims, as torch.tril / torch.triu: element (i, j) is kept when j - i <= k (tril) or
// j - i >= k (triu) and zeroed otherwise; k = 0 is the main diagonal, k > 0 above it. x must be
// at least 2-D. The gradient is the same triangle of g.
Tensor tril(const Tensor& x, int64_t k = 0);
Tensor triu(const Tensor& x, int64_t k = 0);

// ---- linear algebra (kernels::sgemm; transposed views are passed as flags, not copied) ----
// As torch.matmul: a (M,K) @ b (K,N) -> (M,N); with more dims, a (A...,M,K) @ b (B...,K,N) ->
// (F...,M,N) where the batch dims F = broadcast(A, B) (a 2-D operand has none), e.g.
// [2,3,4,5] @ [3,5,4] -> [2,3,4,4]; a 1-D a or b is a row / column vector whose dim is removed
// from the result ([K] @ [K] is a 0-d dot product). The gradient of an operand is summed over
// the batch dims broadcasting expanded for it, without materialising the F-sized products.
Tensor matmul(const Tensor& a, const Tensor& b);
// x (...,in) @ w^T + b: w is (out,in), b is (out) or undefined. Output (...,out).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

// ---- reductions ----
Tensor sum(const Tensor& x);  // 0-d
Tensor sum(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x);  // 0-d
Tensor mean(const Tensor& x, int64_t dim, bool keepdim = false);
// Index of the largest value along dim (first on ties), as float values. Not differentiable.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
// The same indices as int64 (torch's argmax dtype), row-major over the other dimensions, e.g.
// the predicted class of each row of logits (N, C) with dim 1.
std::vector<int64_t> argmax_indices(const Tensor& x, int64_t dim);

// ---- losses ----
// log(softmax(x)) along dim, computed stably.
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor softmax(const Tensor& x, int64_t dim);
// Mean over the batch of -logp[i, targets[i]]. logp is (N,C); targets has N entries in [0, C).
Tensor nll_loss(const Tensor& logp, const std::vector<int64_t>& targets);
// nll_loss(log_softmax(logits, 1), targets): logits (N,C).
Tensor cross_entropy(const Tensor& logits, const std::vector<int64_t>& targets);
// cross_entropy with torch's options and reduction 'mean' (torch.nn.functional.cross_entropy):
// weight (C) rescales each class (undefined: all 1) and the loss is the WEIGHTED mean, divided by
// the sum of the targets' weights; rows whose target equals ignore_index count for nothing
// (neither numerator nor denominator; all rows ignored gives NaN, as torch); label_smoothing s
// in [0, 1] mixes in the uniform distribution: (1 - s) * nll + s / C * the (weighted) mean over
// rows of -sum_c weight[c] logp[i, c]. Other targets must be in [0, C).
Tensor cross_entropy(const Tensor& logits, const std::vector<int64_t>& targets,
                     const Tensor& weight, int64_t ignore_index, double label_smoothing);
// The check of the losses above: every target is in [0, num_classes) or equals ignore_index
// (none when nullopt). Otherwise InvalidArgument naming op, the sample's index in the batch, its
// target, the number of classes and, when dataset_indices holds one entry per target (a data
// loader's indices of the batch), the sample's index in the data set:
// "cross_entropy: sample 3 of the batch of 64 (dataset index 4711) has target 12, expected a class
// index in [0, 10) (the input has 10 classes)".
void check_class_targets(const char* op, const std::vector<int64_t>& targets, int64_t num_classes,
                         std::optional<int64_t> ignore_index = std::nullopt,
                         std::span<const int64_t> dataset_indices = {});
// The losses above with the targets in an IndexTensor, as torch's shapes allow: logits (N,C) with
// targets (N), or logits (N,C,d1,...,dk) with targets (N,d1,...,dk) (class dimension 1), the mean
// taken over all N*d1*...*dk targets; a GPT's logits (B,T,V) go in as logits.reshape({-1, V})
// with targets.reshape({-1}). Other shapes are InvalidArgument naming both.
Tensor cross_entropy(const Tensor& logits, const IndexTensor& targets);
Tensor cross_entropy(const Tensor& logits, const IndexTensor& targets, const Tensor& weight,
                     int64_t ignore_index, double label_smoothing);
Tensor nll_loss(const Tensor& logp, const IndexTensor& targets);
// Class indices held in a tensor (e.g. a batch of labels), for nll_loss / cross_entropy. Every
// value must be a non-negative integer (InvalidArgument naming the index and value otherwise).
std::vector<int64_t> to_indices(const Tensor& t);
// The inverse: a 1-D tensor holding the indices as floats (exact up to 2^24).
Tensor from_indices(const std::vector<int64_t>& indices);
// Mean of (a - b)^2 over all elements.
Tensor mse_loss(const Tensor& a, const Tensor& b);

// ---- shape (free-function forms of the Tensor methods) ----
Tensor reshape(const Tensor& x, Shape shape);
Tensor flatten(const Tensor& x, int64_t start = 0, int64_t end = -1);
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
// Joins tensors along dim; all other sizes must match.
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Views of x along dim, as torch.split: pieces of split_size elements, the last one smaller when
// split_size does not divide x.size(dim) (split_size must be >= 1, or 0 when the dim is empty).
// Each piece is a narrow() view sharing x's storage; gradients of the pieces flow back into x
// (pieces the loss does not use contribute zeros).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
// As torch.split with a list (torch.split_with_sizes): one view per entry of sizes, which must be
// non-negative and add up to x.size(dim).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
// As torch.chunk: split(x, ceil(x.size(dim) / chunks), dim), so there may be FEWER than chunks
// pieces (chunk(ones({5}), 4) gives sizes 2, 2, 1; chunk(ones({2}), 3) gives two); an empty dim
// gives `chunks` empty pieces. chunks >= 1.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

// ---- comparisons ----
// True when shapes are equal and every |a-b| <= atol + rtol*|b|.
bool allclose(const Tensor& a, const Tensor& b, float rtol = 1e-5f, float atol = 1e-8f);

}  // namespace hsgd
