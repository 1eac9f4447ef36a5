#include "comm/launcher/output_router.h"

#include <fcntl.h>
#include <poll.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "comm/error.h"

namespace hsgd::comm::launcher {
namespace {

// A worker printing a huge line without a newline must not grow our buffer without bound.
constexpr size_t kMaxLine = 64 * 1024;
// How long a write to a full non-blocking terminal waits for its reader (see write_all).
constexpr std::chrono::milliseconds kWriteStall{2000};

}  // namespace

OutputRouter::OutputRouter(OutputOptions options, int attempt)
    : options_(std::move(options)),
      attempt_dir_(options_.log_dir.empty()
                       ? std::string()
                       : options_.log_dir + "/attempt_" + std::to_string(attempt)) {
  if (!attempt_dir_.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(attempt_dir_, ec);
    HSGD_CHECK(!ec, "cannot create log directory '", attempt_dir_, "': ", ec.message());
  }
}

OutputRouter::~OutputRouter() {
  for (auto& source : sources_) {
    if (source.fd < 0) continue;
    if (!source.pending.empty()) emit_line(source, source.pending);
    ::close(source.fd);
  }
  for (auto& [rank, fd] : log_fds_) ::close(fd);
}

void OutputRouter::add(int rank, int fd, Stream stream) {
  HSGD_CHECK_GE(fd, 0, "OutputRouter::add: invalid fd for rank ", rank);
  sources_.push_back(Source{rank, stream, fd, {}});
  if (!attempt_dir_.empty() && !log_fds_.contains(rank)) {
    const std::string path = log_path(rank);
    int file = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    HSGD_CHECK(file >= 0, "cannot open log file '", path, "': ", std::strerror(errno));
    log_fds_[rank] = file;
  }
}

std::string OutputRouter::log_path(int rank) const {
  if (attempt_dir_.empty()) return {};
  return attempt_dir_ + "/rank_" + std::to_string(rank) + ".log";
}

bool OutputRouter::pump(std::chrono::milliseconds timeout, int wake_fd) {
  std::vector<pollfd> fds;
  std::vector<Source*> polled;
  for (auto& source : sources_) {
    if (source.fd < 0) continue;
    fds.push_back(pollfd{source.fd, POLLIN, 0});
    polled.push_back(&source);
  }
  if (wake_fd >= 0) fds.push_back(pollfd{wake_fd, POLLIN, 0});
  // With nothing to watch, poll() just sleeps for the timeout: callers may loop on pump().
  int ready = ::poll(fds.data(), fds.size(), static_cast<int>(timeout.count()));
  if (ready <= 0) return false;  // timeout, or EINTR: the caller loops anyway
  for (size_t i = 0; i < polled.size(); ++i) {
    if (fds[i].revents != 0) read_source(*polled[i]);
  }
  return wake_fd >= 0 && (fds.back().revents & POLLIN) != 0;
}

void OutputRouter::drain(std::chrono::milliseconds timeout, int rank) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (open_sources_of(rank)) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pump(left);
  }
}

bool OutputRouter::open_sources_of(int rank) const {
  for (const auto& source : sources_) {
    if (source.fd >= 0 && (rank < 0 || source.rank == rank)) return true;
  }
  return false;
}

std::vector<std::string> OutputRouter::tail(int rank) const {
  auto it = tails_.find(rank);
  if (it == tails_.end()) return {};
  return {it->second.begin(), it->second.end()};
}

void OutputRouter::read_source(Source& source) {
  char buffer[16 * 1024];
  ssize_t n = ::read(source.fd, buffer, sizeof(buffer));
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {  // end of stream (or a broken pipe, which means the same to us)
    if (!source.pending.empty()) emit_line(source, source.pending);
    source.pending.clear();
    ::close(source.fd);
    source.fd = -1;
    return;
  }
  source.pending.append(buffer, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = source.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    emit_line(source, std::string_view(source.pending).substr(start, nl - start));
  }
  source.pending.erase(0, start);
  if (source.pending.size() > kMaxLine) {
    emit_line(source, source.pending);
    source.pending.clear();
  }
}

void OutputRouter::emit_line(const Source& source, std::string_view line) {
  auto& tail = tails_[source.rank];
  tail.emplace_back(line);
  while (tail.size() > options_.tail_lines) tail.pop_front();

  if (auto it = log_fds_.find(source.rank); it != log_fds_.end()) {
    std::string out(line);
    out += '\n';
    write_all(it->second, out);
    return;
  }
  std::string out = "[rank " + std::to_string(source.rank) + "] ";
  out.append(line);
  out += '\n';
  write_all(source.stream == Stream::kStdout ? options_.stdout_fd : options_.stderr_fd, out);
}

void OutputRouter::write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Our stdout may be a non-blocking pipe shared with a parent (CI runners, editors) whose
      // reader is slow, e.g. while every worker's last lines arrive at once on SIGTERM. Wait
      // for room rather than drop the lines, but never stall the launcher for long: a reader
      // that takes no byte for kWriteStall is as good as closed.
      pollfd out{fd, POLLOUT, 0};
      if (::poll(&out, 1, static_cast<int>(kWriteStall.count())) > 0) continue;
      return;
    }
    // A closed terminal (EPIPE) must not stop the job: workers keep running and their tails
    // are still kept for failure reports, so dropping the copy is the right trade-off.
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace hsgd::comm::launcher
