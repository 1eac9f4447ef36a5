#pragma once
// Generator: a seeded, deterministic random number source (xoshiro256** seeded by splitmix64).
// The same seed gives the same sequence on every machine and compiler, unlike
// std::normal_distribution. Not thread-safe: give each thread (rank) its own Generator.
//
// Usage:
//   hsgd::Generator gen(42);
//   hsgd::Tensor w = hsgd::randn({3, 4}, gen);

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace hsgd {

class Generator;
namespace detail {
std::mutex& default_generator_mutex();
Generator& default_generator();    // guarded by default_generator_mutex()
uint64_t& default_initial_seed();  // guarded by default_generator_mutex()
}  // namespace detail

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
  // InvalidArgument for the all-zero words (not a xoshiro256** state).
  void set_state(const State& state);
  // The state as kStateBytes bytes, the same on every machine (the four words, then the spare
  // normal's bits, little-endian, then the flag as 0 or 1): what a checkpoint stores.
  static constexpr size_t kStateBytes = 41;
  std::string state_bytes() const;
  // The State of state_bytes() output; InvalidArgument naming what is wrong (another size, a flag
  // other than 0 or 1, all-zero words). The generator is unchanged on error.
  static State parse_state_bytes(std::string_view bytes);
  void set_state_bytes(std::string_view bytes) { set_state(parse_state_bytes(bytes)); }

 private:
  uint64_t state_[4] = {0, 0, 0, 0};
  bool has_spare_normal_ = false;
  double spare_normal_ = 0;
};

// A seed for the stream called `name` within a family of streams seeded with `seed` (e.g. the
// dropout layers of one model, by their dotted names: nn::Module::seed_generators). A keyed hash
// of the name's bytes (splitmix64's finalizer after each byte, then the length): distinct names
// give unrelated streams, and the same (seed, name) gives the same stream on every machine.
//   derive_seed(7, "blocks.0.dropout.generator") != derive_seed(7, "blocks.1.dropout.generator")
uint64_t derive_seed(uint64_t seed, std::string_view name);

// ---- the default generator ----
// The process-wide default generator, like torch's default CPU generator: modules built without
// an explicit Generator (nn::Linear(in, out), nn::Conv2d(options), ...) draw from it, so two
// layers of the same shape get different values, and a program that calls manual_seed(s) first
// builds the same model on every run and every rank. It starts seeded with kDefaultSeed (torch's
// default seed), so unseeded programs are deterministic too. Thread-safe (one mutex); ranks that
// run as threads of one process share it, so multi-rank tests pass their own Generator.
inline constexpr uint64_t kDefaultSeed = 67280421310721ull;

// Reseeds the default generator (torch.manual_seed).
void manual_seed(uint64_t seed);
// The seed of the last manual_seed call, kDefaultSeed before any (torch.initial_seed). Modules
// take it as the default seed of their random streams (nn::Module::seed_generators).
uint64_t initial_seed();

// Runs fn(Generator&) with the default generator locked; returns what fn returns.
template <typename Fn>
auto with_default_generator(Fn&& fn) {
  std::lock_guard<std::mutex> lock(detail::default_generator_mutex());
  return fn(detail::default_generator());
}

}  // namespace hsgd
