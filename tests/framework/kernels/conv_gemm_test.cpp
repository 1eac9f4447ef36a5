// conv_gemm_nn / conv_gemm_nt (the AVX-512 and AVX2 kernels and the cblas_sgemm fallback) against
// a direct triple loop in double, over sizes that leave every kind of remainder of the kernels'
// blocks (nn: 8 rows x 32 columns on AVX-512, 6 x 16 on AVX2; nt: 4 x 4 entries and 16-long
// inner runs on AVX-512, 3 x 4 entries and 8-long runs on AVX2, and the transposed product above
// 64 rows), and with row strides wider than the rows.

#include "framework/kernels/conv_gemm.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "framework/tensor/ops.h"
#include "tests/framework/tensor/grad_check.h"

namespace hsgd {
namespace {

struct GemmCase {
  int64_t m, n, k;
};

const std::vector<GemmCase> kCases = {
    {1, 1, 1},    {3, 5, 2},     {8, 32, 16},  {16, 256, 16}, {9, 33, 17},
    {17, 70, 31}, {64, 16, 144}, {5, 7, 1000}, {144, 40, 64}, {4, 4, 15},
};

std::string describe(const GemmCase& g, const char* op) {
  return std::string(op) + " m " + std::to_string(g.m) + " n " + std::to_string(g.n) + " k " +
         std::to_string(g.k);
}

TEST(ConvGemmTest, NnMatchesDirectProduct) {
  Generator gen(21);
  for (const GemmCase& g : kCases) {
    // Row strides a little wider than the rows: the kernels must honour lda, ldb, ldc.
    const int64_t lda = g.k + 3, ldb = g.n + 5, ldc = g.n + 2;
    const std::vector<float> a = randn({g.m, lda}, gen).to_vector();
    const std::vector<float> b = randn({g.k, ldb}, gen).to_vector();
    std::vector<float> expected(g.m * ldc, -7.0f);
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        double s = 0;
        for (int64_t t = 0; t < g.k; ++t) s += double(a[i * lda + t]) * b[t * ldb + j];
        expected[i * ldc + j] = static_cast<float>(s);
      }
    }
    for (kernels::simd::Isa isa :
         {kernels::simd::Isa::kAvx512, kernels::simd::Isa::kAvx2, kernels::simd::Isa::kBaseline}) {
      if (!kernels::simd::isa_supported(isa)) continue;
      std::vector<float> c(g.m * ldc, -7.0f);
      kernels::conv_gemm_nn(g.m, g.n, g.k, a.data(), lda, b.data(), ldb, c.data(), ldc, isa);
      // Entries between n and ldc must be left alone (-7).
      testing::expect_near_all(c, expected, 1e-4,
                               describe(g, "nn") + " " + kernels::simd::isa_name(isa));
    }
  }
}

TEST(ConvGemmTest, NtMatchesDirectProduct_OverwriteAndAccumulate) {
  Generator gen(22);
  for (const GemmCase& g : kCases) {
    const int64_t lda = g.k + 1, ldb = g.k + 4, ldc = g.n + 3;
    const std::vector<float> a = randn({g.m, lda}, gen).to_vector();
    const std::vector<float> b = randn({g.n, ldb}, gen).to_vector();
    const std::vector<float> c0 = randn({g.m, ldc}, gen).to_vector();
    for (float beta : {0.0f, 1.0f}) {
      std::vector<float> expected = c0;
      for (int64_t i = 0; i < g.m; ++i) {
        for (int64_t j = 0; j < g.n; ++j) {
          double s = beta * double(c0[i * ldc + j]);
          for (int64_t t = 0; t < g.k; ++t) s += double(a[i * lda + t]) * b[j * ldb + t];
          expected[i * ldc + j] = static_cast<float>(s);
        }
      }
      for (kernels::simd::Isa isa : {kernels::simd::Isa::kAvx512, kernels::simd::Isa::kAvx2,
                                     kernels::simd::Isa::kBaseline}) {
        if (!kernels::simd::isa_supported(isa)) continue;
        std::vector<float> c = c0;
        kernels::conv_gemm_nt(g.m, g.n, g.k, a.data(), lda, b.data(), ldb, beta, c.data(), ldc,
                              isa);
        testing::expect_near_all(c, expected, 1e-4,
                                 describe(g, "nt") + " beta " + std::to_string(beta) + " " +
                                     kernels::simd::isa_name(isa));
      }
    }
  }
}

// HSGD_CONV_ISA=avx2 caps the kernels' choice on a wider CPU. The ctest entry
// conv_kernels_test_avx2 runs this suite so; elsewhere the test has nothing to check.
TEST(ConvIsaTest, EnvironmentCapsTheChoice_Avx2) {
  const char* cap = std::getenv("HSGD_CONV_ISA");
  if (cap == nullptr || std::string_view(cap) != "avx2")
    GTEST_SKIP() << "HSGD_CONV_ISA is not avx2";
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
    GTEST_SKIP() << "this CPU has no AVX2 + FMA";
  }
  EXPECT_EQ(kernels::simd::isa_name(kernels::simd::conv_isa()), std::string("avx2"));
  EXPECT_FALSE(kernels::simd::isa_supported(kernels::simd::Isa::kAvx512));
  EXPECT_TRUE(kernels::simd::isa_supported(kernels::simd::Isa::kAvx2));
}

}  // namespace
}  // namespace hsgd
