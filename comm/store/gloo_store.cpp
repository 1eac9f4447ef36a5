#include "comm/store/gloo_store.h"

#include "comm/error.h"

namespace hsgd::comm {

GlooStore::GlooStore(std::shared_ptr<comm::Store> store, std::string prefix, Duration timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {
  HSGD_CHECK(store_ != nullptr, "GlooStore: store must not be null");
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  store_->set(prefix_ + key, Bytes(data.begin(), data.end()));
}

std::vector<char> GlooStore::get(const std::string& key) {
  Bytes value = store_->get(prefix_ + key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const auto& key : keys) prefixed.push_back(prefix_ + key);
  // Gloo passes kNoTimeout (0) to mean "no deadline"; ours always has one.
  store_->wait(prefixed, timeout.count() > 0 ? Duration(timeout) : timeout_);
}

std::unique_ptr<GlooStore> as_gloo_store(std::shared_ptr<Store> store, std::string prefix,
                                         Duration timeout) {
  return std::make_unique<GlooStore>(std::move(store), std::move(prefix), timeout);
}

}  // namespace hsgd::comm
