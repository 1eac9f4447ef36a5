// hsgd-rendezvous: the standalone rendezvous server of hsgd jobs
// (comm/rendezvous/rendezvous_server.h).
//
//   hsgd-rendezvous --host 127.0.0.1 --port 29400 --token-file F | --insecure
//                   [--handshake-timeout S] [--max-frame-bytes N]
//                   [--threads N] [--job-ttl S] [--max-connections N] [--max-keys-per-job N]
//                   [--max-job-bytes N] [--max-waits-per-job N] [--max-jobs N]
//
// The first line on stdout is "listening on HOST:PORT" (IPv6 hosts in brackets), printed once
// the server accepts connections, so a script can start it with --port 0 and read the port.
// The token file follows comm/rendezvous/rendezvous_server_tokens.h (a server-wide token and/or
// `JOB_ID TOKEN` lines), the same rule hsgd-run reads it by. Connections are TLS 1.3 keyed by
// those tokens (docs/security.md). Without --token-file the server refuses to start (exit 2): a
// token it made would reach no client, so the user makes one and gives it to both sides.
// --insecure serves plain TCP without authentication, and says so on stderr at start.
// SIGTERM or SIGINT stops it cleanly (exit code 0); a usage error (bad flag, malformed token
// file) exits 2, a runtime error (port taken) 1.

#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>

#include "comm/error.h"
#include "comm/log.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/rendezvous_server_tokens.h"
#include "comm/tls/tls.h"

int main(int argc, char** argv) {
  CLI::App app{"hsgd rendezvous server: the key-value store hsgd jobs meet through"};
  hsgd::comm::RendezvousServerOptions options;
  std::string token_file;
  app.add_option("--host", options.host, "address to bind (127.0.0.1, ::1, 0.0.0.0, ...)")
      ->capture_default_str();
  app.add_option("--port", options.port, "port to listen on; 0 picks a free port")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--token-file", token_file,
                 "tokens clients must present: lines 'TOKEN' (server-wide) and/or 'JOB_ID TOKEN'")
      ->check(CLI::ExistingFile);
  bool insecure = false;
  app.add_flag("--insecure", insecure,
               "plain TCP without tokens: unencrypted, anyone who reaches the port reads and "
               "writes every job (a trusted single host only)");
  hsgd::comm::tls::CertificateFiles certificates;
  app.add_option("--tls-cert", certificates.certificate,
                 "PEM certificate of this server, signed by the site's CA (with --tls-key and "
                 "--tls-ca): clients must present certificates of that CA and still prove the "
                 "job's token")
      ->envname("HSGD_TLS_CERT");
  app.add_option("--tls-key", certificates.private_key, "PEM private key of --tls-cert")
      ->envname("HSGD_TLS_KEY");
  app.add_option("--tls-ca", certificates.authority,
                 "PEM certificates of the site's CA, which clients' certificates must chain to")
      ->envname("HSGD_TLS_CA");
  double handshake_timeout_s = 60;
  app.add_option("--handshake-timeout", handshake_timeout_s,
                 "seconds a new connection has to complete its TLS handshake and Hello")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 3600.0));
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
  app.add_option("--max-connections", options.max_connections,
                 "open connections at most (0: the file-descriptor limit minus a reserve)")
      ->capture_default_str();
  app.add_option("--max-keys-per-job", options.max_keys_per_job, "keys one job may hold")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-job-bytes", options.max_job_bytes,
                 "bytes of keys, values and pending waits one job may hold")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-waits-per-job", options.max_waits_per_job,
                 "pending get/wait requests of one job")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-jobs", options.max_jobs, "jobs holding keys at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  options.limit_names = {.max_keys_per_job = "--max-keys-per-job",
                         .max_job_bytes = "--max-job-bytes",
                         .max_waits_per_job = "--max-waits-per-job",
                         .max_jobs = "--max-jobs",
                         .max_connections = "--max-connections"};
  options.idle_job_ttl = std::chrono::seconds(job_ttl_s);
  options.handshake_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(handshake_timeout_s * 1000));
  options.insecure = insecure;
  if (insecure == !token_file.empty()) {
    std::cerr << "hsgd-rendezvous: "
              << (insecure ? "--insecure takes no --token-file (plain TCP checks no token)"
                           : "give --token-file F: connections are TLS 1.3 keyed by the job "
                             "tokens in F, which hsgd-run reads too (make one with `head -c 32 "
                             "/dev/urandom | xxd -p -c 64 > F; chmod 600 F`); or --insecure "
                             "for plain TCP on a trusted host")
              << std::endl;
    return 2;
  }
  if (auto problem = hsgd::comm::tls::certificate_flags_problem(certificates)) {
    std::cerr << "hsgd-rendezvous: " << *problem << std::endl;
    return 2;
  }
  if (insecure && !certificates.certificate.empty()) {
    std::cerr << "hsgd-rendezvous: --insecure runs plain TCP, so --tls-cert would protect "
                 "nothing; drop one of them"
              << std::endl;
    return 2;
  }
  try {
    if (!certificates.certificate.empty()) {
      hsgd::comm::tls::set_certificate_environment(certificates);
    }
    if (!token_file.empty()) {
      const auto tokens =
          hsgd::comm::read_token_file(token_file, "--token-file '" + token_file + "'");
      options.token = tokens.server_token;
      options.job_tokens = tokens.job_tokens;
    }
    hsgd::comm::RendezvousServer check(options);  // validates the options, binds nothing
  } catch (const hsgd::InvalidArgument& e) {
    std::cerr << "hsgd-rendezvous: " << e.what() << std::endl;
    return 2;
  } catch (const hsgd::comm::tls::Failure& e) {
    std::cerr << "hsgd-rendezvous: --tls-cert/--tls-key/--tls-ca: " << e.what() << std::endl;
    return 2;
  }

  // Block the stop signals before the server starts its threads (they inherit the mask), then
  // wait for them synchronously here: no signal handler, no global flag.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  try {
    hsgd::comm::RendezvousServer server(options);
    server.start();
    if (insecure) {
      std::cerr << "hsgd-rendezvous: --insecure: connections are UNENCRYPTED and "
                   "unauthenticated (plain TCP)"
                << std::endl;
    }
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
