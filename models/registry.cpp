#include "models/registry.h"

#include "comm/error.h"
#include "models/mlp.h"
#include "models/resnet.h"

namespace hsgd::models {
namespace {

std::string joined_names() {
  std::string out;
  for (const std::string& n : model_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::shared_ptr<nn::Module> make_resnet(ResNetOptions resnet, const ModelOptions& options) {
  HSGD_CHECK(options.input_shape.size() == 3,
             "make_model: a ResNet needs input_shape (C,H,W), got ",
             shape_str(options.input_shape));
  resnet.in_channels = options.input_shape[0];
  return std::make_shared<ResNet>(resnet);
}

}  // namespace

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> kNames = {"mlp", "resnet20", "resnet32", "resnet56",
                                                  "resnet18"};
  return kNames;
}

std::shared_ptr<nn::Module> make_model(const std::string& name, const ModelOptions& options) {
  if (name == "mlp") {
    HSGD_CHECK(!options.input_shape.empty(), "make_model: mlp needs a non-empty input_shape");
    std::vector<int64_t> sizes = {shape_numel(options.input_shape)};
    sizes.insert(sizes.end(), options.mlp_hidden.begin(), options.mlp_hidden.end());
    sizes.push_back(options.num_classes);
    return std::make_shared<MLP>(MLPOptions{.sizes = sizes, .seed = options.seed});
  }
  if (name == "resnet20" || name == "resnet32" || name == "resnet56") {
    const int64_t depth = std::stoll(name.substr(6));
    return make_resnet(resnet_cifar_options(depth, options.num_classes, options.seed), options);
  }
  if (name == "resnet18") {
    return make_resnet(resnet18_options(options.num_classes, options.seed), options);
  }
  HSGD_THROW(InvalidArgument, "make_model: unknown model '", name,
             "'; known models: ", joined_names());
}

}  // namespace hsgd::models
