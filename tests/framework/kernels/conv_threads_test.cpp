// The conv kernels split their work across framework/parallel's pool. Their results must be the
// same, bit for bit, at every thread count: each output depends only on its own sample, and the
// weight and bias gradients sum per-block shares in block order with blocks that do not depend on
// the thread count.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "framework/kernels/conv_kernels.h"
#include "framework/parallel/parallel.h"
#include "framework/tensor/generator.h"
#include "framework/tensor/ops.h"

namespace hsgd {
namespace {

struct ConvCase {
  int64_t n, c, h, o, k, stride, pad;
};

std::string describe(const ConvCase& s) {
  return "n " + std::to_string(s.n) + " c " + std::to_string(s.c) + " h " + std::to_string(s.h) +
         " o " + std::to_string(s.o) + " k " + std::to_string(s.k) + " s " +
         std::to_string(s.stride) + " p " + std::to_string(s.pad);
}

struct Outputs {
  std::vector<float> y, gx, gw, gb;
};

Outputs run_conv(const ConvCase& s, int threads) {
  set_num_threads(threads);
  const auto g = kernels::make_conv2d_geometry(s.n, s.c, s.h, s.h, s.o, s.k, s.k, s.stride,
                                               s.stride, s.pad, s.pad);
  Generator gen(7);
  const std::vector<float> x = randn({s.n, s.c, s.h, s.h}, gen).to_vector();
  const std::vector<float> w = randn({s.o, s.c, s.k, s.k}, gen).to_vector();
  const std::vector<float> b = randn({s.o}, gen).to_vector();
  const std::vector<float> gy = randn({s.n, s.o, g.oh, g.ow}, gen).to_vector();
  Outputs out;
  out.y.resize(s.n * s.o * g.oh * g.ow);
  out.gx.resize(x.size());
  out.gw.resize(w.size());
  out.gb.resize(b.size());
  kernels::conv2d_forward(x.data(), w.data(), b.data(), g, out.y.data());
  kernels::conv2d_backward(x.data(), w.data(), gy.data(), g, out.gx.data(), out.gw.data(),
                           out.gb.data());
  return out;
}

TEST(ConvThreadsTest, SameBitsAtOneTwoAndThreeThreads) {
  const int saved = get_num_threads();
  // Winograd (3x3 s1 p1, with several tile blocks), the transposed-conv backward (5x5 s1 p2 with
  // 16 channels), im2col with stride 2, a 1x1 projection, and an RGB stem.
  const std::vector<ConvCase> cases = {
      {9, 16, 32, 16, 3, 1, 1}, {7, 64, 8, 64, 3, 1, 1}, {6, 16, 12, 8, 5, 1, 2},
      {5, 16, 16, 32, 3, 2, 1}, {9, 32, 16, 64, 1, 2, 0}, {4, 3, 32, 16, 3, 1, 1},
      {3, 8, 9, 8, 1, 1, 0},
  };
  for (const ConvCase& s : cases) {
    const Outputs one = run_conv(s, 1);
    for (int threads : {2, 3}) {
      const Outputs many = run_conv(s, threads);
      EXPECT_EQ(one.y, many.y) << describe(s) << " forward, " << threads << " threads";
      EXPECT_EQ(one.gx, many.gx) << describe(s) << " gx, " << threads << " threads";
      EXPECT_EQ(one.gw, many.gw) << describe(s) << " gw, " << threads << " threads";
      EXPECT_EQ(one.gb, many.gb) << describe(s) << " gb, " << threads << " threads";
    }
  }
  set_num_threads(saved);
}

}  // namespace
}  // namespace hsgd
