// The hsgd-rendezvous program: --port 0 prints "listening on HOST:PORT" first, serves clients,
// honours --token-file, and exits 0 on SIGTERM/SIGINT. Every child is killed by pid if a test
// fails (ChildProcess's destructor).

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "comm/error.h"
#include "comm/rendezvous/tcp_store.h"
#include "tests/comm/rendezvous/rendezvous_test_util.h"

namespace hsgd::comm {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;

// Parses "listening on HOST:PORT" (HOST may be [v6]); returns the port or -1.
int parse_port(const std::string& line, const std::string& host) {
  std::smatch match;
  const std::regex pattern("listening on (.+):([0-9]+)");
  if (!std::regex_match(line, match, pattern) || match[1] != host) return -1;
  return std::stoi(match[2]);
}

void expect_clean_exit(ChildProcess& child, int sig) {
  child.signal(sig);
  const auto status = child.wait(20s);
  ASSERT_TRUE(status.has_value()) << "hsgd-rendezvous did not exit after signal " << sig;
  ASSERT_TRUE(WIFEXITED(*status)) << "status " << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 0);
}

TEST(HsgdRendezvousAppTest, PortZero_PrintsPortFirst_ServesAndStopsOnSigterm) {
  ChildProcess child({HSGD_RENDEZVOUS_BIN, "--port", "0", "--insecure"});
  const auto line = child.read_line(20s);
  ASSERT_TRUE(line.has_value()) << "no first line on stdout";
  const int port = parse_port(*line, "127.0.0.1");
  ASSERT_GT(port, 0) << "first line: '" << *line << "'";
  TcpStore a({.port = port, .job_id = "app", .insecure = true, .connect_timeout = 10s});
  TcpStore b({.port = port, .job_id = "app", .insecure = true, .connect_timeout = 10s});
  a.set("k", to_bytes("v"));
  EXPECT_EQ(to_string(b.get("k", 5s)), "v");
  expect_clean_exit(child, SIGTERM);
}

TEST(HsgdRendezvousAppTest, StopsOnSigint) {
  ChildProcess child({HSGD_RENDEZVOUS_BIN, "--port", "0", "--threads", "2", "--insecure"});
  const auto line = child.read_line(20s);
  ASSERT_TRUE(line.has_value());
  ASSERT_GT(parse_port(*line, "127.0.0.1"), 0) << *line;
  expect_clean_exit(child, SIGINT);
}

// TLS keyed by the file's token: a client without it is refused, and the server's one log line
// per failed handshake names the peer and no secret.
TEST(HsgdRendezvousAppTest, TokenFile_KeysTls_RefusalsAreLoggedWithoutSecrets) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("hsgd_rdzv_app_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto token_file = dir / "token";
  std::ofstream(token_file) << "tok-123\n";  // the trailing newline is not part of the token
  const auto log = dir / "stderr";
  ChildProcess child({HSGD_RENDEZVOUS_BIN, "--port", "0", "--token-file", token_file.string()},
                     {.stderr_path = log.string()});
  const auto line = child.read_line(20s);
  ASSERT_TRUE(line.has_value());
  const int port = parse_port(*line, "127.0.0.1");
  ASSERT_GT(port, 0) << *line;
  EXPECT_THROW(TcpStore({.port = port, .token = "not-it", .connect_timeout = 10s}), CommError);
  EXPECT_THROW(TcpStore({.port = port, .insecure = true, .connect_timeout = 10s}), CommError);
  TcpStore ok({.port = port, .token = "tok-123", .connect_timeout = 10s});
  EXPECT_TRUE(ok.ping());
  expect_clean_exit(child, SIGTERM);
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  EXPECT_NE(text.find("TLS handshake with 127.0.0.1:"), std::string::npos) << text;
  EXPECT_EQ(text.find("tok-123"), std::string::npos) << text;
  EXPECT_EQ(text.find("not-it"), std::string::npos) << text;
}

// A server needs a token file or an explicit --insecure; insecure says so at start.
TEST(HsgdRendezvousAppTest, WithoutTokenFile_RefusesUnlessInsecure) {
  ChildProcess bare({HSGD_RENDEZVOUS_BIN, "--port", "0"});
  const auto status = bare.wait(20s);
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 2);
  const auto dir = std::filesystem::temp_directory_path() /
                   ("hsgd_rdzv_app_insecure_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  ChildProcess insecure({HSGD_RENDEZVOUS_BIN, "--port", "0", "--insecure"},
                        {.stderr_path = (dir / "stderr").string()});
  ASSERT_TRUE(insecure.read_line(20s).has_value());
  expect_clean_exit(insecure, SIGTERM);
  std::ifstream in(dir / "stderr");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::remove_all(dir);
  EXPECT_NE(text.find("UNENCRYPTED"), std::string::npos) << text;
}

// A refusal for a limit names the flag that sets it (the library names its option field).
TEST(HsgdRendezvousAppTest, LimitRefusals_NameTheFlag) {
  ChildProcess child({HSGD_RENDEZVOUS_BIN, "--port", "0", "--max-jobs", "1", "--insecure"});
  const auto line = child.read_line(20s);
  ASSERT_TRUE(line.has_value());
  const int port = parse_port(*line, "127.0.0.1");
  ASSERT_GT(port, 0) << *line;
  TcpStore first({.port = port, .job_id = "first", .insecure = true, .connect_timeout = 10s});
  first.set("k", to_bytes("v"));
  TcpStore second({.port = port, .job_id = "second", .insecure = true, .connect_timeout = 10s});
  try {
    second.set("k", to_bytes("v"));
    ADD_FAILURE() << "a second job was accepted with --max-jobs 1";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("its limit (--max-jobs)"), std::string::npos) << e.what();
  }
  expect_clean_exit(child, SIGTERM);
}

TEST(HsgdRendezvousAppTest, Ipv6Host_IsPrintedInBrackets) {
  ChildProcess child({HSGD_RENDEZVOUS_BIN, "--host", "::1", "--port", "0", "--insecure"});
  const auto line = child.read_line(20s);
  if (!line) {
    const auto status = child.wait(10s);
    GTEST_SKIP() << "hsgd-rendezvous could not bind ::1 (no IPv6 loopback?), status "
                 << status.value_or(-1);
  }
  const int port = parse_port(*line, "[::1]");
  ASSERT_GT(port, 0) << *line;
  TcpStore store({.host = "::1", .port = port, .insecure = true, .connect_timeout = 10s});
  EXPECT_TRUE(store.ping());
  expect_clean_exit(child, SIGTERM);
}

TEST(HsgdRendezvousAppTest, BadArguments_ExitNonZero) {
  ChildProcess child({HSGD_RENDEZVOUS_BIN, "--port", "99999"});
  const auto status = child.wait(20s);
  ASSERT_TRUE(status.has_value());
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_NE(WEXITSTATUS(*status), 0);
}

TEST(HsgdRendezvousAppTest, PortInUse_ExitsNonZero) {
  ChildProcess first({HSGD_RENDEZVOUS_BIN, "--port", "0", "--insecure"});
  const auto line = first.read_line(20s);
  ASSERT_TRUE(line.has_value());
  const int port = parse_port(*line, "127.0.0.1");
  ASSERT_GT(port, 0);
  ChildProcess second({HSGD_RENDEZVOUS_BIN, "--port", std::to_string(port), "--insecure"});
  const auto status = second.wait(20s);
  ASSERT_TRUE(status.has_value()) << "a server on a taken port must exit";
  ASSERT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 1);
  expect_clean_exit(first, SIGTERM);
}

}  // namespace
}  // namespace hsgd::comm
