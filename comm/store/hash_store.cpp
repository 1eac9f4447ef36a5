#include "comm/store/hash_store.h"

#include <charconv>

#include "comm/error.h"

namespace hsgd::comm {

namespace detail {

Bytes format_counter(int64_t value) { return to_bytes(std::to_string(value)); }

int64_t parse_counter(const std::string& key, const Bytes& value) {
  const std::string text = to_string(value);
  int64_t result = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), result);
  HSGD_CHECK(ec == std::errc() && end == text.data() + text.size() && !text.empty(),
             "Store::add: key '", key, "' holds '", text, "', which is not a decimal counter");
  return result;
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i > 0) out += ", ";
    out += "'" + keys[i] + "'";
  }
  return out + "]";
}

}  // namespace detail

using detail::format_counter;
using detail::join_keys;
using detail::parse_counter;

void HashStore::set(const std::string& key, const Bytes& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  changed_.notify_all();
}

Bytes HashStore::get(const std::string& key, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, {key}, timeout, "get");
  return values_.at(key);
}

int64_t HashStore::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    const int64_t current = it == values_.end() ? 0 : parse_counter(key, it->second);
    result = current + delta;
    values_[key] = format_counter(result);
  }
  changed_.notify_all();
  return result;
}

CompareSetResult HashStore::compare_set(const std::string& key, const Bytes& expected,
                                        const Bytes& desired) {
  CompareSetResult result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    const bool matches = it == values_.end() ? expected.empty() : it->second == expected;
    if (matches) {
      values_[key] = desired;
      result.swapped = true;
      result.current = desired;
    } else {
      result.current = it == values_.end() ? Bytes{} : it->second;
    }
  }
  if (result.swapped) changed_.notify_all();
  return result;
}

void HashStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  wait_locked(lock, keys, timeout, "wait");
}

bool HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& key : keys) {
    if (values_.count(key) == 0) return false;
  }
  return true;
}

bool HashStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.erase(key) > 0;
}

int64_t HashStore::num_keys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(values_.size());
}

void HashStore::wait_locked(std::unique_lock<std::mutex>& lock,
                            const std::vector<std::string>& keys, Duration timeout,
                            const char* op) {
  auto all_present = [&] {
    for (const auto& key : keys) {
      if (values_.count(key) == 0) return false;
    }
    return true;
  };
  if (changed_.wait_for(lock, timeout, all_present)) return;
  std::vector<std::string> missing;
  for (const auto& key : keys) {
    if (values_.count(key) == 0) missing.push_back(key);
  }
  HSGD_THROW(Timeout, "HashStore::", op, ": keys ", join_keys(missing), " still missing after ",
             timeout.count(), " ms");
}

}  // namespace hsgd::comm
