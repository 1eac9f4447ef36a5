#include "comm/process_group/detail/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "comm/error.h"

namespace hsgd::detail {
namespace {

struct Fault {
  std::string text;
  int64_t n = 0;
};

std::optional<Fault> parse_fault() {
  const char* value = std::getenv("HSGD_FAULT_KILL_IN_COLLECTIVE");
  if (value == nullptr || *value == '\0') return std::nullopt;
  const char* restarts = std::getenv("HSGD_RESTART_COUNT");
  if (restarts != nullptr && std::string(restarts) != "0") return std::nullopt;
  std::string spec = value;
  const auto bad = [&] {
    return InvalidArgument(str_cat("HSGD_FAULT_KILL_IN_COLLECTIVE='", value,
                                   "': expected TEXT#N or TEXT#N@LOCAL_RANK (N >= 1), e.g. "
                                   "'averager 8:4#3@0'"));
  };
  const auto number = [&](const std::string& text) {
    char* end = nullptr;
    const long long n = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || n < 0) throw bad();
    return static_cast<int64_t>(n);
  };
  const size_t at = spec.rfind('@');
  const size_t hash = spec.rfind('#', at);
  if (hash == std::string::npos || hash == 0) throw bad();
  if (at != std::string::npos && at > hash) {
    const char* local = std::getenv("LOCAL_RANK");
    if (local == nullptr || std::string(local) != std::to_string(number(spec.substr(at + 1)))) {
      return std::nullopt;
    }
    spec.resize(at);
  }
  const int64_t n = number(spec.substr(hash + 1));
  if (n < 1) throw bad();
  return Fault{spec.substr(0, hash), n};
}

}  // namespace

void maybe_kill_in_collective(const std::string& description) {
  static const std::optional<Fault> fault = parse_fault();
  if (!fault || description.find(fault->text) == std::string::npos) return;
  static std::atomic<int64_t> seen{0};
  if (seen.fetch_add(1) + 1 != fault->n) return;
  std::fprintf(stderr, "hsgd fault injection: SIGKILL in %s (HSGD_FAULT_KILL_IN_COLLECTIVE)\n",
               description.c_str());
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
}

}  // namespace hsgd::detail
