#pragma once
// DistributedDataParallel: synchronous data parallelism over a process group, like
// torch.nn.parallel.DistributedDataParallel on CPU.
//
// What it does:
// - At construction, checks that every rank built the same model (parameter and buffer names,
//   shapes and order; one small allgather, see replica_check.h; hsgd::InvalidArgument on every
//   rank naming the first difference), then makes every replica start from rank 0's parameters
//   and buffers (construction is therefore collective over pg): when every rank holds them
//   already, bit for bit (a 64-bit fingerprint per rank, one allgather; replica_check.h), nothing
//   else is sent; otherwise they are broadcast from rank 0. Either way every replica then holds
//   rank 0's values, bit for bit, as after torch's broadcast.
// - Groups the gradients into buckets in REVERSE registration order (the order backward
//   produces them): the first bucket holds up to first_bucket_cap_mb (1 MB), the others up to
//   bucket_cap_mb (25 MB), as torch does.
// - forward(x) runs the module and walks the autograd graph of the output to find parameters
//   that will get no gradient (torch's find_unused_parameters, always on): they count as ready
//   with zero gradient, so backward never waits for them.
// - During loss.backward(), each parameter's grad-ready hook copies its gradient into its
//   bucket; a full bucket is handed to the communication hook at once (buckets are launched in
//   index order on every rank, so collectives match), so communication overlaps the rest of
//   backward. When the last bucket has been launched, the hook of the last ready parameter
//   waits for every bucket and copies the averaged gradients back into grad(): when
//   loss.backward() returns, grad() holds the average over the group, as PyTorch users expect.
// - no_sync(): forwards inside the guard skip communication; gradients accumulate locally and
//   the next synchronised backward averages the accumulated sum.
// - register_comm_hook(state, hook) replaces the default allreduce_hook (before the first
//   backward), e.g. with post_localSGD_hook.
//
// Contract: every rank runs the same sequence of forward/backward calls (as in torch). The
// object registers hooks on the module's parameters that point back to it: it can be neither
// copied nor moved, and it removes its hooks when destroyed. Communication errors propagate out
// of backward() as hsgd::CommError / hsgd::Timeout.
//
// Usage:
//   auto pg = hsgd::comm::init_process_group(hsgd::comm::InitOptions::from_env());
//   hsgd::distributed::DistributedDataParallel ddp(model, pg);
//   auto opt = std::make_shared<hsgd::optim::SGD>(model->parameters(),
//                                                 hsgd::optim::SGDOptions{.lr = 0.1});
//   hsgd::Tensor loss = hsgd::nn::cross_entropy(ddp.forward(x), y);
//   loss.backward();      // grads are averaged over pg when this returns
//   opt->step();

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/distributed/grad_bucket.h"
#include "framework/nn/module.h"
#include "framework/tensor/tensor.h"

namespace hsgd::distributed {

struct DDPOptions {
  double bucket_cap_mb = 25.0;       // size limit of every bucket but the first
  double first_bucket_cap_mb = 1.0;  // the first bucket is small so communication starts early
  // Also broadcast buffers from rank 0 at each training forward (torch's default), keeping
  // e.g. BatchNorm running statistics equal across ranks.
  bool broadcast_buffers = true;
};

// A communication hook bound to its state: reduces bucket.buffer() in place and returns the
// Work to wait for (nullptr when already done).
using CommHook = std::function<std::shared_ptr<comm::Work>(GradBucket& bucket)>;

// Customisation point: register_comm_hook(state, hook) calls init_comm_hook_state(state, pg)
// when such a function exists for the state's type (found by argument-dependent lookup), e.g.
// to create subgroups at registration rather than inside the hook during backward.

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module,
                          std::shared_ptr<comm::ProcessGroup> pg, DDPOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Runs the module; prepares gradient synchronisation for the backward of the output.
  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }
  // The same for a module whose input is ids (nn::Module::forward(const IndexTensor&)).
  Tensor forward(const IndexTensor& ids);

  // Replaces the communication hook. Must be called before the first backward; every rank must
  // register the same hook. hook(state, bucket) must reduce bucket.buffer() in place.
  template <typename State, typename Hook>
  void register_comm_hook(std::shared_ptr<State> state, Hook hook) {
    if constexpr (requires(State & s) { init_comm_hook_state(s, pg_); }) {
      init_comm_hook_state(*state, pg_);
    }
    register_comm_hook(
        CommHook([state, hook](GradBucket& bucket) { return hook(*state, bucket); }));
  }
  void register_comm_hook(CommHook hook);

  // RAII: while alive, forwards do not synchronise gradients (they accumulate locally).
  class [[nodiscard]] NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_) {
      ddp_.sync_ = false;
    }
    ~NoSyncGuard() { ddp_.sync_ = previous_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  const std::shared_ptr<nn::Module>& module() const { return module_; }
  const std::shared_ptr<comm::ProcessGroup>& process_group() const { return pg_; }
  // The parameters DDP synchronises (requires_grad), in registration order.
  const std::vector<Tensor>& parameters() const { return params_; }
  // Parameter indices (into parameters()) of each bucket, in launch order.
  std::vector<std::vector<size_t>> bucket_assignment() const;

 private:
  struct Bucket;

  void build_buckets();
  // label names the broadcast in failure reports ("DDP buffers").
  void broadcast_from_rank0(const std::vector<Tensor>& tensors, const char* label);
  template <typename Input>
  Tensor forward_impl(const Input& input);
  void prepare_for_backward(const Tensor& output);
  void mark_ready(size_t param, bool has_grad);
  void launch_ready_buckets();
  void finish_iteration();

  // Constant after construction.
  const std::shared_ptr<nn::Module> module_;
  const std::shared_ptr<comm::ProcessGroup> pg_;
  const DDPOptions options_;
  std::vector<Tensor> params_;
  std::vector<Tensor> buffers_;
  std::vector<size_t> bucket_of_;  // per param
  std::vector<size_t> slot_of_;    // per param: its position in its bucket
  std::vector<int64_t> hook_ids_;  // per param

  CommHook comm_hook_;
  bool hook_used_ = false;  // a backward ran: the hook can no longer change
  bool sync_ = true;        // false inside no_sync()

  // State of the current iteration (touched only by the thread running forward/backward).
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<bool> ready_;  // per param, this iteration
  bool expecting_backward_ = false;
  size_t next_launch_ = 0;
};

}  // namespace hsgd::distributed
