#pragma once
// The state of a module and of a generator as StateDict entries, as checkpoint::Checkpointer
// saves them: a module's state_dict() tensors by dotted name plus the bytes of every generator
// it registered (Module::register_generator), and a generator's position as integers. The
// Runtime sends the same entries to a joining node.
//
// Usage:
//   StateDict s = checkpoint::module_state(*model);        // copies
//   checkpoint::load_module_state(*model, "model", s);      // same names and shapes

#include <string>

#include "framework/nn/module.h"
#include "framework/tensor/generator.h"
#include "framework/train/state_dict.h"

namespace hsgd::checkpoint {

// Copies of the module's tensors and its generators' states.
StateDict module_state(nn::Module& module);
// Restores tensors (strict: same names and shapes) and the generators that have an entry; a
// generator without one is left as it is. InvalidArgument naming `name` and the entry when an
// entry is bad; nothing changes then.
void load_module_state(nn::Module& module, const std::string& name, const StateDict& state);

StateDict generator_state(const Generator& generator);
void load_generator_state(Generator& generator, const StateDict& state);

}  // namespace hsgd::checkpoint
