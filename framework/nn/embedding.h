#pragma once
// nn::Embedding: a lookup table of num_embeddings vectors of size embedding_dim, as
// torch.nn.Embedding(num_embeddings, embedding_dim) (no padding_idx, max_norm or sparse).
//
// The parameter "weight" (num_embeddings, embedding_dim) starts from N(0, 1) like torch's,
// drawn from the given Generator (or the default generator). Indices are int64 values in
// [0, num_embeddings); a Tensor of indices (hsgd tensors are float32) holds exact non-negative
// integers, as data::Batch targets and from_indices() make them. The output has the indices'
// shape plus a last dimension embedding_dim; the weight's gradient is dense.
//
// Usage:
//   hsgd::Generator gen(0);
//   auto emb = std::make_shared<nn::Embedding>(1000, 64, gen);
//   Tensor tokens = emb->forward({3, 14, 15, 92, 65, 35}, {2, 3});   // (2,3,64)
//   Tensor same = emb->forward(from_indices({3, 14, 15}));           // (3,64)
//   Tensor ids = emb->forward(IndexTensor({3, 14, 15, 92}, {2, 2}));   // (2,2,64)
//
// Errors (InvalidArgument naming the value): num_embeddings or embedding_dim < 1; an index out
// of [0, num_embeddings) (naming its position); indices whose count does not match the shape; a
// tensor element that is not a non-negative integer.

#include <cstdint>
#include <vector>

#include "framework/nn/module.h"
#include "framework/tensor/index_tensor.h"

namespace hsgd::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen);

  // indices (any shape, float32 holding integers) -> (*indices.shape, embedding_dim).
  Tensor forward(const Tensor& indices) override;
  // indices (any shape) -> (*indices.shape, embedding_dim).
  Tensor forward(const IndexTensor& indices) override;
  // indices in row-major order of `shape` -> (*shape, embedding_dim).
  Tensor forward(const std::vector<int64_t>& indices, const Shape& shape);

  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }
  Tensor weight() const { return weight_; }

 private:
  void reset_parameters(Generator& gen);

  int64_t num_embeddings_;
  int64_t embedding_dim_;
  Tensor weight_;  // (num_embeddings, embedding_dim)
};

}  // namespace hsgd::nn
