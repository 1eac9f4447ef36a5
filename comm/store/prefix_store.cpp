#include "comm/store/prefix_store.h"

#include <utility>

#include "comm/error.h"

namespace hsgd::comm {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> base)
    : prefix_(std::move(prefix)), base_(std::move(base)) {
  HSGD_CHECK(base_ != nullptr, "PrefixStore('", prefix_, "'): base store must not be null");
}

std::string PrefixStore::full_key(const std::string& key) const { return prefix_ + "/" + key; }

std::vector<std::string> PrefixStore::full_keys(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& key : keys) out.push_back(full_key(key));
  return out;
}

void PrefixStore::set(const std::string& key, const Bytes& value) {
  base_->set(full_key(key), value);
}

Bytes PrefixStore::get(const std::string& key, Duration timeout) {
  return base_->get(full_key(key), timeout);
}

int64_t PrefixStore::add(const std::string& key, int64_t delta) {
  return base_->add(full_key(key), delta);
}

CompareSetResult PrefixStore::compare_set(const std::string& key, const Bytes& expected,
                                          const Bytes& desired) {
  return base_->compare_set(full_key(key), expected, desired);
}

void PrefixStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  base_->wait(full_keys(keys), timeout);
}

bool PrefixStore::check(const std::vector<std::string>& keys) {
  return base_->check(full_keys(keys));
}

bool PrefixStore::delete_key(const std::string& key) { return base_->delete_key(full_key(key)); }

int64_t PrefixStore::num_keys() { return base_->num_keys(); }

std::vector<Bytes> PrefixStore::multi_get(const std::vector<std::string>& keys, Duration timeout) {
  return base_->multi_get(full_keys(keys), timeout);
}

void PrefixStore::multi_set(const std::vector<std::string>& keys,
                            const std::vector<Bytes>& values) {
  base_->multi_set(full_keys(keys), values);
}

void PrefixStore::set_owned(const std::string& key, const Bytes& value, Duration linger) {
  base_->set_owned(full_key(key), value, linger);
}

}  // namespace hsgd::comm
