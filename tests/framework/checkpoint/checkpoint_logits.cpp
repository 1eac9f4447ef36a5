// checkpoint_logits: hsgd's logits for a checkpoint's model on a fixed input, so that
// tests/framework/checkpoint/torch_interop_test.py can compare them with PyTorch's logits of the
// exported state dict (scripts/export_torch.py).
//
//   checkpoint_logits CHECKPOINT INPUT OUTPUT [--rank R]
//
// CHECKPOINT is one checkpoint directory (DIR/step_<N>). The model is built from the manifest's
// model name: "mlp <s0>-<s1>-...-<sk>" (train_mlp's name: models::MLP with those sizes) or any
// name of models::make_model ("resnet20", "resnet18", ...). Rank R's file (default 0) is read
// and checked with checkpoint_file.h, its "model.*" entries loaded strictly into the model, and
// the model is run in eval mode (BatchNorm uses its running statistics) without gradients.
//
// INPUT and OUTPUT are tensor files: int64 ndim, ndim int64 sizes, then the float32 values,
// row-major, all little-endian. Exit status 0, or 1 with the error on stderr.

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "framework/checkpoint/checkpoint_file.h"
#include "framework/tensor/grad_mode.h"
#include "models/mlp.h"
#include "models/registry.h"

namespace {

using hsgd::Shape;
using hsgd::Tensor;

Tensor read_tensor(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HSGD_CHECK(in.good(), "checkpoint_logits: cannot open '", path, "'");
  int64_t ndim = 0;
  in.read(reinterpret_cast<char*>(&ndim), sizeof ndim);
  HSGD_CHECK(in.good() && ndim >= 1 && ndim <= 8, "checkpoint_logits: '", path,
             "' has no valid header (ndim ", ndim, ")");
  Shape shape(static_cast<size_t>(ndim));
  in.read(reinterpret_cast<char*>(shape.data()), static_cast<std::streamsize>(ndim * 8));
  Tensor t = hsgd::zeros(shape);
  in.read(reinterpret_cast<char*>(t.data()), static_cast<std::streamsize>(t.numel() * 4));
  HSGD_CHECK(in.good(), "checkpoint_logits: '", path, "' is shorter than its shape ",
             hsgd::shape_str(shape), " needs");
  return t;
}

void write_tensor(const std::string& path, const Tensor& t) {
  std::ofstream out(path, std::ios::binary);
  const Shape shape = t.shape();
  const int64_t ndim = static_cast<int64_t>(shape.size());
  out.write(reinterpret_cast<const char*>(&ndim), sizeof ndim);
  out.write(reinterpret_cast<const char*>(shape.data()), static_cast<std::streamsize>(ndim * 8));
  const Tensor c = t.contiguous();
  out.write(reinterpret_cast<const char*>(c.data()), static_cast<std::streamsize>(c.numel() * 4));
  HSGD_CHECK(out.good(), "checkpoint_logits: cannot write '", path, "'");
}

// "mlp 784-64-32-10" -> MLP{784, 64, 32, 10}; other names -> models::make_model.
std::shared_ptr<hsgd::nn::Module> build_model(const std::string& name, const Shape& input) {
  if (name.rfind("mlp ", 0) == 0) {
    std::vector<int64_t> sizes;
    std::stringstream in(name.substr(4));
    std::string size;
    while (std::getline(in, size, '-')) sizes.push_back(std::stoll(size));
    return std::make_shared<hsgd::models::MLP>(hsgd::models::MLPOptions{.sizes = sizes});
  }
  const Shape example(input.begin() + 1, input.end());
  return hsgd::models::make_model(name, {.input_shape = example});
}

int run(const std::string& checkpoint, const std::string& input_path,
        const std::string& output_path, int rank) {
  using namespace hsgd::checkpoint;
  proto::Manifest manifest;
  const std::string manifest_path = checkpoint + "/" + kManifestName;
  HSGD_CHECK(manifest.ParseFromString(read_envelope(manifest_path, kManifestKind)),
             "checkpoint_logits: '", manifest_path, "' does not parse");
  const std::string rank_path = checkpoint + "/" + rank_file_name(rank);
  proto::RankState rank_state;
  HSGD_CHECK(rank_state.ParseFromString(read_envelope(rank_path, kRankKind)),
             "checkpoint_logits: '", rank_path, "' does not parse");
  const hsgd::StateDict model_state = decode_state(rank_state, rank_path).with_prefix("model.");

  const Tensor input = read_tensor(input_path);
  const std::shared_ptr<hsgd::nn::Module> model =
      build_model(manifest.run().model(), input.shape());
  hsgd::nn::NamedTensors tensors;
  for (const auto& [key, value] : model_state.entries()) {
    tensors.emplace_back(key, std::get<Tensor>(value));
  }
  model->load_state_dict(tensors, /*strict=*/true);
  model->eval();
  hsgd::NoGradGuard no_grad;
  write_tensor(output_path, model->forward(input));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  int rank = 0;
  if (args.size() == 5 && args[3] == "--rank") {
    rank = std::stoi(args[4]);
    args.resize(3);
  }
  if (args.size() != 3) {
    std::fprintf(stderr, "usage: checkpoint_logits CHECKPOINT INPUT OUTPUT [--rank R]\n");
    return 2;
  }
  try {
    return run(args[0], args[1], args[2], rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_logits: error: %s\n", e.what());
    return 1;
  }
}
