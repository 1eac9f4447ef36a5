// apps/common/metrics_log.h and progress_line.h: the JSON lines, their resume, and the plain
// progress line that scripts grep.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "apps/common/metrics_log.h"
#include "apps/common/progress_line.h"
#include "comm/error.h"

namespace hsgd::apps {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::filesystem::path temp_file(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("hsgd_reporting_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir / name;
}

TEST(MetricsLogTest, ToJsonWritesEveryFieldAndNullForNonFinite) {
  MetricsRecord r{.step = 7,
                  .epoch = 2,
                  .wall_s = 1.5,
                  .train_s = 1.25,
                  .train_loss = std::nan(""),
                  .lr = 0.1,
                  .test_accuracy = 0.875,
                  .averaging = {{.period = 2,
                                 .group_size = 4,
                                 .calls = 3,
                                 .bytes = 96,
                                 .seconds = 0.5,
                                 .overlap_wait_seconds = 0.25,
                                 .peak_bytes_per_second = 2.5e6}}};
  EXPECT_EQ(MetricsLog::to_json(r),
            "{\"step\": 7, \"epoch\": 2, \"wall_s\": 1.5, \"train_s\": 1.25, \"train_loss\": null, "
            "\"lr\": 0.1, \"test_accuracy\": 0.875, \"averaging\": [{\"period\": 2, "
            "\"group_size\": 4, \"count\": 3, \"bytes\": 96, \"seconds\": 0.5, "
            "\"overlap_wait_seconds\": 0.25, \"peak_mb_per_s\": 2.5}]}");
}

TEST(MetricsLogTest, FreshRunTruncatesAndResumeKeepsRecordsUpToTheStep) {
  const std::filesystem::path path = temp_file("m.jsonl");
  {
    std::ofstream old(path);
    old << "stale\n";
  }
  {
    MetricsLog log(path.string(), /*resumed_step=*/0);
    for (int64_t step : {10, 20, 30}) {
      log.write({.step = step, .epoch = 1, .wall_s = step * 1.0, .train_s = step * 0.5});
    }
  }
  EXPECT_THAT(read(path), StartsWith("{\"step\": 10,"));
  {
    std::ofstream cut(path, std::ios::app);
    cut << "{\"step\": 40, \"epo";  // a line cut by a kill
  }
  {
    MetricsLog log(path.string(), /*resumed_step=*/20);
    EXPECT_EQ(log.resumed_wall_s(), 20.0);
    EXPECT_EQ(log.resumed_train_s(), 10.0);
    log.write({.step = 25, .epoch = 1, .wall_s = 25});
  }
  const std::string text = read(path);
  EXPECT_THAT(text, HasSubstr("{\"step\": 10,"));
  EXPECT_THAT(text, HasSubstr("{\"step\": 20,"));
  EXPECT_THAT(text, Not(HasSubstr("\"step\": 30,")));
  EXPECT_THAT(text, Not(HasSubstr("\"step\": 40,")));
  EXPECT_THAT(text, HasSubstr("}\n{\"step\": 25,"));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3);
  std::filesystem::remove_all(path.parent_path());
}

TEST(MetricsLogTest, UnwritablePathNamesIt) {
  try {
    MetricsLog log("/nonexistent-dir/m.jsonl", 0);
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'/nonexistent-dir/m.jsonl'"));
  }
}

TEST(ProgressTest, PlainLinesEveryLogEverySteps) {
  ::testing::internal::CaptureStdout();
  {
    ProgressLine progress(ProgressLine::Style::kPlain, 5);
    for (int64_t step = 1; step <= 10; ++step) {
      progress.update({.step = step,
                       .total_steps = 10,
                       .epoch = 1,
                       .epochs = 2,
                       .loss = 0.5,
                       .lr = 0.1,
                       .samples_per_s = 1000,
                       .eta_s = 75,
                       .test_accuracy = step > 5 ? std::optional<double>(0.8512) : std::nullopt});
    }
  }
  EXPECT_EQ(::testing::internal::GetCapturedStdout(),
            "  step 5 loss 0.5000 | epoch 1/2, 5/10 steps, lr 0.1, 1000 samples/s, ETA 1:15\n"
            "  step 10 loss 0.5000 | epoch 1/2, 10/10 steps, lr 0.1, 1000 samples/s, ETA 1:15, "
            "test acc 85.12%\n");
}

TEST(ProgressTest, OffPrintsNothingAndDurationsFormat) {
  ::testing::internal::CaptureStdout();
  ProgressLine(ProgressLine::Style::kOff, 1).update({.step = 1, .total_steps = 1});
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "");
  EXPECT_EQ(ProgressLine::detect(/*enabled=*/false, 10), ProgressLine::Style::kOff);
  EXPECT_EQ(ProgressLine::detect(/*enabled=*/true, 0), ProgressLine::Style::kOff);
  EXPECT_EQ(ProgressLine::format_duration(59.6), "1:00");
  EXPECT_EQ(ProgressLine::format_duration(3725), "1:02:05");
  EXPECT_EQ(ProgressLine::format_duration(-1), "?");
}

}  // namespace
}  // namespace hsgd::apps
