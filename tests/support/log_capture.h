#pragma once
// LogCapture: what this process logs through comm::logger() while the object lives, for tests of
// warnings.
//
// Usage:
//   hsgd::testing::LogCapture log;
//   hsgd::comm::logger()->warn("level {} was dropped", 2);
//   EXPECT_NE(log.text().find("was dropped"), std::string::npos);

#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>

#include "comm/log.h"

namespace hsgd::testing {

class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    comm::logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = comm::logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::string text() {
    sink_->flush();
    return out_.str();
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

}  // namespace hsgd::testing
