#include "framework/tensor/generator.h"

#include <bit>
#include <cmath>
#include <numbers>

#include "comm/error.h"

namespace hsgd {

namespace {

constexpr uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// splitmix64's output function: a bijection of 64 bits in which every input bit affects every
// output bit.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t splitmix64(uint64_t& x) { return mix64(x += 0x9e3779b97f4a7c15ULL); }

// Uniform double in [0, 1) from the top 53 bits.
double unit_double(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

}  // namespace

uint64_t derive_seed(uint64_t seed, std::string_view name) {
  // For a given byte each step is a bijection of h, so names that first differ at some byte give
  // unrelated states from there on; mixing in the length last separates a name from its
  // extensions by NUL bytes.
  uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL);
  for (const char c : name) h = mix64(h ^ static_cast<unsigned char>(c));
  return mix64(h ^ (static_cast<uint64_t>(name.size()) << 8));
}

Generator::Generator(uint64_t seed) { this->seed(seed); }

void Generator::seed(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& s : state_) s = splitmix64(x);
  has_spare_normal_ = false;
}

uint64_t Generator::next_u64() {
  const uint64_t result = rotl(state_[1] * 5, 7) * 9;
  const uint64_t t = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= t;
  state_[3] = rotl(state_[3], 45);
  return result;
}

float Generator::uniform(float lo, float hi) {
  // 24 bits: every value is exactly representable, and the result is < 1 before scaling.
  const float u = static_cast<float>(next_u64() >> 40) * 0x1.0p-24f;
  const float v = lo + (hi - lo) * u;
  return v < hi ? v : lo;  // rounding of lo + (hi-lo)*u may reach hi
}

float Generator::normal(float mean, float std) {
  double z;
  if (has_spare_normal_) {
    z = spare_normal_;
    has_spare_normal_ = false;
  } else {
    const double u1 = 1.0 - unit_double(next_u64());  // (0, 1]: log is finite
    const double u2 = unit_double(next_u64());
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 2.0 * std::numbers::pi * u2;
    z = r * std::cos(theta);
    spare_normal_ = r * std::sin(theta);
    has_spare_normal_ = true;
  }
  return static_cast<float>(mean + std * z);
}

uint64_t Generator::next_below(uint64_t n) {
  HSGD_CHECK(n > 0, "Generator::next_below: n must be positive, got ", n);
  // Rejection sampling removes the modulo bias.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = next_u64();
  } while (x >= limit);
  return x % n;
}

Generator::State Generator::state() const {
  State out{};
  for (int i = 0; i < 4; ++i) out.words[i] = state_[i];
  out.has_spare_normal = has_spare_normal_;
  out.spare_normal = spare_normal_;
  return out;
}

void Generator::set_state(const State& state) {
  HSGD_CHECK(
      state.words[0] != 0 || state.words[1] != 0 || state.words[2] != 0 || state.words[3] != 0,
      "Generator::set_state: an all-zero state is not a valid xoshiro256** state");
  for (int i = 0; i < 4; ++i) state_[i] = state.words[i];
  has_spare_normal_ = state.has_spare_normal;
  spare_normal_ = state.spare_normal;
}

std::string Generator::state_bytes() const {
  std::string out(kStateBytes, '\0');
  const auto put = [&out](size_t at, uint64_t value) {
    for (int b = 0; b < 8; ++b) out[at + b] = static_cast<char>((value >> (8 * b)) & 0xff);
  };
  for (int i = 0; i < 4; ++i) put(8 * i, state_[i]);
  put(32, std::bit_cast<uint64_t>(spare_normal_));
  out[40] = has_spare_normal_ ? 1 : 0;
  return out;
}

Generator::State Generator::parse_state_bytes(std::string_view bytes) {
  HSGD_CHECK(bytes.size() == kStateBytes, "Generator: a saved state has ", bytes.size(),
             " bytes, expected ", kStateBytes);
  const auto get = [bytes](size_t at) {
    uint64_t value = 0;
    for (int b = 0; b < 8; ++b) {
      value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + b])) << (8 * b);
    }
    return value;
  };
  State state{};
  for (int i = 0; i < 4; ++i) state.words[i] = get(8 * i);
  state.spare_normal = std::bit_cast<double>(get(32));
  const int flag = static_cast<unsigned char>(bytes[40]);
  HSGD_CHECK(flag <= 1, "Generator: a saved state has the spare-normal flag ", flag,
             ", expected 0 or 1");
  state.has_spare_normal = flag == 1;
  HSGD_CHECK(
      state.words[0] != 0 || state.words[1] != 0 || state.words[2] != 0 || state.words[3] != 0,
      "Generator: a saved state has all-zero words, not a valid xoshiro256** state");
  return state;
}

namespace detail {

std::mutex& default_generator_mutex() {
  static std::mutex mutex;
  return mutex;
}

Generator& default_generator() {
  static Generator generator(kDefaultSeed);
  return generator;
}

uint64_t& default_initial_seed() {
  static uint64_t seed = kDefaultSeed;
  return seed;
}

}  // namespace detail

void manual_seed(uint64_t seed) {
  with_default_generator([seed](Generator& g) {
    g.seed(seed);
    detail::default_initial_seed() = seed;
  });
}

uint64_t initial_seed() {
  std::lock_guard<std::mutex> lock(detail::default_generator_mutex());
  return detail::default_initial_seed();
}

}  // namespace hsgd
