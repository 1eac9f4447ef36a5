#include "comm/process_group/worker_progress.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "comm/log.h"

namespace hsgd::comm {
namespace {

using detail::ProgressHeader;
using detail::ProgressSlot;

// This process's slot, or nullptr. Process-wide on purpose: HSGD_PROGRESS_FILE and LOCAL_RANK
// describe the process, not a group, and the mapping lives as long as the process.
ProgressSlot* map_own_slot() {
  const char* path = std::getenv("HSGD_PROGRESS_FILE");
  const char* local = std::getenv("LOCAL_RANK");
  if (path == nullptr || *path == '\0' || local == nullptr) return nullptr;
  char* end = nullptr;
  const long local_rank = std::strtol(local, &end, 10);
  if (end == local || *end != '\0' || local_rank < 0) return nullptr;
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    logger()->warn(
        "progress: cannot open HSGD_PROGRESS_FILE '{}': {}; hsgd-run will not see "
        "this worker's progress",
        path, std::strerror(errno));
    return nullptr;
  }
  struct stat st {};
  const size_t need = detail::progress_file_size(static_cast<size_t>(local_rank) + 1);
  void* base = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= need) {
    base =
        ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);
  if (base == MAP_FAILED ||
      std::atomic_ref<uint64_t>(static_cast<ProgressHeader*>(base)->magic).load() !=
          detail::kProgressMagic) {
    logger()->warn(
        "progress: HSGD_PROGRESS_FILE '{}' has no slot for LOCAL_RANK {}; hsgd-run "
        "will not see this worker's progress",
        path, local_rank);
    return nullptr;
  }
  auto* slots = reinterpret_cast<ProgressSlot*>(static_cast<char*>(base) + sizeof(ProgressHeader));
  return &slots[local_rank];
}

ProgressSlot* own_slot() {
  static ProgressSlot* const slot = map_own_slot();
  return slot;
}

void add(uint64_t& field, uint64_t n) {
  std::atomic_ref<uint64_t>(field).fetch_add(n, std::memory_order_relaxed);
}

}  // namespace

void report_progress(int64_t step) {
  ProgressSlot* slot = own_slot();
  if (slot == nullptr) return;
  int64_t none = -1;
  std::atomic_ref<int64_t>(slot->first_step)
      .compare_exchange_strong(none, step, std::memory_order_relaxed);
  std::atomic_ref<int64_t>(slot->step).store(step, std::memory_order_relaxed);
  add(slot->beats, 1);
}

CollectiveProgress::CollectiveProgress() : exceptions_at_start_(std::uncaught_exceptions()) {
  if (ProgressSlot* slot = own_slot()) {
    add(slot->in_collective, 1);
    add(slot->beats, 1);
  }
}

CollectiveProgress::~CollectiveProgress() {
  if (ProgressSlot* slot = own_slot()) {
    if (std::uncaught_exceptions() > exceptions_at_start_) add(slot->collective_failures, 1);
    add(slot->beats, 1);
    std::atomic_ref<uint64_t>(slot->in_collective).fetch_sub(1, std::memory_order_relaxed);
  }
}

}  // namespace hsgd::comm
