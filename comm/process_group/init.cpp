#include "comm/process_group/init.h"

#include <arpa/inet.h>
#include <gloo/transport/tcp/device.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "comm/error.h"
#include "comm/log.h"
#include "comm/process_group/process_group.h"
#include "comm/process_group/slurm_env.h"
#include "comm/rendezvous/rendezvous_server.h"
#include "comm/rendezvous/rendezvous_server_tokens.h"
#include "comm/rendezvous/tcp_store.h"
#include "comm/store/hash_store.h"
#include "comm/transport/tls_device.h"

namespace hsgd::comm {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

// Parses an integer variable; InvalidArgument names it and its value when it is not one.
// The integer in variable `name`, or `fallback` when it is unset; a value that is not an integer
// or lies outside [min_value, max_value] is an InvalidArgument naming the variable and the range.
// The longest collective timeout: deadlines are computed as now + timeout, which must not
// overflow the clock's range (one year, in ms).
constexpr int64_t kMaxTimeoutMs = int64_t{365} * 24 * 3600 * 1000;

int64_t env_int(const char* name, int64_t fallback, int64_t min_value,
                int64_t max_value = std::numeric_limits<int>::max()) {
  const char* value = env(name);
  if (value == nullptr) return fallback;
  int64_t result = 0;
  const char* end = value + std::strlen(value);
  auto [ptr, ec] = std::from_chars(value, end, result);
  HSGD_CHECK(ec != std::errc::result_out_of_range || ptr != end, "environment variable ", name,
             "='", value, "' must be between ", min_value, " and ", max_value);
  HSGD_CHECK(ec == std::errc() && ptr == end, "environment variable ", name, "='", value,
             "' is not an integer");
  HSGD_CHECK(result >= min_value && result <= max_value, "environment variable ", name, "=", result,
             " must be between ", min_value, " and ", max_value);
  return result;
}

std::string env_string(const char* name, const std::string& fallback) {
  const char* value = env(name);
  return value != nullptr ? value : fallback;
}

std::string address_to_string(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw =
      addr->sa_family == AF_INET6
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(addr)->sin_addr);
  ::inet_ntop(addr->sa_family, raw, text, sizeof(text));
  return text;
}

// A task started by srun: its place in the step and the step's rendezvous endpoint.
void apply_slurm_step(const SlurmStep& step, InitOptions& options) {
  options.rank = step.rank;
  options.world_size = step.world_size;
  options.local_rank = step.local_rank;
  options.local_world_size = step.local_world_size();
  options.node_rank = step.node_rank;
  if (env("MASTER_ADDR") == nullptr) {
    // Rank 0 hosts the server on the first node; with another placement only the user knows.
    HSGD_CHECK(step.rank != 0 || step.node_rank == 0, "srun placed rank 0 on node ", step.node_rank,
               " (SLURM_NODEID), not on the first host '", step.first_host(),
               "' of SLURM_STEP_NODELIST where its peers look for the rendezvous server; set "
               "MASTER_ADDR to rank 0's host");
    options.master_addr = step.first_host();
  }
  options.master_port = slurm_rendezvous_port(step.job_id, step.step_id);
  // The intra-node group and shared memory's node identity read these, as under hsgd-run.
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(options.local_world_size).c_str(), 0);
  ::setenv("GROUP_RANK", std::to_string(options.node_rank).c_str(), 0);
  if (step.rank == 0 && !step.block_layout()) {
    logger()->warn(
        "srun placed the ranks of a node apart (not its default block distribution): groups of "
        "contiguous ranks (the post-local hook's intra-node group, the hierarchy's small groups) "
        "will span nodes; a hierarchy level of group size 'node' still groups each node's ranks");
  } else if (step.rank == 0 && !step.uniform_tasks_per_node()) {
    logger()->info(
        "srun runs different numbers of tasks on the nodes ({} nodes, {} tasks): the "
        "post-local hook's intra-node group is each node's tasks; in a hierarchy, group size "
        "'node' averages within each node, where fixed group sizes cannot match the nodes",
        step.num_nodes(), step.world_size);
  }
}

// The transport between ranks: TLS keyed by the token unless the user chose plain TCP.
std::shared_ptr<gloo::transport::Device> data_plane_device(const InitOptions& options) {
  const std::string host = gloo_bind_address(options.master_addr, options.socket_ifname);
  if (options.insecure) {
    if (options.rank == 0) {
      logger()->warn(
          "the data plane between ranks is unencrypted and unauthenticated (plain TCP on {}, "
          "InitOptions::insecure): anyone on the network can read and disturb this job",
          host);
    }
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    return gloo::transport::tcp::CreateDevice(attr);
  }
  HSGD_CHECK(!options.token.empty(), "init_process_group: rank ", options.rank, " of ",
             options.world_size,
             " has no token, which keys the encrypted data plane between ranks: set "
             "InitOptions::token (HSGD_RDZV_TOKEN) or choose unencrypted TCP with "
             "InitOptions::insecure (HSGD_INSECURE=1)");
  const auto handshake = std::min<Duration>(options.timeout, std::chrono::seconds(10));
  return comm::transport::create_tls_device({.host = host,
                                             .job_id = options.job_id,
                                             .token = options.token,
                                             .handshake_timeout = handshake});
}

}  // namespace

InitOptions InitOptions::from_env() {
  InitOptions options;
  if (env("RANK") != nullptr) {
    HSGD_CHECK(env("WORLD_SIZE") != nullptr,
               "environment variable RANK is set but WORLD_SIZE is not");
    options.world_size = static_cast<int>(env_int("WORLD_SIZE", 1, 1));
    options.rank = static_cast<int>(env_int("RANK", 0, 0));
    HSGD_CHECK(options.rank < options.world_size, "environment variable RANK=", options.rank,
               " must be < WORLD_SIZE=", options.world_size);
    options.local_world_size = static_cast<int>(env_int("LOCAL_WORLD_SIZE", 1, 1));
    options.local_rank = static_cast<int>(env_int("LOCAL_RANK", 0, 0));
    HSGD_CHECK(options.local_rank < options.local_world_size,
               "environment variable LOCAL_RANK=", options.local_rank,
               " must be < LOCAL_WORLD_SIZE=", options.local_world_size);
    options.node_rank = static_cast<int>(env_int("GROUP_RANK", -1, 0));
  } else if (const auto step = slurm_step_from_env()) {
    apply_slurm_step(*step, options);
  } else if (env("SLURM_PROCID") != nullptr && env_int("SLURM_NTASKS", 1, 1) > 1) {
    logger()->info(
        "SLURM_NTASKS={} but no SLURM_STEP_ID: not a task of an srun step (a batch script or "
        "an salloc shell), so this process runs alone; start it with srun to use the allocation",
        env("SLURM_NTASKS"));
  }
  options.master_addr = env_string("MASTER_ADDR", options.master_addr);
  options.master_port = static_cast<int>(env_int("MASTER_PORT", options.master_port, 0));
  HSGD_CHECK(options.master_port <= 65535, "environment variable MASTER_PORT=", options.master_port,
             " must be <= 65535");
  options.socket_ifname = env_string("HSGD_SOCKET_IFNAME", "");
  options.job_id = env_string("HSGD_JOB_ID", options.job_id);
  if (const char* insecure = env("HSGD_INSECURE")) {
    const std::string value = insecure;
    HSGD_CHECK(value == "0" || value == "1", "environment variable HSGD_INSECURE='", value,
               "' must be 0 (TLS between ranks, the default) or 1 (plain TCP, unencrypted)");
    options.insecure = value == "1";
  }
  if (!options.insecure) {
    options.token = env_string("HSGD_RDZV_TOKEN", "");
    const std::string file = env_string("HSGD_TOKEN_FILE", "");
    if (options.token.empty() && !file.empty()) {
      const std::string origin = "HSGD_TOKEN_FILE '" + file + "'";
      options.token = read_token_file(file, origin).token_for(options.job_id, origin);
    }
  }
  options.timeout = Duration(env_int("HSGD_TIMEOUT_MS", options.timeout.count(), 1, kMaxTimeoutMs));
  options.mismatch_check =
      Duration(env_int("HSGD_MISMATCH_CHECK_MS", options.mismatch_check.count(), 0, kMaxTimeoutMs));
  if (const char* shm = env("HSGD_SHM")) {
    const std::string value = shm;
    HSGD_CHECK(value == "0" || value == "1", "environment variable HSGD_SHM='", value,
               "' must be 0 (allreduce over Gloo's TCP transport) or 1 (shared memory within a "
               "node, the default)");
    options.shared_memory = value == "1";
  }
  if (const char* name = env("HSGD_ALLREDUCE_ALGORITHM")) {
    options.allreduce_algorithm =
        allreduce_algorithm_named(name, "environment variable HSGD_ALLREDUCE_ALGORITHM");
  }
  if (const char* run_id = env("HSGD_RUN_ID")) {
    options.key_prefix = std::string(run_id) + "/" + env_string("HSGD_RESTART_COUNT", "0") + "/";
    options.embedded_server = false;  // hsgd-run hosts the rendezvous server
  }
  return options;
}

std::string gloo_bind_address(const std::string& host, const std::string& ifname) {
  if (!ifname.empty()) {
    ifaddrs* list = nullptr;
    HSGD_CHECK_AS(CommError, ::getifaddrs(&list) == 0, "getifaddrs failed: ", std::strerror(errno));
    std::string found;
    for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
      if (it->ifa_addr == nullptr || ifname != it->ifa_name) continue;
      const int family = it->ifa_addr->sa_family;
      if (family == AF_INET || (family == AF_INET6 && found.empty())) {
        found = address_to_string(it->ifa_addr);
        if (family == AF_INET) break;  // prefer IPv4
      }
    }
    ::freeifaddrs(list);
    HSGD_CHECK(!found.empty(), "socket interface '", ifname,
               "' (HSGD_SOCKET_IFNAME) does not exist or has no IP address");
    return found;
  }
  // The source address of a route to host: connect() a UDP socket (sends nothing) and read the
  // local address the kernel chose.
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &result);
  HSGD_CHECK(rc == 0, "cannot resolve master address '", host, "': ", ::gai_strerror(rc));
  std::string address;
  for (addrinfo* ai = result; ai != nullptr && address.empty(); ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      address = address_to_string(reinterpret_cast<sockaddr*>(&local));
    }
    ::close(fd);
  }
  ::freeaddrinfo(result);
  HSGD_CHECK_AS(CommError, !address.empty(), "no local address has a route to master address '",
                host, "'");
  return address;
}

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  HSGD_CHECK(options.world_size >= 1, "init_process_group: world_size ", options.world_size,
             " must be >= 1");
  HSGD_CHECK(options.rank >= 0 && options.rank < options.world_size, "init_process_group: rank ",
             options.rank, " must be in [0, world_size=", options.world_size, ")");
  HSGD_CHECK(options.timeout.count() > 0 && options.timeout.count() <= kMaxTimeoutMs,
             "init_process_group: timeout ", options.timeout.count(), " ms must be between 1 and ",
             kMaxTimeoutMs, " (one year)");

  ProcessGroup::Options pg;
  pg.store = options.store;
  std::shared_ptr<RendezvousServer> server;
  if (pg.store == nullptr && options.world_size == 1) {
    pg.store = std::make_shared<HashStore>();
  } else if (pg.store == nullptr) {
    HSGD_CHECK(options.master_port > 0 && options.master_port <= 65535,
               "init_process_group: master_port ", options.master_port, " must be in [1, 65535]");
    HSGD_CHECK(options.insecure || !options.token.empty(), "init_process_group: the store at ",
               options.master_addr, ":", options.master_port,
               " is TLS keyed by the job's token and InitOptions::token is empty; set "
               "HSGD_RDZV_TOKEN or HSGD_TOKEN_FILE on every rank (or HSGD_INSECURE=1: plain TCP)");
    if (options.embedded_server && options.rank == 0) {
      server =
          std::make_shared<RendezvousServer>(RendezvousServerOptions{.host = options.master_addr,
                                                                     .port = options.master_port,
                                                                     .token = options.token,
                                                                     .insecure = options.insecure});
      server->start();
      logger()->info("rank 0 hosts the rendezvous server on {}:{}", options.master_addr,
                     server->port());
    }
    pg.store = std::make_shared<TcpStore>(TcpStoreOptions{.host = options.master_addr,
                                                          .port = options.master_port,
                                                          .job_id = options.job_id,
                                                          .token = options.token,
                                                          .insecure = options.insecure,
                                                          .connect_timeout = options.timeout,
                                                          .timeout = options.timeout});
  }
  pg.key_prefix = options.key_prefix + "pg/";
  pg.name = "world";
  pg.rank = options.rank;
  for (int r = 0; r < options.world_size; ++r) pg.ranks.push_back(r);
  pg.timeout = options.timeout;
  if (options.world_size > 1) pg.device = data_plane_device(options);
  pg.resources = server;
  pg.allreduce_algorithm = options.allreduce_algorithm;
  pg.shared_memory = options.shared_memory;
  pg.mismatch_check = options.mismatch_check;
  pg.diagnosis_grace_after_loss = options.diagnosis_grace_after_loss;
  pg.diagnosis_grace_after_timeout = options.diagnosis_grace_after_timeout;
  pg.local_world_size = options.local_world_size;
  pg.node_rank = options.node_rank;
  return std::make_shared<ProcessGroup>(std::move(pg));
}

}  // namespace hsgd::comm
