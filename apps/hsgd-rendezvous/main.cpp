// hsgd-rendezvous: the standalone rendezvous server of hsgd jobs (comm/rendezvous_server.h).
//
//   hsgd-rendezvous --host 127.0.0.1 --port 29400 [--token-file F] [--max-frame-bytes N]
//                   [--threads N]
//
// The first line on stdout is "listening on HOST:PORT" (IPv6 hosts in brackets), printed once
// the server accepts connections, so a script can start it with --port 0 and read the port.
// SIGTERM or SIGINT stops it cleanly (exit code 0).

#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "comm/error.h"
#include "comm/log.h"
#include "comm/rendezvous_server.h"

namespace {

// The token is the file's contents without trailing whitespace (a trailing newline is what
// editors and `echo` add).
std::string read_token(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HSGD_CHECK(in.good(), "hsgd-rendezvous: cannot read --token-file '", path, "'");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string token = buffer.str();
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) {
    token.pop_back();
  }
  HSGD_CHECK(!token.empty(), "hsgd-rendezvous: --token-file '", path, "' is empty");
  return token;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hsgd rendezvous server: the key-value store hsgd jobs meet through"};
  hsgd::comm::RendezvousServerOptions options;
  std::string token_file;
  app.add_option("--host", options.host, "address to bind (127.0.0.1, ::1, 0.0.0.0, ...)")
      ->capture_default_str();
  app.add_option("--port", options.port, "port to listen on; 0 picks a free port")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--token-file", token_file, "file holding the token clients must present")
      ->check(CLI::ExistingFile);
  app.add_option("--max-frame-bytes", options.max_frame_bytes,
                 "largest frame accepted; larger ones close the connection")
      ->capture_default_str();
  app.add_option("--max-key-bytes", options.max_key_bytes, "longest key accepted")
      ->capture_default_str();
  app.add_option("--threads", options.threads, "I/O threads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  int64_t job_ttl_s = 3600;
  app.add_option("--job-ttl", job_ttl_s,
                 "seconds a job's keys are kept after its last client disconnected (0: forever)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{365} * 24 * 3600));
  CLI11_PARSE(app, argc, argv);
  options.idle_job_ttl = std::chrono::seconds(job_ttl_s);

  // Block the stop signals before the server starts its threads (they inherit the mask), then
  // wait for them synchronously here: no signal handler, no global flag.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  try {
    if (!token_file.empty()) options.token = read_token(token_file);
    hsgd::comm::RendezvousServer server(options);
    server.start();
    const std::string host = server.host();
    const bool v6 = host.find(':') != std::string::npos;
    std::cout << "listening on " << (v6 ? "[" + host + "]" : host) << ":" << server.port()
              << std::endl;  // flushed: a parent process reads this line
    int signal = 0;
    sigwait(&stop_signals, &signal);
    hsgd::comm::logger()->info("hsgd-rendezvous: received {}, stopping",
                               signal == SIGTERM ? "SIGTERM" : "SIGINT");
    server.stop();
  } catch (const hsgd::Error& e) {
    std::cerr << "hsgd-rendezvous: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
