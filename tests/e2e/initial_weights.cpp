// initial_weights: writes the parameters train_mlp --synthetic starts from (models::MLP of sizes
// 784, HIDDEN..., 10 drawn from --seed), in registration order, as raw little-endian float32, so
// that a test can look for them in a capture of the job's traffic.
//
//   initial_weights --seed 7 --hidden 64,32 --out weights.f32
//
// Exit code 0, or 1 when the file cannot be written (the message names it).

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "models/mlp.h"

int main(int argc, char** argv) {
  uint64_t seed = 0;
  std::vector<int64_t> hidden = {512, 256};
  std::string out;
  CLI::App app{"Write the initial parameters of train_mlp --synthetic as raw float32."};
  app.add_option("--seed", seed, "train_mlp's --seed")->required();
  app.add_option("--hidden", hidden, "train_mlp's --hidden")->delimiter(',');
  app.add_option("--out", out, "the file to write")->required();
  CLI11_PARSE(app, argc, argv);

  // The sizes train_mlp derives from the synthetic data set: (1,28,28) examples, 10 classes.
  std::vector<int64_t> sizes = {784};
  sizes.insert(sizes.end(), hidden.begin(), hidden.end());
  sizes.push_back(10);
  const hsgd::models::MLP model({.sizes = sizes, .seed = seed});

  std::FILE* f = std::fopen(out.c_str(), "wb");
  if (f == nullptr) {
    std::fprintf(stderr, "initial_weights: cannot open '%s' for writing\n", out.c_str());
    return 1;
  }
  bool ok = true;
  for (const auto& [name, p] : model.named_parameters()) {
    const auto n = static_cast<size_t>(p.numel());
    ok = ok && std::fwrite(p.data(), sizeof(float), n, f) == n;
  }
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::fprintf(stderr, "initial_weights: cannot write '%s'\n", out.c_str());
    return 1;
  }
  return 0;
}
