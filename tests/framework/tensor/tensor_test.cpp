// Tensor basics: storage sharing, views, factories, Generator, in-place ops, errors.

#include "framework/tensor/tensor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "comm/error.h"
#include "framework/tensor/ops.h"
#include "tests/support/error_message.h"

namespace hsgd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::error_message;

TEST(TensorTest, UndefinedByDefault) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_THROW(t.shape(), InvalidArgument);
}

TEST(TensorTest, CopyIsShallow_SharesStorageAndAutogradState) {
  Tensor a = zeros({2, 3});
  Tensor b = a;
  b.data()[4] = 7.0f;
  EXPECT_EQ(a.data()[4], 7.0f);
  b.set_requires_grad(true);
  EXPECT_TRUE(a.requires_grad());
  EXPECT_TRUE(a.shares_storage_with(b));
}

TEST(TensorTest, ViewsShareStorage_ButNotAutogradState) {
  Tensor a = arange(6).reshape({2, 3});
  Tensor r = a.reshape({3, 2});
  Tensor tr = a.t();
  Tensor n = a.narrow(1, 1, 2);
  Tensor d = a.detach();
  for (const Tensor* v : {&r, &tr, &n, &d}) EXPECT_TRUE(v->shares_storage_with(a));
  a.data()[5] = 50.0f;  // element (1,2)
  EXPECT_EQ(r.to_vector()[5], 50.0f);
  EXPECT_EQ(tr.to_vector()[5], 50.0f);  // tr(2,1)
  EXPECT_EQ(n.to_vector()[3], 50.0f);   // n(1,1)
  EXPECT_EQ(d.data()[5], 50.0f);
  d.set_requires_grad(true);
  EXPECT_FALSE(a.requires_grad());
}

TEST(TensorTest, CloneIsDeep) {
  Tensor a = arange(4);
  Tensor c = a.clone();
  EXPECT_FALSE(c.shares_storage_with(a));
  c.data()[0] = 9;
  EXPECT_EQ(a.data()[0], 0);
}

TEST(TensorTest, TransposeIsNonContiguousView_ContiguousCopies) {
  Tensor a = arange(6).reshape({2, 3});
  Tensor t = a.t();
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_THAT(t.to_vector(), ElementsAre(0, 3, 1, 4, 2, 5));
  Tensor c = t.contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_FALSE(c.shares_storage_with(a));
  EXPECT_THAT(c.to_vector(), ElementsAre(0, 3, 1, 4, 2, 5));
  // reshape of a non-contiguous tensor copies; view refuses.
  EXPECT_THAT(t.reshape({6}).to_vector(), ElementsAre(0, 3, 1, 4, 2, 5));
  EXPECT_THAT(error_message([&] { t.view({6}); }), HasSubstr("contiguous"));
}

TEST(TensorTest, ReshapeInfersMinusOne_AndRejectsWrongNumel) {
  Tensor a = zeros({4, 6});
  EXPECT_EQ(a.reshape({-1, 3}).shape(), (Shape{8, 3}));
  EXPECT_EQ(a.reshape({2, -1, 4}).shape(), (Shape{2, 3, 4}));
  const std::string msg = error_message([&] { a.reshape({5, 5}); });
  EXPECT_THAT(msg, HasSubstr("[5, 5]"));
  EXPECT_THAT(msg, HasSubstr("[4, 6]"));
  EXPECT_THAT(msg, HasSubstr("24"));
  EXPECT_THROW(a.reshape({-1, 5}), InvalidArgument);
  EXPECT_THROW(a.reshape({-1, -1}), InvalidArgument);
}

TEST(TensorTest, FlattenPermuteSqueeze) {
  Tensor a = arange(24).reshape({2, 3, 4});
  EXPECT_EQ(a.flatten().shape(), (Shape{24}));
  EXPECT_EQ(a.flatten(1).shape(), (Shape{2, 12}));
  EXPECT_EQ(a.flatten(0, 1).shape(), (Shape{6, 4}));
  Tensor p = a.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  // p(i,j,k) = a(j,k,i) = j*12 + k*4 + i
  const std::vector<float> pv = p.to_vector();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(pv[(i * 2 + j) * 3 + k], j * 12 + k * 4 + i);
  EXPECT_EQ(a.unsqueeze(1).shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(a.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(a.unsqueeze(1).squeeze(1).shape(), a.shape());
  EXPECT_THAT(error_message([&] { a.squeeze(0); }), HasSubstr("size 2"));
  EXPECT_THROW(a.permute({0, 0, 1}), InvalidArgument);
}

TEST(TensorTest, SizeAcceptsNegativeDims) {
  Tensor a = zeros({2, 3, 5});
  EXPECT_EQ(a.dim(), 3);
  EXPECT_EQ(a.size(-1), 5);
  EXPECT_EQ(a.size(-3), 2);
  EXPECT_EQ(a.numel(), 30);
  EXPECT_THAT(error_message([&] { a.size(3); }), HasSubstr("dim 3"));
}

TEST(TensorTest, ItemNeedsOneElement) {
  EXPECT_EQ(full({1, 1}, 2.5f).item(), 2.5f);
  EXPECT_EQ(sum(ones({3})).item(), 3.0f);
  EXPECT_THAT(error_message([] { zeros({2, 3}).item(); }), HasSubstr("[2, 3]"));
}

TEST(TensorTest, Factories) {
  EXPECT_THAT(zeros({2}).to_vector(), ElementsAre(0, 0));
  EXPECT_THAT(ones({3}).to_vector(), ElementsAre(1, 1, 1));
  EXPECT_THAT(full({2}, -4.0f).to_vector(), ElementsAre(-4, -4));
  EXPECT_THAT(arange(4).to_vector(), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(zeros({}).numel(), 1);
  EXPECT_EQ(zeros({0, 3}).numel(), 0);
  EXPECT_THAT(from_vector({1, 2, 3, 4, 5, 6}, {2, 3}).t().to_vector(),
              ElementsAre(1, 4, 2, 5, 3, 6));
  const std::string msg = error_message([] { from_vector({1, 2, 3}, {2, 2}); });
  EXPECT_THAT(msg, HasSubstr("3 values"));
  EXPECT_THAT(msg, HasSubstr("[2, 2]"));
}

TEST(TensorTest, InPlaceOps) {
  Tensor a = ones({2, 3});
  a.mul_(3.0f);
  EXPECT_THAT(a.to_vector(), ElementsAre(3, 3, 3, 3, 3, 3));
  a.add_(from_vector({1, 2, 3}), 2.0f);  // broadcast over rows
  EXPECT_THAT(a.to_vector(), ElementsAre(5, 7, 9, 5, 7, 9));
  a.t().copy_(from_vector({1, 2, 3, 4, 5, 6}, {3, 2}));  // write through a transposed view
  EXPECT_THAT(a.to_vector(), ElementsAre(1, 3, 5, 2, 4, 6));
  a.narrow(1, 1, 1).fill_(0.0f);
  EXPECT_THAT(a.to_vector(), ElementsAre(1, 0, 5, 2, 0, 6));
  a.zero_();
  EXPECT_THAT(a.to_vector(), ElementsAre(0, 0, 0, 0, 0, 0));
  EXPECT_THROW(a.copy_(zeros({4})), InvalidArgument);
}

TEST(TensorTest, InPlaceOpsDoNotRecordHistory) {
  Tensor w = ones({3}).set_requires_grad(true);
  w.add_(ones({3}), -0.5f);
  EXPECT_TRUE(w.is_leaf());
  EXPECT_THAT(w.to_vector(), ElementsAre(0.5, 0.5, 0.5));
}

TEST(TensorTest, ToStringShowsShapeAndValues) {
  const std::string s = from_vector({1.5f, 2}, {1, 2}).to_string();
  EXPECT_THAT(s, HasSubstr("[1, 2]"));
  EXPECT_THAT(s, HasSubstr("1.5"));
  EXPECT_EQ(Tensor().to_string(), "Tensor(undefined)");
}

TEST(GeneratorTest, SameSeedSameSequence_DifferentSeedDifferent) {
  Generator a(7), b(7), c(8);
  for (int i = 0; i < 100; ++i) {
    const uint64_t va = a.next_u64();
    EXPECT_EQ(va, b.next_u64());
    EXPECT_NE(va, c.next_u64());
  }
  Generator g1(3), g2(3);
  EXPECT_EQ(randn({5, 5}, g1).to_vector(), randn({5, 5}, g2).to_vector());
}

TEST(GeneratorTest, DistributionsHaveTheirMoments) {
  Generator gen(11);
  const int64_t n = 200000;
  const std::vector<float> u = uniform({n}, -2.0f, 4.0f, gen).to_vector();
  const std::vector<float> z = normal({n}, 1.0f, 3.0f, gen).to_vector();
  double su = 0, sz = 0, sz2 = 0;
  for (float v : u) {
    ASSERT_GE(v, -2.0f);
    ASSERT_LT(v, 4.0f);
    su += v;
  }
  for (float v : z) {
    sz += v;
    sz2 += static_cast<double>(v) * v;
  }
  // Tolerances are ~10 standard errors of the estimates.
  EXPECT_NEAR(su / n, 1.0, 0.04);
  const double mean = sz / n;
  EXPECT_NEAR(mean, 1.0, 0.07);
  EXPECT_NEAR(std::sqrt(sz2 / n - mean * mean), 3.0, 0.05);
  for (int i = 0; i < 1000; ++i) EXPECT_LT(gen.next_below(7), 7u);
}

}  // namespace
}  // namespace hsgd
