#include "apps/common/metrics_log.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "comm/error.h"

namespace hsgd::apps {
namespace {

void append_number(std::string& out, const char* key, double value) {
  out += ", \"";
  out += key;
  out += "\": ";
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.10g", value);
  out += buffer;
}

void append_optional(std::string& out, const char* key, const std::optional<double>& value) {
  if (value) append_number(out, key, *value);
}

// The number after "key": in a line this class wrote, or nullopt.
std::optional<double> field(const std::string& line, const std::string& key) {
  const size_t at = line.find("\"" + key + "\": ");
  if (at == std::string::npos) return std::nullopt;
  const char* begin = line.c_str() + at + key.size() + 4;
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  if (end == begin) return std::nullopt;
  return value;
}

}  // namespace

std::string MetricsLog::to_json(const MetricsRecord& r) {
  std::string out =
      "{\"step\": " + std::to_string(r.step) + ", \"epoch\": " + std::to_string(r.epoch);
  append_number(out, "wall_s", r.wall_s);
  append_number(out, "train_s", r.train_s);
  append_optional(out, "train_loss", r.train_loss);
  append_optional(out, "lr", r.lr);
  append_optional(out, "samples_per_s", r.samples_per_s);
  append_optional(out, "test_loss", r.test_loss);
  append_optional(out, "test_accuracy", r.test_accuracy);
  out += ", \"averaging\": [";
  for (size_t i = 0; i < r.averaging.size(); ++i) {
    const distributed::AveragingLevelStats& level = r.averaging[i];
    out += (i ? ", " : "") + std::string("{\"period\": ") + std::to_string(level.period) +
           ", \"group_size\": " + std::to_string(level.group_size) +
           ", \"count\": " + std::to_string(level.calls) +
           ", \"bytes\": " + std::to_string(level.bytes);
    append_number(out, "seconds", level.seconds);
    append_number(out, "overlap_wait_seconds", level.overlap_wait_seconds);
    append_number(out, "peak_mb_per_s", level.peak_bytes_per_second / 1e6);
    out += "}";
  }
  out += "]";
  if (r.generation) {
    const MetricsRecord::Generation& g = *r.generation;
    std::string change;
    for (const char c : g.change) {
      if (c == '"' || c == '\\') change += '\\';
      change += c;
    }
    out += ", \"generation\": {\"number\": " + std::to_string(g.number) +
           ", \"nodes\": " + std::to_string(g.nodes) +
           ", \"workers\": " + std::to_string(g.workers) + ", \"change\": \"" + change +
           "\", \"failure\": " + (g.failure ? "true" : "false") +
           ", \"state_bytes\": " + std::to_string(g.state_bytes);
    append_number(out, "agreement_ms", g.agreement_ms);
    out += "}";
  }
  out += "}";
  return out;
}

MetricsLog::MetricsLog(const std::string& path, int64_t resumed_step) : path_(path) {
  std::string kept;
  if (resumed_step > 0) {
    // Keep the complete records up to the step resumed from; rewrite the file atomically.
    std::ifstream in(path);
    std::string line;
    while (in && std::getline(in, line)) {
      if (in.eof()) break;  // no '\n': a line cut by a kill
      const std::optional<double> step = field(line, "step");
      if (!step || *step > static_cast<double>(resumed_step)) continue;
      kept += line + "\n";
      resumed_wall_s_ = field(line, "wall_s").value_or(resumed_wall_s_);
      resumed_train_s_ = field(line, "train_s").value_or(resumed_train_s_);
    }
  }
  const std::string tmp = path + ".tmp";
  file_ = std::fopen(tmp.c_str(), "w");
  HSGD_CHECK(file_ != nullptr, "--metrics-out: cannot write '", tmp, "' (for '", path, "')");
  std::fputs(kept.c_str(), file_);
  std::fflush(file_);
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::fclose(file_);
    file_ = nullptr;
    HSGD_CHECK(false, "--metrics-out: cannot rename '", tmp, "' to '", path, "': ", ec.message());
  }
}

MetricsLog::~MetricsLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void MetricsLog::write(const MetricsRecord& record) {
  const std::string line = to_json(record) + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace hsgd::apps
