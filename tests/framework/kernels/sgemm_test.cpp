// kernels::sgemm on every instruction set this CPU runs (AVX-512, AVX2 forced where AVX-512 is
// present, and the OpenBLAS baseline), against a triple loop in double, at 1 and 2 threads: all
// four transpose combinations, sizes that leave every remainder of the micro-tiles (14 x 32 and
// 6 x 16) and cross the cache blocks, row strides wider than the rows, alpha and beta 0, 1 and
// others, and the empty cases. Every float outside an operand's entries is NaN (the padding
// between a row's end and its stride, and of c between n and ldc a sentinel), so a kernel that
// reads past an operand or writes past c fails; with beta == 0, c starts as NaN. (Products with
// c narrower than half a micro-tile and taller than wide run on OpenBLAS whatever the instruction
// set, kernels::sgemm_path; the narrow cases with m <= n keep the kernels' masked edges covered.)

#include "framework/kernels/sgemm.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/parallel/parallel.h"

namespace hsgd {
namespace {

using kernels::simd::Isa;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = -7.0f;  // c's entries between n and ldc, which must stay untouched

struct Case {
  bool trans_a, trans_b;
  int64_t m, n, k;
  float alpha, beta;
  int64_t pad = 3;  // extra floats per row of every operand
};

std::string describe(const Case& c, Isa isa, int threads) {
  return std::string(kernels::simd::isa_name(isa)) + " " + (c.trans_a ? "t" : "n") +
         (c.trans_b ? "t" : "n") + " m " + std::to_string(c.m) + " n " + std::to_string(c.n) +
         " k " + std::to_string(c.k) + " alpha " + std::to_string(c.alpha) + " beta " +
         std::to_string(c.beta) + " threads " + std::to_string(threads);
}

// A stored (rows, cols) matrix with row stride cols + pad: entries uniform in [-1, 1], padding NaN.
std::vector<float> make_matrix(int64_t rows, int64_t cols, int64_t pad, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * (cols + pad)), kNan);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) x[i * (cols + pad) + j] = dist(rng);
  }
  return x;
}

// Runs one case on isa at `threads` threads and checks c against the double-precision product,
// entry by entry, within a bound of float rounding over k products. Returns c.
std::vector<float> check_case(const Case& cs, Isa isa, int threads) {
  std::mt19937 rng(static_cast<uint32_t>(cs.m * 7919 + cs.n * 104729 + cs.k));
  // Stored shapes: a is (m,k), or (k,m) when transposed; b is (k,n), or (n,k).
  const int64_t a_rows = cs.trans_a ? cs.k : cs.m, a_cols = cs.trans_a ? cs.m : cs.k;
  const int64_t b_rows = cs.trans_b ? cs.n : cs.k, b_cols = cs.trans_b ? cs.k : cs.n;
  const int64_t lda = a_cols + cs.pad, ldb = b_cols + cs.pad, ldc = cs.n + cs.pad;
  const std::vector<float> a = make_matrix(a_rows, a_cols, cs.pad, rng);
  const std::vector<float> b = make_matrix(b_rows, b_cols, cs.pad, rng);
  std::vector<float> c = make_matrix(cs.m, cs.n, cs.pad, rng);
  for (int64_t i = 0; i < cs.m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      float& x = c[i * ldc + j];
      x = j >= cs.n ? kSentinel : cs.beta == 0.0f ? kNan : x;
    }
  }
  const std::vector<float> c0 = c;

  set_num_threads(threads);
  kernels::sgemm(cs.trans_a, cs.trans_b, cs.m, cs.n, cs.k, cs.alpha, a.data(), lda, b.data(), ldb,
                 cs.beta, c.data(), ldc, isa);

  const std::string what = describe(cs, isa, threads);
  int failures = 0;
  for (int64_t i = 0; i < cs.m && failures < 5; ++i) {
    for (int64_t j = 0; j < ldc && failures < 5; ++j) {
      const float actual = c[i * ldc + j];
      if (j >= cs.n) {
        if (actual != kSentinel) {
          ADD_FAILURE() << what << ": wrote c[" << i << "][" << j << "] past n: " << actual;
          ++failures;
        }
        continue;
      }
      double sum = 0, magnitude = 0;
      for (int64_t p = 0; p < cs.k; ++p) {
        const double x = cs.trans_a ? a[p * lda + i] : a[i * lda + p];
        const double y = cs.trans_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += x * y;
        magnitude += std::fabs(x * y);
      }
      double expected = double(cs.alpha) * sum;
      magnitude *= std::fabs(cs.alpha);
      if (cs.beta != 0.0f) {
        expected += double(cs.beta) * c0[i * ldc + j];
        magnitude += std::fabs(double(cs.beta) * c0[i * ldc + j]);
      }
      const double bound = 4.0 * FLT_EPSILON * static_cast<double>(cs.k + 2) * magnitude + 1e-30;
      if (!(std::fabs(actual - expected) <= bound)) {
        ADD_FAILURE() << what << ": c[" << i << "][" << j << "] expected " << expected << " actual "
                      << actual << " (bound " << bound << ")";
        ++failures;
      }
    }
  }
  return c;
}

// Sizes around every edge: 1, below, at and above the micro-tiles (14 x 32, 6 x 16), the kc
// block (256) and the mc blocks (168, 144); one with n above the nc block (4096); and products
// large enough to be split across 2 threads, by rows (m >= n) and by columns.
const std::vector<std::vector<int64_t>> kSizes = {
    {1, 1, 1},      {7, 13, 31},     {13, 7, 1},     {31, 33, 65},   {33, 31, 17}, {65, 100, 7},
    {100, 65, 257}, {257, 33, 100},  {14, 32, 256},  {15, 33, 513},  {6, 16, 8},   {5, 17, 3},
    {3, 4100, 5},   {300, 200, 520}, {65, 600, 100}, {170, 150, 40},
};

class SgemmTest : public testing::TestWithParam<Isa> {
 protected:
  void SetUp() override {
    if (!kernels::simd::isa_supported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run " << kernels::simd::isa_name(GetParam()) << " code";
    }
    saved_threads_ = get_num_threads();
  }
  void TearDown() override {
    if (saved_threads_ > 0) set_num_threads(saved_threads_);
  }
  int saved_threads_ = 0;
};

TEST_P(SgemmTest, MatchesDoubleProduct_AllTransposes) {
  for (const auto& s : kSizes) {
    for (int t = 0; t < 4; ++t) {
      const Case cs{(t & 1) != 0, (t & 2) != 0, s[0], s[1], s[2], 1.0f, 0.0f};
      for (int threads : {1, 2}) check_case(cs, GetParam(), threads);
    }
  }
}

TEST_P(SgemmTest, MatchesDoubleProduct_AlphaBeta) {
  const std::vector<std::pair<float, float>> scalars = {{1.0f, 1.0f}, {-1.5f, 0.0f}, {0.5f, -2.0f},
                                                        {2.0f, 1.0f}, {0.0f, 0.75f}, {0.0f, 0.0f}};
  for (const auto& s : {kSizes[3], kSizes[6], kSizes[9], kSizes[13]}) {
    for (int t = 0; t < 4; ++t) {
      for (const auto& [alpha, beta] : scalars) {
        const Case cs{(t & 1) != 0, (t & 2) != 0, s[0], s[1], s[2], alpha, beta};
        for (int threads : {1, 2}) check_case(cs, GetParam(), threads);
      }
    }
  }
}

TEST_P(SgemmTest, EmptySizes_KZeroScalesC_MOrNZeroTouchesNothing) {
  for (float beta : {0.0f, 1.0f, -0.5f})
    check_case(Case{false, true, 9, 35, 0, 1.0f, beta}, GetParam(), 1);
  // m == 0 or n == 0: c (here a single sentinel) must not be touched, nor a or b read.
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{0, 5}, {5, 0}}) {
    float c = kSentinel;
    kernels::sgemm(false, false, m, n, 4, 1.0f, nullptr, 4, nullptr, 8, 0.0f, &c, 8, GetParam());
    EXPECT_EQ(c, kSentinel) << kernels::simd::isa_name(GetParam()) << " m " << m << " n " << n;
  }
}

TEST_P(SgemmTest, SameBitsAtOneAndTwoThreads) {
  if (GetParam() == Isa::kBaseline) GTEST_SKIP() << "OpenBLAS's threads may round differently";
  // Every micro-tile is computed the same way whichever chunk holds it.
  for (const auto& s : {kSizes[13], kSizes[14]}) {
    const Case cs{false, true, s[0], s[1], s[2], 1.0f, 0.0f};
    EXPECT_EQ(check_case(cs, GetParam(), 1), check_case(cs, GetParam(), 2))
        << describe(cs, GetParam(), 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, SgemmTest, testing::Values(Isa::kAvx512, Isa::kAvx2, Isa::kBaseline),
                         [](const testing::TestParamInfo<Isa>& info) {
                           return std::string(kernels::simd::isa_name(info.param));
                         });

TEST(SgemmDispatchTest, UsesTheWidestIsaOfTheCpu) {
  __builtin_cpu_init();
  const Isa expected = __builtin_cpu_supports("avx512f") ? Isa::kAvx512
                       : __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
                           ? Isa::kAvx2
                           : Isa::kBaseline;
  EXPECT_EQ(kernels::simd::isa_name(kernels::sgemm_isa()),
            std::string(kernels::simd::isa_name(expected)));
  // The plain overload is the forced widest one, bit for bit.
  const Case cs{true, false, 70, 50, 300, 1.0f, 0.0f};
  std::mt19937 rng(0);
  const std::vector<float> a = make_matrix(cs.k, cs.m, 0, rng), b = make_matrix(cs.k, cs.n, 0, rng);
  std::vector<float> c1(cs.m * cs.n), c2(cs.m * cs.n);
  kernels::sgemm(true, false, cs.m, cs.n, cs.k, 1.0f, a.data(), cs.m, b.data(), cs.n, 0.0f,
                 c1.data(), cs.n);
  kernels::sgemm(true, false, cs.m, cs.n, cs.k, 1.0f, a.data(), cs.m, b.data(), cs.n, 0.0f,
                 c2.data(), cs.n, kernels::sgemm_isa());
  EXPECT_EQ(c1, c2);
}

TEST(SgemmDispatchTest, RejectsAnIsaTheCpuLacks) {
  if (kernels::simd::isa_supported(Isa::kAvx512)) {
    GTEST_SKIP() << "this CPU runs every instruction set sgemm has";
  }
  float c = 0.0f;
  EXPECT_THROW(kernels::sgemm(false, false, 1, 1, 1, 1.0f, &c, 1, &c, 1, 0.0f, &c, 1, Isa::kAvx512),
               InvalidArgument);
}

}  // namespace
}  // namespace hsgd
