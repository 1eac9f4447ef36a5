// The hsgd-rendezvous program under resource attacks, observed from outside: its RSS
// while clients announce frames they never send, its log and CPU while it has no file
// descriptor left, and per-job tokens read from --token-file. The server is a child process so
// that its RSS, CPU time and file-descriptor limit are its own; ChildProcess kills it by pid.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "comm/rendezvous/frame.h"
#include "comm/rendezvous/tcp_store.h"
#include "tests/comm/rendezvous/rendezvous_test_util.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;
using testing::ChildOptions;
using testing::ChildProcess;
using testing::RawClient;
namespace fs = std::filesystem;

const std::string kServer = HSGD_RENDEZVOUS_BIN;

fs::path temp_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() /
                   ("hsgd_rdzv_resources_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// Reads "listening on HOST:PORT"; returns the port or -1.
int read_port(ChildProcess& child) {
  const auto line = child.read_line(20s);
  if (!line) return -1;
  std::smatch match;
  static const std::regex pattern("listening on .+:([0-9]+)");
  if (!std::regex_match(*line, match, pattern)) return -1;
  return std::stoi(match[1]);
}

int count_lines_containing(const fs::path& file, const std::string& text) {
  std::ifstream in(file);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find(text) != std::string::npos ? 1 : 0;
  return n;
}

void expect_clean_exit(ChildProcess& child) {
  child.signal(SIGTERM);
  const auto status = child.wait(20s);
  ASSERT_TRUE(status.has_value()) << "hsgd-rendezvous did not exit after SIGTERM";
  ASSERT_TRUE(WIFEXITED(*status)) << "status " << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

// ---- 1. memory before (and after) login ----

// 20 connections announce 8 MiB before their handshake and 20 after it, then send 10 bytes.
// The server held (and zero-filled) 8 MiB for each: 320 MB. It may only hold what arrived.
TEST(HsgdRendezvousResourcesTest, AnnouncedButUnsentFrames_DoNotGrowRss) {
  ChildProcess server({kServer, "--port", "0", "--insecure"});
  const int port = read_port(server);
  ASSERT_GT(port, 0);
  {
    TcpStore warm({.port = port, .job_id = "warm", .insecure = true, .connect_timeout = 10s});
    ASSERT_TRUE(warm.ping());
  }
  const size_t before = server.rss_bytes();
  ASSERT_GT(before, 0u);
  const auto header = encode_frame_header(8u << 20);
  const std::string announce = std::string(header.begin(), header.end()) + "0123456789";
  std::vector<std::unique_ptr<RawClient>> clients;
  for (int i = 0; i < 40; ++i) {
    clients.push_back(std::make_unique<RawClient>("127.0.0.1", port));
    if (i % 2 == 1) {
      ASSERT_TRUE(clients.back()->hello("job").accepted());
    }
    clients.back()->send_bytes(announce);
  }
  // The server reads in arrival order on one thread: once a later client is served, every
  // announcement above has been read.
  TcpStore probe({.port = port, .job_id = "probe", .insecure = true, .connect_timeout = 10s});
  ASSERT_TRUE(probe.ping());
  std::this_thread::sleep_for(500ms);
  const size_t after = server.rss_bytes();
  EXPECT_LT(after, before + (32u << 20))
      << "RSS grew from " << before / 1024 << " KiB to " << after / 1024 << " KiB";
  expect_clean_exit(server);
}

// ---- 2. out of file descriptors ----

struct FloodResult {
  int accept_log_lines = 0;
  double cpu_seconds = 0;
  bool served_after = false;
};

// Starts hsgd-rendezvous with 64 file descriptors, holds 80 idle connections for 3 s, closes
// them, then checks a client is served.
FloodResult flood(const std::vector<std::string>& extra_args, const fs::path& log) {
  std::vector<std::string> argv = {kServer, "--port", "0", "--insecure"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  ChildProcess server(argv, ChildOptions{.stderr_path = log.string(), .max_open_files = 64});
  const int port = read_port(server);
  EXPECT_GT(port, 0) << "log: " << log;
  FloodResult result;
  if (port <= 0) return result;
  const double cpu_before = server.cpu_seconds();
  {
    std::vector<std::unique_ptr<RawClient>> flood;
    for (int i = 0; i < 80; ++i) flood.push_back(std::make_unique<RawClient>("127.0.0.1", port));
    std::this_thread::sleep_for(3s);
    result.cpu_seconds = server.cpu_seconds() - cpu_before;
  }
  try {
    TcpStore store({.port = port, .job_id = "after", .insecure = true, .connect_timeout = 20s});
    store.set("k", to_bytes("v"));
    result.served_after = to_string(store.get("k", 5s)) == "v";
  } catch (const Error& e) {
    ADD_FAILURE() << "no client served after the flood: " << e.what();
  }
  result.accept_log_lines = count_lines_containing(log, "accept");
  expect_clean_exit(server);
  return result;
}

// The default --max-connections comes from the fd limit: the server stops accepting before it
// runs out, instead of spinning on EMFILE (757,004 log lines in 3 s at 60% CPU).
TEST(HsgdRendezvousResourcesTest, FdExhaustion_DefaultConnectionCap_NoSpin) {
  const auto dir = temp_dir("fd_default");
  const auto result = flood({}, dir / "stderr.log");
  EXPECT_LE(result.accept_log_lines, 5) << "see " << dir / "stderr.log";
  EXPECT_LT(result.cpu_seconds, 1.0);
  EXPECT_TRUE(result.served_after);
  if (!HasFailure()) fs::remove_all(dir);
}

// With a cap above the fd limit the server does hit EMFILE: it backs off and logs once per
// interval, and accepts again once descriptors are free.
TEST(HsgdRendezvousResourcesTest, FdExhaustion_CapAboveLimit_BacksOffAndLogsOnce) {
  const auto dir = temp_dir("fd_emfile");
  const auto result = flood({"--max-connections", "1000"}, dir / "stderr.log");
  EXPECT_GE(result.accept_log_lines, 1) << "EMFILE must be logged; see " << dir / "stderr.log";
  EXPECT_LE(result.accept_log_lines, 5) << "see " << dir / "stderr.log";
  EXPECT_LT(result.cpu_seconds, 1.0);
  EXPECT_TRUE(result.served_after);
  if (!HasFailure()) fs::remove_all(dir);
}

// ---- 5. per-job tokens ----

std::string refusal(int port, const std::string& job, const std::string& token) {
  try {
    TcpStore store({.port = port, .job_id = job, .token = token, .connect_timeout = 10s});
    return "";
  } catch (const CommError& e) {
    return e.what();
  }
}

TEST(HsgdRendezvousResourcesTest, TokenFile_PerJobTokensIsolateJobs) {
  const auto dir = temp_dir("tokens");
  std::ofstream(dir / "tokens") << "# job tokens\n"
                                   "job-a  tok-a\n"
                                   "job-b\ttok-b \r\n"
                                   "\n"
                                   "admin-token\n";
  ChildProcess server({kServer, "--port", "0", "--token-file", (dir / "tokens").string()});
  const int port = read_port(server);
  ASSERT_GT(port, 0);
  EXPECT_EQ(refusal(port, "job-a", "tok-a"), "");
  EXPECT_EQ(refusal(port, "job-b", "tok-b"), "");
  EXPECT_EQ(refusal(port, "job-c", "admin-token"), "");  // the server-wide token: other jobs
  EXPECT_NE(refusal(port, "job-a", "admin-token").find("refused the TLS handshake"),
            std::string::npos);  // a job with its own line: that token only
  // A client holding job A's token cannot touch job B, nor a job without an entry.
  EXPECT_NE(refusal(port, "job-b", "tok-a").find("refused the TLS handshake"), std::string::npos);
  EXPECT_NE(refusal(port, "job-c", "tok-a").find("refused the TLS handshake"), std::string::npos);
  {
    TcpStore a({.port = port, .job_id = "job-a", .token = "tok-a", .connect_timeout = 10s});
    TcpStore b({.port = port, .job_id = "job-b", .token = "tok-b", .connect_timeout = 10s});
    a.set("k", to_bytes("from a"));
    EXPECT_FALSE(b.check({"k"}));
  }
  expect_clean_exit(server);
  fs::remove_all(dir);
}

TEST(HsgdRendezvousResourcesTest, TokenFile_MalformedIsAUsageErrorNamingTheLine) {
  const auto dir = temp_dir("bad_tokens");
  std::ofstream(dir / "tokens") << "job-a tok-a\njob-b tok-b extra\n";
  ChildProcess server({kServer, "--port", "0", "--token-file", (dir / "tokens").string()},
                      ChildOptions{.stderr_path = (dir / "stderr.log").string()});
  const auto status = server.wait(20s);
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 2);
  EXPECT_EQ(count_lines_containing(dir / "stderr.log", "line 2"), 1);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hsgd::comm
