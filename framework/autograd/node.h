#pragma once
// Autograd graph nodes. A Node (a "grad_fn") is attached to the output of a recorded op; given
// d loss / d output it returns d loss / d input for each input. Edges point from a node to the
// nodes of its inputs: to their grad_fn, or for a leaf that requires grad, to the leaf's
// AccumulateGrad node, which adds the gradient into leaf.grad() and fires its grad-ready hooks.
// The engine (engine.h) runs the nodes in reverse topological order.
//
// HOW TO WRITE A DIFFERENTIABLE OP
//
// Usage:
//   Tensor mul(const Tensor& a, const Tensor& b) {
//     Tensor out = zeros(a.shape());                     // 1. compute: plain kernel code, or
//                                                        //    differentiable ops (then the
//                                                        //    composite needs no node at all)
//     if (autograd::needs_grad({a, b})) {                // 2. grad mode on and some input
//       autograd::record(out, "MulBackward", {a, b},     //    requires grad: attach a node
//           [a = a.detach(), b = b.detach()](            // 3. save what backward needs, DETACHED
//               const Tensor& g, const autograd::NeedsGrad& needs) {
//             std::vector<Tensor> grads(2);              // 4. one gradient per input, in the
//             if (needs[0]) grads[0] = sum_to(g * b, a.shape());   // order given to record;
//             if (needs[1]) grads[1] = sum_to(g * a, b.shape());   // undefined = no gradient
//             return grads;
//           });
//     }
//     return out;
//   }
//
// Rules:
// - `out` must be a fresh tensor produced by the op (not one of its inputs).
// - Save tensors with detach(): it shares the data but not the autograd state. Saving `out`
//   itself would make out -> node -> out, a reference cycle that never frees.
// - The backward function runs with grad mode OFF, so it may call any op in ops.h freely.
// - Each returned gradient must have its input's shape (the engine checks and names the node).
//   Skip work for inputs with needs[i] == false (e.g. the data input of the first layer).
// - Saved tensors must not be modified in place between forward and backward.
// - The closure is destroyed when the node has run, which frees the saved tensors.
// - Ops with several outputs are written as one op per output, or return one packed tensor.

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "framework/tensor/tensor.h"

namespace hsgd::autograd {

// needs[i]: whether input i of the recorded op needs a gradient.
using NeedsGrad = std::vector<bool>;
// grad_output -> one gradient per input (undefined where not needed).
using BackwardFn = std::function<std::vector<Tensor>(const Tensor&, const NeedsGrad&)>;

// Where a gradient goes: the node of one input (null when that input needs no gradient) and the
// input's shape, which the engine checks the gradient against.
struct Edge {
  std::shared_ptr<Node> node;
  Shape shape;
};

// A node of the backward graph. Subclass it for ops that want a hand-written node; most ops use
// record() with a lambda instead.
class Node {
 public:
  explicit Node(std::string name);
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients for the inputs, in next_edges() order. Called once per backward pass.
  virtual std::vector<Tensor> apply(const Tensor& grad_output) = 0;
  // Frees what apply needs (saved tensors); afterwards apply throws. Called by the engine.
  virtual void release() {}

  const std::string& name() const { return name_; }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  std::vector<Edge>& mutable_next_edges() { return next_edges_; }
  // Creation order on this thread; the engine runs later nodes first among ready ones, which
  // makes gradients become ready in reverse order of the forward pass (as in PyTorch).
  uint64_t sequence_nr() const { return sequence_nr_; }

 protected:
  void set_sequence_nr(uint64_t nr) { sequence_nr_ = nr; }

 private:
  std::string name_;
  std::vector<Edge> next_edges_;
  uint64_t sequence_nr_;
};

// The node record() attaches: calls a BackwardFn.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, const std::vector<Tensor>& inputs, BackwardFn fn);
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  void release() override { fn_ = nullptr; }

 private:
  BackwardFn fn_;
  NeedsGrad needs_;
};

// The sink of a leaf that requires grad: accumulates into leaf.grad(), then fires the leaf's
// grad-ready hooks. Runs as soon as it is ready (highest priority).
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::vector<Tensor> apply(const Tensor& grad_output) override;
  const std::shared_ptr<TensorImpl>& leaf() const { return leaf_; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// True when grad mode is on and some defined input requires grad.
bool needs_grad(std::initializer_list<Tensor> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Attaches a FunctionNode named `name` with `fn` as out's grad_fn. inputs are the op's tensor
// inputs (undefined ones allowed, e.g. an absent bias; they get no edge). Call only after
// needs_grad(inputs) returned true.
void record(Tensor& out, std::string name, const std::vector<Tensor>& inputs, BackwardFn fn);

// The node that receives the gradient of t: its grad_fn, its AccumulateGrad if it is a leaf that
// requires grad (created on first use and shared by every graph using the leaf), or null.
std::shared_ptr<Node> gradient_edge(const Tensor& t);

}  // namespace hsgd::autograd
