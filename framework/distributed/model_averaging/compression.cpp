#include "framework/distributed/model_averaging/compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

bool is_block(Compression compression) {
  return compression == Compression::kInt8 || compression == Compression::kInt4;
}

int block_bits(Compression compression) { return compression == Compression::kInt8 ? 8 : 4; }

// Words of a block of m values: the step, then the values.
int64_t block_words(Compression compression, int64_t m) {
  const int64_t per_word = 64 / block_bits(compression);
  return 1 + (m + per_word - 1) / per_word;
}

void encode_blocks(Compression compression, std::span<const float> payload,
                   std::span<float> residual, std::span<int64_t> packed) {
  const int bits = block_bits(compression);
  const int per_word = 64 / bits;
  const float qmax = compression == Compression::kInt8 ? 127.0f : 7.0f;
  const uint64_t mask = (uint64_t{1} << bits) - 1;
  const auto n = static_cast<int64_t>(payload.size());
  std::vector<float> v(static_cast<size_t>(std::min(n, kQuantBlock)));
  int64_t word = 0;
  for (int64_t begin = 0; begin < n; begin += kQuantBlock) {
    const int64_t m = std::min(kQuantBlock, n - begin);
    float largest = 0.0f;
    for (int64_t j = 0; j < m; ++j) {
      const auto i = static_cast<size_t>(begin + j);
      v[j] = residual.empty() ? payload[i] : payload[i] + residual[i];
      // A NaN makes largest NaN (the comparison below is false for it, so test it explicitly).
      largest = std::isnan(v[j]) ? v[j] : std::max(largest, std::abs(v[j]));
      if (std::isnan(largest)) break;
    }
    for (int64_t j = 0; j < m && std::isnan(largest); ++j) {  // the rest of a poisoned block
      const auto i = static_cast<size_t>(begin + j);
      v[j] = residual.empty() ? payload[i] : payload[i] + residual[i];
    }
    const float step = std::isfinite(largest) ? largest / qmax : std::nanf("");
    uint32_t step_bits = 0;
    std::memcpy(&step_bits, &step, sizeof(step_bits));
    packed[word++] = static_cast<int64_t>(step_bits);
    for (int64_t j = 0; j < m; ++j) {
      float q = 0.0f;
      if (step > 0.0f) q = std::clamp(std::nearbyint(v[j] / step), -qmax, qmax);
      const float decoded = q * step;  // NaN for a poisoned block
      if (!residual.empty()) residual[static_cast<size_t>(begin + j)] = v[j] - decoded;
      const uint64_t code = static_cast<uint64_t>(static_cast<int64_t>(q)) & mask;
      const int64_t w = word + j / per_word;
      packed[w] = static_cast<int64_t>(static_cast<uint64_t>(packed[w]) |
                                       (code << (bits * (j % per_word))));
    }
    word += block_words(compression, m) - 1;
  }
}

void decode_add_blocks(Compression compression, std::span<const int64_t> packed,
                       std::span<float> sum) {
  const int bits = block_bits(compression);
  const int per_word = 64 / bits;
  const auto n = static_cast<int64_t>(sum.size());
  int64_t word = 0;
  for (int64_t begin = 0; begin < n; begin += kQuantBlock) {
    const int64_t m = std::min(kQuantBlock, n - begin);
    const auto step_bits = static_cast<uint32_t>(static_cast<uint64_t>(packed[word++]));
    float step = 0.0f;
    std::memcpy(&step, &step_bits, sizeof(step));
    for (int64_t j = 0; j < m; ++j) {
      const uint64_t w = static_cast<uint64_t>(packed[word + j / per_word]);
      // Sign-extend the field: shift it to the top of the word, then arithmetic-shift it down.
      const auto code =
          static_cast<int64_t>(w << (64 - bits * (j % per_word + 1))) >> (64 - bits);
      sum[static_cast<size_t>(begin + j)] += static_cast<float>(code) * step;
    }
    word += block_words(compression, m) - 1;
  }
}

}  // namespace

int64_t packed_words(Compression compression, int64_t n) {
  HSGD_CHECK(compression != Compression::kNone, "packed_words: float32 is not packed");
  if (!is_block(compression)) return (n + 3) / 4;
  const int64_t whole = n / kQuantBlock, rest = n % kQuantBlock;
  return whole * block_words(compression, kQuantBlock) +
         (rest > 0 ? block_words(compression, rest) : 0);
}

void encode(Compression compression, float scale, std::span<const float> payload,
            std::span<float> residual, std::span<int64_t> packed) {
  HSGD_CHECK(compression != Compression::kNone, "encode: no compression to encode with");
  HSGD_CHECK_EQ(static_cast<int64_t>(packed.size()),
                packed_words(compression, static_cast<int64_t>(payload.size())),
                "encode: packed words");
  HSGD_CHECK(residual.empty() || residual.size() == payload.size(), "encode: residual has ",
             residual.size(), " values, the payload ", payload.size());
  std::fill(packed.begin(), packed.end(), 0);
  if (is_block(compression)) {
    HSGD_CHECK(scale == 1.0f, "encode: ", to_string(compression),
               " chooses its scale per block, got scale ", scale);
    encode_blocks(compression, payload, residual, packed);
    return;
  }
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
  HSGD_CHECK_GE(static_cast<int64_t>(packed.size()),
                packed_words(compression, static_cast<int64_t>(sum.size())),
                "decode_add: packed words");
  if (is_block(compression)) {
    decode_add_blocks(compression, packed, sum);
    return;
  }
  for (size_t i = 0; i < sum.size(); ++i) {
    const auto bits = static_cast<uint16_t>(static_cast<uint64_t>(packed[i / 4]) >> (16 * (i % 4)));
    sum[i] += from16(compression, bits) / scale;
  }
}

float round_trip(Compression compression, float value) {
  if (compression == Compression::kNone) return value;
  HSGD_CHECK(!is_block(compression), "round_trip: ", to_string(compression),
             " rounds whole blocks; use the span overload");
  return from16(compression, to16(compression, value));
}

std::vector<float> round_trip(Compression compression, float scale, std::span<const float> values) {
  std::vector<int64_t> words(
      static_cast<size_t>(packed_words(compression, static_cast<int64_t>(values.size()))));
  encode(compression, scale, values, {}, words);
  std::vector<float> out(values.size(), 0.0f);
  decode_add(compression, scale, words, out);
  return out;
}

}  // namespace hsgd::distributed
