#pragma once
// Wire formats of compressed averaging levels (level_options.h). A float32 payload travels as
// int64 words, so that ProcessGroup::allgather(int64) and ring_exchange carry it bit for bit.
//
// 16-bit formats (bf16, fp16): four values per word (value i in bits 16*(i%4) of word i/4, the
// last word zero-padded). Both round to nearest even; fp16 saturates at +-65504 instead of
// overflowing to infinity (a payload too large for the scale then loses magnitude, which error
// feedback carries to the next averaging, rather than turning the model into inf).
//
//   encoded_i = to16(payload_i * scale)      decoded_i = float(encoded_i) / scale
//
// Block formats (int8, int4): the payload is cut into blocks of kQuantBlock values from its first
// value (the last block may be short). A block is one word holding its float32 step s (low 32
// bits; the high 32 bits are zero), then its values, 8 (int8) or 16 (int4) to a word, value j of
// the block in bits b*(j%k) of the block's word j/k (b = 8 or 4 bits, two's complement), the last
// word zero-padded:
//
//   s = max_j |v_j| / qmax        (qmax = 127 or 7; s = 0 for an all-zero block)
//   q_j = nearbyint(v_j / s) clamped to [-qmax, qmax]        decoded_j = q_j * s
//
// so that the largest value of a block is exact up to float rounding. A block holding a NaN or an
// infinity gets s = NaN and decodes to NaN, as a float32 sum would be poisoned. The scale
// argument is 1 for block formats (level_options.h checks it).
//
// Bytes per value: 4 (float32), 2 (16-bit), 33/32 (int8), 17/32 (int4) for whole blocks.
//
// Usage:
//   std::vector<float> payload(1000, 0.5f), residual(1000), sum(1000);
//   std::vector<int64_t> words(packed_words(Compression::kInt4, 1000));
//   encode(Compression::kInt4, 1.0f, payload, residual, words);   // residual may be empty
//   decode_add(Compression::kInt4, 1.0f, words, sum);             // sum += decoded

#include <cstdint>
#include <span>
#include <vector>

#include "framework/distributed/model_averaging/level_options.h"

namespace hsgd::distributed {

// Values per block of the block formats.
inline constexpr int64_t kQuantBlock = 256;

// int64 words that carry n values in the given format (not kNone).
int64_t packed_words(Compression compression, int64_t n);

// Encodes v_i = payload_i + residual_i (residual_i = 0 when residual is empty) into packed.
// With a residual, stores this rank's rounding error v_i - decoded_i back into it (error
// feedback). packed.size() == packed_words(compression, payload.size()); residual is empty or as
// payload.
void encode(Compression compression, float scale, std::span<const float> payload,
            std::span<float> residual, std::span<int64_t> packed);

// sum_i += decoded_i for the first sum.size() values of packed (which must hold at least
// packed_words(compression, sum.size()) words, encoded from at least as many values).
void decode_add(Compression compression, float scale, std::span<const int64_t> packed,
                std::span<float> sum);

// One value's round trip in a 16-bit format (to 16 bits and back, scale 1); the value itself
// for kNone. For tests and reference computations.
float round_trip(Compression compression, float value);

// The decoded values of encode(compression, scale, values) (any format but kNone), for tests
// and reference computations.
std::vector<float> round_trip(Compression compression, float scale, std::span<const float> values);

}  // namespace hsgd::distributed
