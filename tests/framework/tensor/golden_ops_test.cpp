// The tensor ops against PyTorch: reads reference files written by tests/golden/generate.py
// (forward output and the gradients of sum(out * gout)) and requires relative error <= 1e-4.

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "framework/tensor/ops.h"

namespace hsgd {
namespace {

// name -> tensor, from "name ndim d0 d1 ..." followed by a line of values.
std::map<std::string, Tensor> load_golden(const std::string& file) {
  const std::string path = std::string(HSGD_SOURCE_DIR) + "/tests/golden/data/" + file;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::map<std::string, Tensor> out;
  std::string header;
  while (std::getline(in, header)) {
    if (header.empty() || header[0] == '#') continue;
    std::istringstream hs(header);
    std::string name;
    int64_t ndim = 0;
    hs >> name >> ndim;
    Shape shape(ndim);
    for (int64_t& d : shape) hs >> d;
    std::string values_line;
    std::getline(in, values_line);
    std::istringstream vs(values_line);
    std::vector<float> values(shape_numel(shape));
    for (float& v : values) vs >> v;
    out[name] = from_vector(std::move(values), shape);
  }
  return out;
}

void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::vector<float> a = actual.to_vector(), e = expected.to_vector();
  int failures = 0;
  for (size_t i = 0; i < a.size() && failures < 5; ++i) {
    const double tol = 1e-4 * std::max(1.0, std::fabs(double(e[i])));
    if (!(std::fabs(double(a[i]) - e[i]) <= tol)) {
      ADD_FAILURE() << what << " index " << i << ": expected " << e[i] << ", actual " << a[i];
      ++failures;
    }
  }
}

Tensor leaf(const Tensor& t) { return t.clone().set_requires_grad(true); }

TEST(GoldenOpsTest, ProducesPyTorchValues_Linear) {
  auto g = load_golden("linear.txt");
  ASSERT_TRUE(g.count("grad_b"));
  Tensor x = leaf(g["x"]), w = leaf(g["w"]), b = leaf(g["b"]);
  Tensor out = linear(x, w, b);
  sum(out * g["gout"]).backward();
  expect_close(out, g["out"], "out");
  expect_close(x.grad(), g["grad_x"], "grad_x");
  expect_close(w.grad(), g["grad_w"], "grad_w");
  expect_close(b.grad(), g["grad_b"], "grad_b");
}

TEST(GoldenOpsTest, ProducesPyTorchValues_Relu) {
  auto g = load_golden("relu.txt");
  ASSERT_TRUE(g.count("grad_x"));
  Tensor x = leaf(g["x"]);
  Tensor out = relu(x);
  sum(out * g["gout"]).backward();
  expect_close(out, g["out"], "out");
  expect_close(x.grad(), g["grad_x"], "grad_x");
}

TEST(GoldenOpsTest, ProducesPyTorchValues_LogSoftmax) {
  auto g = load_golden("log_softmax.txt");
  ASSERT_TRUE(g.count("grad_x"));
  Tensor x = leaf(g["x"]);
  Tensor out = log_softmax(x, 1);
  sum(out * g["gout"]).backward();
  expect_close(out, g["out"], "out");
  expect_close(x.grad(), g["grad_x"], "grad_x");
}

TEST(GoldenOpsTest, ProducesPyTorchValues_CrossEntropy) {
  auto g = load_golden("cross_entropy.txt");
  ASSERT_TRUE(g.count("grad_logits"));
  Tensor logits = leaf(g["logits"]);
  Tensor loss = cross_entropy(logits, to_indices(g["targets"]));
  loss.backward();
  expect_close(loss, g["loss"], "loss");
  expect_close(logits.grad(), g["grad_logits"], "grad_logits");
}

}  // namespace
}  // namespace hsgd
