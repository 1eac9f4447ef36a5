#include "framework/autograd/node.h"

#include "comm/error.h"
#include "framework/tensor/tensor_impl.h"

namespace hsgd::autograd {

namespace {
// Creation order of nodes on this thread (several ranks as threads keep separate counters).
thread_local uint64_t t_next_sequence_nr = 0;
}  // namespace

Node::Node(std::string name) : name_(std::move(name)), sequence_nr_(t_next_sequence_nr++) {}
Node::~Node() {
  // Destroying a long chain through nested shared_ptr destructors would recurse once per node
  // and can overflow the stack (a graph that is never backwarded). Instead, take over the edges
  // of every node that dies with this one and destroy them from a flat list.
  std::vector<std::shared_ptr<Node>> pending;
  for (Edge& edge : next_edges_) {
    if (edge.node) pending.push_back(std::move(edge.node));
  }
  while (!pending.empty()) {
    std::shared_ptr<Node> node = std::move(pending.back());
    pending.pop_back();
    if (node.use_count() == 1) {
      for (Edge& edge : node->next_edges_) {
        if (edge.node) pending.push_back(std::move(edge.node));
      }
    }
    // node is destroyed here (if this was the last owner) with no edges left to recurse into.
  }
}

FunctionNode::FunctionNode(std::string name, const std::vector<Tensor>& inputs, BackwardFn fn)
    : Node(std::move(name)), fn_(std::move(fn)) {
  auto& edges = mutable_next_edges();
  edges.reserve(inputs.size());
  needs_.reserve(inputs.size());
  for (const Tensor& input : inputs) {
    std::shared_ptr<Node> node = input.defined() ? gradient_edge(input) : nullptr;
    needs_.push_back(node != nullptr);
    edges.push_back(Edge{std::move(node), input.defined() ? input.shape() : Shape{}});
  }
}

std::vector<Tensor> FunctionNode::apply(const Tensor& grad_output) {
  HSGD_CHECK_AS(Error, fn_ != nullptr, "autograd: ", name(),
                " was already run and released; backward through the same graph twice is not "
                "supported (recompute the forward pass)");
  return fn_(grad_output, needs_);
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad"), leaf_(std::move(leaf)) {
  // Runs as soon as it is ready, so hooks fire as early as possible.
  set_sequence_nr(UINT64_MAX);
}

std::vector<Tensor> AccumulateGrad::apply(const Tensor& grad_output) {
  TensorImpl& leaf = *leaf_;
  const std::shared_ptr<TensorImpl>& g = grad_output.impl();
  if (g == nullptr) {
    // Reached, but every path contributed "no gradient": nothing to add; hooks still fire.
  } else if (leaf.grad == nullptr) {
    // Take the incoming buffer when nobody else can see it; otherwise copy, so that a later
    // in-place accumulation cannot write into another tensor.
    Tensor incoming = grad_output;
    const bool exclusive = g.use_count() <= 2 && g->storage.use_count() == 1 &&
                           incoming.is_contiguous() && g->offset == 0 && g->grad_fn == nullptr;
    leaf.grad = exclusive ? g : incoming.clone().impl();
  } else {
    Tensor(leaf.grad).add_(grad_output);
  }
  if (!leaf.grad_ready_hooks.empty()) {
    Tensor handle(leaf_);
    // Copy: a hook may remove itself or register others while we iterate.
    auto hooks = leaf.grad_ready_hooks;
    for (auto& [id, hook] : hooks) hook(handle);
  }
  return {};
}

bool needs_grad(std::initializer_list<Tensor> inputs) {
  if (!grad_mode_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_mode_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

void record(Tensor& out, std::string name, const std::vector<Tensor>& inputs, BackwardFn fn) {
  HSGD_CHECK(out.defined() && out.is_leaf() && !out.impl()->requires_grad, "autograd::record(",
             name, "): the output must be a fresh tensor made by the op");
  out.impl()->grad_fn = std::make_shared<FunctionNode>(std::move(name), inputs, std::move(fn));
}

std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  TensorImpl& impl = *t.impl();
  if (impl.grad_fn) return impl.grad_fn;
  if (!impl.requires_grad) return nullptr;
  std::shared_ptr<Node> acc = impl.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl());
    impl.grad_accumulator = acc;
  }
  return acc;
}

}  // namespace hsgd::autograd
