// masked_fill, where, tril / triu, split and chunk: values and gradients against PyTorch 1.13
// (tests/golden/generate_tensor_ops.py), numerical Jacobians, views, and the errors for bad input.

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

// A float 0/1 tensor with about half ones.
Tensor random_mask(Shape shape, Generator& gen) {
  const std::vector<float> u = rand(shape, gen).to_vector();
  std::vector<float> m;
  for (float v : u) m.push_back(v < 0.5f ? 1.0f : 0.0f);
  return from_vector(m, std::move(shape));
}

// ---- masked_fill and where ----

TEST(TensorOpsTest, MaskedFill_MatchesPyTorch_Broadcast) {
  golden::File f("masked_fill_broadcast");
  Tensor x = f.leaf("x");
  Tensor out = masked_fill(x, f.tensor("mask"), -2.5f);
  expect_close(out, f.tensor("out"), "out");
  sum(out * f.tensor("gout")).backward();
  expect_close(x.grad(), f.tensor("grad_x"), "grad_x");
}

TEST(TensorOpsTest, MaskedFill_MatchesPyTorch_MaskExpandsInput) {
  golden::File f("masked_fill_expand");
  Tensor x = f.leaf("x");  // (4,5) against a (2,4,5) mask: the output is (2,4,5)
  Tensor out = masked_fill(x, f.tensor("mask"), 7.0f);
  EXPECT_EQ(out.shape(), (Shape{2, 4, 5}));
  expect_close(out, f.tensor("out"), "out");
  sum(out * f.tensor("gout")).backward();
  expect_close(x.grad(), f.tensor("grad_x"), "grad_x");
}

TEST(TensorOpsTest, Where_MatchesPyTorch_Broadcast) {
  golden::File f("where_broadcast");
  Tensor a = f.leaf("a"), b = f.leaf("b");
  Tensor out = where(f.tensor("condition"), a, b);
  expect_close(out, f.tensor("out"), "out");
  sum(out * f.tensor("gout")).backward();
  expect_close(a.grad(), f.tensor("grad_a"), "grad_a");
  expect_close(b.grad(), f.tensor("grad_b"), "grad_b");
}

TEST(TensorOpsTest, MaskedFillAndWhere_Gradcheck_BroadcastShapes) {
  Generator gen(41);
  struct Case {
    Shape x, mask;
  };
  for (const Case& c : {Case{{3, 4}, {3, 4}}, Case{{2, 3, 4}, {4}}, Case{{4}, {2, 3, 4}},
                        Case{{2, 1, 4}, {3, 1}}, Case{{}, {2, 2}}}) {
    SCOPED_TRACE(shape_str(c.x) + " mask " + shape_str(c.mask));
    const Tensor mask = random_mask(c.mask, gen);
    EXPECT_TRUE(expect_gradients_match([mask](In in) { return masked_fill(in[0], mask, -3.0f); },
                                       {param(c.x, gen)}));
    EXPECT_TRUE(expect_gradients_match([mask](In in) { return where(mask, in[0], in[1]); },
                                       {param(c.x, gen), param(c.mask, gen)}));
    EXPECT_TRUE(expect_gradients_match([mask](In in) { return where(mask, in[1], in[0]); },
                                       {param(c.x, gen), param({1}, gen)}));
  }
}

TEST(TensorOpsTest, MaskedFill_MaskGetsNoGradient) {
  Tensor x = ones({2, 2}).set_requires_grad(true);
  Tensor mask = from_vector({1, 0, 0, 1}, {2, 2}).set_requires_grad(true);
  sum(masked_fill(x, mask, 5.0f)).backward();
  EXPECT_FALSE(mask.grad().defined());
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{0, 1, 1, 0}));
}

TEST(TensorOpsTest, MaskedFill_RejectsMaskValuesOtherThanZeroAndOne) {
  const std::string msg = error_message([] {
    masked_fill(zeros({2, 2}), from_vector({0, 1, 0.5f, 0}, {2, 2}), 1.0f);
  });
  EXPECT_THAT(msg, HasSubstr("masked_fill: mask element 2"));
  EXPECT_THAT(msg, HasSubstr("is 0.5, expected 0 or 1"));
  const std::string additive = error_message([] {
    where(from_vector({0, -1e9f}), zeros({2}), ones({2}));
  });
  EXPECT_THAT(additive, HasSubstr("where: condition element 1"));
  EXPECT_THAT(additive, HasSubstr("-1e+09"));
}

TEST(TensorOpsTest, MaskedFillAndWhere_RejectShapesThatDoNotBroadcast) {
  const std::string msg = error_message([] { masked_fill(zeros({2, 3}), ones({4}), 1.0f); });
  EXPECT_THAT(msg, HasSubstr("masked_fill: shapes input [2, 3], mask [4] do not broadcast"));
  const std::string w = error_message([] { where(ones({3}), zeros({2, 3}), zeros({4, 1, 2})); });
  EXPECT_THAT(w, HasSubstr("where: shapes condition [3], a [2, 3], b [4, 1, 2] do not broadcast"));
}

// ---- tril and triu ----

TEST(TensorOpsTest, TrilTriu_MatchesPyTorch_Diagonals) {
  golden::File f("tril_triu");
  for (const char* op : {"tril", "triu"}) {
    for (int64_t k : {0, 1, -2, 4, -6}) {
      const std::string prefix =
          std::string(op) + "_k" + (k < 0 ? "m" : "") + std::to_string(k < 0 ? -k : k) + ".";
      SCOPED_TRACE(prefix);
      Tensor x = f.leaf(prefix + "x");  // (2,3,5,4)
      Tensor out = std::string(op) == "tril" ? tril(x, k) : triu(x, k);
      expect_close(out, f.tensor(prefix + "out"), prefix + "out");
      sum(out * f.tensor(prefix + "gout")).backward();
      expect_close(x.grad(), f.tensor(prefix + "grad_x"), prefix + "grad_x");
    }
  }
}

TEST(TensorOpsTest, TrilTriu_Gradcheck_BatchedAndNonContiguous) {
  Generator gen(42);
  for (int64_t k : {-1, 0, 2}) {
    SCOPED_TRACE(k);
    EXPECT_TRUE(
        expect_gradients_match([k](In in) { return tril(in[0], k); }, {param({2, 3, 4}, gen)}));
    EXPECT_TRUE(
        expect_gradients_match([k](In in) { return triu(in[0], k); }, {param({3, 5}, gen)}));
    EXPECT_TRUE(expect_gradients_match([k](In in) { return triu(in[0].transpose(0, 1), k); },
                                       {param({4, 3, 2}, gen)}));
  }
}

TEST(TensorOpsTest, Tril_CausalMaskOfOnes) {
  // The mask a causal attention builds: row i keeps columns 0..i.
  EXPECT_EQ(tril(ones({3, 3})).to_vector(), (std::vector<float>{1, 0, 0, 1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(triu(ones({2, 3}), 1).to_vector(), (std::vector<float>{0, 1, 1, 0, 0, 1}));
}

TEST(TensorOpsTest, Tril_RejectsFewerThanTwoDims) {
  EXPECT_THAT(error_message([] { tril(ones({4})); }),
              HasSubstr("tril: needs a tensor of at least 2 dims (..., R, C), got shape [4]"));
  EXPECT_THAT(error_message([] { triu(ones({})); }), HasSubstr("triu: needs"));
}

// ---- split and chunk ----

// The pieces of prefix: out0, out1, ... while the file has them.
void expect_pieces(const golden::File& f, const std::string& prefix, const Tensor& x,
                   const std::vector<Tensor>& pieces) {
  Tensor loss = zeros({});
  size_t i = 0;
  for (; f.has(prefix + "out" + std::to_string(i)); ++i) {
    ASSERT_LT(i, pieces.size()) << prefix << ": torch has more pieces";
    const std::string n = std::to_string(i);
    expect_close(pieces[i], f.tensor(prefix + "out" + n), prefix + "out" + n);
    loss = loss + sum(pieces[i] * f.tensor(prefix + "gout" + n));
  }
  EXPECT_EQ(i, pieces.size()) << prefix << ": piece count";
  loss.backward();
  expect_close(x.grad(), f.tensor(prefix + "grad_x"), prefix + "grad_x");
}

TEST(TensorOpsTest, SplitChunk_MatchesPyTorch_SizesAndGradients) {
  golden::File f("split_chunk");
  auto x = [&](const std::string& prefix) { return f.leaf(prefix + "x"); };  // (4,7,3)
  Tensor a = x("size3_dim1.");
  expect_pieces(f, "size3_dim1.", a, split(a, 3, 1));
  Tensor b = x("size3_dim1_unused.");
  const std::vector<Tensor> pieces = split(b, 3, 1);
  expect_pieces(f, "size3_dim1_unused.", b, {pieces[0], pieces[2]});
  Tensor c = x("sizes214_dim1.");
  expect_pieces(f, "sizes214_dim1.", c, split(c, std::vector<int64_t>{2, 4, 1}, 1));
  Tensor d = x("sizes_dimm1.");
  expect_pieces(f, "sizes_dimm1.", d, split(d, std::vector<int64_t>{1, 0, 2}, -1));
  Tensor e = x("chunk3_dim1.");
  expect_pieces(f, "chunk3_dim1.", e, chunk(e, 3, 1));
  Tensor g = x("chunk4_dim0.");
  expect_pieces(f, "chunk4_dim0.", g, chunk(g, 4, 0));
  Tensor h = x("chunk3_dim2.");
  expect_pieces(f, "chunk3_dim2.", h, chunk(h, 3, 2));
}

TEST(TensorOpsTest, Split_Gradcheck_EveryPieceWeighted) {
  Generator gen(43);
  const Tensor w = randn({5, 3}, gen);
  // Pieces recombined with different weights so that a misplaced gradient shows.
  EXPECT_TRUE(expect_gradients_match(
      [w](In in) {
        const std::vector<Tensor> p = split(in[0], 2, 0);  // 2, 2, 1 rows
        return cat({p[2] * 3.0f, p[0], p[1] * -2.0f}, 0) * w;
      },
      {param({5, 3}, gen)}));
  EXPECT_TRUE(expect_gradients_match(
      [](In in) {
        const std::vector<Tensor> p = chunk(in[0], 2, 1);  // 2, 1 columns
        return p[0] * p[1];
      },
      {param({4, 3}, gen)}));
}

TEST(TensorOpsTest, Split_PiecesAreViewsOfTheInput) {
  Tensor x = arange(6).reshape({2, 3});
  const std::vector<Tensor> p = split(x, std::vector<int64_t>{1, 2}, 1);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_TRUE(p[1].shares_storage_with(x));
  EXPECT_EQ(p[1].to_vector(), (std::vector<float>{1, 2, 4, 5}));
  x.fill_(9.0f);
  EXPECT_EQ(p[0].to_vector(), (std::vector<float>{9, 9}));
}

TEST(TensorOpsTest, Chunk_CanReturnFewerPiecesThanAsked) {
  EXPECT_EQ(chunk(ones({2}), 3).size(), 2u);
  std::vector<int64_t> sizes;
  for (const Tensor& p : chunk(ones({5}), 4)) sizes.push_back(p.size(0));
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 2, 1}));
  // An empty dim gives `chunks` empty pieces and split one, as torch.
  EXPECT_EQ(chunk(zeros({0, 2}), 3).size(), 3u);
  EXPECT_EQ(split(zeros({0, 2}), 4).size(), 1u);
}

TEST(TensorOpsTest, SplitChunk_RejectBadSizes) {
  EXPECT_THAT(error_message([] {
                split(zeros({4, 7}), std::vector<int64_t>{2, 4}, 1);
              }),
              HasSubstr("split: sizes [2, 4] add up to 6, expected the size 7 of dim 1"));
  EXPECT_THAT(error_message([] {
                split(zeros({4, 7}), std::vector<int64_t>{8, -1}, 1);
              }),
              HasSubstr("split: sizes [8, -1] must be non-negative"));
  EXPECT_THAT(error_message([] {
                split(zeros({4, 7}), 0, 1);
              }),
              HasSubstr("split: split_size 0 must be >= 1"));
  EXPECT_THAT(error_message([] {
                split(zeros({4, 7}), 2, 2);
              }),
              HasSubstr("split: dim 2 out of range for shape [4, 7]"));
  EXPECT_THAT(error_message([] { chunk(zeros({4}), 0); }),
              HasSubstr("chunk: chunks 0 must be >= 1"));
}

}  // namespace
}  // namespace hsgd
