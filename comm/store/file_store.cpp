#include "comm/store/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "comm/error.h"
#include "comm/store/hash_store.h"

namespace hsgd::comm {
namespace {

constexpr size_t kMaxFileName = 240;  // below NAME_MAX (255), room for the temp suffix

// Holds an exclusive flock() on a file for the lifetime of the object.
class FileLock {
 public:
  explicit FileLock(const std::filesystem::path& path) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    HSGD_CHECK_AS(CommError, fd_ >= 0, "FileStore: cannot open lock file ", path.string(), ": ",
                  std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      HSGD_CHECK_AS(CommError, errno == EINTR, "FileStore: flock(", path.string(),
                    ") failed: ", std::strerror(errno));
    }
  }
  ~FileLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

FileStore::FileStore(std::filesystem::path path) : path_(std::move(path)) {
  std::error_code ec;
  std::filesystem::create_directories(path_, ec);
  HSGD_CHECK_AS(CommError, !ec, "FileStore: cannot create directory ", path_.string(), ": ",
                ec.message());
}

std::filesystem::path FileStore::file_of(const std::string& key) const {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string name = "k_";
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      name += static_cast<char>(c);
    } else {
      name += '%';
      name += kHex[c >> 4];
      name += kHex[c & 15];
    }
  }
  HSGD_CHECK(name.size() <= kMaxFileName, "FileStore: key '", key, "' is too long (", name.size(),
             " bytes once encoded; at most ", kMaxFileName, " expected)");
  return path_ / name;
}

bool FileStore::read(const std::string& key, Bytes* value) const {
  std::ifstream in(file_of(key), std::ios::binary);
  if (!in) return false;
  value->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}

void FileStore::write(const std::string& key, const Bytes& value) {
  // A temporary name unique per process, instance and call, then an atomic rename: readers see
  // either the old or the new value, never a partial one.
  const auto target = file_of(key);
  const auto temp = path_ / (".tmp_" + std::to_string(::getpid()) + "_" +
                             std::to_string(reinterpret_cast<uintptr_t>(this)) + "_" +
                             std::to_string(temp_counter_.fetch_add(1)));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(value.data()),
              static_cast<std::streamsize>(value.size()));
    HSGD_CHECK_AS(CommError, out.good(), "FileStore: cannot write ", temp.string());
  }
  std::error_code ec;
  std::filesystem::rename(temp, target, ec);
  HSGD_CHECK_AS(CommError, !ec, "FileStore: cannot rename ", temp.string(), " to ", target.string(),
                ": ", ec.message());
}

void FileStore::set(const std::string& key, const Bytes& value) { write(key, value); }

Bytes FileStore::get(const std::string& key, Duration timeout) {
  wait({key}, timeout);
  Bytes value;
  HSGD_CHECK_AS(CommError, read(key, &value), "FileStore::get: key '", key, "' disappeared from ",
                path_.string());
  return value;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  FileLock lock(path_ / ".lock");
  Bytes current;
  const int64_t value = (read(key, &current) ? detail::parse_counter(key, current) : 0) + delta;
  write(key, detail::format_counter(value));
  return value;
}

CompareSetResult FileStore::compare_set(const std::string& key, const Bytes& expected,
                                        const Bytes& desired) {
  FileLock lock(path_ / ".lock");
  Bytes current;
  const bool exists = read(key, &current);
  if (exists ? current == expected : expected.empty()) {
    write(key, desired);
    return {.swapped = true, .current = desired};
  }
  return {.swapped = false, .current = exists ? current : Bytes{}};
}

void FileStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto sleep = std::chrono::milliseconds(1);
  while (true) {
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (!std::filesystem::exists(file_of(key))) missing.push_back(key);
    }
    if (missing.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      HSGD_THROW(Timeout, "FileStore::wait (", path_.string(), "): keys ",
                 detail::join_keys(missing), " still missing after ", timeout.count(), " ms");
    }
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(sleep, deadline - now));
    sleep = std::min(sleep * 2, std::chrono::milliseconds(20));
  }
}

bool FileStore::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    if (!std::filesystem::exists(file_of(key))) return false;
  }
  return true;
}

bool FileStore::delete_key(const std::string& key) {
  std::error_code ec;
  return std::filesystem::remove(file_of(key), ec);
}

int64_t FileStore::num_keys() {
  int64_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path_)) {
    if (entry.path().filename().string().rfind("k_", 0) == 0) ++count;
  }
  return count;
}

}  // namespace hsgd::comm
