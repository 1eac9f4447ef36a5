#pragma once
// The names a usage example may use without declaring them (scripts/check_doc_examples.py
// compiles every example of the headers and the Markdown pages with these in scope). They are
// the things an example takes as given: "the model", "the world group", "a batch". An example
// that declares one of these names itself hides it. Only declared, never defined: the examples
// are compiled, not linked or run.
//
// Keep this list short and the types the obvious ones; an example that needs something else
// declares it.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hsgd.h"

namespace hsgd::doc_examples_given {

// The model being trained and its parameters, buffers and optimizer.
extern std::shared_ptr<nn::Module> model;
extern std::vector<Tensor> params;
extern std::vector<Tensor> buffers;
extern std::shared_ptr<Optimizer> optimizer;
extern Generator& gen;

// The process groups: the world, or the group a component works over.
extern std::shared_ptr<comm::ProcessGroup> world;
extern std::shared_ptr<comm::ProcessGroup> pg;
extern int rank;
extern std::shared_ptr<comm::Store> store;
extern distributed::DistributedDataParallel& ddp;

// The data: a data set, a loader over it, one batch of inputs x (N, ...) and targets y.
extern std::filesystem::path dir;
extern std::shared_ptr<const data::Dataset> dataset;
extern data::DataLoader& loader;
extern data::Batch batch;
extern Tensor x;
extern std::vector<int64_t> y;
extern Tensor loss;
extern int64_t epochs;

}  // namespace hsgd::doc_examples_given
