#include "framework/data/fashion_mnist.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "comm/error.h"

namespace hsgd::data {
namespace {

const char* kDir = "/usr/share/datasets/fashion-mnist";

TEST(FashionMNISTTest, TestSplit_HasTenBalancedClassesScaledToUnitRange) {
  if (!std::filesystem::exists(kDir)) {
    GTEST_SKIP() << kDir << " missing: install dataset-fashion-mnist (scripts/setup.sh does)";
  }
  FashionMNIST test(kDir, FashionMNIST::Split::kTest);
  ASSERT_EQ(test.size(), 10000);
  EXPECT_EQ(test.example_shape(), (Shape{1, 28, 28}));
  std::map<int64_t, int> per_class;
  for (int64_t t : test.targets()) ++per_class[t];
  ASSERT_EQ(per_class.size(), 10u);
  for (auto& [c, k] : per_class) EXPECT_EQ(k, 1000) << "class " << c;  // the published split
  float lo = 1, hi = 0;
  double mean = 0;
  for (float v : test.values()) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    mean += v;
  }
  EXPECT_EQ(lo, 0.0f);
  EXPECT_EQ(hi, 1.0f);
  mean /= static_cast<double>(test.values().size());
  EXPECT_NEAR(mean, 0.2860, 0.01);  // the published pixel mean of Fashion-MNIST

  FashionMNIST normalized(kDir, FashionMNIST::Split::kTest, {.normalize = true});
  EXPECT_NEAR(normalized.values()[1234], (test.values()[1234] - 0.2860f) / 0.3530f, 1e-5);
}

TEST(FashionMNISTTest, MissingDirectory_NamesThePath) {
  const std::string dir = "/nonexistent/fashion";
  try {
    FashionMNIST ds(dir, FashionMNIST::Split::kTrain);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
}

TEST(FashionMNISTTest, MissingFile_NamesTheExpectedFile) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("hsgd_fmnist_empty_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  try {
    FashionMNIST ds(dir, FashionMNIST::Split::kTest);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("t10k-images-idx3-ubyte"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hsgd::data
