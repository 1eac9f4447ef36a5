#pragma once
// A Slurm job step as its tasks see it: the variables srun sets for every task, and the two
// compressed notations among them. InitOptions::from_env() (comm/process_group/init.h) takes a
// worker's rank, its node's layout and the rendezvous endpoint from here under `srun`, and hsgd-run
// takes its node count, node rank and endpoint from here when started by `srun` inside an
// allocation.
//
// What srun sets for each task (srun(1), "OUTPUT ENVIRONMENT VARIABLES") and what is read:
//   SLURM_PROCID               rank of the task in the step, 0..SLURM_NTASKS-1
//   SLURM_NTASKS               tasks in the step
//   SLURM_LOCALID              rank of the task among the tasks of its node
//   SLURM_NODEID               index of the task's node in SLURM_STEP_NODELIST
//   SLURM_STEP_NUM_NODES       nodes in the step
//   SLURM_STEP_TASKS_PER_NODE  tasks on each node, in node order, compressed: "2(x3),1" is
//                              2,2,2,1 (a count followed by "(xN)" repeats it on N nodes)
//   SLURM_STEP_NODELIST        the step's nodes, compressed as a hostlist: "node[01-03,07]" is
//                              node01,node02,node03,node07; "a[1-2],b3" is a1,a2,b3
//   SLURM_JOB_ID, SLURM_STEP_ID  name the step (the default rendezvous port)
//
// Surprising but true: a batch script (sbatch) or an salloc shell has SLURM_PROCID=0 and the
// allocation's SLURM_NTASKS too, yet no SLURM_STEP_* variables. A program started there without
// srun is a single process, not a task of a step: slurm_step_from_env() returns nullopt for it,
// so that it runs as a world of one instead of waiting for SLURM_NTASKS-1 peers that never come.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hsgd::comm {

struct SlurmStep {
  int rank = 0;                                // SLURM_PROCID
  int world_size = 1;                          // SLURM_NTASKS
  int local_rank = 0;                          // SLURM_LOCALID
  int node_rank = 0;                           // SLURM_NODEID
  std::vector<int> tasks_per_node = {1};       // SLURM_STEP_TASKS_PER_NODE, one entry per node
  std::vector<std::string> nodes = {"local"};  // SLURM_STEP_NODELIST, expanded, in node order
  int64_t job_id = 0;                          // SLURM_JOB_ID
  int64_t step_id = 0;                         // SLURM_STEP_ID

  int num_nodes() const { return static_cast<int>(nodes.size()); }
  // Tasks on this task's node.
  int local_world_size() const { return tasks_per_node[node_rank]; }
  // The first node of the step. Rank 0 runs there under srun's block, cyclic and plane
  // distributions, so it is where a job started by srun finds its rendezvous server.
  const std::string& first_host() const { return nodes.front(); }
  // True when the ranks of each node are contiguous, in node order (srun's default block
  // distribution): this task's rank is the tasks of the nodes before it plus its local rank.
  // hsgd's intra-node groups (the post-local hook's subgroup, the hierarchy's small groups) are
  // made of contiguous ranks, so they match the nodes only then.
  bool block_layout() const;
  // True when every node runs the same number of tasks (LOCAL_WORLD_SIZE is one number).
  bool uniform_tasks_per_node() const;
};

// Expands Slurm's compressed tasks-per-node list: "4" -> {4}; "2(x3),1" -> {2, 2, 2, 1}.
// Throws hsgd::InvalidArgument naming the text and the bad part when it is not of that form
// (counts and repetitions are positive integers; at most 1,000,000 nodes in all).
std::vector<int> expand_tasks_per_node(std::string_view text);

// Expands a Slurm hostlist into host names, in order: comma-separated entries, each a name with
// zero or more bracketed lists of numbers and ranges. "tux[0-2,8]" -> tux0 tux1 tux2 tux8;
// "node[01-03,07]" -> node01 node02 node03 node07 (a range keeps the width of its lower bound,
// leading zeros included); "a[1-2],b3" -> a1 a2 b3; "rack[0-1]_blade[0-1]" -> rack0_blade0
// rack0_blade1 rack1_blade0 rack1_blade1. Throws hsgd::InvalidArgument naming the text and the
// bad part for an empty list or entry, an unclosed or nested bracket, a range whose upper bound
// is below its lower bound, or more than 1,000,000 hosts.
std::vector<std::string> expand_hostlist(std::string_view text);

// The rendezvous port of a step when MASTER_PORT is not set: 20000 + 10 * (job_id % 1000) +
// step_id % 10, in [20000, 29999] (below Linux's ephemeral ports). Jobs whose ids differ in their
// last three digits, and up to ten steps of one job, get different ports, so two jobs sharing a
// node do not collide.
int slurm_rendezvous_port(int64_t job_id, int64_t step_id);

// Reads a variable: returns nullptr when it is unset. Tests pass a map; programs use getenv.
using EnvLookup = std::function<const char*(const char*)>;

// The step this process is a task of, from the variables above; nullopt when SLURM_PROCID or
// SLURM_STEP_ID is unset (not launched by srun, see above). Throws hsgd::InvalidArgument naming
// the variable and its value when one is missing, not a number, out of range, or inconsistent
// with the others (SLURM_STEP_TASKS_PER_NODE must list SLURM_STEP_NUM_NODES nodes and sum to
// SLURM_NTASKS; SLURM_STEP_NODELIST must name SLURM_STEP_NUM_NODES hosts).
std::optional<SlurmStep> slurm_step_from_env(const EnvLookup& lookup);
std::optional<SlurmStep> slurm_step_from_env();  // from the process environment

}  // namespace hsgd::comm
