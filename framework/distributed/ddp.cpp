#include "framework/distributed/ddp.h"

#include <algorithm>
#include <span>
#include <unordered_set>

#include "comm/error.h"
#include "comm/log.h"
#include "framework/autograd/node.h"
#include "framework/distributed/comm_hooks/default_hooks.h"
#include "framework/distributed/replica_check.h"
#include "framework/distributed/tensor_collectives.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd::distributed {

struct DistributedDataParallel::Bucket {
  std::vector<size_t> params;  // indices into params_, in bucket order
  GradBucket grad_bucket;      // what the hook sees; buffer is (numel,)
  int pending = 0;             // parameters not yet ready this iteration
  bool launched = false;
  std::shared_ptr<comm::Work> work;
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module,
                                                 std::shared_ptr<comm::ProcessGroup> pg,
                                                 DDPOptions options)
    : module_(std::move(module)), pg_(std::move(pg)), options_(options) {
  HSGD_CHECK(module_ != nullptr, "DistributedDataParallel: module is null");
  HSGD_CHECK(pg_ != nullptr, "DistributedDataParallel: process group is null");
  HSGD_CHECK(options_.bucket_cap_mb > 0, "DistributedDataParallel: bucket_cap_mb must be > 0, got ",
             options_.bucket_cap_mb);
  HSGD_CHECK(options_.first_bucket_cap_mb > 0,
             "DistributedDataParallel: first_bucket_cap_mb must be > 0, got ",
             options_.first_bucket_cap_mb);

  std::vector<Tensor> all_params;
  for (auto& [name, p] : module_->named_parameters()) {
    all_params.push_back(p);
    if (p.requires_grad()) params_.push_back(p);
  }
  for (auto& [name, b] : module_->named_buffers()) buffers_.push_back(b);

  // Every replica starts from rank 0's state, once every rank is known to hold the same model
  // (a broadcast of one flat buffer would only compare the total sizes). When every rank holds
  // rank 0's values already (a model built from one seed), the broadcast would copy them onto
  // themselves: a fingerprint of 8 bytes per rank replaces the model on the wire.
  detail::check_same_tensors(*pg_, "DistributedDataParallel", detail::describe_module(*module_));
  std::vector<Tensor> state = all_params;
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  if (!detail::same_values_on_all_ranks(*pg_, state, "DDP start fingerprint")) {
    broadcast_from_rank0(state, "DDP parameters and buffers");
  }

  build_buckets();
  comm_hook_ = [pg = pg_](GradBucket& bucket) { return allreduce_hook(*pg, bucket); };

  ready_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    hook_ids_.push_back(params_[i].register_grad_ready_hook([this, i](Tensor&) {
      if (expecting_backward_ && !ready_[i]) mark_ready(i, /*has_grad=*/true);
    }));
  }
  comm::logger()->debug("rank {}: DDP over group '{}' with {} parameters in {} buckets",
                        pg_->rank(), pg_->name(), params_.size(), buckets_.size());
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < params_.size(); ++i) params_[i].remove_grad_ready_hook(hook_ids_[i]);
}

void DistributedDataParallel::broadcast_from_rank0(const std::vector<Tensor>& tensors,
                                                   const char* label) {
  if (pg_->size() == 1) return;
  broadcast(*pg_, tensors, 0, label);  // one flat buffer, see tensor_collectives.h
}

void DistributedDataParallel::build_buckets() {
  // Reverse registration order: backward produces the last layer's gradients first.
  const double mb = 1024.0 * 1024.0;
  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  std::vector<std::vector<size_t>> groups;
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    if (groups.empty() || bytes == -1) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(k);
    bytes += params_[k].numel() * static_cast<int64_t>(sizeof(float));
    const double cap =
        (groups.size() == 1 ? options_.first_bucket_cap_mb : options_.bucket_cap_mb) * mb;
    if (static_cast<double>(bytes) >= cap) bytes = -1;  // full: the next parameter starts one
  }
  for (size_t b = 0; b < groups.size(); ++b) {
    std::vector<Tensor> tensors;
    std::vector<int64_t> offsets;
    int64_t n = 0;
    for (size_t slot = 0; slot < groups[b].size(); ++slot) {
      const size_t p = groups[b][slot];
      bucket_of_[p] = b;
      slot_of_[p] = slot;
      tensors.push_back(params_[p]);
      offsets.push_back(n);
      n += params_[p].numel();
    }
    auto bucket = std::unique_ptr<Bucket>(new Bucket{
        .params = groups[b],
        .grad_bucket = GradBucket(static_cast<int64_t>(b), b + 1 == groups.size(), zeros({n}),
                                  std::move(tensors), std::move(offsets)),
        .pending = 0,
        .launched = false,
        .work = nullptr,
    });
    buckets_.push_back(std::move(bucket));
  }
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_assignment() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets_) out.push_back(b->params);
  return out;
}

void DistributedDataParallel::register_comm_hook(CommHook hook) {
  HSGD_CHECK(static_cast<bool>(hook), "DistributedDataParallel::register_comm_hook: empty hook");
  HSGD_CHECK(!hook_used_,
             "DistributedDataParallel::register_comm_hook: must be called before the first "
             "backward (a hook already ran)");
  comm_hook_ = std::move(hook);
}

Tensor DistributedDataParallel::forward(const Tensor& input) { return forward_impl(input); }

Tensor DistributedDataParallel::forward(const IndexTensor& ids) { return forward_impl(ids); }

template <typename Input>
Tensor DistributedDataParallel::forward_impl(const Input& input) {
  const bool training = module_->is_training() && grad_mode_enabled();
  if (training && options_.broadcast_buffers && !buffers_.empty()) {
    broadcast_from_rank0(buffers_, "DDP buffers");
  }
  Tensor output = module_->forward(input);
  expecting_backward_ = false;
  if (training && sync_ && output.requires_grad() && !buckets_.empty()) {
    prepare_for_backward(output);
  }
  return output;
}

void DistributedDataParallel::prepare_for_backward(const Tensor& output) {
  for (auto& b : buckets_) {
    b->pending = static_cast<int>(b->params.size());
    b->launched = false;
    b->work.reset();
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_launch_ = 0;
  expecting_backward_ = true;
  hook_used_ = true;

  // Walk the graph of output to find the leaves backward will reach. The others get no
  // gradient this pass; they are ready now, with zeros (torch's find_unused_parameters).
  std::unordered_set<const TensorImpl*> reached;
  std::unordered_set<const autograd::Node*> seen;
  std::vector<std::shared_ptr<autograd::Node>> stack;
  if (output.grad_fn()) stack.push_back(output.grad_fn());
  while (!stack.empty()) {
    std::shared_ptr<autograd::Node> node = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(node.get()).second) continue;
    if (auto* acc = dynamic_cast<autograd::AccumulateGrad*>(node.get())) {
      reached.insert(acc->leaf().get());
      continue;
    }
    for (const autograd::Edge& e : node->next_edges()) {
      if (e.node) stack.push_back(e.node);
    }
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (reached.count(params_[i].impl().get()) == 0) mark_ready(i, /*has_grad=*/false);
  }
}

void DistributedDataParallel::mark_ready(size_t param, bool has_grad) {
  ready_[param] = true;
  Bucket& bucket = *buckets_[bucket_of_[param]];
  const size_t slot = slot_of_[param];
  float* dst = bucket.grad_bucket.buffer().data() + bucket.grad_bucket.offsets()[slot];
  const int64_t n = params_[param].numel();
  const Tensor grad = has_grad ? params_[param].grad() : Tensor();
  if (grad.defined()) {
    const Tensor g = grad.contiguous();
    std::copy_n(g.data(), n, dst);
  } else {
    std::fill_n(dst, n, 0.0f);
  }
  if (--bucket.pending == 0) launch_ready_buckets();
}

void DistributedDataParallel::launch_ready_buckets() {
  // In index order on every rank, so that the collectives of the hooks match across ranks.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->pending == 0) {
    Bucket& bucket = *buckets_[next_launch_];
    bucket.work = comm_hook_(bucket.grad_bucket);
    bucket.launched = true;
    ++next_launch_;
  }
  if (next_launch_ == buckets_.size()) finish_iteration();
}

void DistributedDataParallel::finish_iteration() {
  expecting_backward_ = false;
  for (auto& b : buckets_) {
    if (b->work) b->work->wait(pg_->work_timeout());
    const float* src = b->grad_bucket.buffer().data();
    for (size_t slot = 0; slot < b->params.size(); ++slot) {
      Tensor& p = params_[b->params[slot]];
      Tensor grad = p.grad();
      if (!grad.defined()) {
        grad = zeros(p.shape());
        p.set_grad(grad);
      }
      const int64_t offset = b->grad_bucket.offsets()[slot];
      if (grad.is_contiguous()) {
        std::copy_n(src + offset, p.numel(), grad.data());
      } else {
        grad.copy_(
            from_vector(std::vector<float>(src + offset, src + offset + p.numel()), p.shape()));
      }
    }
    b->work.reset();
  }
}

}  // namespace hsgd::distributed
