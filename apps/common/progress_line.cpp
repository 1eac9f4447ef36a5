#include "apps/common/progress_line.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>

namespace hsgd::apps {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string format(const char* fmt, auto... args) {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, fmt, args...);
  return buffer;
}

// The fields after the step and loss, shared by both styles.
std::string details(const ProgressState& s, const char* sep) {
  std::string text = format("lr %.4g%s%.0f samples/s%sETA %s", s.lr, sep, s.samples_per_s, sep,
                            ProgressLine::format_duration(s.eta_s).c_str());
  if (s.test_accuracy) text += format("%stest acc %.2f%%", sep, 100 * *s.test_accuracy);
  return text;
}

}  // namespace

ProgressLine::Style ProgressLine::detect(bool enabled, int64_t log_every) {
  if (!enabled || log_every <= 0) return Style::kOff;
  return isatty(STDOUT_FILENO) ? Style::kLive : Style::kPlain;
}

ProgressLine::ProgressLine(Style style, int64_t log_every) : style_(style), log_every_(log_every) {}

ProgressLine::~ProgressLine() { clear(); }

std::string ProgressLine::format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const auto s = static_cast<long long>(std::llround(seconds));
  if (s >= 3600) return format("%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return format("%lld:%02lld", s / 60, s % 60);
}

void ProgressLine::update(const ProgressState& s) {
  if (style_ == Style::kOff) return;
  if (style_ == Style::kPlain) {
    if (s.step % log_every_ != 0) return;
    std::printf("  step %lld loss %.4f | epoch %lld/%lld, %lld/%lld steps, %s\n",
                static_cast<long long>(s.step), s.loss, static_cast<long long>(s.epoch),
                static_cast<long long>(s.epochs), static_cast<long long>(s.step),
                static_cast<long long>(s.total_steps), details(s, ", ").c_str());
    std::fflush(stdout);
    return;
  }
  const double now = now_seconds();
  if (drawn_ && now - last_draw_ < 0.1 && s.step != s.total_steps) return;
  last_draw_ = now;
  std::string line =
      format("epoch %lld/%lld | step %lld/%lld | loss %.4f | ", static_cast<long long>(s.epoch),
             static_cast<long long>(s.epochs), static_cast<long long>(s.step),
             static_cast<long long>(s.total_steps), s.loss) +
      details(s, " | ");
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 1 &&
      line.size() >= size.ws_col) {
    line.resize(size.ws_col - 1u);  // a wrapped line could not be redrawn with '\r'
  }
  std::printf("\r%s\033[K", line.c_str());
  std::fflush(stdout);
  drawn_ = true;
}

void ProgressLine::clear() {
  if (!drawn_) return;
  std::printf("\r\033[K");
  std::fflush(stdout);
  drawn_ = false;
}

void ProgressLine::print(const std::string& text) {
  clear();
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace hsgd::apps
