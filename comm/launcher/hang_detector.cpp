#include "comm/launcher/hang_detector.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/error.h"

namespace hsgd::comm::launcher {
namespace {

using detail::ProgressHeader;
using detail::ProgressSlot;
using std::chrono::milliseconds;

std::string seconds_text(HangDetector::Clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

// 'R', 'S', 'D', 'T' (stopped), 't' (traced), 'Z'...; 0 when unreadable.
char process_state(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return 0;
  return text[close + 2];
}

std::string shm_dir() {
  std::error_code ec;
  if (std::filesystem::is_directory("/dev/shm", ec)) return "/dev/shm";
  return std::filesystem::temp_directory_path().string();
}

}  // namespace

HangDetector::HangDetector(int slots, int rank_offset, std::string node)
    : rank_offset_(rank_offset), node_(std::move(node)), watch_(static_cast<size_t>(slots)) {
  HSGD_CHECK(slots >= 1, "HangDetector: slots ", slots, " must be >= 1");
  bytes_ = detail::progress_file_size(static_cast<size_t>(slots));
  // A memfd, which workers open as /proc/<our pid>/fd/<fd>: it disappears with the last process
  // using it, so even `kill -9` of hsgd-run leaves no file behind. Else a file in /dev/shm.
  int fd = ::memfd_create("hsgd-progress", MFD_CLOEXEC);
  if (fd >= 0) {
    path_ = "/proc/" + std::to_string(::getpid()) + "/fd/" + std::to_string(fd);
    memfd_ = fd;
  } else {
    path_ = shm_dir() + "/hsgd-progress-" + std::to_string(::getpid()) + "-XXXXXX";
    fd = ::mkstemp(path_.data());  // mode 0600
  }
  if (fd < 0) {
    HSGD_THROW(Error, "HangDetector: cannot create the progress file '", path_,
               "': ", std::strerror(errno));
  }
  void* base = MAP_FAILED;
  if (::ftruncate(fd, static_cast<off_t>(bytes_)) == 0) {
    base = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  const int err = errno;
  if (memfd_ < 0) ::close(fd);
  if (base == MAP_FAILED) {
    if (memfd_ >= 0) {
      ::close(memfd_);
    } else {
      ::unlink(path_.c_str());
    }
    HSGD_THROW(Error, "HangDetector: cannot map the progress file '", path_,
               "': ", std::strerror(err));
  }
  auto* header = static_cast<ProgressHeader*>(base);
  slots_ = reinterpret_cast<ProgressSlot*>(static_cast<char*>(base) + sizeof(ProgressHeader));
  for (int i = 0; i < slots; ++i) {
    slots_[i].step = -1;
    slots_[i].first_step = -1;
  }
  header->slots = static_cast<uint64_t>(slots);
  // The magic last: a worker that sees it sees initialised slots.
  std::atomic_ref<uint64_t>(header->magic).store(detail::kProgressMagic);
  for (auto& w : watch_) w.changed = Clock::now();
}

HangDetector::~HangDetector() {
  ::munmap(reinterpret_cast<char*>(slots_) - sizeof(ProgressHeader), bytes_);
  if (memfd_ >= 0) {
    ::close(memfd_);
  } else {
    ::unlink(path_.c_str());
  }
}

HangDetector::Snapshot HangDetector::read(int local) const {
  ProgressSlot& s = slots_[local];
  constexpr auto relaxed = std::memory_order_relaxed;
  return Snapshot{
      .beats = std::atomic_ref<uint64_t>(s.beats).load(relaxed),
      .in_collective = std::atomic_ref<uint64_t>(s.in_collective).load(relaxed),
      .collective_failures = std::atomic_ref<uint64_t>(s.collective_failures).load(relaxed),
      .step = std::atomic_ref<int64_t>(s.step).load(relaxed),
      .first_step = std::atomic_ref<int64_t>(s.first_step).load(relaxed)};
}

void HangDetector::observe(Clock::time_point now, const std::vector<pid_t>& pids) {
  for (size_t i = 0; i < watch_.size(); ++i) {
    Watch& w = watch_[i];
    w.pid = i < pids.size() ? pids[i] : -1;
    const uint64_t beats = read(static_cast<int>(i)).beats;
    if (beats != w.beats) {
      w.beats = beats;
      w.changed = now;
    }
    const bool stopped = w.pid > 0 && process_state(w.pid) == 'T';
    if (!stopped) {
      w.stopped.reset();
    } else if (!w.stopped) {
      w.stopped = now;
    }
  }
}

std::string HangDetector::describe(int local) const {
  std::ostringstream out;
  out << "rank " << rank_offset_ + local << " (" << node_ << ", local rank " << local << ", pid "
      << watch_[local].pid << ")";
  return out.str();
}

std::optional<HangDetector::Hang> HangDetector::check(int local, Clock::time_point now,
                                                      milliseconds timeout,
                                                      int waiting_also) const {
  const Watch& w = watch_[local];
  if (w.pid <= 0) return std::nullopt;
  const Snapshot me = read(local);
  const std::string last_step =
      me.step >= 0 ? "its last step: " + std::to_string(me.step) : "it reported no step yet";
  // Stopped: for `timeout` since the first sample that saw it stopped, or since its last
  // progress (which came before the stop) when it reports progress: whichever is reached first.
  if (w.stopped) {
    const auto stopped_for = now - *w.stopped;
    const auto silent_for = now - w.changed;
    if (me.beats > 0 && silent_for >= timeout) {
      return Hang{local, describe(local) + " is stopped (process state T, e.g. SIGSTOP) and made " +
                             "no progress for " + seconds_text(silent_for) + "; " + last_step};
    }
    if (stopped_for >= timeout) {
      return Hang{local, describe(local) + " is stopped (process state T, e.g. SIGSTOP) for " +
                             seconds_text(stopped_for) + "; " + last_step};
    }
  }
  if (me.beats == 0 || me.in_collective > 0 || now - w.changed < timeout) return std::nullopt;
  std::string waiting;
  for (int j = 0; j < static_cast<int>(watch_.size()); ++j) {
    if (j == local) continue;
    if (j == waiting_also || (watch_[j].pid > 0 && read(j).in_collective > 0)) {
      waiting += (waiting.empty() ? "" : ", ") + std::to_string(rank_offset_ + j);
    }
  }
  if (waiting.empty()) return std::nullopt;
  return Hang{local, describe(local) + " made no progress for " + seconds_text(now - w.changed) +
                         " outside any collective while rank(s) " + waiting +
                         " waited in one (stuck or looping); " + last_step};
}

std::optional<HangDetector::Hang> HangDetector::find_hung(Clock::time_point now,
                                                          milliseconds timeout) const {
  for (int i = 0; i < static_cast<int>(watch_.size()); ++i) {
    if (auto hang = check(i, now, timeout, /*waiting_also=*/-1)) return hang;
  }
  return std::nullopt;
}

std::optional<HangDetector::Hang> HangDetector::suspect(Clock::time_point now, int failed,
                                                        milliseconds min_silence) const {
  for (int i = 0; i < static_cast<int>(watch_.size()); ++i) {
    if (i == failed) continue;
    if (watch_[i].stopped) return check(i, now, milliseconds(0), failed);
    if (auto hang = check(i, now, min_silence, failed)) return hang;
  }
  return std::nullopt;
}

int64_t HangDetector::last_step() const {
  int64_t last = -1;
  for (int i = 0; i < static_cast<int>(watch_.size()); ++i) last = std::max(last, read(i).step);
  return last;
}

int64_t HangDetector::resumed_step() const {
  int64_t resumed = -1;
  for (int i = 0; i < static_cast<int>(watch_.size()); ++i) {
    const int64_t first = read(i).first_step;
    if (first >= 0 && (resumed < 0 || first < resumed)) resumed = first;
  }
  return resumed;
}

}  // namespace hsgd::comm::launcher
