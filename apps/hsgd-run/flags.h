#pragma once
// The command line of hsgd-run: parsing and every check that can be made without the network.
//
// Contract:
// - parse_flags() returns the validated flags, or std::nullopt after printing --help. Any usage
//   error throws UsageError (hsgd-run exits 2) whose message names the flag and the value given
//   and says what was expected: an unknown flag, no program, a program that is missing or not
//   executable, numbers out of range or not finite, an endpoint without host or with a bad port,
//   an invalid --rdzv-id, an unreadable --token-file or one without a token for this job, an
//   unwritable --log-dir (probed by creating a file in it), and inconsistent node flags.
// - Nothing is sent over the network: every usage error surfaces before the first connection.
// - Under srun (comm/process_group/slurm_env.h), what the command line and HSGD_* left unset comes
// from the
//   step before the checks run.
//
// Usage (in main(argc, argv)):
//   std::optional<Flags> flags = parse_flags(argc, argv);   // throws UsageError
//   if (!flags) return 0;                                   // --help

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/launcher/launcher_names.h"
#include "comm/rendezvous/rendezvous_server_tokens.h"
#include "comm/tls/tls.h"

namespace hsgd::run {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Endpoint {
  std::string host;
  int port = 29400;
};

struct Flags {
  bool standalone = false;
  int nnodes = 1;  // the maximum in elastic mode
  // --nnodes MIN:MAX with MIN < MAX: elastic membership (comm/launcher/elastic_agent.h); N and
  // N:N are a fixed number of nodes.
  bool elastic = false;
  int min_nodes = 1;
  int max_nodes = 1;
  double last_call = 2;  // seconds (--rdzv-last-call)
  int nproc_per_node = 1;
  int node_rank = -1;  // -1: by order of arrival
  int max_restarts = 0;
  std::string endpoint;  // as given; empty when embedded
  std::string rdzv_id = "default";
  std::string log_dir;
  std::string token_file;
  bool insecure = false;        // plain TCP, no token (--insecure)
  comm::tls::CertificateFiles certificates;  // --tls-cert, --tls-key, --tls-ca (all or none)
  double rdzv_timeout = 300;    // seconds
  double grace_period = 10;     // seconds
  double heartbeat = 30;        // seconds
  double worker_timeout = 120;  // seconds; 0 = off
  long long tail_lines = 20;
  std::vector<std::string> program;  // argv of the worker program, program[0] resolved

  // Derived by parse_flags.
  bool embedded = false;     // run an embedded server on 127.0.0.1 (--standalone)
  bool host_server = false;  // this node hosts the server at `store_at` (node 0 of a Slurm step or
                             // of a job started through PET_* variables, see torch_env.h)
  Endpoint store_at;         // parsed endpoint (unset when embedded)
  comm::TokenTable tokens;
  std::string token;             // this job's token ("" only when insecure)
  bool generated_token = false;  // made by this hsgd-run (one node, no --token-file)
};

std::optional<Flags> parse_flags(int argc, char** argv);

// How the launcher library names hsgd-run and its settings in logs and errors: by the flags.
comm::launcher::LauncherNames flag_names();

// --nnodes and PET_NNODES: "N" or "MIN:MAX" with 1 <= MIN <= MAX. Sets nnodes (MAX), min_nodes,
// max_nodes and elastic (MIN < MAX) in flags; UsageError starting with `label` (how the value was
// given, e.g. "--nnodes '3:2'") otherwise.
void set_nnodes(Flags& flags, const std::string& text, const std::string& label);

// "host:port", "host" (default port) or "[v6addr]:port"; UsageError naming `flag` otherwise.
Endpoint parse_endpoint(const std::string& text, const std::string& flag = "--rdzv-endpoint");

}  // namespace hsgd::run
