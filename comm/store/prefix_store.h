#pragma once
// PrefixStore: a view of another Store in which every key becomes prefix + "/" + key (like
// torch.distributed.PrefixStore). Process groups use it to give each group its own keys.
//
// num_keys() returns the base store's count (as torch does): a Store has no way to count the
// keys under a prefix.
//
// Usage:
//   #include "comm/store/hash_store.h"
//   auto base = std::make_shared<hsgd::comm::HashStore>();
//   hsgd::comm::PrefixStore group_store("group-3", base);
//   group_store.set("rank0", hsgd::comm::to_bytes("v"));   // base key "group-3/rank0"

#include <memory>
#include <string>
#include <vector>

#include "comm/store/store.h"

namespace hsgd::comm {

class PrefixStore : public Store {
 public:
  // Throws hsgd::InvalidArgument when base is null.
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout = kDefaultTimeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  CompareSetResult compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout = kDefaultTimeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys,
                               Duration timeout = kDefaultTimeout) override;
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override;
  void set_owned(const std::string& key, const Bytes& value, Duration linger) override;

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string full_key(const std::string& key) const;
  std::vector<std::string> full_keys(const std::vector<std::string>& keys) const;

  // Constant after construction.
  const std::string prefix_;
  const std::shared_ptr<Store> base_;
};

}  // namespace hsgd::comm
