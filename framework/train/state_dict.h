#pragma once
// StateDict: the state of one object (optimizer, scheduler, averager, data loader, ...) for
// checkpoints, as an ORDERED list of (key, value) with unique keys. Keys are dotted paths chosen
// by each object and documented there (SGD: "param_groups.<g>.lr", "state.<i>.momentum_buffer").
// Tensors put into a StateDict by state_dict() methods are copies, independent of the object
// (checkpoint::Checkpointer writes them on a background thread while training goes on).
//
// Usage:
//   StateDict state;
//   state.set("step", int64_t{12});
//   state.set("note", std::string("bytes or text"));
//   int64_t step = state.get_int("step");
//   StateDict sub = state.with_prefix("model.");   // entries under "model.", prefix removed
//
// Getters throw InvalidArgument naming the key when it is missing or holds another type.

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "framework/tensor/tensor.h"

namespace hsgd {

// The value of one state entry: a hyper-parameter, a counter, a tensor (e.g. a momentum buffer)
// or bytes (an application's own data).
using StateValue = std::variant<double, int64_t, Tensor, std::string>;

// "double", "int64", "Tensor" or "bytes", for messages.
const char* state_value_type(const StateValue& value);

class StateDict {
 public:
  // Replaces the value of key, or appends (key, value) if key is new.
  void set(const std::string& key, StateValue value);
  bool contains(const std::string& key) const { return find(key) != nullptr; }
  // Null when key is absent.
  const StateValue* find(const std::string& key) const;
  double get_double(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  Tensor get_tensor(const std::string& key) const;
  const std::string& get_bytes(const std::string& key) const;
  const std::vector<std::pair<std::string, StateValue>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

  // The entries whose key starts with prefix, with the prefix removed, in order.
  StateDict with_prefix(const std::string& prefix) const;
  // Appends every entry of other under prefix + its key (replacing equal keys).
  void merge(const std::string& prefix, const StateDict& other);

 private:
  std::vector<std::pair<std::string, StateValue>> entries_;
};

}  // namespace hsgd
