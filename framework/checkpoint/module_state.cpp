#include "framework/checkpoint/module_state.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "comm/error.h"
#include "framework/tensor/grad_mode.h"

namespace hsgd::checkpoint {

StateDict module_state(nn::Module& module) {
  NoGradGuard no_grad;
  StateDict state;
  for (const auto& [key, t] : module.state_dict()) state.set(key, t.clone());
  for (const auto& [key, gen] : module.named_generators()) state.set(key, gen->state_bytes());
  return state;
}

// Nothing changes when an entry is bad: every entry is checked before anything is restored.
void load_module_state(nn::Module& module, const std::string& name, const StateDict& state) {
  const std::vector<std::pair<std::string, Generator*>> generators = module.named_generators();
  std::vector<std::pair<Generator*, Generator::State>> streams;
  nn::NamedTensors tensors;
  for (const auto& [key, value] : state.entries()) {
    if (const Tensor* t = std::get_if<Tensor>(&value)) {
      tensors.emplace_back(key, *t);
      continue;
    }
    const std::string* bytes = std::get_if<std::string>(&value);
    const auto gen = std::find_if(generators.begin(), generators.end(),
                                  [&key](const auto& g) { return g.first == key; });
    HSGD_CHECK(bytes != nullptr && gen != generators.end(), "checkpoint: module '", name,
               "' entry '", key, "' holds a ", state_value_type(value),
               ", expected a Tensor (or the bytes of one of its generators)");
    try {
      streams.emplace_back(gen->second, Generator::parse_state_bytes(*bytes));
    } catch (const InvalidArgument& e) {
      HSGD_THROW(InvalidArgument, "checkpoint: module '", name, "' generator '", key,
                 "': ", e.what());
    }
  }
  module.load_state_dict(tensors);
  for (const auto& [gen, s] : streams) gen->set_state(s);
}

StateDict generator_state(const Generator& generator) {
  const Generator::State s = generator.state();
  StateDict state;
  for (int i = 0; i < 4; ++i) {
    state.set("word" + std::to_string(i), static_cast<int64_t>(s.words[i]));
  }
  state.set("has_spare_normal", int64_t{s.has_spare_normal});
  state.set("spare_normal", s.spare_normal);
  return state;
}

void load_generator_state(Generator& generator, const StateDict& state) {
  Generator::State s{};
  for (int i = 0; i < 4; ++i) {
    s.words[i] = static_cast<uint64_t>(state.get_int("word" + std::to_string(i)));
  }
  s.has_spare_normal = state.get_int("has_spare_normal") != 0;
  s.spare_normal = state.get_double("spare_normal");
  generator.set_state(s);
}

}  // namespace hsgd::checkpoint
