#pragma once
// Parameter averaging over a process group: the one code path every averager uses.
//
// Semantics (docs/design.md): tensors whose grad() is undefined are skipped (they did not take
// part in the step, like torch's get_params_to_average); the rest are packed into one flat buffer
// (flat_buffer.h), divided by the group size, allreduced once (sum) and copied back. A rank
// outside the group (a null group) does nothing. Note: torch's utils.average_parameters averages
// every tensor it is given; hsgd's free function applies the grad filter itself so that no
// caller forgets it.
//
// Usage:
//   hsgd::distributed::average_parameters(model->parameters(), pg);   // one allreduce
//
//   FlatAverager averager;                        // keeps its buffer between calls
//   averager.average(params, buffers, *pg);

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "comm/process_group/process_group.h"
#include "framework/tensor/tensor.h"
#include "framework/train/optimizer.h"

namespace hsgd::distributed {

// The tensors of params whose grad() is defined, in order.
std::vector<Tensor> get_params_to_average(const std::vector<Tensor>& params);
// The same over every group's params, group by group.
std::vector<Tensor> get_params_to_average(const std::vector<ParamGroup>& groups);

// Averages the parameters with a gradient over pg (see the file comment). Allocates a flat
// buffer for the call; the averagers keep theirs instead (FlatAverager). A null pg (this rank
// is not a member) is a no-op. Throws hsgd::CommError / hsgd::Timeout if the allreduce fails.
void average_parameters(const std::vector<Tensor>& params,
                        const std::shared_ptr<comm::ProcessGroup>& pg);

// The packing machinery with a persistent buffer: after the first call of a given size no
// memory is allocated. Not thread-safe; one per averager.
class FlatAverager {
 public:
  // Averages params (all of them: the caller filters) and then buffers (e.g. BatchNorm running
  // statistics) over group with one allreduce. Returns the payload in bytes (4 * elements).
  // label names the allreduce in failure reports ("averager 2:4").
  int64_t average(const std::vector<Tensor>& params, const std::vector<Tensor>& buffers,
                  comm::ProcessGroup& group, std::string_view label = {});

 private:
  std::vector<float> flat_;  // (sum of numel) packed params then buffers
};

}  // namespace hsgd::distributed
