#include "framework/data/fashion_mnist.h"

#include <string>

#include "comm/error.h"
#include "framework/data/idx.h"

namespace hsgd::data {
namespace {

// dir/name.gz if it exists, else dir/name (the reader accepts both compressed and raw).
std::filesystem::path find_file(const std::filesystem::path& dir, const std::string& name) {
  std::error_code ec;
  const std::filesystem::path gz = dir / (name + ".gz");
  if (std::filesystem::exists(gz, ec)) return gz;
  const std::filesystem::path raw = dir / name;
  HSGD_CHECK(std::filesystem::exists(raw, ec), "FashionMNIST: neither '", gz.string(), "' nor '",
             raw.string(), "' exists (expected the IDX files of Fashion-MNIST in '", dir.string(),
             "')");
  return raw;
}

}  // namespace

struct FashionMNIST::Loaded {
  std::vector<float> values;
  std::vector<int64_t> targets;
};

FashionMNIST::Loaded FashionMNIST::load(const std::filesystem::path& dir, FashionMNIST::Split split,
                                        const FashionMNISTOptions& options) {
  std::error_code ec;
  HSGD_CHECK(std::filesystem::is_directory(dir, ec), "FashionMNIST: data directory '", dir.string(),
             "' does not exist or is not a directory");
  const std::string prefix = split == FashionMNIST::Split::kTrain ? "train" : "t10k";
  const std::filesystem::path images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::filesystem::path labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  const IdxImages images = read_idx_images(images_path);
  Loaded out;
  out.targets = read_idx_labels(labels_path);
  HSGD_CHECK(images.rows == 28 && images.cols == 28, "FashionMNIST: '", images_path.string(),
             "' holds ", images.rows, "x", images.cols, " images, expected 28x28");
  HSGD_CHECK(static_cast<int64_t>(out.targets.size()) == images.count, "FashionMNIST: '",
             labels_path.string(), "' has ", out.targets.size(), " labels but '",
             images_path.string(), "' has ", images.count, " images");
  for (size_t i = 0; i < out.targets.size(); ++i) {
    HSGD_CHECK(out.targets[i] < FashionMNIST::kNumClasses, "FashionMNIST: label ", out.targets[i],
               " at index ", i, " of '", labels_path.string(), "' is not a class in [0, 10)");
  }
  HSGD_CHECK(!options.normalize || options.std > 0, "FashionMNIST: std ", options.std,
             " must be positive");
  const float scale = options.normalize ? 1.0f / (255.0f * options.std) : 1.0f / 255.0f;
  const float shift = options.normalize ? options.mean / options.std : 0.0f;
  out.values.resize(images.pixels.size());
  for (size_t i = 0; i < images.pixels.size(); ++i) {
    out.values[i] = static_cast<float>(images.pixels[i]) * scale - shift;
  }
  return out;
}

FashionMNIST::FashionMNIST(const std::filesystem::path& dir, Split split,
                           FashionMNISTOptions options)
    : FashionMNIST(load(dir, split, options)) {}

FashionMNIST::FashionMNIST(Loaded&& loaded)
    : InMemoryDataset(std::move(loaded.values), std::move(loaded.targets), {1, 28, 28}) {}

}  // namespace hsgd::data
