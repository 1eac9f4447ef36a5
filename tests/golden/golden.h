#pragma once
// Loads the PyTorch reference files written by tests/golden/generate.py (format documented
// there) and compares tensors against them. Header-only so every suite can include it.
//
// Usage:
//   golden::File f("linear");                         // tests/golden/data/linear.txt
//   Tensor x = f.tensor("x");
//   Tensor out = linear(x, f.tensor("w"), f.tensor("b"));
//   golden::expect_close(out, f.tensor("out"), "linear out");

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "comm/error.h"
#include "framework/tensor/tensor.h"

namespace hsgd::golden {

// The tolerance of every golden comparison: |actual - expected| <= kRtol * |expected| + kAtol.
// kAtol only matters for values within ~1e-2 of zero, where float32 rounding of sums of O(1) terms
// is larger than 1e-4 relative.
inline constexpr double kRtol = 1e-4;
inline constexpr double kAtol = 1e-6;

struct Entry {
  Shape shape;
  std::vector<float> values;
};

class File {
 public:
  explicit File(const std::string& name)
      : path_(std::string(HSGD_SOURCE_DIR) + "/tests/golden/data/" + name + ".txt") {
    std::ifstream in(path_);
    HSGD_CHECK(in.good(), "golden file '", path_, "' is missing; run tests/golden/generate.py");
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream header(line);
      std::string key;
      int64_t ndim = 0;
      header >> key >> ndim;
      Entry e;
      for (int64_t d = 0; d < ndim; ++d) {
        int64_t s = 0;
        header >> s;
        e.shape.push_back(s);
      }
      HSGD_CHECK(std::getline(in, line), "golden file '", path_, "': no values for '", key, "'");
      std::istringstream values(line);
      float v = 0;
      while (values >> v) e.values.push_back(v);
      HSGD_CHECK_EQ(static_cast<int64_t>(e.values.size()), shape_numel(e.shape), "golden file '",
                    path_, "': value count of '", key, "'");
      order_.push_back(key);
      entries_[key] = std::move(e);
    }
  }

  bool has(const std::string& key) const { return entries_.count(key) == 1; }
  const Entry& entry(const std::string& key) const {
    auto it = entries_.find(key);
    HSGD_CHECK(it != entries_.end(), "golden file '", path_, "' has no entry '", key, "'");
    return it->second;
  }
  // A fresh leaf tensor holding the entry.
  Tensor tensor(const std::string& key) const {
    const Entry& e = entry(key);
    return from_vector(e.values, e.shape);
  }
  // A fresh leaf tensor holding the entry, requiring grad (an input whose gradient is compared).
  Tensor leaf(const std::string& key) const {
    Tensor t = tensor(key);
    t.set_requires_grad(true);
    return t;
  }
  std::vector<int64_t> targets(const std::string& key) const {
    std::vector<int64_t> out;
    for (float v : entry(key).values) out.push_back(static_cast<int64_t>(v));
    return out;
  }
  float scalar(const std::string& key) const { return entry(key).values.at(0); }
  // Keys in file order.
  const std::vector<std::string>& keys() const { return order_; }

 private:
  std::string path_;
  std::vector<std::string> order_;
  std::map<std::string, Entry> entries_;
};

// Expects the same shape and every element within tolerance; reports the first few mismatches
// with index, expected and actual, and the largest relative error.
inline void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what,
                         double rtol = kRtol, double atol = kAtol) {
  ASSERT_TRUE(actual.defined()) << what << ": actual tensor is undefined";
  ASSERT_EQ(shape_str(actual.shape()), shape_str(expected.shape())) << what << ": shape";
  const std::vector<float> a = actual.to_vector();
  const std::vector<float> e = expected.to_vector();
  int reported = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(a[i]) - e[i]);
    if (!(diff <= rtol * std::fabs(e[i]) + atol)) {
      if (++reported <= 5) {
        ADD_FAILURE() << what << ": index " << i << " expected " << e[i] << " actual " << a[i]
                      << " (abs diff " << diff << ")";
      }
    }
  }
  EXPECT_EQ(reported, 0) << what << ": " << reported << " of " << a.size()
                         << " elements outside rtol " << rtol << " atol " << atol;
}

}  // namespace hsgd::golden
