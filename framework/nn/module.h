#pragma once
// nn::Module: the base of every layer and model. A module owns named parameters (tensors that
// require grad and are trained), named buffers (state that is not trained, e.g. BatchNorm's
// running statistics) and named submodules, all kept in REGISTRATION ORDER. Names are dotted
// paths ("features.0.weight"), so named_parameters() is identical on every process that builds
// the same model: DDP buckets and model averaging rely on that order.
//
// A module may also register the random streams it draws from (register_generator): not part of
// state_dict(), but saved by a Checkpointer with the module's tensors.
//
// Random streams of a module tree. A stream registered with GeneratorSeed::kFromTree (the
// default; nn::Dropout's when no seed is given) is seeded with derive_seed(tree seed, its dotted
// name), e.g. "blocks.2.attn_dropout.generator", so every dropout layer of a model draws its own
// masks, and a model built twice with the same tree seed draws the same masks. The tree seed is
// the root's: initial_seed() (the last manual_seed, else kDefaultSeed) read when the root was
// constructed, unless seed_generators(seed) was called. Names are relative to the root, or to the
// module seed_generators was last called on, which keeps its seed and names when it is later
// registered into a parent. The streams are re-derived when a module is registered and by
// seed_generators, which restarts them: build the model, seed it, then restore a checkpoint.
// Data-parallel ranks thus draw the same masks on their different batches by default, as PyTorch
// ranks seeded alike do; seed_generators(seed + rank) gives each rank its own streams.
//
// Modules are held by std::shared_ptr and are not copyable (parameters are shared handles, a
// copy would silently alias them). Tensors returned by parameters()/state_dict() are handles to
// the module's own tensors: writing into them (copy_, add_) changes the module.
//
// Usage:
//   class Net : public nn::Module {
//    public:
//     Net() : Module("Net") {
//       fc1_ = register_module("fc1", std::make_shared<nn::Linear>(784, 100));
//       fc2_ = register_module("fc2", std::make_shared<nn::Linear>(100, 10));
//     }
//     Tensor forward(const Tensor& x) override { return fc2_->forward(relu(fc1_->forward(x))); }
//    private:
//     std::shared_ptr<nn::Linear> fc1_, fc2_;
//   };
//   auto net = std::make_shared<Net>();
//   for (auto& [name, p] : net->named_parameters()) std::cout << name;   // "fc1.weight", ...
//   net->seed_generators(42);   // its dropout layers' streams, if it had any, derive from 42
//
// Errors: registering an empty name, a name with '.', a duplicate name or an undefined tensor
// throws hsgd::InvalidArgument; load_state_dict names the missing, unexpected or mis-shaped key.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "framework/tensor/generator.h"
#include "framework/tensor/index_tensor.h"
#include "framework/tensor/tensor.h"

namespace hsgd::nn {

// An ordered list of (dotted name, tensor). Used for parameters, buffers and state dicts; a
// vector rather than a map so that the order is the registration order on every process.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// The tensor called name in named, or an undefined Tensor.
Tensor find_tensor(const NamedTensors& named, const std::string& name);

class Module {
 public:
  // type_name appears in messages and in to_string() ("Linear", "Sequential", ...).
  explicit Module(std::string type_name = "Module");
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. The base class throws hsgd::Error (containers with several inputs, or
  // modules used only as parameter holders, need not override it).
  virtual Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }
  // The computation on integer ids (token ids of a language model): modules whose input is ids
  // (nn::Embedding, a Sequential that starts with one, a GPT) override it; the base class throws
  // hsgd::Error saying that this module takes float inputs. A subclass that overrides only one
  // of the two forwards hides the other from calls through the subclass's own type (C++'s name
  // hiding); calls through Module& see both.
  virtual Tensor forward(const IndexTensor& ids);

  // ---- registration (returns what it registered) ----
  // Stores t as parameter `name` and marks it requires_grad. t becomes the module's tensor: the
  // caller should keep the returned handle in a member.
  Tensor register_parameter(const std::string& name, Tensor t);
  // Stores t as a buffer: part of state_dict() but not of parameters(); never requires grad.
  Tensor register_buffer(const std::string& name, Tensor t);
  // How a registered stream is seeded.
  enum class GeneratorSeed {
    kFromTree,  // derived from the tree seed and its dotted name (file comment); reseeded now
    kOwn,       // keeps the seed it was given (e.g. nn::Dropout(0.1, /*seed=*/7))
  };
  // Registers gen, a member of this module, as a random stream its forward draws from
  // (nn::Dropout's masks). Not part of state_dict(): a torch module holds no such state, so
  // state dicts keep torch's keys. Checkpointer::add_module saves and restores it with the
  // module's tensors, so a resumed run draws what an uninterrupted one would.
  Generator& register_generator(const std::string& name, Generator& gen,
                                GeneratorSeed seeding = GeneratorSeed::kFromTree);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    register_module_impl(name, module);
    return module;
  }

  // Makes seed the tree seed of this module and everything below it (a seed_generators call on a
  // descendant no longer counts) and reseeds every kFromTree stream below it with
  // derive_seed(seed, its name relative to this module). kOwn streams keep their seeds. The
  // streams restart: call it before training or restoring a checkpoint.
  void seed_generators(uint64_t seed);

  // ---- traversal, all in registration order, depth-first (own entries before children's) ----
  NamedTensors named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const {
    return children_;
  }
  std::vector<std::shared_ptr<Module>> children() const;
  // Every registered generator by dotted name ("2.generator"), depth-first. The pointers are
  // non-owning and valid while this module lives.
  std::vector<std::pair<std::string, Generator*>> named_generators();
  // Every submodule at any depth with its dotted name, preceded by this module itself under "".
  // The pointers are non-owning and valid while this module lives.
  std::vector<std::pair<std::string, Module*>> named_modules();

  // ---- mode ----
  // Sets training mode on this module and every submodule (BatchNorm and Dropout behave
  // differently in eval mode).
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Zeroes the gradient of every parameter that has one (PyTorch 1.13's default,
  // set_to_none=False); undefined gradients stay undefined.
  void zero_grad();

  // ---- state ----
  // Parameters then buffers of each module, depth-first, as handles to the module's tensors.
  // This is torch's state_dict() order for modules that register parameters before buffers.
  NamedTensors state_dict() const;
  // Copies every tensor of state into the module's tensor of the same name (no autograd history).
  // strict: every key of state_dict() must be present and no other key may be. Throws
  // InvalidArgument naming the key for a missing or unexpected key or a shape mismatch; on error
  // nothing has been modified.
  void load_state_dict(const NamedTensors& state, bool strict = true);

  const std::string& type_name() const { return type_name_; }
  // A multi-line description: module tree with parameter shapes.
  std::string to_string() const;

 private:
  void register_module_impl(const std::string& name, std::shared_ptr<Module> module);
  // Reseeds the kFromTree streams of this subtree: derive_seed(seed, prefix + name), or from this
  // module's own seed and names when seed_generators was called on it.
  void derive_generators(uint64_t seed, std::string prefix);
  void unpin_seeds();
  void check_new_name(const std::string& name, const char* what) const;
  void collect(const std::string& prefix, bool recurse, bool buffers, NamedTensors& out) const;
  void collect_state(const std::string& prefix, NamedTensors& out) const;
  void describe(const std::string& name, int indent, std::string& out) const;

  std::string type_name_;
  bool training_ = true;
  NamedTensors parameters_;
  NamedTensors buffers_;
  struct RegisteredGenerator {
    std::string name;
    Generator* generator;
    GeneratorSeed seeding;
  };
  std::vector<RegisteredGenerator> generators_;
  // The tree seed when this module is the root or seed_generators was called on it (pinned).
  uint64_t tree_seed_;
  bool seed_pinned_ = false;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace hsgd::nn
