// operator<< of Tensor against PyTorch 1.13's printed form (torch.set_printoptions defaults).
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "comm/error.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/tensor.h"

namespace hsgd {
namespace {

std::string printed(const Tensor& t) {
  std::ostringstream out;
  out << t;
  return out.str();
}

TEST(TensorPrintTest, MatrixIsShapedAndAligned) {
  // torch.tensor([[1.0, -2.5, 3.0], [10.0, 0.25, -0.125]])
  const Tensor t = from_vector({1.0f, -2.5f, 3.0f, 10.0f, 0.25f, -0.125f}, {2, 3});
  EXPECT_EQ(printed(t),
            "tensor([[ 1.0000, -2.5000,  3.0000],\n"
            "        [10.0000,  0.2500, -0.1250]])");
}

TEST(TensorPrintTest, ScalarVectorAndThreeDimensions) {
  EXPECT_EQ(printed(full({}, 2.0f)), "tensor(2.)");
  EXPECT_EQ(printed(from_vector({1, 2}, {2})), "tensor([1., 2.])");
  EXPECT_EQ(printed(from_vector({1, 2.5f}, {2})), "tensor([1.0000, 2.5000])");
  EXPECT_EQ(printed(zeros({2, 1, 2})),
            "tensor([[[0., 0.]],\n"
            "\n"
            "        [[0., 0.]]])");
}

TEST(TensorPrintTest, LargeTensorsAreSummarised) {
  const std::string s = printed(zeros({2000}));
  EXPECT_EQ(s, "tensor([0., 0., 0.,  ..., 0., 0., 0.])");
}

TEST(TensorPrintTest, GradFnAndRequiresGradAreShown) {
  Tensor w = ones({2});
  w.set_requires_grad(true);
  EXPECT_EQ(printed(w), "tensor([1., 1.], requires_grad=True)");
  const std::string s = printed(w * 2.0f);
  EXPECT_NE(s.find(", grad_fn=<"), std::string::npos) << s;
  EXPECT_EQ(printed(Tensor()), "tensor(undefined)");
}

TEST(TensorPrintTest, ArgmaxIndicesAreInt64PerRow) {
  const Tensor logits = from_vector({0.1f, 0.9f, 0.0f, 5.0f, -1.0f, 5.0f}, {2, 3});
  EXPECT_EQ(argmax_indices(logits, 1), (std::vector<int64_t>{1, 0}));  // first on ties
  EXPECT_EQ(argmax_indices(logits, 0), (std::vector<int64_t>{1, 0, 1}));
}

TEST(TensorPrintTest, BackwardWithRetainGraphCanRunTwice) {
  Tensor w = from_vector({1, 2, 3}, {3});
  w.set_requires_grad(true);
  Tensor loss = sum(w * w);
  loss.backward(/*retain_graph=*/true);
  loss.backward();  // the graph was kept: gradients add up (2w twice)
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{4, 8, 12}));
  EXPECT_THROW(loss.backward(), Error);  // released by the second pass
}

}  // namespace
}  // namespace hsgd
