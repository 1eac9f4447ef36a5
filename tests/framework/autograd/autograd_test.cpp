// The autograd engine: accumulation, grad mode, hooks, graph release, errors.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/tensor_impl.h"
#include "tests/support/error_message.h"

namespace hsgd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using testing::error_message;

TEST(AutogradTest, LeafGradUndefinedUntilBackward) {
  Tensor w = ones({2}).set_requires_grad(true);
  EXPECT_TRUE(w.is_leaf());
  EXPECT_FALSE(w.grad().defined());
  Tensor y = sum(w * 3.0f);
  EXPECT_FALSE(y.is_leaf());
  EXPECT_TRUE(y.requires_grad());
  ASSERT_NE(y.grad_fn(), nullptr);
  y.backward();
  EXPECT_THAT(w.grad().to_vector(), ElementsAre(3, 3));
}

TEST(AutogradTest, GradAccumulatesOverTwoBackwardCalls) {
  Tensor w = from_vector({1, 2}).set_requires_grad(true);
  sum(w * w).backward();  // d/dw = 2w
  sum(w * w).backward();
  EXPECT_THAT(w.grad().to_vector(), ElementsAre(4, 8));
  w.grad().zero_();  // what an optimizer's zero_grad does
  sum(w * 5.0f).backward();
  EXPECT_THAT(w.grad().to_vector(), ElementsAre(5, 5));
}

TEST(AutogradTest, LeafUsedTwiceGetsSummedGradient) {
  Tensor x = from_vector({2, 3}).set_requires_grad(true);
  Tensor y = sum(x * 2.0f + x * x);  // d/dx = 2 + 2x
  y.backward();
  EXPECT_THAT(x.grad().to_vector(), ElementsAre(6, 8));
}

TEST(AutogradTest, GradOfSharedBufferIsNotAliased) {
  // AddBackward hands the same gradient tensor to both leaves; accumulating into one must not
  // change the other.
  Tensor a = zeros({2}).set_requires_grad(true), b = zeros({2}).set_requires_grad(true);
  sum(a + b).backward();
  EXPECT_FALSE(a.grad().shares_storage_with(b.grad()));
  sum(a * 10.0f).backward();
  EXPECT_THAT(a.grad().to_vector(), ElementsAre(11, 11));
  EXPECT_THAT(b.grad().to_vector(), ElementsAre(1, 1));
}

TEST(AutogradTest, NoGradGuardStopsRecording) {
  Tensor w = ones({2}).set_requires_grad(true);
  EXPECT_TRUE(grad_mode_enabled());
  {
    NoGradGuard no_grad;
    EXPECT_FALSE(grad_mode_enabled());
    Tensor y = w * 2.0f;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_TRUE(y.is_leaf());
    { NoGradGuard nested; }
    EXPECT_FALSE(grad_mode_enabled());  // nested guard restores "off", not "on"
  }
  EXPECT_TRUE(grad_mode_enabled());
  EXPECT_TRUE((w * 2.0f).requires_grad());
}

TEST(AutogradTest, GradModeIsThreadLocal) {
  NoGradGuard no_grad;
  bool other_thread_enabled = false;
  std::thread t([&] { other_thread_enabled = grad_mode_enabled(); });
  t.join();
  EXPECT_TRUE(other_thread_enabled);
  EXPECT_FALSE(grad_mode_enabled());
}

TEST(AutogradTest, DetachCutsTheGraph) {
  Tensor w = ones({2}).set_requires_grad(true);
  Tensor d = (w * 2.0f).detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  sum(w * d).backward();
  EXPECT_THAT(w.grad().to_vector(), ElementsAre(2, 2));
}

TEST(AutogradTest, BackwardWithGradOutput) {
  Tensor x = from_vector({1, 2, 3}).set_requires_grad(true);
  Tensor y = x * x;
  y.backward(from_vector({1, 0, -1}));
  EXPECT_THAT(x.grad().to_vector(), ElementsAre(2, 0, -6));
}

TEST(AutogradTest, BackwardOnLeafItself) {
  Tensor x = from_vector({1, 2}).set_requires_grad(true);
  Tensor g = from_vector({3, 4});
  x.backward(g);
  EXPECT_THAT(x.grad().to_vector(), ElementsAre(3, 4));
  g.fill_(0);  // the caller's tensor is not the stored gradient
  EXPECT_THAT(x.grad().to_vector(), ElementsAre(3, 4));
}

TEST(AutogradTest, BackwardOnNonScalarWithoutGradOutputThrows) {
  Tensor x = ones({2, 3}).set_requires_grad(true);
  const std::string msg = error_message([&] { (x * 2.0f).backward(); });
  EXPECT_THAT(msg, HasSubstr("[2, 3]"));
  EXPECT_THROW((x * 2.0f).backward(ones({3, 2})), InvalidArgument);
}

TEST(AutogradTest, BackwardWithoutRequiresGradThrows) {
  EXPECT_THAT(error_message([] { sum(ones({2})).backward(); }), HasSubstr("does not require grad"));
}

TEST(AutogradTest, SecondBackwardThroughReleasedGraphThrows) {
  Tensor x = ones({2}).set_requires_grad(true);
  Tensor y = sum(x * x);
  y.backward();
  EXPECT_THROW(y.backward(), Error);
}

TEST(AutogradTest, SetRequiresGradOnNonLeafThrows) {
  Tensor x = ones({2}).set_requires_grad(true);
  Tensor y = x * 2.0f;
  EXPECT_THAT(error_message([&] { y.set_requires_grad(false); }), HasSubstr("MulScalarBackward"));
  EXPECT_THROW(y.register_grad_ready_hook([](Tensor&) {}), InvalidArgument);
}

TEST(AutogradTest, LeafOutsideTheGraphKeepsUndefinedGrad) {
  Tensor a = ones({2}).set_requires_grad(true), b = ones({2}).set_requires_grad(true);
  sum(a * 2.0f).backward();
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(AutogradTest, GradReadyHookFiresOncePerBackward_WithTheSummedGradient) {
  Tensor x = from_vector({1, 2}).set_requires_grad(true);
  int calls = 0;
  std::vector<float> seen;
  x.register_grad_ready_hook([&](Tensor& leaf) {
    ++calls;
    seen = leaf.grad().to_vector();
  });
  // x is used by three ops; the hook must see all three contributions: 3 + 2x + 1.
  Tensor y = sum(x * 3.0f + x * x + x);
  y.backward();
  EXPECT_EQ(calls, 1);
  EXPECT_THAT(seen, ElementsAre(6, 8));
  sum(x * 3.0f).backward();
  EXPECT_EQ(calls, 2);
  EXPECT_THAT(seen, ElementsAre(9, 11));  // accumulated over passes
}

TEST(AutogradTest, GradReadyHookRemoved) {
  Tensor x = ones({2}).set_requires_grad(true);
  int calls = 0;
  const int64_t id = x.register_grad_ready_hook([&](Tensor&) { ++calls; });
  x.remove_grad_ready_hook(id);
  x.remove_grad_ready_hook(id + 100);  // unknown: no-op
  sum(x).backward();
  EXPECT_EQ(calls, 0);
}

TEST(AutogradTest, GradReadyHooksFireInReverseLayerOrder_BeforeBackwardEnds) {
  // A 3-layer chain: the last layer's gradient is final first; DDP relies on this order to
  // start communicating while earlier layers are still being differentiated.
  Generator gen(0);
  std::vector<Tensor> weights;
  for (int i = 0; i < 3; ++i) weights.push_back(randn({4, 4}, gen).set_requires_grad(true));
  std::vector<int> order;
  std::vector<bool> first_layer_done_at_hook;
  for (int i = 0; i < 3; ++i) {
    weights[i].register_grad_ready_hook([&, i](Tensor&) {
      order.push_back(i);
      first_layer_done_at_hook.push_back(weights[0].grad().defined());
    });
  }
  Tensor h = randn({2, 4}, gen);
  for (const Tensor& w : weights) h = tanh(linear(h, w));
  sum(h).backward();
  EXPECT_THAT(order, ElementsAre(2, 1, 0));
  // When the last layer's hook ran, the first layer's gradient did not exist yet.
  EXPECT_THAT(first_layer_done_at_hook, ElementsAre(false, false, true));
}

TEST(AutogradTest, DiamondGraph) {
  Tensor x = from_vector({1.5f}).set_requires_grad(true);
  Tensor a = x * 2.0f, b = exp(x);
  Tensor y = sum(a * b);  // y = 2x e^x, dy/dx = 2 e^x (1 + x)
  y.backward();
  EXPECT_NEAR(x.grad().item(), 2 * std::exp(1.5) * 2.5, 1e-4);
}

TEST(AutogradTest, ViewsOfLeafPropagateGradient) {
  Tensor x = arange(6).set_requires_grad(true);
  Tensor y = x.reshape({2, 3}).t();  // (3,2)
  y.backward(from_vector({1, 2, 3, 4, 5, 6}, {3, 2}));
  // y(i,j) = x(j*3 + i)
  EXPECT_THAT(x.grad().to_vector(), ElementsAre(1, 3, 5, 2, 4, 6));
}

TEST(AutogradTest, CustomNodeWithRecord) {
  // The recipe of framework/autograd/node.h: a cube op with a hand-written backward.
  auto cube = [](const Tensor& x) {
    Tensor out = x.detach() * x.detach() * x.detach();
    if (autograd::needs_grad({x})) {
      autograd::record(out, "CubeBackward", {x},
                       [x = x.detach()](const Tensor& g, const autograd::NeedsGrad&) {
                         return std::vector<Tensor>{g * x * x * 3.0f};
                       });
    }
    return out;
  };
  Tensor x = from_vector({1, -2}).set_requires_grad(true);
  Tensor y = cube(x);
  EXPECT_EQ(y.grad_fn()->name(), "CubeBackward");
  sum(y).backward();
  EXPECT_THAT(x.grad().to_vector(), ElementsAre(3, 12));
}

TEST(AutogradTest, WrongGradientShapeFromNodeNamesTheNode) {
  Tensor x = ones({3}).set_requires_grad(true);
  Tensor out = ones({3});
  autograd::record(out, "BrokenBackward", {x}, [](const Tensor&, const autograd::NeedsGrad&) {
    return std::vector<Tensor>{ones({2})};
  });
  try {
    sum(out).backward();
    ADD_FAILURE() << "expected hsgd::Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("BrokenBackward"));
    EXPECT_THAT(e.what(), HasSubstr("[2]"));
  }
}

TEST(AutogradTest, RanksAsThreadsBackwardIndependently) {
  auto run = [](float scale, std::vector<float>* grad) {
    Tensor w = ones({3}).set_requires_grad(true);
    for (int i = 0; i < 50; ++i) sum(w * scale).backward();
    *grad = w.grad().to_vector();
  };
  std::vector<float> g1, g2;
  std::thread t1(run, 1.0f, &g1), t2(run, 2.0f, &g2);
  t1.join();
  t2.join();
  EXPECT_THAT(g1, ElementsAre(50, 50, 50));
  EXPECT_THAT(g2, ElementsAre(100, 100, 100));
}

}  // namespace
}  // namespace hsgd

namespace hsgd {
namespace {

TEST(AutogradTest, BackwardFreesSavedTensors) {
  Tensor x = from_vector({1, 2, 3}).set_requires_grad(true);
  std::weak_ptr<Storage> saved;
  Tensor loss;
  {
    Tensor h = exp(x);  // MulBackward below saves h (detached, same storage)
    saved = h.impl()->storage;
    loss = sum(h * h);
  }
  EXPECT_FALSE(saved.expired()) << "the graph keeps what backward needs";
  loss.backward();
  EXPECT_TRUE(saved.expired()) << "backward must release the saved tensors";
}

TEST(AutogradTest, DeepChainDoesNotOverflowTheStack) {
  Tensor x = ones({1}).set_requires_grad(true);
  Tensor h = x;
  for (int i = 0; i < 100000; ++i) h = h * 1.0f;
  sum(h).backward();
  EXPECT_EQ(x.grad().item(), 1.0f);
}

}  // namespace
}  // namespace hsgd

namespace hsgd {
namespace {

TEST(AutogradTest, ReachedLeafWithoutGradientStillFiresHookOnce) {
  // A node may return "no gradient" for an input; the leaf is still reached by the graph, so
  // its hook fires (DDP marks every reached parameter ready through its hook).
  Tensor x = ones({2}).set_requires_grad(true);
  Tensor y = ones({2}).set_requires_grad(true);
  int x_calls = 0, y_calls = 0;
  x.register_grad_ready_hook([&](Tensor&) { ++x_calls; });
  y.register_grad_ready_hook([&](Tensor&) { ++y_calls; });
  Tensor out = ones({2});
  autograd::record(out, "NoGradForX", {x}, [](const Tensor&, const autograd::NeedsGrad&) {
    return std::vector<Tensor>{Tensor()};
  });
  sum(out + y).backward();
  EXPECT_EQ(x_calls, 1);
  EXPECT_EQ(y_calls, 1);
  EXPECT_FALSE(x.grad().defined());
  EXPECT_TRUE(y.grad().defined());
}

}  // namespace
}  // namespace hsgd

namespace hsgd {
namespace {

TEST(AutogradTest, DroppingADeepGraphWithoutBackwardDoesNotOverflowTheStack) {
  Tensor x = ones({1}).set_requires_grad(true);
  {
    Tensor h = x;
    for (int i = 0; i < 200000; ++i) h = h * 1.0f;
    EXPECT_FALSE(h.is_leaf());
  }                          // the whole chain is freed here
  Tensor y = sum(x * 2.0f);  // the leaf still works after its old graph is gone
  y.backward();
  EXPECT_EQ(x.grad().item(), 2.0f);
}

}  // namespace
}  // namespace hsgd

namespace hsgd {
namespace {

TEST(AutogradTest, SummingContributionsNeverWritesIntoASharedGradient) {
  // AddBackward hands the same tensor to a and b; a then receives a second contribution.
  // Summing it in place would also change b's gradient.
  Tensor a = zeros({3}).set_requires_grad(true), b = zeros({3}).set_requires_grad(true);
  Tensor w = from_vector({1, 2, 3});
  Tensor loss = sum((a + b) * w) + sum(a * 10.0f);
  loss.backward();
  EXPECT_THAT(b.grad().to_vector(), ElementsAre(1, 2, 3));
  EXPECT_THAT(a.grad().to_vector(), ElementsAre(11, 12, 13));
  Tensor x = ones({2}).set_requires_grad(true);
  sum(x + x + x + x).backward();
  EXPECT_THAT(x.grad().to_vector(), ElementsAre(4, 4));
}

}  // namespace
}  // namespace hsgd
