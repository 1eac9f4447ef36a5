#include "framework/train/state_dict.h"

#include "comm/error.h"

namespace hsgd {
namespace {

template <typename T>
const T& get_as(const StateDict& state, const std::string& key, const char* wanted) {
  const StateValue* v = state.find(key);
  HSGD_CHECK(v != nullptr, "StateDict: missing key '", key, "'");
  const T* value = std::get_if<T>(v);
  HSGD_CHECK(value != nullptr, "StateDict: key '", key, "' holds a ", state_value_type(*v),
             ", expected a ", wanted);
  return *value;
}

}  // namespace

const char* state_value_type(const StateValue& value) {
  switch (value.index()) {
    case 0:
      return "double";
    case 1:
      return "int64";
    case 2:
      return "Tensor";
    default:
      return "bytes";
  }
}

void StateDict::set(const std::string& key, StateValue value) {
  for (auto& [k, v] : entries_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries_.emplace_back(key, std::move(value));
}

const StateValue* StateDict::find(const std::string& key) const {
  for (const auto& [k, v] : entries_) {
    if (k == key) return &v;
  }
  return nullptr;
}

double StateDict::get_double(const std::string& key) const {
  return get_as<double>(*this, key, "double");
}

int64_t StateDict::get_int(const std::string& key) const {
  return get_as<int64_t>(*this, key, "int64");
}

Tensor StateDict::get_tensor(const std::string& key) const {
  return get_as<Tensor>(*this, key, "Tensor");
}

const std::string& StateDict::get_bytes(const std::string& key) const {
  return get_as<std::string>(*this, key, "bytes");
}

StateDict StateDict::with_prefix(const std::string& prefix) const {
  StateDict out;
  for (const auto& [key, value] : entries_) {
    if (key.size() >= prefix.size() && key.compare(0, prefix.size(), prefix) == 0) {
      out.entries_.emplace_back(key.substr(prefix.size()), value);
    }
  }
  return out;
}

void StateDict::merge(const std::string& prefix, const StateDict& other) {
  if (entries_.empty()) {
    entries_.reserve(other.size());
    for (const auto& [key, value] : other.entries_) entries_.emplace_back(prefix + key, value);
    return;
  }
  for (const auto& [key, value] : other.entries_) set(prefix + key, value);
}

}  // namespace hsgd
