#pragma once
// 16-bit wire formats of compressed averaging levels (level_options.h): a float32 payload is
// encoded as bfloat16 or IEEE half, four values per int64 word (value i in bits 16*(i%4) of word
// i/4, the last word zero-padded), so that ProcessGroup::allgather(int64) carries them bit for
// bit. Both conversions round to nearest even; fp16 saturates at +-65504 instead of overflowing
// to infinity (a payload too large for the scale then loses magnitude, which error feedback
// carries to the next averaging, rather than turning the model into inf). NaN stays NaN.
//
//   encoded_i = to16(payload_i * scale)      decoded_i = float(encoded_i) / scale
//
// Usage:
//   std::vector<float> payload(1000, 0.5f), residual(1000), sum(1000);
//   std::vector<int64_t> words(packed_words(1000));
//   encode(Compression::kBF16, 1.0f, payload, residual, words);   // residual may be empty
//   decode_add(Compression::kBF16, 1.0f, words, sum);             // sum += decoded

#include <cstdint>
#include <span>

#include "framework/distributed/model_averaging/level_options.h"

namespace hsgd::distributed {

// int64 words that carry n 16-bit values.
int64_t packed_words(int64_t n);

// Encodes v_i = payload_i + residual_i (residual_i = 0 when residual is empty) into packed.
// With a residual, stores this rank's rounding error v_i - decoded_i back into it (error
// feedback). packed.size() == packed_words(payload.size()); residual is empty or as payload.
void encode(Compression compression, float scale, std::span<const float> payload,
            std::span<float> residual, std::span<int64_t> packed);

// sum_i += decoded_i for the first sum.size() values of packed.
void decode_add(Compression compression, float scale, std::span<const int64_t> packed,
                std::span<float> sum);

// One value's round trip (to 16 bits and back, scale 1), for tests and reference computations.
float round_trip(Compression compression, float value);

}  // namespace hsgd::distributed
