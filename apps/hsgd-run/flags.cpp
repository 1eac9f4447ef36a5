#include "apps/hsgd-run/flags.h"

#include <stdlib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <vector>

#include "apps/hsgd-run/torch_env.h"
#include "comm/error.h"
#include "comm/launcher/worker_process.h"
#include "comm/process_group/slurm_env.h"

namespace hsgd::run {
namespace {

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

  # elastic: 2 to 4 machines; a machine that fails rejoins (up to 3 times) while the others go on
  hsgd-run --nnodes 2:4 --nproc-per-node 4 --rdzv-endpoint node0:29400 --rdzv-id job43 \
           --max-restarts 3 -- ./worker   # a worker that joins generations (docs/launcher.md)

  # every flag can also come from the environment
  HSGD_NPROC_PER_NODE=2 HSGD_LOG_DIR=/tmp/logs hsgd-run -- ./train_mlp

  # and from torchrun's PET_* variables (Kubeflow's PyTorchJob sets them): PET_NNODES,
  # PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_ENDPOINT,
  # PET_RDZV_ID, PET_RDZV_BACKEND; node 0 then hosts the rendezvous server (see scripts/k8s/)

Workers get RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT, HSGD_RUN_ID, HSGD_JOB_ID, HSGD_RESTART_COUNT, HSGD_MAX_RESTARTS,
HSGD_PROGRESS_FILE (and OMP_NUM_THREADS=HSGD_NUM_THREADS=OPENBLAS_NUM_THREADS=1 when
--nproc-per-node > 1 and unset). With --nnodes MIN:MAX (elastic) also HSGD_ELASTIC_NODE_ID,
HSGD_ELASTIC_MIN_NODES, HSGD_ELASTIC_MAX_NODES and HSGD_ELASTIC_HEARTBEAT_MS; the workers then
take their ranks from the generation they join, not from RANK (see docs/launcher.md).
SIGINT, SIGTERM and SIGUSR1 are forwarded to the workers (and the other nodes stop theirs);
train_mlp and train_resnet with --checkpoint-dir take SIGTERM/SIGUSR1 as a preemption: a
checkpoint at a step boundary, then exit 75.
Exit code: 0 when every worker on every node exited 0; 75 when the job was preempted (the
workers exited 75 after a checkpoint; not restarted); 78 when a worker exited 78 (a failure a
restart would repeat; not restarted); 1 on failure; 2 on a usage error; 128+N after signal N.)";

constexpr double kYear = 365.0 * 24 * 3600;
constexpr double kDay = 24 * 3600;

template <typename... Args>
[[noreturn]] void usage_error(const Args&... args) {
  throw UsageError(str_cat(args...));
}

// Library messages may end with the failed check; keep the sentence.
std::string sentence_of(const std::exception& e) {
  std::string message = e.what();
  if (const auto check = message.find(" [check '"); check != std::string::npos) {
    message.erase(check);
  }
  return message;
}

// 0.2, 86400, 31536000, 1e+300, nan: whole numbers without an exponent while they are exact.
std::string number_text(double value) {
  std::ostringstream out;
  if (std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 1e15) {
    out << static_cast<long long>(value);
  } else {
    out << value;
  }
  return out.str();
}

void check_int(const char* flag, long long value, long long lo, long long hi) {
  if (value < lo || value > hi) {
    usage_error(flag, " ", value, ": expected an integer from ", lo, " to ", hi);
  }
}

// Seconds in [lo, hi] (lo excluded when lo_open), finite; `zero_ok` also allows 0 (= off).
void check_seconds(const char* flag, double value, double lo, bool lo_open, double hi,
                   const char* hi_words, bool zero_ok = false) {
  if (zero_ok && value == 0) return;
  const bool low = lo_open ? !(value > lo) : !(value >= lo);
  if (std::isfinite(value) && !low && value <= hi) return;
  std::string expected = lo_open ? "more than " + number_text(lo) : "at least " + number_text(lo);
  usage_error(flag, " ", number_text(value), ": expected a number of seconds, ", expected,
              " and at most ", number_text(hi), " (", hi_words, ")",
              zero_ok ? ", or 0 to turn it off" : "");
}

// Creates dir if needed and proves it writable by creating (and removing) a file in it: the
// workers' logs must not be lost after an hour of training because of a typo.
void check_log_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) usage_error("--log-dir '", dir, "': cannot create the directory: ", ec.message());
  std::string probe = dir + "/.hsgd-run-probe-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) {
    usage_error("--log-dir '", dir, "': cannot write in the directory: ", std::strerror(errno));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

// What the command line and HSGD_* did not set comes from the Slurm step, if any.
void apply_slurm(Flags& f, bool nnodes_given, bool node_rank_given, bool rdzv_id_given) {
  const auto slurm = f.standalone ? std::nullopt : comm::slurm_step_from_env();
  if (!slurm) return;
  if (!nnodes_given) f.nnodes = slurm->world_size;
  if (!node_rank_given) f.node_rank = slurm->rank;
  if (!rdzv_id_given) {
    f.rdzv_id = "slurm-" + std::to_string(slurm->job_id) + "." + std::to_string(slurm->step_id);
  }
  if (f.endpoint.empty()) {
    if (slurm->rank == 0 && slurm->node_rank != 0) {
      usage_error("srun placed task 0 on node ", slurm->node_rank, ", not on the first host '",
                  slurm->first_host(), "' of SLURM_STEP_NODELIST; pass --rdzv-endpoint");
    }
    f.endpoint = slurm->first_host() + ":" +
                 std::to_string(comm::slurm_rendezvous_port(slurm->job_id, slurm->step_id));
    f.host_server = slurm->rank == 0;
  }
}

// "--nnodes 4" or "--nnodes 1:4" in messages.
std::string nnodes_text(const Flags& f) {
  return f.elastic ? std::to_string(f.min_nodes) + ":" + std::to_string(f.max_nodes)
                   : std::to_string(f.nnodes);
}

void validate(Flags& f) {
  check_int("--nnodes", f.nnodes, 1, 1 << 20);
  check_int("--nproc-per-node", f.nproc_per_node, 1, 1 << 16);
  check_int("--max-restarts", f.max_restarts, 0, 1 << 20);
  if (f.node_rank != -1 && (f.node_rank < 0 || f.node_rank >= f.nnodes)) {
    usage_error("--node-rank ", f.node_rank, ": expected a node rank from 0 to ", f.nnodes - 1,
                " for --nnodes ", f.nnodes);
  }
  check_seconds("--rdzv-timeout", f.rdzv_timeout, 0, true, kYear, "one year");
  check_seconds("--grace-period", f.grace_period, 0, false, kDay, "one day");
  check_seconds("--heartbeat-timeout", f.heartbeat, 0.2, false, kDay, "one day");
  check_seconds("--worker-timeout", f.worker_timeout, 0.5, false, kYear, "one year",
                /*zero_ok=*/true);
  check_seconds("--rdzv-last-call", f.last_call, 0, false, kDay, "one day");
  check_int("--tail-lines", f.tail_lines, 0, 100000);
  if (const auto problem = comm::job_id_problem(f.rdzv_id)) {
    usage_error("--rdzv-id '", comm::printable_excerpt(f.rdzv_id), "': ", *problem);
  }

  f.embedded = f.standalone || (f.endpoint.empty() && f.nnodes == 1);
  if (f.embedded && f.nnodes > 1) {
    usage_error("--standalone runs one node, but --nnodes is ", nnodes_text(f),
                "; start hsgd-rendezvous and pass --rdzv-endpoint HOST:PORT instead");
  }
  if (!f.embedded && f.endpoint.empty()) {
    usage_error("--nnodes ", nnodes_text(f),
                " needs --rdzv-endpoint HOST:PORT of a running hsgd-rendezvous");
  }
  if (!f.embedded) f.store_at = parse_endpoint(f.endpoint);

  // A typo in the program name fails now, before any server or rendezvous.
  try {
    const char* path = std::getenv("PATH");
    (void)comm::launcher::resolve_program(f.program.front(), path != nullptr ? path : "");
  } catch (const InvalidArgument& e) {
    throw UsageError(sentence_of(e));
  }
  // One rule with hsgd-rendezvous (comm/rendezvous/rendezvous_server_tokens.h): this job's line,
  // else the server-wide token.
  // Without a file, one node makes its own token (its server and workers are all it must
  // reach); several nodes cannot agree on a random one without a secret they already share.
  if (auto problem = comm::tls::certificate_flags_problem(f.certificates)) usage_error(*problem);
  if (f.insecure && !f.certificates.certificate.empty()) {
    usage_error("--insecure runs plain TCP, so --tls-cert '", f.certificates.certificate,
                "' would protect nothing; drop one of them");
  }
  if (f.insecure) {
    if (!f.token_file.empty()) {
      usage_error("--insecure runs plain TCP without authentication, so --token-file '",
                  f.token_file, "' would protect nothing; drop one of them");
    }
  } else if (!f.token_file.empty()) {
    try {
      const std::string origin = "--token-file '" + f.token_file + "'";
      f.tokens = comm::read_token_file(f.token_file, origin);
      f.token = f.tokens.token_for(f.rdzv_id, origin);
    } catch (const InvalidArgument& e) {
      throw UsageError(sentence_of(e));
    }
  } else if (f.embedded) {
    f.token = comm::random_token();
    f.tokens.job_tokens[f.rdzv_id] = f.token;
    f.generated_token = true;
  } else {
    usage_error("the rendezvous server at ",
                f.endpoint.empty() ? "the step's first host" : f.endpoint,
                " authenticates its clients by the job's token, and nodes cannot share a random "
                "one: pass --token-file F (the file hsgd-rendezvous reads, copied to every node) "
                "or HSGD_TOKEN_FILE; or --insecure for plain TCP to a server started --insecure");
  }
  if (!f.log_dir.empty()) check_log_dir(f.log_dir);
}

// Edits (insertions, deletions, substitutions) that turn a into b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// An unknown "--flag": the nearest known flag when it is a likely typo, else where the flags are
// listed; the '--' hint only for what looks like a program (a path).
std::string unknown_flag_problem(const CLI::App& app, const std::string& arg) {
  const std::string name = arg.substr(0, arg.find('='));
  std::string best;
  size_t best_distance = 3;  // more edits than this is not a typo
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& long_name : option->get_lnames()) {
      const std::string known = "--" + long_name;
      const size_t d = edit_distance(name, known);
      if (d < best_distance || (known.starts_with(name) && name.size() >= 4 && best.empty())) {
        best = known;
        best_distance = std::min(d, best_distance);
      }
    }
  }
  if (!best.empty()) return "unknown flag '" + name + "'; did you mean " + best + "?";
  std::error_code ec;
  if (name.find('/') != std::string::npos || std::filesystem::exists(name, ec)) {
    return "unknown flag '" + name +
           "'; to run a program whose name starts with '-', put '--' before it";
  }
  return "unknown flag '" + name + "'";
}

// CLI11's "Could not convert: --flag = value" in the words of the other usage errors.
std::string conversion_problem(const CLI::App& app, const std::string& message) {
  const std::string prefix = "Could not convert: ";
  const auto equals = message.find(" = ");
  if (!message.starts_with(prefix) || equals == std::string::npos) return message;
  const std::string flag = message.substr(prefix.size(), equals - prefix.size());
  const std::string value = message.substr(equals + 3);
  const CLI::Option* option = app.get_option_no_throw(flag);
  const std::string type = option != nullptr ? option->get_type_name() : "";
  const std::string expected = type == "INT"     ? "an integer"
                               : type == "FLOAT" ? "a number of seconds"
                                                 : "a value of type " + type;
  return flag + " '" + value + "': expected " + expected + " (e.g. " + flag +
         (type == "INT" ? " 4" : " 30") + ")";
}

}  // namespace

void set_nnodes(Flags& f, const std::string& text, const std::string& label) {
  constexpr int kMost = 1 << 20;
  auto whole = [&](const std::string& part, int& value) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      return false;
    }
    if (used != part.size() || part.empty() || !std::isdigit(static_cast<unsigned char>(part[0])) ||
        v < 1 || v > kMost) {
      return false;
    }
    value = static_cast<int>(v);
    return true;
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    int n = 0;
    if (!whole(text, n)) {
      usage_error(label, ": expected a whole number from 1 to ", kMost,
                  ", or MIN:MAX for an elastic job (e.g. 4 or 1:4)");
    }
    f.nnodes = f.min_nodes = f.max_nodes = n;
    f.elastic = false;
    return;
  }
  int least = 0, most = 0;
  if (!whole(text.substr(0, colon), least) || !whole(text.substr(colon + 1), most)) {
    usage_error(label, ": expected MIN:MAX, whole numbers with 1 <= MIN <= MAX <= ", kMost,
                " (e.g. 1:4)");
  }
  if (least > most) {
    usage_error(label, ": expected MIN:MAX with MIN <= MAX, but MIN ", least, " > MAX ", most);
  }
  f.nnodes = f.max_nodes = most;
  f.min_nodes = least;
  f.elastic = least < most;
}

comm::launcher::LauncherNames flag_names() {
  return {.agent = "hsgd-run",
          .nnodes = "--nnodes",
          .node_rank = "--node-rank",
          .run_id = "--rdzv-id",
          .endpoint = "--rdzv-endpoint",
          .max_restarts = "--max-restarts",
          .rdzv_timeout = "--rdzv-timeout",
          .heartbeat_timeout = "--heartbeat-timeout",
          .worker_timeout = "--worker-timeout",
          .node_range = "--nnodes MIN:MAX",
          .last_call = "--rdzv-last-call"};
}

Endpoint parse_endpoint(const std::string& text, const std::string& flag) {
  Endpoint e;
  std::string port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos) {
      usage_error(flag, " '", text, "' has no closing ']'; expected [ADDR]:PORT");
    }
    e.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') usage_error(flag, " '", text, "': expected ':' after ']'");
      port = text.substr(close + 2);
    }
  } else {
    const auto colon = text.rfind(':');
    e.host = text.substr(0, colon);
    if (colon != std::string::npos) port = text.substr(colon + 1);
  }
  if (e.host.empty()) usage_error(flag, " '", text, "' has no host; expected HOST:PORT");
  if (!port.empty()) {
    size_t used = 0;
    long value = 0;
    try {
      value = std::stol(port, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != port.size() || value < 1 || value > 65535) {
      usage_error(flag, " '", text, "' has port '", port, "'; expected a number from 1 to 65535");
    }
    e.port = static_cast<int>(value);
  }
  return e;
}

std::optional<Flags> parse_flags(int argc, char** argv) {
  CLI::App app{"hsgd-run: start the workers of an hsgd job on this node (like torchrun)."};
  app.footer(kExamples);
  Flags f;
  // Ranges are checked by validate(), with messages that name flag and value in plain words.
  app.add_flag("--standalone", f.standalone,
               "Embed the rendezvous server on 127.0.0.1 with a free port (the default when "
               "--nnodes is 1 and no --rdzv-endpoint is given)")
      ->envname("HSGD_STANDALONE");
  std::string nnodes;
  auto* nnodes_option =
      app.add_option("--nnodes", nnodes,
                     "Number of nodes (hsgd-run processes) in the job, N or MIN:MAX (elastic: "
                     "nodes may leave and join while at least MIN remain; see docs/launcher.md); "
                     "under srun SLURM_NTASKS")
          ->envname("HSGD_NNODES");
  auto* nproc_option = app.add_option("--nproc-per-node,--nproc_per_node", f.nproc_per_node,
                                      "Workers to start on this node")
                           ->envname("HSGD_NPROC_PER_NODE");
  auto* endpoint_option =
      app.add_option("--rdzv-endpoint,--rdzv_endpoint", f.endpoint,
                     "HOST:PORT of hsgd-rendezvous (port defaults to 29400); under srun the step's "
                     "first host, where node 0 hosts the server")
          ->envname("HSGD_RDZV_ENDPOINT");
  auto* rdzv_id_option =
      app.add_option(
             "--rdzv-id,--rdzv_id", f.rdzv_id,
             "Job id: the nodes of one job use the same id; use a new one per job (under srun "
             "slurm-JOBID.STEPID)")
          ->envname("HSGD_RDZV_ID")
          ->capture_default_str();
  auto* node_rank_option =
      app.add_option(
             "--node-rank,--node_rank", f.node_rank,
             "Rank of this node; by default nodes are ranked by order of arrival (under srun "
             "SLURM_PROCID)")
          ->envname("HSGD_NODE_RANK");
  app.add_option("--max-restarts,--max_restarts", f.max_restarts,
                 "Restart the whole job (all nodes) up to this many times after a failure")
      ->envname("HSGD_MAX_RESTARTS")
      ->capture_default_str();
  app.add_option("--rdzv-timeout,--rdzv_timeout", f.rdzv_timeout,
                 "Seconds to wait for the endpoint and for all nodes to join")
      ->envname("HSGD_RDZV_TIMEOUT")
      ->capture_default_str();
  app.add_option("--rdzv-last-call,--rdzv_last_call", f.last_call,
                 "Elastic jobs: seconds the first generation waits for more nodes once MIN are "
                 "there (unless MAX are)")
      ->envname("HSGD_RDZV_LAST_CALL")
      ->capture_default_str();
  app.add_option("--log-dir,--log_dir", f.log_dir,
                 "Write each rank's output to DIR/attempt_K/rank_N.log instead of the terminal")
      ->envname("HSGD_LOG_DIR");
  app.add_option("--token-file", f.token_file,
                 "Token file of the rendezvous server ('TOKEN' and/or 'JOB_ID TOKEN' lines, as "
                 "hsgd-rendezvous reads it); this job's token is passed to workers")
      ->envname("HSGD_TOKEN_FILE");
  app.add_flag("--insecure", f.insecure,
               "Plain TCP without a token: the job's connections are unencrypted and anyone who "
               "reaches its ports can read and write its store (a trusted single host only)");
  app.add_option("--tls-cert", f.certificates.certificate,
                 "PEM certificate of this node, signed by the site's CA (with --tls-key and "
                 "--tls-ca): connections verify certificates both ways and still need the job's "
                 "token; every process of the job must use certificates")
      ->envname("HSGD_TLS_CERT");
  app.add_option("--tls-key", f.certificates.private_key, "PEM private key of --tls-cert")
      ->envname("HSGD_TLS_KEY");
  app.add_option("--tls-ca", f.certificates.authority,
                 "PEM certificates of the site's CA, which peers' certificates must chain to")
      ->envname("HSGD_TLS_CA");
  app.add_option("--grace-period", f.grace_period,
                 "Seconds between SIGTERM and SIGKILL when stopping")
      ->envname("HSGD_GRACE_PERIOD")
      ->capture_default_str();
  app.add_option(
         "--heartbeat-timeout", f.heartbeat,
         "Seconds without a heartbeat after which another node's hsgd-run counts as "
         "dead (its host or link is gone). In an elastic job (--nnodes MIN:MAX) an hsgd-run "
         "that exits or is killed is seen sooner: the rendezvous server drops its alive key "
         "once its connections close (after a tenth of this, 0.1 to 1 s)")
      ->envname("HSGD_HEARTBEAT_TIMEOUT")
      ->capture_default_str();
  app.add_option("--worker-timeout", f.worker_timeout,
                 "Seconds a worker of this node may make no progress (no step, no collective) "
                 "outside a collective while another waits in one, or stay stopped (SIGSTOP), "
                 "before it is named as hung and the job restarted; 0 turns it off. Must exceed "
                 "the longest stretch one rank computes alone (e.g. rank 0's evaluation)")
      ->envname("HSGD_WORKER_TIMEOUT")
      ->capture_default_str();
  app.add_option("--tail-lines", f.tail_lines, "Output lines of the failed rank shown in reports")
      ->envname("HSGD_TAIL_LINES")
      ->capture_default_str();
  // Everything from the first positional argument on (or after "--") is the worker command.
  app.prefix_command();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return std::nullopt;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return std::nullopt;
  } catch (const CLI::ConversionError& e) {
    throw UsageError(conversion_problem(app, e.what()));
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  f.program = app.remaining();
  if (!f.program.empty() && f.program.front() == "--") {
    f.program.erase(f.program.begin());
  } else if (!f.program.empty() && f.program.front().starts_with("-")) {
    // prefix_command() stops at the first argument it does not know: without "--" that is a
    // misspelt flag, not a program.
    usage_error(unknown_flag_problem(app, f.program.front()));
  }
  if (f.program.empty())
    usage_error("no program given; expected hsgd-run [OPTIONS] -- PROGRAM ARGS...");
  if (nnodes_option->count() > 0) set_nnodes(f, nnodes, "--nnodes '" + nnodes + "'");
  TorchEnvGiven given{.nnodes = nnodes_option->count() > 0,
                      .nproc_per_node = nproc_option->count() > 0,
                      .node_rank = node_rank_option->count() > 0,
                      .rdzv_id = rdzv_id_option->count() > 0,
                      .endpoint = endpoint_option->count() > 0};
  apply_torch_env(f, given);
  apply_slurm(f, given.nnodes, given.node_rank, given.rdzv_id);
  validate(f);
  return f;
}

}  // namespace hsgd::run
