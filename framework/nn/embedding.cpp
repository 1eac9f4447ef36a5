#include "framework/nn/embedding.h"

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"

namespace hsgd::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim)
    : Module("Embedding"), num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  with_default_generator([&](Generator& gen) { reset_parameters(gen); });
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen)
    : Module("Embedding"), num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  reset_parameters(gen);
}

void Embedding::reset_parameters(Generator& gen) {
  HSGD_CHECK(num_embeddings_ > 0 && embedding_dim_ > 0, "Embedding: num_embeddings ",
             num_embeddings_, " and embedding_dim ", embedding_dim_, " must be positive");
  weight_ = register_parameter("weight", randn({num_embeddings_, embedding_dim_}, gen));
}

Tensor Embedding::forward(const Tensor& indices) {
  HSGD_CHECK(indices.defined(), "Embedding: the indices tensor is undefined");
  return forward(to_indices(indices), indices.shape());
}

Tensor Embedding::forward(const IndexTensor& indices) { return embedding(weight_, indices); }

Tensor Embedding::forward(const std::vector<int64_t>& indices, const Shape& shape) {
  return embedding(weight_, indices, shape);
}

}  // namespace hsgd::nn
