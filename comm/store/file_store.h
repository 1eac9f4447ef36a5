#pragma once
// FileStore: a Store kept in a directory of a file system every rank can see (a local /tmp for
// ranks on one machine, or a shared file system). One file per key; the directory is created
// if missing. Processes of one job pass the same path.
//
// Writes are atomic (write a temporary file, then rename); add() and compare_set() take an
// flock() on "<path>/.lock" so concurrent processes never lose an update. Waiting polls the
// directory with a growing sleep (1 ms .. 20 ms) instead of inotify, because inotify does not
// see writes made by other machines on NFS.
//
// Usage:
//   auto store = std::make_shared<hsgd::comm::FileStore>("/tmp/job42");
//   store->set("k", hsgd::comm::to_bytes("v"));

#include <atomic>
#include <filesystem>

#include "comm/store/store.h"

namespace hsgd::comm {

class FileStore : public Store {
 public:
  // Throws hsgd::CommError if the directory cannot be created.
  explicit FileStore(std::filesystem::path path);
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  const std::filesystem::path& path() const { return path_; }

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout = kDefaultTimeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  CompareSetResult compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout = kDefaultTimeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

 private:
  // Keys become file names: [A-Za-z0-9._-] are kept, every other byte is written %XX.
  std::filesystem::path file_of(const std::string& key) const;
  bool read(const std::string& key, Bytes* value) const;  // false if the key does not exist
  void write(const std::string& key, const Bytes& value);

  const std::filesystem::path path_;
  std::atomic<uint64_t> temp_counter_{0};  // names temporary files
};

}  // namespace hsgd::comm
