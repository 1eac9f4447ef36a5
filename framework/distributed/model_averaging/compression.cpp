#include "framework/distributed/model_averaging/compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/error.h"

namespace hsgd::distributed {
namespace {

constexpr float kHalfMax = 65504.0f;

uint16_t to_bf16(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // keep it a NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(bits >> 16);
}

float from_bf16(uint16_t half) {
  const uint32_t bits = static_cast<uint32_t>(half) << 16;
  float value = 0;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

uint16_t to_fp16(float value) {
  if (!std::isnan(value)) value = std::clamp(value, -kHalfMax, kHalfMax);
  const _Float16 half = static_cast<_Float16>(value);  // rounds to nearest even
  uint16_t bits = 0;
  std::memcpy(&bits, &half, sizeof(bits));
  return bits;
}

float from_fp16(uint16_t bits) {
  _Float16 half;
  std::memcpy(&half, &bits, sizeof(bits));
  return static_cast<float>(half);
}

uint16_t to16(Compression compression, float value) {
  return compression == Compression::kBF16 ? to_bf16(value) : to_fp16(value);
}

float from16(Compression compression, uint16_t bits) {
  return compression == Compression::kBF16 ? from_bf16(bits) : from_fp16(bits);
}

}  // namespace

int64_t packed_words(int64_t n) { return (n + 3) / 4; }

void encode(Compression compression, float scale, std::span<const float> payload,
            std::span<float> residual, std::span<int64_t> packed) {
  HSGD_CHECK(compression != Compression::kNone, "encode: no compression to encode with");
  HSGD_CHECK_EQ(static_cast<int64_t>(packed.size()),
                packed_words(static_cast<int64_t>(payload.size())), "encode: packed words");
  HSGD_CHECK(residual.empty() || residual.size() == payload.size(), "encode: residual has ",
             residual.size(), " values, the payload ", payload.size());
  std::fill(packed.begin(), packed.end(), 0);
  for (size_t i = 0; i < payload.size(); ++i) {
    const float v = residual.empty() ? payload[i] : payload[i] + residual[i];
    const uint16_t bits = to16(compression, v * scale);
    if (!residual.empty()) residual[i] = v - from16(compression, bits) / scale;
    const uint64_t word = static_cast<uint64_t>(bits) << (16 * (i % 4));
    packed[i / 4] = static_cast<int64_t>(static_cast<uint64_t>(packed[i / 4]) | word);
  }
}

void decode_add(Compression compression, float scale, std::span<const int64_t> packed,
                std::span<float> sum) {
  HSGD_CHECK_GE(static_cast<int64_t>(packed.size()), packed_words(static_cast<int64_t>(sum.size())),
                "decode_add: packed words");
  for (size_t i = 0; i < sum.size(); ++i) {
    const auto bits = static_cast<uint16_t>(static_cast<uint64_t>(packed[i / 4]) >> (16 * (i % 4)));
    sum[i] += from16(compression, bits) / scale;
  }
}

float round_trip(Compression compression, float value) {
  if (compression == Compression::kNone) return value;
  return from16(compression, to16(compression, value));
}

}  // namespace hsgd::distributed
