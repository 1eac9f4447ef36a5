#include "framework/data/cifar10.h"

#include <fstream>

#include "comm/error.h"

namespace hsgd::data {
namespace {

// Where the files are: dir itself, or the folder the official archive unpacks to.
std::filesystem::path find_data_dir(const std::filesystem::path& dir,
                                    const std::string& first_file) {
  std::error_code ec;
  HSGD_CHECK(std::filesystem::is_directory(dir, ec), "CIFAR10: data directory '", dir.string(),
             "' does not exist or is not a directory");
  const std::filesystem::path nested = dir / "cifar-10-batches-bin";
  if (!std::filesystem::exists(dir / first_file, ec) &&
      std::filesystem::exists(nested / first_file, ec)) {
    return nested;
  }
  return dir;
}

}  // namespace

std::vector<std::string> CIFAR10::file_names(Split split) {
  if (split == Split::kTest) return {"test_batch.bin"};
  std::vector<std::string> names;
  for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
  return names;
}

CIFAR10::CIFAR10(const std::filesystem::path& dir, Split split, CIFAR10Options options)
    : options_(std::move(options)), gen_(options_.seed) {
  HSGD_CHECK(options_.records_per_file >= 1, "CIFAR10: records_per_file ",
             options_.records_per_file, " must be at least 1");
  HSGD_CHECK(options_.crop_padding >= 0, "CIFAR10: crop_padding ", options_.crop_padding,
             " must not be negative");
  for (int64_t c = 0; c < kChannels; ++c) {
    const float sd = options_.std[c];
    HSGD_CHECK(!options_.normalize || sd > 0, "CIFAR10: std ", sd, " of channel ", c,
               " must be positive");
    scale_[c] = options_.normalize ? 1.0f / (255.0f * sd) : 1.0f / 255.0f;
    shift_[c] = options_.normalize ? options_.mean[c] / sd : 0.0f;
  }
  const std::vector<std::string> names = file_names(split);
  const std::filesystem::path data_dir = find_data_dir(dir, names.front());
  const auto total = static_cast<size_t>(options_.records_per_file) * names.size();
  pixels_.reserve(total * kImageBytes);
  targets_.reserve(total);
  for (const std::string& name : names) read_file(data_dir / name);
}

void CIFAR10::read_file(const std::filesystem::path& path) {
  std::error_code ec;
  HSGD_CHECK(std::filesystem::is_regular_file(path, ec), "CIFAR10: '", path.string(),
             "' does not exist (expected the CIFAR-10 binary files data_batch_1..5.bin and "
             "test_batch.bin)");
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  const auto expected = static_cast<uintmax_t>(options_.records_per_file * kRecordBytes);
  HSGD_CHECK(!ec && bytes == expected, "CIFAR10: '", path.string(), "' has ",
             ec ? std::string("unknown") : std::to_string(bytes), " bytes, expected ", expected,
             " (", options_.records_per_file, " records of ", kRecordBytes, " bytes)");
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buffer(static_cast<size_t>(expected));
  in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
  HSGD_CHECK(in.good(), "CIFAR10: could not read ", expected, " bytes from '", path.string(), "'");

  for (int64_t r = 0; r < options_.records_per_file; ++r) {
    const auto* record = reinterpret_cast<const uint8_t*>(buffer.data()) + r * kRecordBytes;
    HSGD_CHECK(record[0] < kNumClasses, "CIFAR10: label ", static_cast<int>(record[0]),
               " of record ", r, " in '", path.string(), "' is not a class in [0, 10)");
    targets_.push_back(record[0]);
    pixels_.insert(pixels_.end(), record + 1, record + kRecordBytes);
  }
}

Batch CIFAR10::get_batch(const std::vector<int64_t>& indices) const {
  constexpr int64_t kS = kImageSize;
  const auto b = static_cast<int64_t>(indices.size());
  for (int64_t index : indices) {
    HSGD_CHECK(index >= 0 && index < size(), "CIFAR10: index ", index, " out of range [0, ", size(),
               ")");
  }
  // Per example: crop offsets (dy, dx) in [-pad, pad] and the flip, drawn in example order.
  const int64_t pad = options_.augment ? options_.crop_padding : 0;
  std::vector<int64_t> dy(indices.size(), 0), dx(indices.size(), 0);
  std::vector<bool> flip(indices.size(), false);
  if (options_.augment) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto range = static_cast<uint64_t>(2 * pad + 1);
    for (size_t i = 0; i < indices.size(); ++i) {
      dy[i] = static_cast<int64_t>(gen_.next_below(range)) - pad;
      dx[i] = static_cast<int64_t>(gen_.next_below(range)) - pad;
      flip[i] = options_.horizontal_flip && gen_.next_below(2) == 1;
    }
  }

  std::vector<float> out(static_cast<size_t>(b * kImageBytes));  // (B,3,32,32)
  Batch batch;
  batch.targets.reserve(indices.size());
  for (int64_t i = 0; i < b; ++i) {
    const auto ui = static_cast<size_t>(i);
    const uint8_t* src = pixels_.data() + indices[ui] * kImageBytes;  // (3,32,32)
    float* dst = out.data() + i * kImageBytes;                        // (3,32,32)
    for (int64_t c = 0; c < kChannels; ++c) {
      const float black = -shift_[c];  // a padding pixel, normalised like the others
      for (int64_t y = 0; y < kS; ++y) {
        const int64_t sy = y + dy[ui];
        for (int64_t x = 0; x < kS; ++x) {
          // Output column x shows cropped column kS-1-x when flipped.
          const int64_t sx = (flip[ui] ? kS - 1 - x : x) + dx[ui];
          const bool inside = sy >= 0 && sy < kS && sx >= 0 && sx < kS;
          dst[(c * kS + y) * kS + x] =
              inside ? static_cast<float>(src[(c * kS + sy) * kS + sx]) * scale_[c] - shift_[c]
                     : black;
        }
      }
    }
    batch.targets.push_back(targets_[static_cast<size_t>(indices[ui])]);
  }
  batch.inputs = from_vector(std::move(out), {b, kChannels, kS, kS});
  return batch;
}

}  // namespace hsgd::data
