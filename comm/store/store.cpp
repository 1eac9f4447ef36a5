#include "comm/store/store.h"

#include "comm/error.h"

namespace hsgd::comm {

std::vector<Bytes> Store::multi_get(const std::vector<std::string>& keys, Duration timeout) {
  wait(keys, timeout);
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(get(key, timeout));
  return values;
}

void Store::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  HSGD_CHECK_EQ(keys.size(), values.size(), "Store::multi_set: number of keys and values differ");
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

void Store::set_owned(const std::string& key, const Bytes& value, Duration /*linger*/) {
  set(key, value);
}

}  // namespace hsgd::comm
