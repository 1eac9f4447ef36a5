// operator<< for Tensor: PyTorch's layout (nested brackets, aligned columns; "2." when every value
// is an integer, else 4 decimals; summarised with " ..." beyond 1000 elements, showing the first
// and last 3 of each dimension). Unlike torch, no switch to scientific notation for wide ranges.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "framework/autograd/node.h"
#include "framework/tensor/tensor.h"

namespace hsgd {
namespace {

constexpr int64_t kSummarizeAbove = 1000;  // torch's printoptions threshold
constexpr int64_t kEdgeItems = 3;          // torch's edgeitems

std::string format_value(float v, bool integers) {
  char buffer[48];
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  std::snprintf(buffer, sizeof(buffer), integers ? "%.0f." : "%.4f", static_cast<double>(v));
  return buffer;
}

struct Printer {
  const std::vector<float>& values;
  const Shape& shape;
  bool summarize;
  bool integers;
  size_t width;
  std::ostream& out;

  // Indices of dimension d to show: all, or the first and last kEdgeItems (-1 marks "...").
  std::vector<int64_t> shown(size_t d) const {
    std::vector<int64_t> idx;
    const int64_t n = shape[d];
    if (!summarize || n <= 2 * kEdgeItems) {
      for (int64_t i = 0; i < n; ++i) idx.push_back(i);
      return idx;
    }
    for (int64_t i = 0; i < kEdgeItems; ++i) idx.push_back(i);
    idx.push_back(-1);
    for (int64_t i = n - kEdgeItems; i < n; ++i) idx.push_back(i);
    return idx;
  }

  void print(size_t d, int64_t offset, int64_t stride, size_t indent) const {
    out << '[';
    const std::vector<int64_t> idx = shown(d);
    const int64_t inner = stride / shape[d];
    for (size_t k = 0; k < idx.size(); ++k) {
      if (k > 0) {
        out << ',';
        if (d + 1 == shape.size()) {
          out << ' ';
        } else {
          out << std::string(shape.size() - d - 1, '\n') << std::string(indent + 1, ' ');
        }
      }
      if (idx[k] < 0) {
        out << " ...";
        continue;
      }
      if (d + 1 == shape.size()) {
        const std::string v = format_value(values[static_cast<size_t>(offset + idx[k])], integers);
        out << std::string(width - std::min(width, v.size()), ' ') << v;
      } else {
        print(d + 1, offset + idx[k] * inner, inner, indent + 1);
      }
    }
    out << ']';
  }
};

}  // namespace

std::ostream& operator<<(std::ostream& out, const Tensor& t) {
  if (!t.defined()) return out << "tensor(undefined)";
  const std::vector<float> values = t.to_vector();
  const Shape& shape = t.shape();
  const bool summarize = t.numel() > kSummarizeAbove;
  bool integers = true;
  for (float v : values) integers = integers && (!std::isfinite(v) || std::nearbyint(v) == v);
  size_t width = 0;
  for (float v : values) width = std::max(width, format_value(v, integers).size());
  out << "tensor(";
  if (shape.empty()) {
    out << format_value(values.at(0), integers);
  } else if (t.numel() == 0) {
    out << "[], size=(";
    for (size_t d = 0; d < shape.size(); ++d) out << (d ? ", " : "") << shape[d];
    out << ')';
  } else {
    Printer{values, shape, summarize, integers, width, out}.print(0, 0, t.numel(), 7);
  }
  if (t.grad_fn()) {
    out << ", grad_fn=<" << t.grad_fn()->name() << '>';
  } else if (t.requires_grad()) {
    out << ", requires_grad=True";
  }
  return out << ')';
}

}  // namespace hsgd
