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

Rendezvous start_rendezvous(const fs::path& token_file) {
  return hsgd::testing::start_rendezvous(kRendezvous, token_file.string());
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

// Every file under dir and its folders, concatenated (the run's logs).
std::string all_files(const fs::path& dir) {
  std::string out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) out += slurp(entry.path());
  }
  return out;
}

// Standalone without --token-file: hsgd-run makes a random token, its workers use it (their
// store and process group work), and it is in no process's command line nor any log line.
TEST(HsgdRunTokenFileTest, Standalone_WithoutTokenFile_MakesATokenNoCmdlineOrLogShows) {
  const auto dir = unique_temp_dir("hsgd_run_token_made");
  const auto result =
      Command::start({kRun, "--standalone", "--nproc-per-node", "2", "--log-dir",
                      (dir / "logs").string(), "--", kWorker, "secrets", dir.string()},
                     {"HSGD_TOKEN_FILE=", "HSGD_RDZV_TOKEN="})
          .wait(seconds(90));
  ASSERT_TRUE(result.status.success()) << show(result);
  const std::string first = slurp(dir / "secrets_rank0");
  const std::string second = slurp(dir / "secrets_rank1");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(first, m, std::regex("token=([0-9a-f]{64})\n"))) << first;
  const std::string token = m[1];
  EXPECT_EQ(first, second) << "both workers got the same token and saw no command line with it";
  EXPECT_EQ(first.find("command line"), std::string::npos) << first;
  EXPECT_EQ(result.output.find(token), std::string::npos) << "the token is in hsgd-run's output";
  EXPECT_EQ(all_files(dir / "logs").find(token), std::string::npos) << "the token is in a log";
  EXPECT_NE(result.output.find("TLS 1.3 keyed by a random token"), std::string::npos)
      << show(result);
}

// --insecure: plain TCP on request, said at start; the workers get HSGD_INSECURE=1 and no token.
TEST(HsgdRunTokenFileTest, Insecure_RunsPlainAndSaysSo) {
  const auto dir = unique_temp_dir("hsgd_run_insecure");
  const auto result = Command::start({kRun, "--standalone", "--insecure", "--nproc-per-node", "2",
                                      "--", kWorker, "secrets", dir.string()},
                                     {"HSGD_TOKEN_FILE=", "HSGD_RDZV_TOKEN="})
                          .wait(seconds(90));
  ASSERT_TRUE(result.status.success()) << show(result);
  EXPECT_EQ(slurp(dir / "secrets_rank0"), "token=<unset>\ninsecure=1\n");
  EXPECT_NE(result.output.find("UNENCRYPTED"), std::string::npos) << show(result);
}

// Nodes cannot share a random token: several without a token file is a usage error naming it.
TEST(HsgdRunTokenFileTest, SeveralNodesWithoutTokenFile_IsAUsageErrorNamingTheFlag) {
  const auto dir = unique_temp_dir("hsgd_run_token_none");
  const auto result = Command::start({kRun, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29400",
                                      "--", kWorker, "env", dir.string()},
                                     {"HSGD_TOKEN_FILE="})
                          .wait(seconds(30));
  EXPECT_EQ(result.status.exit_code, 2) << show(result);
  EXPECT_NE(result.output.find("--token-file"), std::string::npos) << show(result);
  const auto both = Command::start({kRun, "--insecure", "--token-file", test_token_file(), "--",
                                    kWorker, "env", dir.string()})
                        .wait(seconds(30));
  EXPECT_EQ(both.status.exit_code, 2) << show(both);
}

}  // namespace
}  // namespace hsgd::testing
