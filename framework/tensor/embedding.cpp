// embedding forward (row gather) and backward (row scatter-add).

#include <cstring>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/tensor/nn_ops.h"

namespace hsgd {

using autograd::NeedsGrad;

Tensor embedding(const Tensor& weight, const std::vector<int64_t>& indices,
                 const Shape& indices_shape) {
  HSGD_CHECK(weight.defined() && weight.dim() == 2,
             "embedding: weight must be (num_embeddings, embedding_dim), got ",
             weight.defined() ? shape_str(weight.shape()) : std::string("undefined"));
  HSGD_CHECK(shape_numel(indices_shape) == static_cast<int64_t>(indices.size()),
             "embedding: indices shape ", shape_str(indices_shape), " holds ",
             shape_numel(indices_shape), " values, got ", indices.size(), " indices");
  const int64_t v = weight.size(0), d = weight.size(1);
  for (size_t i = 0; i < indices.size(); ++i) {
    HSGD_CHECK(indices[i] >= 0 && indices[i] < v, "embedding: index ", i, " is ", indices[i],
               ", expected a value in [0, ", v, ") (num_embeddings ", v, ")");
  }
  const Tensor wc = weight.detach().contiguous();
  Shape out_shape = indices_shape;
  out_shape.push_back(d);
  Tensor out = empty(out_shape);
  for (size_t i = 0; i < indices.size(); ++i) {
    std::memcpy(out.data() + static_cast<int64_t>(i) * d, wc.data() + indices[i] * d,
                sizeof(float) * static_cast<size_t>(d));
  }
  if (autograd::needs_grad({weight})) {
    autograd::record(out, "EmbeddingBackward", {weight},
                     [indices, v, d](const Tensor& g, const NeedsGrad&) {
                       const Tensor gc = g.contiguous();  // (..., D)
                       Tensor gw = zeros({v, d});
                       for (size_t i = 0; i < indices.size(); ++i) {
                         const float* src = gc.data() + static_cast<int64_t>(i) * d;
                         float* dst = gw.data() + indices[i] * d;
                         for (int64_t j = 0; j < d; ++j) dst[j] += src[j];
                       }
                       return std::vector<Tensor>{gw};
                     });
  }
  return out;
}

Tensor embedding(const Tensor& weight, const IndexTensor& indices) {
  HSGD_CHECK(indices.defined(), "embedding: the indices tensor is undefined");
  return embedding(weight, indices.to_vector(), indices.shape());
}

}  // namespace hsgd
