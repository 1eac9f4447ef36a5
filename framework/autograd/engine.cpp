#include "framework/autograd/engine.h"

#include <queue>
#include <unordered_map>
#include <vector>

#include "comm/error.h"
#include "framework/autograd/node.h"
#include "framework/tensor/ops.h"
#include "framework/tensor/tensor_impl.h"

namespace hsgd::autograd {

namespace {

struct ReadyEntry {
  Node* node;
  bool operator<(const ReadyEntry& other) const {
    return node->sequence_nr() < other.node->sequence_nr();  // max-heap: latest first
  }
};

// Counts, for every node reachable from root, the edges that point at it.
std::unordered_map<Node*, int> count_dependencies(Node* root) {
  std::unordered_map<Node*, int> deps;
  deps[root] = 0;
  std::vector<Node*> stack{root};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& edge : node->next_edges()) {
      Node* next = edge.node.get();
      if (next == nullptr) continue;
      auto [it, inserted] = deps.try_emplace(next, 0);
      ++it->second;
      if (inserted) stack.push_back(next);
    }
  }
  return deps;
}

// True when t is the only handle to its tensor object and storage, so writing into it in place
// cannot be observed elsewhere (e.g. a gradient a node also handed to another input).
bool exclusively_owned(const Tensor& t) {
  const auto& impl = t.impl();
  return impl.use_count() == 1 && impl->storage.use_count() == 1 && t.is_contiguous();
}

}  // namespace

void run_backward(const Tensor& root, const Tensor& grad_output, bool retain_graph) {
  HSGD_CHECK(root.defined(), "backward: the tensor is undefined");
  HSGD_CHECK(root.requires_grad(), "backward: the tensor of shape ", shape_str(root.shape()),
             " does not require grad and has no grad_fn (did it come from a NoGradGuard scope, "
             "or from inputs without requires_grad?)");
  HSGD_CHECK(grad_output.defined(), "backward: grad_output is undefined");
  HSGD_CHECK(grad_output.shape() == root.shape(), "backward: grad_output shape ",
             shape_str(grad_output.shape()), " must equal the tensor shape ",
             shape_str(root.shape()));

  NoGradGuard no_grad;
  std::shared_ptr<Node> root_node = gradient_edge(root);
  std::unordered_map<Node*, int> deps = count_dependencies(root_node.get());
  // Keeps every node alive until it has run, even if its owner drops it meanwhile.
  std::unordered_map<Node*, std::shared_ptr<Node>> alive;
  std::unordered_map<Node*, Tensor> buffers;  // summed incoming gradient of each pending node
  std::priority_queue<ReadyEntry> ready;

  alive[root_node.get()] = root_node;
  buffers[root_node.get()] = grad_output;
  ready.push({root_node.get()});

  while (!ready.empty()) {
    Node* node = ready.top().node;
    ready.pop();
    Tensor grad = std::move(buffers[node]);
    buffers.erase(node);
    const std::vector<Edge>& edges = node->next_edges();
    // A node whose incoming gradients were all undefined still passes "nothing" on, so that the
    // dependency counts of the nodes after it reach zero. AccumulateGrad runs regardless: every
    // leaf the graph reaches fires its grad-ready hooks once per pass (DDP counts on that).
    const bool run = grad.defined() || dynamic_cast<AccumulateGrad*>(node) != nullptr;
    std::vector<Tensor> input_grads = run ? node->apply(grad) : std::vector<Tensor>(edges.size());
    grad = Tensor();
    HSGD_CHECK_AS(Error, input_grads.size() == edges.size(), "autograd: ", node->name(),
                  " returned ", input_grads.size(), " gradients for ", edges.size(), " inputs");
    for (size_t i = 0; i < input_grads.size(); ++i) {
      const Edge& edge = edges[i];
      Node* next = edge.node.get();
      if (next == nullptr) continue;
      Tensor& g = input_grads[i];
      if (g.defined()) {
        HSGD_CHECK_AS(Error, g.shape() == edge.shape, "autograd: ", node->name(),
                      " returned a gradient of shape ", shape_str(g.shape()), " for input ", i,
                      " of shape ", shape_str(edge.shape));
        auto [it, inserted] = buffers.try_emplace(next, g);
        if (!inserted) {
          Tensor& buffer = it->second;
          if (!buffer.defined()) {
            buffer = g;
          } else if (exclusively_owned(buffer)) {
            buffer.add_(g);  // nobody else sees this tensor: sum in place, no allocation
          } else {
            buffer = add(buffer, g);
          }
        }
      } else {
        buffers.try_emplace(next, Tensor());
      }
      alive.try_emplace(next, edge.node);
      if (--deps[next] == 0) ready.push({next});
    }
    // Free the saved tensors now, and cut the node's edges so that the rest of the graph is
    // freed as the pass goes (and never destroyed by deep recursion later).
    if (!retain_graph) {
      node->release();
      node->mutable_next_edges().clear();
    }
    alive.erase(node);
  }
}

}  // namespace hsgd::autograd
