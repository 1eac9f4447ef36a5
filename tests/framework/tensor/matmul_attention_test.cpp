// Broadcasting matmul and scaled_dot_product_attention: values and gradients against PyTorch
// 1.13 (tests/golden/generate_tensor_ops.py), numerical Jacobians, the fused attention against
// its composition from hsgd's own ops over several row blocks, and the errors for bad shapes.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/tensor/nn_ops.h"
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

// ---- scaled_dot_product_attention ----

// The unfused definition: softmax(q k^T * scale + causal mask) v, from hsgd's ops.
Tensor composed_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                          float scale) {
  Tensor s = matmul(q, k.transpose(-1, -2)) * scale;  // (...,T,S)
  if (causal) {
    const Tensor above = 1.0f - tril(ones({q.size(-2), k.size(-2)}));
    s = masked_fill(s, above, -INFINITY);
  }
  return matmul(softmax(s, -1), v);
}

void expect_attention_case(const std::string& name, bool causal) {
  SCOPED_TRACE(name);
  golden::File f(name);
  Tensor q = f.leaf("q"), k = f.leaf("k"), v = f.leaf("v");
  Tensor out = scaled_dot_product_attention(q, k, v, causal);
  // Gradients are sums over the S keys; atol covers float32 rounding of terms that cancel.
  constexpr double kAtol = 1e-5;
  expect_close(out, f.tensor("out"), name + " out", golden::kRtol, kAtol);
  sum(out * f.tensor("gout")).backward();
  expect_close(q.grad(), f.tensor("grad_q"), name + " grad_q", golden::kRtol, kAtol);
  expect_close(k.grad(), f.tensor("grad_k"), name + " grad_k", golden::kRtol, kAtol);
  expect_close(v.grad(), f.tensor("grad_v"), name + " grad_v", golden::kRtol, kAtol);
}

TEST(TensorOpsTest, ScaledDotProductAttention_MatchesPyTorch_NotCausal) {
  expect_attention_case("sdpa", false);  // T 5, S 7
}

TEST(TensorOpsTest, ScaledDotProductAttention_MatchesPyTorch_Causal) {
  expect_attention_case("sdpa_causal", true);
  expect_attention_case("sdpa_causal_rect", true);  // T 5 < S 8: top-left aligned
  expect_attention_case("sdpa_causal_long", true);  // T 70: two row blocks
}

TEST(TensorOpsTest, ScaledDotProductAttention_Gradcheck) {
  Generator gen(53);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    EXPECT_TRUE(expect_gradients_match(
        [causal](In in) { return scaled_dot_product_attention(in[0], in[1], in[2], causal); },
        {param({2, 4, 3}, gen), param({2, 4, 3}, gen), param({2, 4, 2}, gen)}));
    EXPECT_TRUE(expect_gradients_match(
        [causal](In in) { return scaled_dot_product_attention(in[0], in[1], in[2], causal, 0.7); },
        {param({1, 2, 3, 2}, gen), param({1, 2, 5, 2}, gen), param({1, 2, 5, 3}, gen)}));
  }
}

TEST(TensorOpsTest, ScaledDotProductAttention_MatchesComposition_ManyRowBlocks) {
  Generator gen(54);
  // T = 150: blocks of 64, 64 and 22 rows; causal blocks use 64, 128 and 150 keys.
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    Tensor q = param({2, 150, 8}, gen), k = param({2, 150, 8}, gen), v = param({2, 150, 5}, gen);
    Tensor q2 = q.detach().clone().set_requires_grad(true);
    Tensor k2 = k.detach().clone().set_requires_grad(true);
    Tensor v2 = v.detach().clone().set_requires_grad(true);
    const Tensor gout = randn({2, 150, 5}, gen);
    Tensor fused = scaled_dot_product_attention(q, k, v, causal);
    Tensor composed = composed_attention(q2, k2, v2, causal, 1.0f / std::sqrt(8.0f));
    expect_close(fused, composed.detach(), "out", 1e-4, 1e-5);
    sum(fused * gout).backward();
    sum(composed * gout).backward();
    expect_close(q.grad(), q2.grad(), "grad_q", 1e-3, 1e-5);
    expect_close(k.grad(), k2.grad(), "grad_k", 1e-3, 1e-5);
    expect_close(v.grad(), v2.grad(), "grad_v", 1e-3, 1e-5);
  }
}

TEST(TensorOpsTest, ScaledDotProductAttention_ReadsStridedHeadsInPlace_SameBitsAsContiguous) {
  Generator gen(55);
  const int64_t b = 2, t = 70, h = 3, d = 4;
  // q, k, v as a GPT splits them from one (B,T,3C) projection: (B,H,T,D) views with row stride
  // 3C; and a value whose last dim is not unit-stride, which is read through a copy.
  const Tensor qkv = randn({b, t, 3 * h * d}, gen);
  const Tensor v_t = randn({b, h, d, t}, gen);
  const Tensor gout = randn({b, h, t, d}, gen);
  for (bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "not causal");
    Tensor base = qkv.clone().set_requires_grad(true);
    Tensor v_base = v_t.clone().set_requires_grad(true);
    auto heads = [&](int64_t i) {
      return base.narrow(2, i * h * d, h * d).reshape({b, t, h, d}).transpose(1, 2);
    };
    const Tensor q = heads(0), k = heads(1), v = v_base.transpose(-1, -2);
    ASSERT_FALSE(q.is_contiguous());
    Tensor qc = q.detach().contiguous().set_requires_grad(true);
    Tensor kc = k.detach().contiguous().set_requires_grad(true);
    Tensor vc = v.detach().contiguous().set_requires_grad(true);
    Tensor strided = scaled_dot_product_attention(q, k, v, causal);
    Tensor packed = scaled_dot_product_attention(qc, kc, vc, causal);
    // The output follows the query's (B,T,H,D) memory order.
    EXPECT_TRUE(strided.transpose(1, 2).is_contiguous());
    EXPECT_EQ(strided.to_vector(), packed.to_vector());
    sum(strided * gout).backward();
    sum(packed * gout).backward();
    const Tensor grad_q = base.grad().narrow(2, 0, h * d).reshape({b, t, h, d}).transpose(1, 2);
    const Tensor grad_k = base.grad().narrow(2, h * d, h * d).reshape({b, t, h, d}).transpose(1, 2);
    EXPECT_EQ(grad_q.to_vector(), qc.grad().to_vector());
    EXPECT_EQ(grad_k.to_vector(), kc.grad().to_vector());
    EXPECT_EQ(v_base.grad().transpose(-1, -2).to_vector(), vc.grad().to_vector());
  }
}

TEST(TensorOpsTest, ScaledDotProductAttention_RejectsMismatchedShapes) {
  EXPECT_THAT(error_message([] {
                scaled_dot_product_attention(zeros({2, 5, 4}), zeros({2, 6, 3}), zeros({2, 6, 4}));
              }),
              HasSubstr("key [2, 6, 3] must have the query's embedding size D = 4"));
  EXPECT_THAT(error_message([] {
                scaled_dot_product_attention(zeros({2, 5, 4}), zeros({2, 6, 4}), zeros({2, 7, 4}));
              }),
              HasSubstr("value [2, 7, 4] must have the key's sequence length S = 6"));
  EXPECT_THAT(error_message([] {
                scaled_dot_product_attention(zeros({2, 5, 4}), zeros({1, 6, 4}), zeros({1, 6, 4}));
              }),
              HasSubstr("must be equal (no broadcasting)"));
  EXPECT_THAT(error_message([] {
                scaled_dot_product_attention(zeros({5, 4}), zeros({0, 4}), zeros({0, 4}));
              }),
              HasSubstr("has no positions (S = 0)"));
}

}  // namespace
}  // namespace hsgd
