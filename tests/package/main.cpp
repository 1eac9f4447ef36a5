// package_app: one real call into each of hsgd's libraries through find_package(hsgd), each
// checked, so that the package test fails when a library is empty, missing from hsgd::hsgd or
// not linkable. Prints "hsgd package ok" (check.sh compares it) or what failed, exiting 1.
#include <iostream>
#include <string>

#include "comm/store/hash_store.h"
#include "hsgd.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::cout << "FAILED: " << what << "\n";
    ++failures;
  }
}

}  // namespace

int main() {
  using namespace hsgd;
  try {
    // comm (header-only HSGD_CHECK, then the library's HashStore).
    bool threw = false;
    try {
      HSGD_CHECK(1 + 1 == 3, "arithmetic");
    } catch (const InvalidArgument&) {
      threw = true;
    }
    expect(threw, "HSGD_CHECK(false) throws hsgd::InvalidArgument");
    comm::HashStore store;
    store.set("key", comm::Bytes{1, 2, 3});
    expect(store.get("key") == comm::Bytes{1, 2, 3}, "comm: HashStore returns what was set");

    // framework: a reduction over a tensor.
    expect(sum(ones({2, 3})).item() == 6.0f, "framework: sum(ones({2, 3})) is 6");

    // optim: one SGD step moves a parameter by -lr * grad.
    Tensor p = full({1}, 1.0f).set_requires_grad(true);
    p.set_grad(ones({1}));
    optim::SGD sgd({p}, {.lr = 0.25});
    sgd.step();
    expect(p.item() == 0.75f, "optim: SGD step with lr 0.25 takes 1 to 0.75");

    // models: an MLP's output shape and parameter count.
    models::MLP mlp(models::MLPOptions{.sizes = {4, 3, 2}});
    expect(mlp.forward(zeros({5, 4})).shape() == Shape{5, 2},
           "models: MLP 4-3-2 maps (5,4) to (5,2)");
    int64_t numel = 0;
    for (const Tensor& t : mlp.parameters()) numel += t.numel();
    expect(numel == 4 * 3 + 3 + 3 * 2 + 2, "models: MLP 4-3-2 has 23 parameters");
  } catch (const std::exception& e) {
    std::cout << "FAILED: unexpected exception: " << e.what() << "\n";
    return 1;
  }
  if (failures > 0) return 1;
  std::cout << "hsgd package ok\n";
  return 0;
}
