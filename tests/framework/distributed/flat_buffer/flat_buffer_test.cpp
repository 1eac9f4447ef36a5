// flatten_into / unflatten_from: the layout (tensors in order, each row-major), the exact
// division, strided tensors, writes through shared storage without autograd history, errors.

#include "framework/distributed/flat_buffer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tests/support/error_message.h"

namespace hsgd::distributed {
namespace {

using hsgd::testing::error_message;
using ::testing::HasSubstr;

constexpr float kSentinel = -12345.0f;

// Values that no two tensors share, so a misplaced slice shows.
std::vector<Tensor> three_tensors() {
  return {from_vector({1, 2, 3, 4, 5, 6}, {2, 3}), from_vector({10, 20, 30, 40}, {4}),
          from_vector({-1.5f, 0.25f}, {1, 1, 2})};
}

TEST(FlatBuffer, Flatten_TensorsInOrderEachRowMajor_RestUntouched) {
  const std::vector<Tensor> tensors = three_tensors();
  EXPECT_EQ(flat_numel(tensors), 12);
  std::vector<float> flat(14, kSentinel);
  EXPECT_EQ(flatten_into(tensors, flat), 12);
  const std::vector<float> expected = {1,  2,  3,  4,     5,     6,         10,
                                       20, 30, 40, -1.5f, 0.25f, kSentinel, kSentinel};
  EXPECT_EQ(flat, expected);
}

TEST(FlatBuffer, Flatten_DividesExactlyAsASeparateDivision) {
  // The averagers pre-divide by the group size while packing: the result must be the bits of
  // x / 7.0f, not of x * (1 / 7.0f), which rounds differently for some of these values.
  const Tensor t = from_vector({0.1f, 0.2f, 0.3f, -7.3f, 1.0f, 3e-38f});
  std::vector<float> flat(6);
  flatten_into({t}, flat, 7.0f);
  const std::vector<float> src = t.to_vector();
  volatile float seven = 7.0f;  // keeps the compiler from folding the reference divisions
  int differs_from_reciprocal = 0;
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(flat[i], src[i] / seven) << "index " << i;
    differs_from_reciprocal += src[i] * (1.0f / seven) != src[i] / seven;
  }
  ASSERT_GT(differs_from_reciprocal, 0) << "the values no longer tell the two roundings apart";
  // Divisor 1 copies the bits, including the sign of zero.
  flatten_into({from_vector({-0.0f})}, flat);
  EXPECT_TRUE(std::signbit(flat[0]));
}

TEST(FlatBuffer, Unflatten_InverseOfFlatten_WritesSharedStorage) {
  const std::vector<Tensor> tensors = three_tensors();
  std::vector<Tensor> targets = {zeros({2, 3}), zeros({4}), zeros({1, 1, 2})};
  const Tensor alias = targets[1];  // shallow copy: the same tensor
  std::vector<float> flat(12);
  flatten_into(tensors, flat);
  EXPECT_EQ(unflatten_from(flat, targets), 12);
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(targets[i].to_vector(), tensors[i].to_vector()) << "tensor " << i;
    EXPECT_EQ(targets[i].shape(), tensors[i].shape()) << "tensor " << i;
  }
  EXPECT_EQ(alias.to_vector(), (std::vector<float>{10, 20, 30, 40}));
}

TEST(FlatBuffer, ChainedOnSubspans_ParamsThenBuffers) {
  const std::vector<Tensor> params = {from_vector({1, 2}), from_vector({3})};
  const std::vector<Tensor> buffers = {from_vector({4, 5, 6})};
  std::vector<float> flat(6);
  const int64_t at = flatten_into(params, flat);
  EXPECT_EQ(at, 3);
  EXPECT_EQ(flatten_into(buffers, std::span<float>(flat).subspan(3)), 3);
  EXPECT_EQ(flat, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  for (float& x : flat) x *= 10;
  std::vector<Tensor> out_params = {zeros({2}), zeros({1})};
  std::vector<Tensor> out_buffers = {zeros({3})};
  unflatten_from(flat, out_params);
  unflatten_from(std::span<const float>(flat).subspan(3), out_buffers);
  EXPECT_EQ(out_params[0].to_vector(), (std::vector<float>{10, 20}));
  EXPECT_EQ(out_params[1].to_vector(), (std::vector<float>{30}));
  EXPECT_EQ(out_buffers[0].to_vector(), (std::vector<float>{40, 50, 60}));
}

TEST(FlatBuffer, StridedViews_ReadAndWrittenInTheirOwnRowMajorOrder) {
  // base is (2,3) [[0 1 2] [3 4 5]]; its transpose (3,2) reads 0 3 1 4 2 5.
  Tensor base = from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  Tensor view = base.t();
  ASSERT_FALSE(view.is_contiguous());
  std::vector<float> flat(6);
  flatten_into({view}, flat);
  EXPECT_EQ(flat, (std::vector<float>{0, 3, 1, 4, 2, 5}));
  // Writing 10..15 through the view puts them in base transposed.
  flat = {10, 11, 12, 13, 14, 15};
  unflatten_from(flat, {view});
  EXPECT_EQ(base.to_vector(), (std::vector<float>{10, 12, 14, 11, 13, 15}));
}

TEST(FlatBuffer, Unflatten_RecordsNoHistoryOnParameters) {
  Tensor param = zeros({3}).set_requires_grad(true);
  const std::vector<float> flat = {1, 2, 3};
  unflatten_from(flat, {param});
  EXPECT_TRUE(param.is_leaf());
  EXPECT_TRUE(param.requires_grad());
  EXPECT_EQ(param.to_vector(), flat);
  Tensor strided = zeros({2, 2}).set_requires_grad(true);
  std::vector<float> out(4);
  flatten_into({strided.t()}, out);  // the contiguous copy of a view must not need a backward
  EXPECT_TRUE(strided.is_leaf());
}

TEST(FlatBuffer, Errors_NameTheTensorAndTheSizes) {
  std::vector<float> flat(5);
  EXPECT_THAT(error_message([&] {
                flatten_into({zeros({2}), Tensor()}, flat);
              }),
              HasSubstr("flatten_into: tensor 1 of 2 is undefined"));
  EXPECT_THAT(error_message([&] { flatten_into(three_tensors(), flat); }),
              HasSubstr("the flat buffer has 5 elements; the 3 tensors need 12"));
  EXPECT_THAT(error_message([&] { unflatten_from(flat, three_tensors()); }),
              HasSubstr("unflatten_from: the flat buffer has 5 elements; the 3 tensors need 12"));
  // Nothing was written before the size check failed.
  EXPECT_EQ(flat, std::vector<float>(5, 0.0f));
  EXPECT_EQ(flatten_into({}, flat), 0);
  EXPECT_EQ(flat_numel({}), 0);
}

}  // namespace
}  // namespace hsgd::distributed
