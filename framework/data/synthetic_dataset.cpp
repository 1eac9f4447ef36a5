#include "framework/data/synthetic_dataset.h"

#include "comm/error.h"

namespace hsgd::data {
namespace {

struct Generated {
  std::vector<float> values;
  std::vector<int64_t> targets;
};

Generated generate(const SyntheticOptions& o) {
  HSGD_CHECK(o.size >= 0, "SyntheticDataset: size ", o.size, " must be non-negative");
  HSGD_CHECK(o.num_classes >= 1, "SyntheticDataset: num_classes ", o.num_classes,
             " must be at least 1");
  HSGD_CHECK(o.noise >= 0, "SyntheticDataset: noise ", o.noise, " must be non-negative");
  HSGD_CHECK(!o.example_shape.empty(), "SyntheticDataset: example_shape must not be empty");
  for (int64_t d : o.example_shape) {
    HSGD_CHECK(d > 0, "SyntheticDataset: example_shape ", shape_str(o.example_shape),
               " must have positive sizes");
  }
  const auto numel = static_cast<size_t>(shape_numel(o.example_shape));
  Generator gen(o.seed);
  std::vector<float> centroids(static_cast<size_t>(o.num_classes) * numel);  // (C, numel)
  for (float& v : centroids) v = gen.normal();
  Generated out;
  out.values.resize(static_cast<size_t>(o.size) * numel);  // (size, numel)
  out.targets.resize(static_cast<size_t>(o.size));
  for (size_t i = 0; i < out.targets.size(); ++i) {
    const auto c = static_cast<int64_t>(gen.next_below(static_cast<uint64_t>(o.num_classes)));
    out.targets[i] = c;
    for (size_t j = 0; j < numel; ++j) {
      out.values[i * numel + j] =
          centroids[static_cast<size_t>(c) * numel + j] + o.noise * gen.normal();
    }
  }
  return out;
}

// Wraps generate() so the base can be built from its result in the member-initialiser list.
InMemoryDataset make(const SyntheticOptions& o) {
  Generated g = generate(o);
  return InMemoryDataset(std::move(g.values), std::move(g.targets), o.example_shape);
}

}  // namespace

SyntheticDataset::SyntheticDataset(const SyntheticOptions& options)
    : InMemoryDataset(make(options)), num_classes_(options.num_classes) {}

}  // namespace hsgd::data
