#include "comm/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <string>

namespace hsgd::comm {

std::shared_ptr<spdlog::logger> logger() {
  // A function-local static: initialised once, thread-safely, and never mutated afterwards.
  static const std::shared_ptr<spdlog::logger> instance = [] {
    auto log = spdlog::stderr_color_mt("hsgd");
    log->set_pattern("[%H:%M:%S.%e] [hsgd pid %P] [%^%l%$] %v");
    const char* level = std::getenv("HSGD_LOG_LEVEL");
    log->set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::info);
    return log;
  }();
  return instance;
}

}  // namespace hsgd::comm
