#pragma once
// init_process_group: creates the world ProcessGroup of a job (like torch's
// init_process_group(backend="gloo", init_method="env://")). There is no hidden default group:
// the returned group is passed explicitly to whatever needs it.
//
// Usage, under hsgd-run or torchrun-style variables:
//   auto world = hsgd::comm::init_process_group(hsgd::comm::InitOptions::from_env());
// or explicitly, e.g. in a test with a shared store:
//   auto world = hsgd::comm::init_process_group({.rank = r, .world_size = 4, .store = store});

#include <memory>
#include <string>

#include "comm/store/store.h"

namespace hsgd::comm {

class ProcessGroup;
enum class AllreduceAlgorithm;

struct InitOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // Ranks per node (LOCAL_WORLD_SIZE); the world group keeps it (ProcessGroup::local_world_size)
  // as the job's node layout. 0 = not declared: the intra-node group is then the whole group.
  int local_world_size = 0;
  // This rank's node: GROUP_RANK under hsgd-run and torchrun, SLURM_NODEID under srun; -1 = not
  // declared. The world group keeps it (ProcessGroup::node_rank), so that nodes with different
  // numbers of ranks can be told apart (comm/process_group/node_layout.h).
  int node_rank = -1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // If set, used instead of connecting to master_addr:master_port (FileStore, HashStore...).
  std::shared_ptr<Store> store = nullptr;
  std::string job_id = "default";  // namespaces keys on the rendezvous server
  // Prefix of every key this job writes; distinct per restart attempt so that a restarted job
  // never reads the keys of the previous attempt. from_env() sets it to
  // "<HSGD_RUN_ID>/<HSGD_RESTART_COUNT>/" when launched by hsgd-run.
  std::string key_prefix = "";
  // The job's secret (HSGD_RDZV_TOKEN, else the job's entry of HSGD_TOKEN_FILE): it keys TLS to
  // the rendezvous server and the TLS data plane between ranks (comm/transport/tls_device.h). A
  // group of several ranks needs one unless `insecure` is set.
  std::string token = "";
  // Plain TCP to the rendezvous server and between ranks (Gloo's transport: no encryption, no
  // authentication), for trusted single-host work; only when the user asks (HSGD_INSECURE=1).
  // Rank 0 logs a warning saying so.
  bool insecure = false;
  std::string socket_ifname = "";      // network interface for Gloo (HSGD_SOCKET_IFNAME); "" = the
                                       // address that reaches master_addr
  Duration timeout = kDefaultTimeout;  // connect and every collective
  // Without a store and with world_size > 1, rank 0 hosts a rendezvous server on
  // master_addr:master_port (torch's env:// behaviour). from_env() clears it when the job was
  // launched by hsgd-run (HSGD_RUN_ID set), which runs the server itself.
  bool embedded_server = true;
  // kAuto; see process_group.h. from_env() reads HSGD_ALLREDUCE_ALGORITHM (to_string's names):
  // "ring" where one link joins two groups of nodes (racks), see docs/communication.md.
  AllreduceAlgorithm allreduce_algorithm{};
  // Allreduce over shared memory in groups whose members all run on one node (HSGD_SHM=0
  // turns it off, e.g. to measure Gloo's TCP path); see comm/process_group/shm_allreduce.h.
  bool shared_memory = true;
  // A collective that has waited this long checks through the store whether the other ranks are
  // in another collective, and fails within seconds if so (ProcessGroup::Options::mismatch_check,
  // HSGD_MISMATCH_CHECK_MS; 0 turns the check off).
  Duration mismatch_check = std::chrono::seconds(2);
  // ProcessGroup::Options::diagnosis_grace_after_loss / _after_timeout: how long a failed
  // collective waits for the other ranks' reports of what they were doing (0: it does not ask).
  Duration diagnosis_grace_after_loss = std::chrono::seconds(2);
  Duration diagnosis_grace_after_timeout = std::chrono::seconds(30);

  // Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
  // HSGD_RDZV_TOKEN, HSGD_SOCKET_IFNAME, HSGD_RUN_ID, HSGD_RESTART_COUNT, HSGD_JOB_ID,
  // HSGD_TIMEOUT_MS, HSGD_MISMATCH_CHECK_MS, HSGD_SHM and HSGD_INSECURE (0 or 1). Without RANK, a
  // task started by srun takes its place from Slurm (see comm/process_group/slurm_env.h): rank
  // SLURM_PROCID, world SLURM_NTASKS, local rank SLURM_LOCALID, local world its node's entry of
  // SLURM_STEP_TASKS_PER_NODE, node rank SLURM_NODEID; unless MASTER_ADDR / MASTER_PORT are set,
  // the rendezvous is on the first host of SLURM_STEP_NODELIST at
  // slurm_rendezvous_port(SLURM_JOB_ID, SLURM_STEP_ID), hosted by rank 0. It then also exports
  // LOCAL_WORLD_SIZE and GROUP_RANK (when unset), which the intra-node group of the post-local hook
  // and shared memory's node identity read, so a job under srun gets the node layout it would get
  // under hsgd-run; call it before starting threads. Without RANK or a Slurm step (a batch script's
  // own SLURM_PROCID does not count): a world of one. Throws hsgd::InvalidArgument naming the
  // variable and its value when a value is not a number, out of range or inconsistent.
  // Also HSGD_INSECURE (1: insecure) and, when HSGD_RDZV_TOKEN is unset, HSGD_TOKEN_FILE.
  static InitOptions from_env();
};

// Creates the world group: ranks() = 0..world_size-1. Without options.store: world_size 1 uses a
// HashStore; otherwise a TcpStore to master_addr:master_port, and (like env://) rank 0 hosts an
// embedded rendezvous server on master_port when the job was not launched by hsgd-run (no
// HSGD_RUN_ID). Between ranks, collectives run over TLS 1.3 keyed by options.token and bound to
// (job_id, ranks, pair); with options.insecure over plain TCP. Blocks until every rank arrived;
// throws hsgd::Timeout naming the ranks missing after options.timeout, hsgd::InvalidArgument for
// inconsistent options, including several ranks with neither a token nor insecure.
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options);

// The local address Gloo binds to for reaching host: the interface's address when ifname is
// set, else the source address the kernel picks for a route to host (127.0.0.1 for loopback).
std::string gloo_bind_address(const std::string& host, const std::string& ifname);

}  // namespace hsgd::comm
