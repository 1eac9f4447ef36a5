// Winograd conv kernels (framework/kernels/conv_winograd.h): forward and both gradients against
// direct-loop definitions accumulated in double; gradients of conv2d on the
// Winograd route against a numerical Jacobian.

#include "framework/kernels/conv_winograd.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/kernels/conv_kernels.h"
#include "framework/tensor/nn_ops.h"
#include "framework/tensor/ops.h"
#include "tests/framework/tensor/grad_check.h"
#include "tests/framework/tensor/reference.h"

namespace hsgd {
namespace {

struct Shape3x3 {
  int64_t n, c, h, w, o;
};

std::string describe(const Shape3x3& s) {
  return "x (" + std::to_string(s.n) + "," + std::to_string(s.c) + "," + std::to_string(s.h) + "," +
         std::to_string(s.w) + ") o " + std::to_string(s.o);
}

// Batch 1, 1x1 and 2x2 planes (smaller than a tile), odd sizes that leave partial tiles,
// C != O in both directions, ResNet-20 shapes, batches with enough tiles for several tile
// blocks and a last block that is not a multiple of the 16 SIMD lanes, and rows of 8, 16 and 32
// tiles (the direct patch collection), also with an odd number of tile rows.
const std::vector<Shape3x3> kShapes = {
    {1, 1, 1, 1, 1},
    {1, 2, 2, 2, 3},
    {2, 3, 7, 5, 4},
    {1, 5, 9, 6, 2},
    {3, 4, 6, 11, 5},
    {1, 16, 32, 32, 16},
    {2, 64, 8, 8, 64},
    {3, 24, 20, 18, 40},
    {5, 40, 21, 19, 24},
    {1, 3, 32, 32, 16},
    {2, 32, 16, 16, 32},
    {2, 5, 15, 16, 7},
    {1, 4, 9, 15, 3},
    {1, 2, 6, 64, 3},
    // One sample per block in both passes, so the weight gradient accumulates over blocks.
    {3, 32, 32, 32, 32},
};

kernels::Conv2dGeometry geometry(const Shape3x3& s) {
  return kernels::make_conv2d_geometry(s.n, s.c, s.h, s.w, s.o, 3, 3, 1, 1, 1, 1);
}

// gx[n,c,y+i-1,x+j-1] += gy[n,o,y,x] * w[o,c,i,j] and gw[o,c,i,j] += gy[n,o,y,x] *
// x[n,c,y+i-1,x+j-1] over positions inside the plane, in double.
void reference_backward(const std::vector<float>& x, const std::vector<float>& w,
                        const std::vector<float>& gy, const Shape3x3& s, std::vector<float>& gx,
                        std::vector<float>& gw) {
  std::vector<double> dx(x.size(), 0.0), dw(w.size(), 0.0);
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t o = 0; o < s.o; ++o)
      for (int64_t y = 0; y < s.h; ++y)
        for (int64_t xx = 0; xx < s.w; ++xx) {
          const double g = gy[((n * s.o + o) * s.h + y) * s.w + xx];
          for (int64_t c = 0; c < s.c; ++c)
            for (int64_t i = 0; i < 3; ++i)
              for (int64_t j = 0; j < 3; ++j) {
                const int64_t iy = y + i - 1, ix = xx + j - 1;
                if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
                const int64_t xi = ((n * s.c + c) * s.h + iy) * s.w + ix;
                const int64_t wi = ((o * s.c + c) * 3 + i) * 3 + j;
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
        }
  gx.assign(dx.begin(), dx.end());
  gw.assign(dw.begin(), dw.end());
}

// 1e-4 of every value, as the golden tests against PyTorch require.
constexpr double kTol = 1e-4;

// Every instruction set the CPU runs: the AVX-512 build of the kernels and the AVX2 and
// baseline ones that other CPUs would take.
std::vector<kernels::simd::Isa> supported_isas() {
  std::vector<kernels::simd::Isa> out;
  for (auto isa :
       {kernels::simd::Isa::kAvx512, kernels::simd::Isa::kAvx2, kernels::simd::Isa::kBaseline}) {
    if (kernels::simd::isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

TEST(WinogradConvTest, ForwardMatchesDirectDefinition_EverySupportedIsa) {
  ASSERT_FALSE(supported_isas().empty());
  Generator gen(11);
  for (const Shape3x3& s : kShapes) {
    const std::vector<float> x = randn({s.n, s.c, s.h, s.w}, gen).to_vector();
    const std::vector<float> w = randn({s.o, s.c, 3, 3}, gen).to_vector();
    const std::vector<float> expected =
        testing::reference_conv2d(x, w, nullptr, s.n, s.c, s.h, s.w, s.o, 3, 3, 1, 1, 1, 1);
    for (kernels::simd::Isa isa : supported_isas()) {
      std::vector<float> y(expected.size(), NAN);
      kernels::winograd_conv2d_forward(x.data(), w.data(), geometry(s), y.data(), isa);
      testing::expect_near_all(y, expected, kTol, describe(s) + " " + kernels::simd::isa_name(isa));
    }
  }
}

TEST(WinogradConvTest, GradientsMatchDirectDefinition_EverySupportedIsa) {
  Generator gen(12);
  for (const Shape3x3& s : kShapes) {
    const std::vector<float> x = randn({s.n, s.c, s.h, s.w}, gen).to_vector();
    const std::vector<float> w = randn({s.o, s.c, 3, 3}, gen).to_vector();
    const std::vector<float> gy = randn({s.n, s.o, s.h, s.w}, gen).to_vector();
    std::vector<float> gx_ref, gw_ref;
    reference_backward(x, w, gy, s, gx_ref, gw_ref);
    for (kernels::simd::Isa isa : supported_isas()) {
      std::vector<float> gx(x.size(), NAN), gw(w.size(), NAN);
      kernels::winograd_conv2d_backward(x.data(), w.data(), gy.data(), geometry(s), gx.data(),
                                        gw.data(), isa);
      const std::string what = describe(s) + " " + kernels::simd::isa_name(isa);
      testing::expect_near_all(gx, gx_ref, kTol, "gx " + what);
      testing::expect_near_all(gw, gw_ref, kTol, "gw " + what);
    }
  }
}

TEST(WinogradConvTest, OneGradientOnly_LeavesOtherUntouched) {
  Generator gen(13);
  const Shape3x3 s = {2, 3, 7, 5, 4};
  const std::vector<float> x = randn({s.n, s.c, s.h, s.w}, gen).to_vector();
  const std::vector<float> w = randn({s.o, s.c, 3, 3}, gen).to_vector();
  const std::vector<float> gy = randn({s.n, s.o, s.h, s.w}, gen).to_vector();
  std::vector<float> gx_ref, gw_ref;
  reference_backward(x, w, gy, s, gx_ref, gw_ref);
  std::vector<float> gx(x.size(), NAN), gw(w.size(), NAN);
  kernels::winograd_conv2d_backward(x.data(), w.data(), gy.data(), geometry(s), gx.data(), nullptr);
  testing::expect_near_all(gx, gx_ref, kTol, "gx alone");
  kernels::winograd_conv2d_backward(x.data(), w.data(), gy.data(), geometry(s), nullptr, gw.data());
  testing::expect_near_all(gw, gw_ref, kTol, "gw alone");
}

TEST(WinogradConvTest, Conv2dGradientsMatchNumericalJacobian) {
  // conv2d routes every 3x3, stride-1, padding-1 conv to the Winograd kernels.
  Generator gen(14);
  for (const Shape3x3& s : {Shape3x3{2, 3, 5, 4, 2}, Shape3x3{1, 2, 7, 6, 3}}) {
    ASSERT_TRUE(kernels::winograd_applies(geometry(s)));
    std::vector<Tensor> inputs = {randn({s.n, s.c, s.h, s.w}, gen), randn({s.o, s.c, 3, 3}, gen),
                                  randn({s.o}, gen)};
    testing::check_gradients(
        describe(s),
        [](const std::vector<Tensor>& in) {
          return conv2d(in[0], in[1], in[2], {1, 1}, {1, 1});
        },
        inputs);
  }
}

TEST(WinogradConvTest, OnlyStride1Padding1Applies) {
  EXPECT_TRUE(
      kernels::winograd_applies(kernels::make_conv2d_geometry(1, 2, 5, 5, 2, 3, 3, 1, 1, 1, 1)));
  EXPECT_FALSE(
      kernels::winograd_applies(kernels::make_conv2d_geometry(1, 2, 5, 5, 2, 3, 3, 2, 2, 1, 1)));
  EXPECT_FALSE(
      kernels::winograd_applies(kernels::make_conv2d_geometry(1, 2, 5, 5, 2, 3, 3, 1, 1, 0, 0)));
  EXPECT_FALSE(
      kernels::winograd_applies(kernels::make_conv2d_geometry(1, 2, 5, 5, 2, 1, 1, 1, 1, 0, 0)));
}

TEST(WinogradConvTest, OtherGeometry_ThrowsNamingValues) {
  const std::vector<float> x(25, 1.0f), w(9, 1.0f);
  std::vector<float> y(25);
  const kernels::Conv2dGeometry g = kernels::make_conv2d_geometry(1, 1, 5, 5, 1, 3, 3, 2, 2, 1, 1);
  testing::expect_invalid_argument(
      [&] { kernels::winograd_conv2d_forward(x.data(), w.data(), g, y.data()); }, "stride (2,2)");
}

}  // namespace
}  // namespace hsgd
