// hsgd-run: starts the workers of a data-parallel hsgd job on this node, like torchrun.
// See `hsgd-run --help`. The work is done by comm::launcher::LaunchAgent; this file parses the
// command line, sets up the store (embedded server with --standalone) and forwards signals.

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/error.h"
#include "comm/launcher/agent.h"
#include "comm/launcher/worker_process.h"
#include "comm/rendezvous_server.h"
#include "comm/rendezvous_server_tokens.h"
#include "comm/slurm_env.h"
#include "comm/tcp_store.h"

namespace {

using hsgd::comm::launcher::AgentOptions;
using hsgd::comm::launcher::LaunchAgent;

constexpr int kDefaultPort = 29400;

const char* kExamples = R"(Examples:
  # one machine, 4 workers (standalone: an embedded rendezvous server on a free port)
  hsgd-run --nproc-per-node 4 -- ./train_mlp --epochs 2

  # two machines with 4 workers each: start the server once, then hsgd-run on every machine
  hsgd-rendezvous --host 0.0.0.0 --port 29400
  hsgd-run --nnodes 2 --nproc-per-node 4 --rdzv-endpoint node0:29400 --rdzv-id job42 \
           --max-restarts 3 -- ./train_mlp --mode hierarchical --hierarchy 2:4,8:8

  # inside a Slurm allocation: one hsgd-run per node; --nnodes, the node rank, the endpoint and
  # the job id come from the step (node 0 hosts the rendezvous server, see scripts/slurm/)
  srun --ntasks-per-node=1 hsgd-run --nproc-per-node 4 -- ./train_mlp --mode hierarchical

  # every flag can also come from the environment
  HSGD_NPROC_PER_NODE=2 HSGD_LOG_DIR=/tmp/logs hsgd-run -- ./train_mlp

Workers get RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, HSGD_RUN_ID, HSGD_JOB_ID, HSGD_RESTART_COUNT, HSGD_MAX_RESTARTS (and
OMP_NUM_THREADS=HSGD_NUM_THREADS=OPENBLAS_NUM_THREADS=1 when --nproc-per-node > 1 and unset).
Exit code: 0 when every worker on every node exited 0; 1 on failure; 2 on a usage error;
128+N after signal N.)";

struct Endpoint {
  std::string host;
  int port = kDefaultPort;
};

// "host:port", "host" (default port) or "[v6addr]:port".
Endpoint parse_endpoint(const std::string& text) {
  Endpoint e;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    HSGD_CHECK(close != std::string::npos, "hsgd-run: --rdzv-endpoint '", text,
               "' has no closing ']'; expected [ADDR]:PORT");
    e.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      HSGD_CHECK(text[close + 1] == ':', "hsgd-run: --rdzv-endpoint '", text,
                 "': expected ':' after ']'");
      port = text.substr(close + 2);
    }
  } else {
    const auto colon = text.rfind(':');
    e.host = text.substr(0, colon);
    if (colon != std::string::npos) port = text.substr(colon + 1);
  }
  HSGD_CHECK(!e.host.empty(), "hsgd-run: --rdzv-endpoint '", text,
             "' has no host; expected HOST:PORT");
  if (!port.empty()) {
    size_t used = 0;
    try {
      e.port = std::stoi(port, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    HSGD_CHECK(used == port.size() && e.port > 0 && e.port < 65536, "hsgd-run: --rdzv-endpoint '",
               text, "' has port '", port, "'; expected a number in [1, 65535]");
  }
  return e;
}

std::chrono::milliseconds seconds_to_ms(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0));
}

// Waits for SIGINT/SIGTERM (blocked in every thread) and hands them to the agent.
class SignalForwarder {
 public:
  explicit SignalForwarder(LaunchAgent& agent)
      : thread_([this, &agent] {
          sigset_t set;
          sigemptyset(&set);
          sigaddset(&set, SIGINT);
          sigaddset(&set, SIGTERM);
          const timespec tick{0, 100'000'000};
          while (!done_.load()) {
            int sig = sigtimedwait(&set, nullptr, &tick);
            if (sig > 0) agent.request_stop(sig);
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

int run(int argc, char** argv) {
  CLI::App app{"hsgd-run: start the workers of an hsgd job on this node (like torchrun)."};
  app.footer(kExamples);
  bool standalone = false;
  int nnodes = 1, nproc = 1, node_rank = -1, max_restarts = 0;
  std::string endpoint, rdzv_id = "default", log_dir, token_file;
  double rdzv_timeout = 300, grace = 10, heartbeat = 30;
  size_t tail_lines = 20;
  app.add_flag("--standalone", standalone,
               "Embed the rendezvous server on 127.0.0.1 with a free port (the default when "
               "--nnodes is 1 and no --rdzv-endpoint is given)")
      ->envname("HSGD_STANDALONE");
  auto* nnodes_option =
      app.add_option("--nnodes", nnodes,
                     "Number of nodes (hsgd-run processes) in the job; under srun SLURM_NTASKS")
          ->envname("HSGD_NNODES")
          ->check(CLI::Range(1, 1 << 20));
  app.add_option("--nproc-per-node,--nproc_per_node", nproc, "Workers to start on this node")
      ->envname("HSGD_NPROC_PER_NODE")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", endpoint,
                 "HOST:PORT of hsgd-rendezvous (port defaults to 29400); under srun the step's "
                 "first host, where node 0 hosts the server")
      ->envname("HSGD_RDZV_ENDPOINT");
  auto* rdzv_id_option =
      app.add_option(
             "--rdzv-id,--rdzv_id", rdzv_id,
             "Job id: the nodes of one job use the same id; use a new one per job (under srun "
             "slurm-JOBID.STEPID)")
          ->envname("HSGD_RDZV_ID")
          ->capture_default_str();
  auto* node_rank_option =
      app.add_option(
             "--node-rank,--node_rank", node_rank,
             "Rank of this node; by default nodes are ranked by order of arrival (under srun "
             "SLURM_PROCID)")
          ->envname("HSGD_NODE_RANK")
          ->check(CLI::Range(0, 1 << 20));
  app.add_option("--max-restarts,--max_restarts", max_restarts,
                 "Restart the whole job (all nodes) up to this many times after a failure")
      ->envname("HSGD_MAX_RESTARTS")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--rdzv-timeout,--rdzv_timeout", rdzv_timeout,
                 "Seconds to wait for the endpoint and for all nodes to join")
      ->envname("HSGD_RDZV_TIMEOUT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--log-dir,--log_dir", log_dir,
                 "Write each rank's output to DIR/attempt_K/rank_N.log instead of the terminal")
      ->envname("HSGD_LOG_DIR");
  app.add_option("--token-file", token_file,
                 "Token file of the rendezvous server ('TOKEN' and/or 'JOB_ID TOKEN' lines, as "
                 "hsgd-rendezvous reads it); this job's token is passed to workers")
      ->envname("HSGD_TOKEN_FILE");
  app.add_option("--grace-period", grace, "Seconds between SIGTERM and SIGKILL when stopping")
      ->envname("HSGD_GRACE_PERIOD")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", heartbeat,
                 "Seconds without a heartbeat after which another node's hsgd-run counts as dead")
      ->envname("HSGD_HEARTBEAT_TIMEOUT")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--tail-lines", tail_lines, "Output lines of the failed rank shown in reports")
      ->envname("HSGD_TAIL_LINES")
      ->capture_default_str();
  // Everything from the first positional argument on (or after "--") is the worker command.
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help exits 0; a usage error exits 2, like argparse (and so torchrun).
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::vector<std::string> program = app.remaining();
  if (!program.empty() && program.front() == "--") program.erase(program.begin());
  HSGD_CHECK(!program.empty(),
             "hsgd-run: no program given; expected hsgd-run [OPTIONS] -- "
             "PROGRAM ARGS... (see --help)");

  // Started by srun inside an allocation (one hsgd-run per Slurm task): what was not given, on
  // the command line or in HSGD_*, comes from the step (comm/slurm_env.h).
  const auto slurm = standalone ? std::nullopt : hsgd::comm::slurm_step_from_env();
  bool host_slurm_server = false;  // node 0 hosts the server at the step's default endpoint
  if (slurm) {
    if (nnodes_option->count() == 0) nnodes = slurm->world_size;
    if (node_rank_option->count() == 0) node_rank = slurm->rank;
    if (rdzv_id_option->count() == 0) {
      rdzv_id = "slurm-" + std::to_string(slurm->job_id) + "." + std::to_string(slurm->step_id);
    }
    if (endpoint.empty()) {
      HSGD_CHECK(slurm->rank != 0 || slurm->node_rank == 0, "hsgd-run: srun placed task 0 on node ",
                 slurm->node_rank, ", not on the first host '", slurm->first_host(),
                 "' of SLURM_STEP_NODELIST; pass --rdzv-endpoint");
      endpoint = slurm->first_host() + ":" +
                 std::to_string(hsgd::comm::slurm_rendezvous_port(slurm->job_id, slurm->step_id));
      host_slurm_server = slurm->rank == 0;
    }
  }

  const bool embedded = standalone || (endpoint.empty() && nnodes == 1);
  HSGD_CHECK(!(embedded && nnodes > 1), "hsgd-run: --standalone runs one node, but --nnodes is ",
             nnodes, "; start hsgd-rendezvous and pass --rdzv-endpoint HOST:PORT instead");
  HSGD_CHECK(embedded || !endpoint.empty(), "hsgd-run: --nnodes ", nnodes,
             " needs --rdzv-endpoint HOST:PORT of a running hsgd-rendezvous");
  HSGD_CHECK(node_rank < nnodes, "hsgd-run: --node-rank ", node_rank, " must be in [0, ", nnodes,
             ") for --nnodes ", nnodes);
  // A typo in the program name fails now, before any server or rendezvous.
  const char* path = std::getenv("PATH");
  (void)hsgd::comm::launcher::resolve_program(program.front(), path != nullptr ? path : "");
  // One rule with hsgd-rendezvous (comm/rendezvous_server_tokens.h): this job's line, else the
  // server-wide token.
  hsgd::comm::TokenTable tokens;
  if (!token_file.empty()) tokens = hsgd::comm::read_token_file(token_file);
  const std::string token =
      tokens.token_for(rdzv_id, "hsgd-run: --token-file '" + token_file + "'");

  // SIGINT/SIGTERM go to the forwarding thread only: block them before any thread starts.
  sigset_t blocked;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed terminal must not kill the launcher (and its workers)

  std::unique_ptr<hsgd::comm::RendezvousServer> server;
  Endpoint store_at;
  if (embedded) {
    if (!endpoint.empty()) {
      std::cerr << "hsgd-run: --standalone ignores --rdzv-endpoint " << endpoint << "\n";
    }
    server = std::make_unique<hsgd::comm::RendezvousServer>(
        hsgd::comm::RendezvousServerOptions{.host = "127.0.0.1",
                                            .port = 0,
                                            .token = tokens.server_token,
                                            .job_tokens = tokens.job_tokens});
    server->start();
    store_at = Endpoint{"127.0.0.1", server->port()};
  } else {
    store_at = parse_endpoint(endpoint);
    if (host_slurm_server) {
      server = std::make_unique<hsgd::comm::RendezvousServer>(hsgd::comm::RendezvousServerOptions{
          .host = store_at.host, .port = store_at.port, .token = token});
      server->start();
    }
  }

  std::shared_ptr<hsgd::comm::TcpStore> store;
  try {
    store = std::make_shared<hsgd::comm::TcpStore>(
        hsgd::comm::TcpStoreOptions{.host = store_at.host,
                                    .port = store_at.port,
                                    .job_id = rdzv_id,
                                    .token = token,
                                    .connect_timeout = seconds_to_ms(rdzv_timeout),
                                    .timeout = std::chrono::seconds(60)});
  } catch (const hsgd::Error& e) {
    std::ostringstream msg;
    msg << "hsgd-run: cannot reach the rendezvous endpoint " << store_at.host << ":"
        << store_at.port << " within " << rdzv_timeout << " s (--rdzv-timeout): " << e.what();
    throw hsgd::CommError(msg.str());
  }

  LaunchAgent agent(AgentOptions{.nnodes = nnodes,
                                 .nproc_per_node = nproc,
                                 .node_rank = node_rank,
                                 .run_id = rdzv_id,
                                 .max_restarts = max_restarts,
                                 .rdzv_timeout = seconds_to_ms(rdzv_timeout),
                                 .grace_period = seconds_to_ms(grace),
                                 .heartbeat_timeout = seconds_to_ms(heartbeat),
                                 .master_addr = store_at.host,
                                 .master_port = store_at.port,
                                 .token = token,
                                 .token_file = token_file,
                                 .program = program,
                                 .output = {.log_dir = log_dir, .tail_lines = tail_lines}},
                    store);
  SignalForwarder forwarder(agent);
  const int code = agent.run();
  if (host_slurm_server) {
    // The other nodes may still be reading the last "done" keys: serve them until they left
    // (this process's own store is the one connection left), for a heartbeat timeout at most.
    const auto deadline = std::chrono::steady_clock::now() + seconds_to_ms(heartbeat);
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
  } catch (const std::exception& e) {
    // Library messages already start with "hsgd-run: "; say it once.
    std::string_view message = e.what();
    if (message.starts_with("hsgd-run: ")) message.remove_prefix(10);
    std::cerr << "hsgd-run: error: " << message << std::endl;
    return 1;
  }
}
