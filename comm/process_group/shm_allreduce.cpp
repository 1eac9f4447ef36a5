#include "comm/process_group/shm_allreduce.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <utility>
#include <vector>

#include "comm/error.h"
#include "comm/format_ranks.h"
#include "comm/log.h"
#include "comm/process_group/process_group.h"
#include "comm/store/store_barrier.h"

namespace hsgd::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string read_link(const char* path) {
  char buffer[256] = {};
  const ssize_t n = ::readlink(path, buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
}

// Alive unless it is gone or a zombie (an exited child its parent did not reap yet).
bool process_alive(pid_t pid) {
  if (pid <= 0) return true;  // not known yet: let the deadline decide
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  const std::string stat = read_first_line(("/proc/" + std::to_string(pid) + "/stat").c_str());
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return !stat.empty();
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

bool reached(uint32_t count, uint32_t target) {
  return static_cast<int32_t>(count - target) >= 0;  // wrap-safe
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::milliseconds wait) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(wait.count() / 1000);
  ts.tv_nsec = static_cast<long>((wait.count() % 1000) * 1000000);
  // FUTEX_WAIT without the PRIVATE flag: the word lives in a mapping shared between processes.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr,
            0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Unmaps on scope exit unless released.
struct Mapping {
  void* base = nullptr;
  size_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, bytes);
  }
  void* release() { return std::exchange(base, nullptr); }
};

// Maps the segment; creates (and sizes, with its pages reserved so that a full /dev/shm is an
// error here instead of a SIGBUS later) when create is set. Returns an empty string on
// success, else why not.
std::string map_segment(const std::string& name, size_t bytes, bool create, Mapping& mapping) {
  const int fd = create ? ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600)
                        : ::shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return std::string("shm_open: ") + std::strerror(errno);
  std::string why;
  if (create) {
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      why = std::string("ftruncate: ") + std::strerror(errno);
    } else if (const int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
      why = std::string("posix_fallocate: ") + std::strerror(rc);
    }
  } else {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
      why = "the segment has " + std::to_string(st.st_size) + " bytes, expected " +
            std::to_string(bytes);
    }
  }
  if (why.empty()) {
    void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      why = std::string("mmap: ") + std::strerror(errno);
    } else {
      mapping.base = base;
      mapping.bytes = bytes;
    }
  }
  ::close(fd);
  return why;
}

std::string unique_segment_name() {
  static std::atomic<uint64_t> counter{0};
  std::random_device device;
  const uint64_t nonce = (uint64_t{device()} << 32) | device();
  char text[96];
  std::snprintf(text, sizeof(text), "/hsgd-%d-%llu-%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(counter++), static_cast<unsigned long long>(nonce));
  return text;
}

template <typename T>
void reduce_into(T* out, const std::vector<const T*>& in, size_t n, ReduceOp op) {
  std::memcpy(out, in[0], n * sizeof(T));
  for (size_t r = 1; r < in.size(); ++r) {
    const T* src = in[r];
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        for (size_t i = 0; i < n; ++i) out[i] += src[i];
        break;
      case ReduceOp::kMin:
        for (size_t i = 0; i < n; ++i) out[i] = std::min(out[i], src[i]);
        break;
      case ReduceOp::kMax:
        for (size_t i = 0; i < n; ++i) out[i] = std::max(out[i], src[i]);
        break;
    }
  }
  if (op == ReduceOp::kAvg) {
    const T count = static_cast<T>(in.size());
    for (size_t i = 0; i < n; ++i) out[i] /= count;
  }
}

}  // namespace

std::string node_identity(int node_rank) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const char* group_rank = std::getenv("GROUP_RANK");
  const std::string node = node_rank >= 0          ? std::to_string(node_rank)
                           : group_rank != nullptr ? std::string(group_rank)
                                                   : std::string();
  return std::string(host) + "|" + read_first_line("/proc/sys/kernel/random/boot_id") + "|" +
         read_link("/proc/self/ns/mnt") + "|" + read_link("/proc/self/ns/pid") + "|" + node;
}

struct ShmAllreduce::Header {
  alignas(64) std::atomic<uint32_t> count;    // barrier arrivals, all ranks; the futex word
  alignas(64) std::atomic<uint32_t> waiters;  // ranks asleep (or about to be) on count
  // 1 + the rank that called abort_members(), or 0.
  alignas(64) std::atomic<uint32_t> aborted_by;
  struct alignas(64) Member {
    std::atomic<uint32_t> round;  // barriers this rank reached
    std::atomic<int32_t> pid;
    // The collective this rank is in: element count, element size and op, checked against
    // the others' after the first barrier (see allreduce_impl).
    std::atomic<uint64_t> count;
    std::atomic<uint32_t> element_bytes;
    std::atomic<uint32_t> op;
  };
  Member members[kMaxRanks];
};

namespace {
constexpr size_t kDataOffset = 8192;  // the header, rounded up to whole pages
}  // namespace

std::unique_ptr<ShmAllreduce> ShmAllreduce::connect(Store& store, const std::string& key_prefix,
                                                    int rank, int size, Duration timeout,
                                                    const std::string& group_name) {
  static_assert(sizeof(Header) <= kDataOffset);
  static_assert(std::atomic<uint32_t>::is_always_lock_free);
  HSGD_CHECK(size >= 2 && size <= kMaxRanks, "ShmAllreduce: group '", group_name, "' has ", size,
             " ranks; expected 2 to ", kMaxRanks);
  const size_t bytes = kDataOffset + 2 * (static_cast<size_t>(size) + 1) * kChunkBytes;
  Mapping mapping;
  std::string name, why;
  struct Unlink {
    std::string* name;
    ~Unlink() {
      if (!name->empty()) ::shm_unlink(name->c_str());
    }
  };
  std::string created;  // unlinked when connect returns or throws, by rank 0 only
  Unlink unlink{&created};
  if (rank == 0) {
    name = unique_segment_name();
    why = map_segment(name, bytes, /*create=*/true, mapping);
    if (why.empty() || why.rfind("shm_open", 0) != 0) created = name;
    store.set(key_prefix + "name", to_bytes(why.empty() ? name : "-"));
  } else {
    name = to_string(store.get(key_prefix + "name", timeout));
    why = name == "-" ? "rank 0 could not create it" : map_segment(name, bytes, false, mapping);
  }
  if (mapping.base != nullptr) {
    static_cast<Header*>(mapping.base)->members[rank].pid.store(static_cast<int32_t>(::getpid()));
  }
  // Every rank votes whether it mapped the segment; all use it or none does.
  const std::string ok = key_prefix + "ok/";
  store_barrier(store, ok, rank, size, timeout,
                {.value = to_bytes(why.empty() ? "1" : "0"),
                 .what = str_cat("shared-memory setup of group '", group_name, "' (rank ", rank,
                                 " of ", size, ")")});
  const auto values = store.multi_get(store_barrier_keys(ok, size), timeout);
  std::vector<int> failed;
  for (int r = 0; r < size; ++r) {
    if (to_string(values[static_cast<size_t>(r)]) != "1") failed.push_back(r);
  }
  if (!failed.empty()) {
    logger()->warn(
        "group '{}': ranks {} could not map the shared-memory segment{}{}; allreduce uses Gloo's "
        "TCP transport",
        group_name, detail::format_ranks(failed),
        why.empty() ? "" : " (here: ", why.empty() ? "" : why + ")");
    return nullptr;
  }
  auto channel =
      std::unique_ptr<ShmAllreduce>(new ShmAllreduce(mapping.base, bytes, rank, size, group_name));
  mapping.release();
  return channel;
}

ShmAllreduce::ShmAllreduce(void* base, size_t bytes, int rank, int size, std::string group_name)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      size_(size),
      group_name_(std::move(group_name)),
      header_(static_cast<Header*>(base)) {}

ShmAllreduce::~ShmAllreduce() { ::munmap(base_, bytes_); }

char* ShmAllreduce::slot(int half, int rank) const {
  const size_t index =
      static_cast<size_t>(half) * (static_cast<size_t>(size_) + 1) + static_cast<size_t>(rank);
  return static_cast<char*>(base_) + kDataOffset + index * kChunkBytes;
}

char* ShmAllreduce::result(int half) const { return slot(half, size_); }

void ShmAllreduce::abort_members() {
  header_->aborted_by.store(static_cast<uint32_t>(rank_) + 1, std::memory_order_relaxed);
  abort();
}

void ShmAllreduce::check_peers(uint32_t target_round, Clock::time_point deadline) {
  if (const uint32_t by = header_->aborted_by.load(std::memory_order_relaxed); by != 0) {
    HSGD_THROW(CommError, "shared-memory allreduce of group '", group_name_, "' aborted: rank ",
               by - 1, " abandoned the group");
  }
  if (aborted_.load(std::memory_order_relaxed)) {
    HSGD_THROW(CommError, "shared-memory allreduce of group '", group_name_,
               "' aborted: the members are in different collectives");
  }
  std::vector<int> behind;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (reached(header_->members[r].round.load(std::memory_order_acquire), target_round)) continue;
    const pid_t pid = header_->members[r].pid.load(std::memory_order_relaxed);
    if (!process_alive(pid)) {
      // Between the read of its round above and this check, the peer may have arrived, finished
      // the collective and exited (a finished peer's exit is not a failure). A dead process's
      // round is final, so reading it again now tells which happened.
      if (reached(header_->members[r].round.load(std::memory_order_acquire), target_round)) {
        continue;
      }
      HSGD_THROW(CommError, "shared-memory allreduce of group '", group_name_, "': rank ", r,
                 " (pid ", pid, ") exited before reaching this collective (shared-memory barrier ",
                 target_round, ")");
    }
    behind.push_back(r);
  }
  if (!behind.empty() && Clock::now() >= deadline) {
    HSGD_THROW(Timeout, "shared-memory allreduce of group '", group_name_, "' timed out: ranks ",
               detail::format_ranks(behind), " did not reach shared-memory barrier ", target_round);
  }
}

// Every rank compares every other's description of the collective after the first barrier;
// they were written before it, and the next collective's cannot overwrite them before everyone
// passed the second barrier, which a mismatch also goes through before throwing. All ranks see
// the same descriptions, so either all throw or none does, after the same number of barriers:
// the group stays usable, and no buffer was changed.
std::string ShmAllreduce::check_same_call(size_t count, size_t element_bytes, ReduceOp op) const {
  for (int r = 0; r < size_; ++r) {
    const Header::Member& other = header_->members[r];
    const uint64_t their_count = other.count.load(std::memory_order_relaxed);
    const uint32_t their_bytes = other.element_bytes.load(std::memory_order_relaxed);
    const auto their_op = static_cast<ReduceOp>(other.op.load(std::memory_order_relaxed));
    if (their_count == count && their_bytes == element_bytes && their_op == op) continue;
    auto describe = [](uint64_t n, uint32_t bytes, ReduceOp o) {
      return str_cat(n, " x ", bytes == 4 ? "float" : "double", ", ", to_string(o));
    };
    return str_cat("allreduce of group '", group_name_,
                   "': the ranks called it with different arguments: rank ", r, " with (",
                   describe(their_count, their_bytes, their_op), "), rank ", rank_, " with (",
                   describe(count, static_cast<uint32_t>(element_bytes), op),
                   "); every rank must pass the same size, type and op. No buffer was "
                   "changed");
  }
  return "";
}

void ShmAllreduce::barrier(Clock::time_point deadline) {
  const uint32_t round = ++rounds_;
  const uint32_t target = round * static_cast<uint32_t>(size_);
  header_->members[rank_].round.store(round, std::memory_order_release);
  const uint32_t now = header_->count.fetch_add(1, std::memory_order_seq_cst) + 1;
  if (now == target) {
    if (header_->waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&header_->count);
    return;
  }
  // Spin briefly (the peers may be running on other cores), then yield (they may need this
  // core), then sleep on the futex in slices that let us notice a dead peer or the deadline.
  for (int i = 0; i < 256; ++i) {
    if (reached(header_->count.load(std::memory_order_acquire), target)) return;
    cpu_relax();
  }
  for (int i = 0; i < 16; ++i) {
    if (reached(header_->count.load(std::memory_order_acquire), target)) return;
    ::sched_yield();
  }
  while (true) {
    const uint32_t current = header_->count.load(std::memory_order_seq_cst);
    if (reached(current, target)) return;
    check_peers(round, deadline);
    header_->waiters.fetch_add(1, std::memory_order_seq_cst);
    futex_wait(&header_->count, current, std::chrono::milliseconds(100));
    header_->waiters.fetch_sub(1, std::memory_order_seq_cst);
  }
}

template <typename T>
void ShmAllreduce::allreduce_impl(std::span<T> data, ReduceOp op, Clock::time_point deadline) {
  constexpr size_t kChunk = kChunkBytes / sizeof(T);
  std::vector<const T*> inputs(static_cast<size_t>(size_));
  Header::Member& me = header_->members[rank_];
  me.count.store(data.size(), std::memory_order_relaxed);
  me.element_bytes.store(sizeof(T), std::memory_order_relaxed);
  me.op.store(static_cast<uint32_t>(op), std::memory_order_relaxed);
  for (size_t offset = 0; offset < data.size(); offset += kChunk) {
    const size_t len = std::min(kChunk, data.size() - offset);
    const int half = static_cast<int>(chunks_++ & 1);
    std::memcpy(slot(half, rank_), data.data() + offset, len * sizeof(T));
    barrier(deadline);
    if (offset == 0) {
      const std::string mismatch = check_same_call(data.size(), sizeof(T), op);
      if (!mismatch.empty()) {
        barrier(deadline);  // nobody writes the next call's description before all have read
        throw InvalidArgument(mismatch);
      }
    }
    // This rank's share of the chunk, in whole cache lines.
    constexpr size_t kLine = 64 / sizeof(T);
    const size_t share = (len + static_cast<size_t>(size_) - 1) / static_cast<size_t>(size_);
    const size_t per = (share + kLine - 1) / kLine * kLine;
    const size_t begin = std::min(len, per * static_cast<size_t>(rank_));
    const size_t end = std::min(len, begin + per);
    if (begin < end) {
      for (int r = 0; r < size_; ++r) {
        inputs[static_cast<size_t>(r)] = reinterpret_cast<const T*>(slot(half, r)) + begin;
      }
      reduce_into(reinterpret_cast<T*>(result(half)) + begin, inputs, end - begin, op);
    }
    barrier(deadline);
    std::memcpy(data.data() + offset, result(half), len * sizeof(T));
  }
}

void ShmAllreduce::allreduce(std::span<float> data, ReduceOp op, Clock::time_point deadline) {
  allreduce_impl(data, op, deadline);
}

void ShmAllreduce::allreduce(std::span<double> data, ReduceOp op, Clock::time_point deadline) {
  allreduce_impl(data, op, deadline);
}

}  // namespace hsgd::comm
