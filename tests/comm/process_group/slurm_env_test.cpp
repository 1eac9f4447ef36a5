// comm/slurm_env: the compressed forms srun(1) and slurm.conf(5) document (tasks per node
// "2(x3),1", hostlists "tux[0-2,8]", "linux[0000-1023]", "rack[0-63]_blade[0-41]"), the step read
// from the variables srun sets, and errors naming the bad text.

#include "comm/process_group/slurm_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "comm/error.h"

namespace hsgd::comm {
namespace {

using Strings = std::vector<std::string>;

void expect_invalid_hostlist(const std::string& text, const std::string& expected_in_message) {
  try {
    expand_hostlist(text);
    ADD_FAILURE() << "expand_hostlist('" << text << "') did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(expected_in_message), std::string::npos)
        << "text '" << text << "': " << e.what();
  }
}

void expect_invalid_tasks(const std::string& text, const std::string& expected_in_message) {
  try {
    expand_tasks_per_node(text);
    ADD_FAILURE() << "expand_tasks_per_node('" << text << "') did not throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(expected_in_message), std::string::npos)
        << "text '" << text << "': " << e.what();
  }
}

TEST(SlurmEnvTest, TasksPerNode_DocumentedForms) {
  EXPECT_EQ(expand_tasks_per_node("4"), (std::vector<int>{4}));
  EXPECT_EQ(expand_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));  // srun(1)
  EXPECT_EQ(expand_tasks_per_node("72(x2),36"), (std::vector<int>{72, 72, 36}));
  EXPECT_EQ(expand_tasks_per_node("1(x4)"), (std::vector<int>{1, 1, 1, 1}));
  EXPECT_EQ(expand_tasks_per_node("3,1(x2),5"), (std::vector<int>{3, 1, 1, 5}));
}

TEST(SlurmEnvTest, TasksPerNode_BadFormsNameThePart) {
  expect_invalid_tasks("", "tasks per node ''");
  expect_invalid_tasks("2,,1", "'' is not a positive count");
  expect_invalid_tasks("0", "'0' is not a positive count");
  expect_invalid_tasks("2(x0)", "'2(x0)'");
  expect_invalid_tasks("2(x3", "'2(x3'");
  expect_invalid_tasks("2(3)", "'2(3)'");
  expect_invalid_tasks("-1", "'-1'");
  expect_invalid_tasks("4(x2000000)", "more than 1000000 nodes");
}

TEST(SlurmEnvTest, Hostlist_DocumentedForms) {
  EXPECT_EQ(expand_hostlist("vm"), (Strings{"vm"}));
  EXPECT_EQ(expand_hostlist("alpha,beta,gamma"), (Strings{"alpha", "beta", "gamma"}));
  EXPECT_EQ(expand_hostlist("tux[0-2,8]"), (Strings{"tux0", "tux1", "tux2", "tux8"}));
  EXPECT_EQ(expand_hostlist("node[01-03,07]"), (Strings{"node01", "node02", "node03", "node07"}));
  EXPECT_EQ(expand_hostlist("a[1-2],b3"), (Strings{"a1", "a2", "b3"}));
  EXPECT_EQ(expand_hostlist("node1,node[2-3,12]"), (Strings{"node1", "node2", "node3", "node12"}));
  EXPECT_EQ(expand_hostlist("lx[15,18,32-33]"), (Strings{"lx15", "lx18", "lx32", "lx33"}));
  EXPECT_EQ(expand_hostlist("gnode[10,20,25,37]"),
            (Strings{"gnode10", "gnode20", "gnode25", "gnode37"}));
  EXPECT_EQ(expand_hostlist("rack[0-1]_blade[0-1]"),
            (Strings{"rack0_blade0", "rack0_blade1", "rack1_blade0", "rack1_blade1"}));
  EXPECT_EQ(expand_hostlist("n[8-10]"), (Strings{"n8", "n9", "n10"}));  // no width from 8
  EXPECT_EQ(expand_hostlist("n[098-101]"), (Strings{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_hostlist("a-b.c[1-2]"), (Strings{"a-b.c1", "a-b.c2"}));  // '-' outside []
  EXPECT_EQ(expand_hostlist("x[5]"), (Strings{"x5"}));
}

TEST(SlurmEnvTest, Hostlist_LargeRangeKeepsWidth) {
  const Strings hosts = expand_hostlist("linux[0000-1023]");  // slurm.conf(5)
  ASSERT_EQ(hosts.size(), 1024u);
  EXPECT_EQ(hosts.front(), "linux0000");
  EXPECT_EQ(hosts[999], "linux0999");
  EXPECT_EQ(hosts.back(), "linux1023");
  EXPECT_EQ(expand_hostlist("rack[0-63]_blade[0-41]").size(), 64u * 42u);
}

TEST(SlurmEnvTest, Hostlist_BadFormsNameThePart) {
  expect_invalid_hostlist("", "hostlist is empty");
  expect_invalid_hostlist("a,,b", "empty entry");
  expect_invalid_hostlist("a,", "empty entry");
  expect_invalid_hostlist("node[1-3", "'[' without ']'");
  expect_invalid_hostlist("node1-3]", "']' without '['");
  expect_invalid_hostlist("node[3-1]", "'3-1' is a range whose upper bound is below");
  expect_invalid_hostlist("node[a-c]", "'a-c' is not a number");
  expect_invalid_hostlist("node[]", "'' is not a number");
  expect_invalid_hostlist("node[1,,2]", "'' is not a number");
  expect_invalid_hostlist("bgl[123x456]", "'123x456' is not a number");
  expect_invalid_hostlist("n[[1-2]]", "nested brackets");
  expect_invalid_hostlist("n[0-999999999]", "more than 1000000 hosts");
  expect_invalid_hostlist("a[0-999]b[0-999]c[0-9]", "more than 1000000 hosts");
}

TEST(SlurmEnvTest, RendezvousPortDependsOnJobAndStep) {
  EXPECT_EQ(slurm_rendezvous_port(0, 0), 20000);
  EXPECT_EQ(slurm_rendezvous_port(4242, 0), 22420);
  EXPECT_EQ(slurm_rendezvous_port(4243, 0), 22430);
  EXPECT_EQ(slurm_rendezvous_port(4242, 3), 22423);
  EXPECT_EQ(slurm_rendezvous_port(999999, 9), 29999);
  EXPECT_NE(slurm_rendezvous_port(17, 0), slurm_rendezvous_port(18, 0));
}

// ---- the step from the environment ----

using Env = std::map<std::string, std::string>;

EnvLookup lookup_in(const Env& env) {
  return [&env](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

// What srun sets for rank 5 of `srun -N 4 -n 7` (block distribution: 2,2,2,1 tasks).
Env srun_task_env() {
  return {{"SLURM_PROCID", "5"},
          {"SLURM_NTASKS", "7"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "2"},
          {"SLURM_STEP_NUM_NODES", "4"},
          {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
          {"SLURM_STEP_NODELIST", "node[01-03,07]"},
          {"SLURM_JOB_ID", "123456"},
          {"SLURM_STEP_ID", "2"}};
}

void expect_invalid_step(const Env& env, const std::string& expected_in_message) {
  try {
    slurm_step_from_env(lookup_in(env));
    ADD_FAILURE() << "expected InvalidArgument mentioning " << expected_in_message;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(expected_in_message), std::string::npos) << e.what();
  }
}

TEST(SlurmEnvTest, StepFromSrunVariables) {
  const Env env = srun_task_env();
  const auto step = slurm_step_from_env(lookup_in(env));
  ASSERT_TRUE(step.has_value());
  EXPECT_EQ(step->rank, 5);
  EXPECT_EQ(step->world_size, 7);
  EXPECT_EQ(step->local_rank, 1);
  EXPECT_EQ(step->node_rank, 2);
  EXPECT_EQ(step->num_nodes(), 4);
  EXPECT_EQ(step->local_world_size(), 2);
  EXPECT_EQ(step->nodes, (Strings{"node01", "node02", "node03", "node07"}));
  EXPECT_EQ(step->first_host(), "node01");
  EXPECT_EQ(step->job_id, 123456);
  EXPECT_EQ(step->step_id, 2);
  EXPECT_TRUE(step->block_layout());
  EXPECT_FALSE(step->uniform_tasks_per_node());
}

TEST(SlurmEnvTest, CyclicDistributionIsNotBlockLayout) {
  // srun -N 2 -n 4 -m cyclic: node 0 runs ranks 0 and 2, node 1 runs ranks 1 and 3.
  Env env = srun_task_env();
  env["SLURM_PROCID"] = "2";
  env["SLURM_NTASKS"] = "4";
  env["SLURM_LOCALID"] = "1";
  env["SLURM_NODEID"] = "0";
  env["SLURM_STEP_NUM_NODES"] = "2";
  env["SLURM_STEP_TASKS_PER_NODE"] = "2(x2)";
  env["SLURM_STEP_NODELIST"] = "a[1-2]";
  const auto step = slurm_step_from_env(lookup_in(env));
  ASSERT_TRUE(step.has_value());
  EXPECT_FALSE(step->block_layout());
  EXPECT_TRUE(step->uniform_tasks_per_node());
  EXPECT_EQ(step->local_world_size(), 2);
}

TEST(SlurmEnvTest, NoStepOutsideSrun) {
  EXPECT_FALSE(slurm_step_from_env(lookup_in({})).has_value());
  // A batch script: SLURM_PROCID=0 and the allocation's SLURM_NTASKS, no SLURM_STEP_*.
  const Env batch = {{"SLURM_PROCID", "0"},         {"SLURM_NTASKS", "3"},
                     {"SLURM_LOCALID", "0"},        {"SLURM_NODEID", "0"},
                     {"SLURM_NNODES", "1"},         {"SLURM_JOB_ID", "3"},
                     {"SLURM_TASKS_PER_NODE", "3"}, {"SLURM_JOB_NODELIST", "vm"}};
  EXPECT_FALSE(slurm_step_from_env(lookup_in(batch)).has_value());
}

TEST(SlurmEnvTest, InconsistentStepNamesTheVariable) {
  Env env = srun_task_env();
  env.erase("SLURM_STEP_NODELIST");
  expect_invalid_step(env, "SLURM_STEP_NODELIST is not set");

  env = srun_task_env();
  env["SLURM_STEP_TASKS_PER_NODE"] = "2(x3)";
  expect_invalid_step(env, "SLURM_STEP_TASKS_PER_NODE='2(x3)' lists 3 nodes");

  env = srun_task_env();
  env["SLURM_STEP_TASKS_PER_NODE"] = "2(x3),2";
  expect_invalid_step(env, "adds up to 8 tasks but SLURM_NTASKS=7");

  env = srun_task_env();
  env["SLURM_STEP_NODELIST"] = "node[01-03]";
  expect_invalid_step(env, "SLURM_STEP_NODELIST='node[01-03]' names 3 hosts");

  env = srun_task_env();
  env["SLURM_PROCID"] = "7";
  expect_invalid_step(env, "SLURM_PROCID=7 must be < SLURM_NTASKS=7");

  env = srun_task_env();
  env["SLURM_NODEID"] = "4";
  expect_invalid_step(env, "SLURM_NODEID=4 must be < SLURM_STEP_NUM_NODES=4");

  env = srun_task_env();
  env["SLURM_NODEID"] = "3";  // node07 runs one task
  expect_invalid_step(env, "SLURM_LOCALID=1 must be < 1, the tasks of node 3");

  env = srun_task_env();
  env["SLURM_LOCALID"] = "one";
  expect_invalid_step(env, "SLURM_LOCALID='one' is not a non-negative integer");
}

}  // namespace
}  // namespace hsgd::comm
