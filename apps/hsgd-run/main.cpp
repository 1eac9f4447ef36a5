// hsgd-run: starts the workers of a data-parallel hsgd job on this node, like torchrun.
// See `hsgd-run --help`. The work is done by comm::launcher::LaunchAgent (ElasticAgent with
// --nnodes MIN:MAX); this file parses the command line (flags.h), sets up the store (embedded
// server with --standalone) and forwards signals.

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "apps/hsgd-run/flags.h"
#include "comm/error.h"
#include "comm/launcher/agent.h"
#include "comm/launcher/elastic_agent.h"
#include "comm/launcher/worker_process.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/tcp_store.h"

namespace {

using hsgd::comm::launcher::AgentOptions;
using hsgd::comm::launcher::ElasticAgent;
using hsgd::comm::launcher::LaunchAgent;
using hsgd::run::Endpoint;
using hsgd::run::Flags;

std::chrono::milliseconds seconds_to_ms(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
}

// Waits for SIGINT/SIGTERM/SIGUSR1 (blocked in every thread) and hands them to the agent, which
// forwards them to the workers: SIGUSR1 and SIGTERM are how Slurm announces a preemption or the
// end of the time limit (--signal=B:USR1@60 through the batch script, SIGTERM before SIGKILL).
class SignalForwarder {
 public:
  explicit SignalForwarder(std::function<void(int)> request_stop)
      : thread_([this, request_stop = std::move(request_stop)] {
          sigset_t set;
          sigemptyset(&set);
          sigaddset(&set, SIGINT);
          sigaddset(&set, SIGTERM);
          sigaddset(&set, SIGUSR1);
          const timespec tick{0, 100'000'000};
          while (!done_.load()) {
            int sig = sigtimedwait(&set, nullptr, &tick);
            if (sig > 0) request_stop(sig);
          }
        }) {}
  ~SignalForwarder() {
    done_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// The agent's options from the validated flags; store_at is where the workers find the store.
AgentOptions agent_options(const Flags& f, const Endpoint& store_at) {
  return AgentOptions{
      .nnodes = f.nnodes,
      .nproc_per_node = f.nproc_per_node,
      .node_rank = f.node_rank,
      .run_id = f.rdzv_id,
      .max_restarts = f.max_restarts,
      .rdzv_timeout = seconds_to_ms(f.rdzv_timeout),
      .grace_period = seconds_to_ms(f.grace_period),
      .heartbeat_timeout = seconds_to_ms(f.heartbeat),
      .worker_timeout = seconds_to_ms(f.worker_timeout),
      .min_nodes = f.min_nodes,
      .max_nodes = f.max_nodes,
      .last_call = seconds_to_ms(f.last_call),
      .master_addr = store_at.host,
      .master_port = store_at.port,
      .token = f.token,
      .token_file = f.token_file,
      .insecure = f.insecure,
      .program = f.program,
      .output = {.log_dir = f.log_dir, .tail_lines = static_cast<size_t>(f.tail_lines)},
      .names = hsgd::run::flag_names()};
}

int run(int argc, char** argv) {
  // Every usage error throws hsgd::run::UsageError here, before any network step.
  const std::optional<Flags> parsed = hsgd::run::parse_flags(argc, argv);
  if (!parsed) return 0;  // --help
  const Flags& f = *parsed;

  // SIGINT/SIGTERM/SIGUSR1 go to the forwarding thread only: block them before any thread
  // starts.
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  sigaddset(&blocked, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed terminal must not kill the launcher (and its workers)

  const unsigned cores = std::thread::hardware_concurrency();
  if (cores > 0 && static_cast<unsigned>(f.nproc_per_node) > cores) {
    std::cerr << "hsgd-run: warning: --nproc-per-node " << f.nproc_per_node << " on a machine with "
              << cores << " cores: the " << f.nproc_per_node << " workers share " << cores
              << " cores (one intra-op thread each), so each computes more slowly than alone\n";
  }

  // Certificates: the servers and stores below, and every worker (through its environment).
  const bool certificates = !f.certificates.certificate.empty();
  if (certificates) {
    try {
      hsgd::comm::tls::set_certificate_environment(f.certificates);
    } catch (const hsgd::comm::tls::Failure& e) {
      throw hsgd::run::UsageError(std::string("--tls-cert/--tls-key/--tls-ca: ") + e.what());
    }
  }

  std::unique_ptr<hsgd::comm::RendezvousServer> server;
  Endpoint store_at = f.store_at;
  if (f.embedded) {
    if (!f.endpoint.empty()) {
      std::cerr << "hsgd-run: --standalone ignores --rdzv-endpoint " << f.endpoint << "\n";
    }
    server = std::make_unique<hsgd::comm::RendezvousServer>(
        hsgd::comm::RendezvousServerOptions{.host = "127.0.0.1",
                                            .port = 0,
                                            .token = f.tokens.server_token,
                                            .job_tokens = f.tokens.job_tokens,
                                            .insecure = f.insecure});
    server->start();
    store_at = Endpoint{"127.0.0.1", server->port()};
  } else if (f.host_server) {
    server = std::make_unique<hsgd::comm::RendezvousServer>(hsgd::comm::RendezvousServerOptions{
        .host = store_at.host, .port = store_at.port, .token = f.token, .insecure = f.insecure});
    server->start();
  }
  // The start-up line: how this job's connections are protected (never the token itself).
  if (f.insecure) {
    std::cerr << "hsgd-run: --insecure: this job's connections are UNENCRYPTED and "
                 "unauthenticated (plain TCP): anyone who reaches "
              << store_at.host << ":" << store_at.port << " can read and write its store\n";
  } else {
    const char* token = f.generated_token ? "a random token made for this run"
                                          : "the token of --token-file";
    if (certificates) {
      std::cerr << "hsgd-run: job '" << f.rdzv_id
                << "': connections are TLS 1.3 with certificates verified against --tls-ca '"
                << f.certificates.authority << "', identities bound to " << token << "\n";
    } else {
      std::cerr << "hsgd-run: job '" << f.rdzv_id << "': connections are TLS 1.3 keyed by "
                << token << "\n";
    }
  }

  std::shared_ptr<hsgd::comm::TcpStore> store;
  try {
    store = std::make_shared<hsgd::comm::TcpStore>(
        hsgd::comm::TcpStoreOptions{.host = store_at.host,
                                    .port = store_at.port,
                                    .job_id = f.rdzv_id,
                                    .token = f.token,
                                    .name = "agent",
                                    .insecure = f.insecure,
                                    .connect_timeout = seconds_to_ms(f.rdzv_timeout),
                                    .timeout = std::chrono::seconds(60),
                                    .reconnect_timeout_name = "--rdzv-timeout"});
  } catch (const hsgd::Timeout& e) {
    std::ostringstream msg;
    msg << "cannot reach the rendezvous endpoint " << store_at.host << ":" << store_at.port
        << " within " << f.rdzv_timeout << " s (--rdzv-timeout): " << e.what();
    throw hsgd::CommError(msg.str());
  } catch (const hsgd::CommError& e) {
    // The server answered and said no (a wrong token, another protocol version): retrying or
    // waiting longer cannot help.
    std::ostringstream msg;
    msg << "the rendezvous server at " << store_at.host << ":" << store_at.port << " refused job '"
        << f.rdzv_id << "': " << e.what();
    throw hsgd::CommError(msg.str());
  }

  const AgentOptions options = agent_options(f, store_at);
  int code = 0;
  if (f.elastic) {
    ElasticAgent agent(options, store);
    SignalForwarder forwarder([&agent](int sig) { agent.request_stop(sig); });
    code = agent.run();
  } else {
    LaunchAgent agent(options, store);
    SignalForwarder forwarder([&agent](int sig) { agent.request_stop(sig); });
    code = agent.run();
  }
  if (f.host_server) {
    // The other nodes may still be reading the last "done" keys: serve them until they left
    // (this process's own store is the one connection left), for a heartbeat timeout at most.
    const auto deadline = std::chrono::steady_clock::now() + seconds_to_ms(f.heartbeat);
    while (server->num_connections() > 1 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const hsgd::run::UsageError& e) {
    // A usage error exits 2, like argparse (and so torchrun).
    std::cerr << "hsgd-run: error: " << e.what() << " (see hsgd-run --help)" << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "hsgd-run: error: " << e.what() << std::endl;
    return 1;
  }
}
