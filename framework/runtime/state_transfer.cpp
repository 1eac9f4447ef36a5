#include "framework/runtime/detail/state_transfer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <span>

#include "comm/error.h"
#include "comm/process_group/work.h"
#include "framework/checkpoint/checkpoint_file.h"

namespace hsgd::runtime::detail {
namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

}  // namespace

uint64_t model_hash(nn::Module& model) {
  uint64_t h = kFnvOffset;
  for (const Tensor& t : model.parameters()) {
    const Tensor c = t.contiguous();
    const auto* bytes = reinterpret_cast<const unsigned char*>(c.data());
    for (size_t i = 0; i < static_cast<size_t>(c.numel()) * sizeof(float); ++i) {
      h = (h ^ bytes[i]) * kFnvPrime;
    }
  }
  return h;
}

std::string model_signature(nn::Module& model) {
  uint64_t h = kFnvOffset;
  int64_t values = 0;
  const nn::NamedTensors tensors = model.state_dict();
  for (const auto& [name, t] : tensors) {
    std::string shape = name + "[";
    for (int64_t d = 0; d < t.dim(); ++d) shape += std::to_string(t.size(d)) + ",";
    for (const char c : shape + "]") h = (h ^ static_cast<unsigned char>(c)) * kFnvPrime;
    values += t.numel();
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return str_cat("model ", tensors.size(), " tensors, ", values, " values (shapes ", hex, ")");
}

StateDict broadcast_state(comm::ProcessGroup& world, int root, int64_t step, const StateDict& state,
                          const std::string& what, int64_t* bytes_sent) {
  std::string bytes;
  // {length, crc32} of the encoded state, from root.
  std::array<int64_t, 2> header{0, 0};
  if (world.rank() == root) {
    bytes = checkpoint::encode_state(root, step, state).SerializeAsString();
    header = {static_cast<int64_t>(bytes.size()),
              static_cast<int64_t>(checkpoint::crc32_of(bytes))};
  }
  world.broadcast(std::span<int64_t>(header), root, what + " header")->wait();
  std::vector<int64_t> words(static_cast<size_t>((header[0] + 7) / 8));
  if (world.rank() == root) std::memcpy(words.data(), bytes.data(), bytes.size());
  world.broadcast(std::span<int64_t>(words), root, what)->wait();
  if (bytes_sent != nullptr) *bytes_sent = header[0];
  if (world.rank() == root) return state;
  bytes.assign(reinterpret_cast<const char*>(words.data()),
               std::min(static_cast<size_t>(header[0]), words.size() * 8));
  return decode_transferred(bytes, {.length = header[0], .crc32 = header[1]}, root, what);
}

StateDict decode_transferred(const std::string& bytes, TransferHeader sent, int root,
                             const std::string& what) {
  const auto crc = static_cast<int64_t>(checkpoint::crc32_of(bytes));
  HSGD_CHECK_AS(CommError, static_cast<int64_t>(bytes.size()) == sent.length && crc == sent.crc32,
                what, " from rank ", root, " is corrupt: ", bytes.size(), " bytes with crc32 ", crc,
                " received, ", sent.length, " bytes with crc32 ", sent.crc32,
                " sent; nothing was restored");
  checkpoint::proto::RankState proto;
  HSGD_CHECK_AS(CommError, proto.ParseFromString(bytes), what, " from rank ", root,
                " does not parse (", bytes.size(), " bytes, checksum correct)");
  return checkpoint::decode_state(proto, what + " of rank " + std::to_string(root));
}

void average_over(comm::ProcessGroup& world, std::vector<Tensor> tensors, bool in_group,
                  int count) {
  size_t total = 0;
  for (const Tensor& t : tensors) total += static_cast<size_t>(t.numel());
  std::vector<float> flat(total, 0.0f);
  if (in_group) {
    size_t at = 0;
    for (const Tensor& t : tensors) {
      const std::vector<float> v = t.to_vector();
      std::copy(v.begin(), v.end(), flat.begin() + static_cast<std::ptrdiff_t>(at));
      at += v.size();
    }
  }
  world.allreduce(std::span<float>(flat), comm::ReduceOp::kSum, "elastic survivors' average")
      ->wait();
  size_t at = 0;
  for (Tensor& t : tensors) {
    HSGD_CHECK(t.is_contiguous(), "elastic average: a model tensor is not contiguous");
    float* out = t.data();
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = flat[at++] / static_cast<float>(count);
  }
}

}  // namespace hsgd::runtime::detail
