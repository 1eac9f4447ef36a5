// Broadcasting matmul: values and gradients against PyTorch 1.13
// (tests/golden/generate_tensor_ops.py), numerical Jacobians, strided operands and the errors
// for bad shapes.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/tensor/ops.h"
#include "tests/framework/tensor/grad_check.h"
#include "tests/golden/golden.h"
#include "tests/support/error_message.h"

namespace hsgd {
namespace {

using golden::expect_close;
using testing::error_message;
using testing::expect_gradients_match;
using ::testing::HasSubstr;
using testing::param;
using In = const std::vector<Tensor>&;

// ---- matmul ----

// Case `name` of matmul.txt: out = a @ b and the gradients of sum(out * gout).
void expect_matmul_case(const golden::File& f, const std::string& name) {
  SCOPED_TRACE(name);
  Tensor a = f.leaf(name + ".a"), b = f.leaf(name + ".b");
  Tensor out = matmul(a, b);
  expect_close(out, f.tensor(name + ".out"), name + ".out");
  sum(out * f.tensor(name + ".gout")).backward();
  expect_close(a.grad(), f.tensor(name + ".grad_a"), name + ".grad_a");
  expect_close(b.grad(), f.tensor(name + ".grad_b"), name + ".grad_b");
}

TEST(TensorOpsTest, Matmul_MatchesPyTorch_BroadcastBatch) {
  golden::File f("matmul");
  expect_matmul_case(f, "batch_broadcast");  // [2,3,4,5] @ [3,5,4] -> [2,3,4,4]
  expect_matmul_case(f, "batch_ones");       // [2,1,4,5] @ [1,3,5,2] -> [2,3,4,2]
}

TEST(TensorOpsTest, Matmul_MatchesPyTorch_MatrixAndBatch) {
  golden::File f("matmul");
  expect_matmul_case(f, "matrix_at_batch");  // [3,4] @ [2,3,4,5]
  expect_matmul_case(f, "batch_at_matrix");  // [2,3,4,5] @ [5,2]
  expect_matmul_case(f, "batch_equal");      // [2,3,4] @ [2,4,3]
}

TEST(TensorOpsTest, Matmul_MatchesPyTorch_Vectors) {
  golden::File f("matmul");
  expect_matmul_case(f, "vector_at_batch");   // [5] @ [2,5,3] -> [2,3]
  expect_matmul_case(f, "batch_at_vector");   // [2,3,4,5] @ [5] -> [2,3,4]
  expect_matmul_case(f, "vector_at_matrix");  // [4] @ [4,3] -> [3]
  expect_matmul_case(f, "matrix_at_vector");  // [4,5] @ [5] -> [4]
  expect_matmul_case(f, "dot");               // [5] @ [5] -> []
}

TEST(TensorOpsTest, Matmul_Gradcheck_BroadcastBatch) {
  Generator gen(51);
  struct Case {
    Shape a, b;
  };
  for (const Case& c : {Case{{2, 3, 4, 5}, {3, 5, 2}}, Case{{2, 1, 3, 4}, {1, 2, 4, 3}},
                        Case{{3, 4}, {2, 4, 2}}, Case{{2, 2, 3}, {1, 3, 2}}, Case{{4}, {2, 4, 3}},
                        Case{{2, 1, 3, 4}, {4}}, Case{{3}, {3}}}) {
    SCOPED_TRACE(shape_str(c.a) + " @ " + shape_str(c.b));
    EXPECT_TRUE(expect_gradients_match([](In in) { return matmul(in[0], in[1]); },
                                       {param(c.a, gen), param(c.b, gen)}));
  }
}

TEST(TensorOpsTest, Matmul_NonContiguousBatchedOperands) {
  Generator gen(52);
  // a is a permuted view (last two dims transposed in memory), b a batch-strided narrow view.
  Tensor a_mem = randn({2, 5, 4}, gen), b_mem = randn({3, 5, 6}, gen);
  Tensor a = a_mem.transpose(1, 2).unsqueeze(1);  // (2,1,4,5)
  Tensor b = b_mem.narrow(2, 1, 3);               // (3,5,3)
  const Tensor expected = matmul(a.contiguous(), b.contiguous());
  EXPECT_EQ(expected.shape(), (Shape{2, 3, 4, 3}));
  expect_close(matmul(a, b), expected, "strided operands");
  EXPECT_TRUE(expect_gradients_match(
      [](In in) { return matmul(in[0].transpose(-1, -2), in[1].narrow(2, 1, 3)); },
      {param({2, 1, 5, 4}, gen), param({3, 5, 6}, gen)}));
}

TEST(TensorOpsTest, Matmul_RejectsBatchDimsThatDoNotBroadcast) {
  const std::string msg = error_message([] { matmul(zeros({2, 3, 4, 5}), zeros({4, 5, 4})); });
  EXPECT_THAT(msg, HasSubstr("matmul: batch dimensions [2, 3] and [4] of [2, 3, 4, 5] @ "
                             "[4, 5, 4] do not broadcast (3 vs 4)"));
  EXPECT_THAT(error_message([] { matmul(zeros({3}), zeros({4})); }),
              HasSubstr("matmul: inner dimensions differ: [3] @ [4] (3 vs 4)"));
}

}  // namespace
}  // namespace hsgd
