#pragma once
// Logging for library code. Library code never prints to stdout; it logs through this logger
// (stderr). The level comes from HSGD_LOG_LEVEL (trace, debug, info, warn, error, off;
// default info). Messages carry their context themselves ("rank 3 group hier-4: ...") since
// several ranks may live in one process.
//
// Usage: hsgd::comm::logger()->info("rank {} joined group {}", rank, "world");

#include <spdlog/spdlog.h>

#include <memory>

namespace hsgd::comm {

// The shared "hsgd" logger; created on first use, thread-safe.
std::shared_ptr<spdlog::logger> logger();

}  // namespace hsgd::comm
