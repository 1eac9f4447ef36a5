#include "comm/store/store_outage.h"

#include <ctime>

namespace hsgd::comm {
namespace {

thread_local int no_server_wait_depth = 0;

}  // namespace

NoServerWait::NoServerWait() { ++no_server_wait_depth; }

NoServerWait::~NoServerWait() { --no_server_wait_depth; }

bool NoServerWait::active() { return no_server_wait_depth > 0; }

ServerWait::ServerWait() : saved_depth_(no_server_wait_depth) { no_server_wait_depth = 0; }

ServerWait::~ServerWait() { no_server_wait_depth = saved_depth_; }

std::string utc_text(std::chrono::system_clock::time_point t) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(t);
  std::tm parts{};
  ::gmtime_r(&seconds, &parts);
  char text[40];
  if (std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &parts) == 0) return "?";
  return text;
}

}  // namespace hsgd::comm
