// Replays the committed seed corpus of the rendezvous fuzz target (corpus/, written by
// make_seeds.py; inputs the fuzzer found worth keeping may be added) through the server's frame
// decoder and dispatcher, in the normal suite with the normal compiler. Every input must run
// without crash or exception; the named seeds must take the protocol path they are named after.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "tests/comm/rendezvous/fuzz/rendezvous_fuzz_input.h"

namespace hsgd::comm::fuzz {
namespace {

namespace fs = std::filesystem;

std::map<std::string, std::vector<uint8_t>> corpus() {
  std::map<std::string, std::vector<uint8_t>> inputs;
  for (const auto& entry : fs::directory_iterator(HSGD_FUZZ_CORPUS_DIR)) {
    std::ifstream in(entry.path(), std::ios::binary);
    inputs[entry.path().filename().string()] =
        std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
  }
  return inputs;
}

Summary run(const std::vector<uint8_t>& input) { return run_input(input.data(), input.size()); }

TEST(RendezvousFuzzReplayTest, EveryCorpusInputRuns) {
  const auto inputs = corpus();
  ASSERT_GE(inputs.size(), 11u) << "the seeds of make_seeds.py are missing";
  for (const auto& [name, input] : inputs) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(run(input));
  }
}

TEST(RendezvousFuzzReplayTest, SeedsTakeTheirPaths) {
  auto inputs = corpus();
  auto s = run(inputs.at("hello_set_get"));
  EXPECT_TRUE(s.accepted);
  EXPECT_EQ(s.responses_ok, 2);
  EXPECT_FALSE(s.closed);

  s = run(inputs.at("hello_unproven_job"));
  EXPECT_EQ(s.refused, 1);
  EXPECT_TRUE(s.closed);
  EXPECT_EQ(s.responses_ok, 0);

  s = run(inputs.at("hello_bad_job_id"));
  EXPECT_EQ(s.refused, 1);

  s = run(inputs.at("hello_old_version"));
  EXPECT_EQ(s.refused, 1);

  s = run(inputs.at("prelogin_8mib"));
  EXPECT_TRUE(s.closed);
  EXPECT_EQ(s.frames, 0);

  s = run(inputs.at("garbage_after_hello"));
  EXPECT_TRUE(s.accepted);
  EXPECT_TRUE(s.closed);

  s = run(inputs.at("wait_then_set"));
  EXPECT_EQ(s.waiters, 1);
  EXPECT_EQ(s.async_replies, 1) << "the multi_set must wake the wait";
  EXPECT_EQ(s.responses_ok, 1);

  s = run(inputs.at("huge_timeout"));
  EXPECT_EQ(s.waiters, 1);
  EXPECT_EQ(s.async_replies, 0) << "a 2^63-1 ms timeout must not expire at once";

  s = run(inputs.at("zero_timeout"));
  EXPECT_EQ(s.waiters, 1);
  EXPECT_EQ(s.async_replies, 1) << "a 0 ms timeout answers TIMEOUT at once";

  s = run(inputs.at("quota_keys"));
  EXPECT_EQ(s.responses_invalid, 1) << "65 keys break the fuzz server's 64-key quota";

  s = run(inputs.at("add_compare_delete"));
  EXPECT_EQ(s.responses_ok, 5);
}

}  // namespace
}  // namespace hsgd::comm::fuzz
