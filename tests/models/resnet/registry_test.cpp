#include "models/registry.h"

#include <gtest/gtest.h>

#include <string>

#include "comm/error.h"
#include "framework/tensor/grad_mode.h"
#include "models/mlp.h"
#include "models/resnet.h"

namespace hsgd::models {
namespace {

TEST(ModelRegistryTest, UnknownName_ListsKnownNames) {
  try {
    make_model("resnet7");
    FAIL() << "make_model accepted 'resnet7'";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'resnet7'"), std::string::npos) << msg;
    for (const std::string& name : model_names()) {
      EXPECT_NE(msg.find(name), std::string::npos) << name << " missing from: " << msg;
    }
  }
}

TEST(ModelRegistryTest, EveryKnownName_BuildsAModelThatRuns) {
  NoGradGuard no_grad;
  for (const std::string& name : model_names()) {
    auto model = make_model(name, {.num_classes = 6, .input_shape = {3, 16, 16}, .seed = 1});
    ASSERT_NE(model, nullptr) << name;
    EXPECT_EQ(shape_str(model->forward(zeros({2, 3, 16, 16})).shape()), "[2, 6]") << name;
  }
}

TEST(ModelRegistryTest, Names_SelectTheRightArchitecture) {
  auto r56 = std::dynamic_pointer_cast<ResNet>(make_model("resnet56"));
  ASSERT_NE(r56, nullptr);
  EXPECT_EQ(r56->options().blocks, (std::vector<int64_t>{9, 9, 9}));
  auto r18 =
      std::dynamic_pointer_cast<ResNet>(make_model("resnet18", {.input_shape = {1, 28, 28}}));
  ASSERT_NE(r18, nullptr);
  EXPECT_EQ(r18->options().widths, (std::vector<int64_t>{64, 128, 256, 512}));
  EXPECT_EQ(r18->options().in_channels, 1);
  auto mlp = std::dynamic_pointer_cast<MLP>(
      make_model("mlp", {.input_shape = {1, 28, 28}, .mlp_hidden = {32}}));
  ASSERT_NE(mlp, nullptr);
  ASSERT_EQ(mlp->layers().size(), 2u);
  EXPECT_EQ(mlp->layers()[0]->in_features(), 28 * 28);
  EXPECT_EQ(mlp->layers()[1]->out_features(), 10);
}

TEST(ModelRegistryTest, ResNetWithoutChannelDim_IsRejected) {
  EXPECT_THROW(make_model("resnet20", {.input_shape = {784}}), InvalidArgument);
}

}  // namespace
}  // namespace hsgd::models
