#pragma once
// Generator: a seeded, deterministic random number source (xoshiro256** seeded by splitmix64).
// The same seed gives the same sequence on every machine and compiler, unlike
// std::normal_distribution. Not thread-safe: give each thread (rank) its own Generator.
//
//   hsgd::Generator gen(42);
//   hsgd::Tensor w = hsgd::randn({3, 4}, gen);

#include <cstdint>

namespace hsgd {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0);

  // Restarts the sequence as if freshly constructed with seed.
  void seed(uint64_t seed);
  // 64 uniformly distributed random bits.
  uint64_t next_u64();
  // Uniform in [lo, hi) (24 random mantissa bits).
  float uniform(float lo, float hi);
  // Normal with the given mean and standard deviation (Box-Muller).
  float normal(float mean = 0, float std = 1);
  // Uniform integer in [0, n); n > 0.
  uint64_t next_below(uint64_t n);

  // The whole state (for checkpoints): set_state(state()) continues the same sequence.
  struct State {
    uint64_t words[4];
    bool has_spare_normal;
    double spare_normal;
  };
  State state() const;
  void set_state(const State& state);

 private:
  uint64_t state_[4] = {0, 0, 0, 0};
  bool has_spare_normal_ = false;
  double spare_normal_ = 0;
};

}  // namespace hsgd
