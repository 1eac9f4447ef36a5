// hsgd-run and hsgd-rendezvous read one --token-file by one rule
// (comm/rendezvous/rendezvous_server_tokens.h): a trailing tab, CRLF, comments or per-job lines
// must mean the same token to both, and a job's own line is the token hsgd-run presents. All
// processes are real and started through Command, which kills them at the end of the test at the
// latest.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "command.h"
#include "tests/support/multiprocess.h"

namespace hsgd::testing {
namespace {

using std::chrono::seconds;
namespace fs = std::filesystem;

const std::string kRun = HSGD_RUN_PATH;
const std::string kRendezvous = HSGD_RENDEZVOUS_PATH;
const std::string kWorker = LAUNCHER_TEST_WORKER_PATH;

struct Rendezvous {
  Command command;
  int port = 0;
};

Rendezvous start_rendezvous(const fs::path& token_file) {
  auto cmd = Command::start(
      {kRendezvous, "--host", "127.0.0.1", "--port", "0", "--token-file", token_file.string()});
  EXPECT_TRUE(cmd.wait_for_output("\n", seconds(30))) << cmd.output();
  std::smatch m;
  const std::string out = cmd.output();
  EXPECT_TRUE(std::regex_search(out, m, std::regex("listening on 127\\.0\\.0\\.1:(\\d+)"))) << out;
  return Rendezvous{std::move(cmd), m.empty() ? 0 : std::stoi(m[1])};
}

// One node of 2 workers against server with the given token file and job id.
Command::Result run_job(int port, const fs::path& token_file, const std::string& job,
                        const fs::path& dir) {
  return Command::start({kRun, "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-endpoint",
                         "127.0.0.1:" + std::to_string(port), "--rdzv-id", job, "--rdzv-timeout",
                         "30", "--token-file", token_file.string(), "--", kWorker, "allreduce",
                         dir.string()})
      .wait(seconds(90));
}

// hsgd-run took the first line minus '\r' and ' ', hsgd-rendezvous the whole file minus trailing
// whitespace: a trailing tab gave "invalid token".
TEST(HsgdRunTokenFileTest, TrailingTabAndCrlf_MeanTheSameTokenToRunAndServer) {
  const auto dir = unique_temp_dir("hsgd_run_token_tab");
  std::ofstream(dir / "token") << "tok-123 \t\r\n";
  auto server = start_rendezvous(dir / "token");
  ASSERT_GT(server.port, 0);
  const auto result = run_job(server.port, dir / "token", "tab-job", dir);
  EXPECT_TRUE(result.status.success()) << show(result);
  EXPECT_TRUE(fs::exists(dir / "allreduce_rank1")) << show(result);
}

TEST(HsgdRunTokenFileTest, PerJobLines_RunPresentsItsJobsToken) {
  const auto dir = unique_temp_dir("hsgd_run_token_jobs");
  std::ofstream(dir / "tokens") << "# one line per job\nother-job tok-x\ntoken-job tok-r\n";
  auto server = start_rendezvous(dir / "tokens");
  ASSERT_GT(server.port, 0);
  const auto ok = run_job(server.port, dir / "tokens", "token-job", dir);
  EXPECT_TRUE(ok.status.success()) << show(ok);
  EXPECT_TRUE(fs::exists(dir / "allreduce_rank1")) << show(ok);
  // A job without a line (and no server-wide token) fails before any network step.
  const auto missing = run_job(server.port, dir / "tokens", "third-job", dir);
  EXPECT_FALSE(missing.status.success()) << show(missing);
  EXPECT_NE(missing.output.find("third-job"), std::string::npos) << show(missing);
  EXPECT_NE(missing.output.find("token"), std::string::npos) << show(missing);
}

// A wrong token is a refusal by a server that answered, not a reachability problem: it is said
// so at once, without waiting out --rdzv-timeout.
TEST(HsgdRunTokenFileTest, WrongToken_IsARefusalNotUnreachable) {
  const auto dir = unique_temp_dir("hsgd_run_token_wrong");
  std::ofstream(dir / "server_tokens") << "right-token\n";
  std::ofstream(dir / "run_tokens") << "wrong-token\n";
  auto server = start_rendezvous(dir / "server_tokens");
  ASSERT_GT(server.port, 0);
  const auto start = std::chrono::steady_clock::now();
  const auto result = run_job(server.port, dir / "run_tokens", "wrong-job", dir);
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20)) << show(result);
  EXPECT_EQ(result.status.exit_code, 1) << show(result);
  EXPECT_NE(result.output.find("the rendezvous server at 127.0.0.1:" + std::to_string(server.port) +
                               " refused job 'wrong-job'"),
            std::string::npos)
      << show(result);
  EXPECT_EQ(result.output.find("cannot reach"), std::string::npos) << show(result);
}

TEST(HsgdRunTokenFileTest, Standalone_EmbeddedServerUsesTheJobsToken) {
  const auto dir = unique_temp_dir("hsgd_run_token_standalone");
  std::ofstream(dir / "tokens") << "solo-job tok-solo\nanother tok-other\n";
  const auto result = Command::start({kRun, "--standalone", "--nproc-per-node", "2", "--rdzv-id",
                                      "solo-job", "--token-file", (dir / "tokens").string(), "--",
                                      kWorker, "allreduce", dir.string()})
                          .wait(seconds(90));
  EXPECT_TRUE(result.status.success()) << show(result);
  EXPECT_TRUE(fs::exists(dir / "allreduce_rank1")) << show(result);
}

}  // namespace
}  // namespace hsgd::testing
