#pragma once
// Helpers shared by the rendezvous server and TcpStore suites: a raw protocol client (to send
// malformed frames the real client never would), a bounded polling helper for test conditions,
// and a child-process handle that always kills what it started.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/rendezvous/proto/rendezvous.pb.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/tcp_store.h"

namespace hsgd::comm::testing {

// The server-wide token of start_server()'s servers.
inline constexpr char kTestToken[] = "test-token";

// An in-process TLS server on a free port (options.port is overridden), started. Without a
// token in options, kTestToken is its server-wide token.
std::unique_ptr<RendezvousServer> start_server(RendezvousServerOptions options = {});
// The same, insecure (plain TCP): for tests that speak raw frames with RawClient.
std::unique_ptr<RendezvousServer> start_plain_server(RendezvousServerOptions options = {});

// A TcpStore client of `server` for `job` (10 s to connect, 20 s per request), TLS keyed by
// token, or plain when the server is insecure.
TcpStoreOptions client_options(const RendezvousServer& server, std::string job = "job",
                               std::string token = kTestToken);

// Waits until condition() is true or the deadline passes; returns the last value. Used only for
// conditions the server reaches asynchronously (connection counts), never for timing claims.
bool eventually(const std::function<bool()>& condition,
                std::chrono::milliseconds deadline = std::chrono::seconds(20));

// A plain blocking TCP socket speaking raw frames, with a receive timeout on every read (to an
// insecure server; to a TLS server it is the outsider without a key).
class RawClient {
 public:
  RawClient(const std::string& host, int port);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void send_bytes(const std::string& bytes);
  // Sends header + payload as one frame.
  void send_frame(const std::string& payload);
  // Hello with the given fields; returns the server's reply.
  proto::HelloReply hello(const std::string& job, uint32_t version = 0 /* 0 = current */);
  // Reads one frame; std::nullopt when the server closed the connection.
  std::optional<std::string> read_frame(
      std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // True when the server closed the connection (EOF) within the timeout.
  bool closed_by_server(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  void close();

 private:
  int fd_ = -1;
};

struct ChildOptions {
  std::string stderr_path = {};  // non-empty: the child's stderr goes to this file (truncated)
  int max_open_files = 0;        // > 0: the child's RLIMIT_NOFILE (soft and hard), set before exec
};

// A child process whose stdout is a pipe. The destructor SIGKILLs it (by pid) if still running.
class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& argv, const ChildOptions& options = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // One line of stdout (without the newline), or std::nullopt at EOF or timeout.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout);
  void signal(int sig);
  // Waits for exit; returns the exit status as from waitpid, or std::nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  pid_t pid() const { return pid_; }

  // Resident set size in bytes (VmRSS of /proc/PID/status); 0 when it cannot be read.
  size_t rss_bytes() const;
  // User + system CPU time consumed so far (/proc/PID/stat), in seconds.
  double cpu_seconds() const;

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buffer_;
  bool exited_ = false;
};

}  // namespace hsgd::comm::testing
